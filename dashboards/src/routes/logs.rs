//! Log reads (issue 13): `GET /api/v1/logs` (search, newest first, cursor paging) and
//! `GET /api/v1/logs/stream` (the live tail as Server-Sent Events).
//!
//! The stream carries `event: logs`, `id:` = the row id of the last record sent (row ids
//! grow with arrival), `data:` = `{"items":[log...]}` oldest first. With `Last-Event-ID`
//! (or `?last_event_id=`) it resumes after that row, else it starts with the records that
//! arrive after it connected. It takes the search's filters (not `cursor`/`limit`) and
//! polls storage every [`TAIL_POLL`]; keep-alive comments every 5 s. Log rows have
//! their own id sequence, so the tail is a stream of its own rather than frames on the
//! incident stream, whose `Last-Event-ID` is an incident id.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};
use stallwatch_storage::model::{attr, AnyValue};
use stallwatch_storage::telemetry::{LogEntry, LogQuery, MAX_SEVERITY};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::events::KEEP_ALIVE;
use super::traces::{span_id, trace_id};
use crate::error::DashboardError;
use crate::json::nanos;
use crate::params::Params;
use crate::state::{Shared, ShutdownSignal};
use crate::wire::LogJ;

/// Default search page size.
pub const DEFAULT_PAGE: u64 = 100;
/// Largest search page size.
pub const MAX_PAGE: u64 = 1000;
/// How often the live tail looks for new records.
pub const TAIL_POLL: Duration = Duration::from_millis(500);
/// Records per live-tail frame at most.
const TAIL_BATCH: usize = 500;

/// A severity: a number 1..=24 or a name of the OTLP logs data model's ranges
/// (`trace`=1, `debug`=5, `info`=9, `warn`=13, `error`=17, `fatal`=21).
fn severity(v: &str) -> Result<i32, DashboardError> {
    let named = match v.to_ascii_lowercase().as_str() {
        "trace" => Some(1),
        "debug" => Some(5),
        "info" => Some(9),
        "warn" | "warning" => Some(13),
        "error" => Some(17),
        "fatal" => Some(21),
        _ => None,
    };
    match named.or_else(|| v.parse::<i32>().ok()) {
        Some(n) if (1..=MAX_SEVERITY).contains(&n) => Ok(n),
        _ => Err(DashboardError::bad_param(format!(
            "query parameter \"min_severity\" must be 1..=24 or trace, debug, info, warn, error, fatal, got {v:?}"
        ))),
    }
}

/// Parses the filters shared by the search and the tail: `service`, `min_severity`,
/// `body` (case-insensitive substring), `attr=key=value` (repeatable, AND, on the record
/// or its resource), `trace_id`, `span_id`, `runner_id`, `start_unix_nano` (inclusive),
/// `end_unix_nano` (exclusive).
fn filters(p: &mut Params) -> Result<LogQuery, DashboardError> {
    let mut attributes = Vec::new();
    for v in p.all("attr")? {
        match v.split_once('=') {
            Some((k, val)) if !k.is_empty() => attributes.push((k.to_string(), val.to_string())),
            _ => {
                return Err(DashboardError::bad_param(format!(
                    "query parameter \"attr\" must be key=value, got {v:?}"
                )))
            }
        }
    }
    let start = p.u64_in("start_unix_nano", 0, i64::MAX as u64)?;
    let end = p.u64_in("end_unix_nano", 0, i64::MAX as u64)?;
    if let (Some(s), Some(e)) = (start, end) {
        if e <= s {
            return Err(DashboardError::bad_param(
                "end_unix_nano must be after start_unix_nano",
            ));
        }
    }
    Ok(LogQuery {
        service: p.string("service")?,
        min_severity: p
            .string("min_severity")?
            .as_deref()
            .map(severity)
            .transpose()?,
        body_contains: p.string("body")?,
        attributes,
        trace_id: p.string("trace_id")?.as_deref().map(trace_id).transpose()?,
        span_id: p.string("span_id")?.as_deref().map(span_id).transpose()?,
        runner_id: p.string("runner_id")?,
        from_unix_nano: start,
        to_unix_nano: end,
        limit: 0,
        cursor: None,
    })
}

/// One record: the read API's log JSON plus `id`, `received_unix_nano` and `runner_id`
/// (the resource's `stallwatch.runner.id`, for the link to the runner).
fn entry(e: &LogEntry) -> Value {
    let mut v = serde_json::to_value(LogJ(&e.log, None)).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.insert("id".into(), json!(e.id));
        m.insert("received_unix_nano".into(), nanos(e.received_unix_nano));
        m.insert(
            "runner_id".into(),
            json!(
                attr(&e.log.resource.attributes, "stallwatch.runner.id").and_then(AnyValue::as_str)
            ),
        );
    }
    v
}

/// `GET /api/v1/logs` → `{"items":[log...],"next_cursor":string|null}`, newest first (by
/// record time, then arrival); filters as [`filters`] plus `limit` (1..=1000, default 100)
/// and `cursor`.
pub(crate) async fn search(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let mut p = Params::repeatable(q, &["attr"])?;
    let mut query = filters(&mut p)?;
    query.limit = p.limit(DEFAULT_PAGE, MAX_PAGE)?;
    query.cursor = p.string("cursor")?;
    p.finish()?;
    let page = ctx.app.storage.search_logs(query).await?;
    Ok(Json(json!({
        "items": page.items.iter().map(entry).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
    })))
}

async fn tail(
    ctx: Shared,
    query: LogQuery,
    mut last: i64,
    tx: mpsc::Sender<Result<Event, Infallible>>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(TAIL_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tx.closed() => return,
            _ = tick.tick() => {}
        }
        loop {
            let (items, upto) = match ctx
                .app
                .storage
                .logs_after(query.clone(), last, TAIL_BATCH)
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("log tail read failed: {e}");
                    break;
                }
            };
            let full = items.len() == TAIL_BATCH;
            if let Some(newest) = items.last().map(|e| e.id) {
                let data = json!({ "items": items.iter().map(entry).collect::<Vec<_>>() });
                let ev = Event::default()
                    .event("logs")
                    .id(newest.to_string())
                    .data(data.to_string());
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            last = upto;
            if !full {
                break;
            }
        }
    }
}

/// `GET /api/v1/logs/stream` → `text/event-stream` of `logs` frames (see the module doc).
pub(crate) async fn stream(
    State(ctx): State<Shared>,
    signal: Option<Extension<ShutdownSignal>>,
    headers: HeaderMap,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Response, DashboardError> {
    let mut p = Params::repeatable(q, &["attr"])?;
    let query = filters(&mut p)?;
    let from_query = p.u64_in("last_event_id", 0, i64::MAX as u64)?;
    p.finish()?;
    let from_header = crate::params::last_event_id(&headers, "a log row id")?;
    let start = match from_header.or(from_query.map(|v| v as i64)) {
        Some(v) => v,
        None => ctx.app.storage.newest_log_id().await?,
    };
    let permit = crate::state::stream_permit(&ctx)?;
    let (tx, out) = mpsc::channel(16);
    let metrics = ctx.http.clone();
    metrics.sse(1);
    let shutdown = signal.map(|Extension(s)| s.0).unwrap_or_default();
    stallwatch_vocabulary::task::spawn_boxed(async move {
        let _permit = permit;
        tail(ctx, query, start, tx, shutdown).await;
        metrics.sse(-1);
    });
    Ok(Sse::new(ReceiverStream::new(out))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}
