//! Trace reads: search, one trace (spans, inferred parents, logs), one span, open spans,
//! services and span names (docs/design.md, Read API JSON).

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use stallwatch_storage::ledger::{OpenSpanQuery, DEFAULT_OPEN_SPANS_PAGE, MAX_OPEN_SPANS_PAGE};
use stallwatch_storage::model::{now_unix_nano, SpanId, TraceId};
use stallwatch_storage::telemetry::{StatusFilter, TraceQuery, MAX_NAMES_PAGE};

use crate::error::DashboardError;
use crate::json;
use crate::otlp::TracesData;
use crate::params::Params;
use crate::state::Shared;
use crate::wire::TraceJ;

/// Default search page size.
pub const DEFAULT_PAGE: u64 = 50;
/// Largest search page size.
pub const MAX_PAGE: u64 = 1000;

pub(crate) fn trace_id(s: &str) -> Result<TraceId, DashboardError> {
    if s.len() != 32 {
        return Err(DashboardError::bad_param(format!(
            "trace_id must be 32 hex characters, got {s:?}"
        )));
    }
    TraceId::from_hex(s)
        .ok_or_else(|| DashboardError::bad_param(format!("trace_id {s:?} is not hex")))
}

pub(crate) fn span_id(s: &str) -> Result<SpanId, DashboardError> {
    if s.len() != 16 {
        return Err(DashboardError::bad_param(format!(
            "span_id must be 16 hex characters, got {s:?}"
        )));
    }
    SpanId::from_hex(s)
        .ok_or_else(|| DashboardError::bad_param(format!("span_id {s:?} is not hex")))
}

fn duration_ms(p: &mut Params, name: &str) -> Result<Option<u64>, DashboardError> {
    match p.string(name)? {
        None => Ok(None),
        Some(v) => match v.parse::<f64>() {
            Ok(ms) if (0.0..1e12).contains(&ms) => Ok(Some((ms * 1e6) as u64)),
            _ => Err(DashboardError::bad_param(format!(
                "query parameter {name:?} must be a non-negative number of ms, got {v:?}"
            ))),
        },
    }
}

/// Parses the search parameters: `service`, `span_name`, `tool_name`,
/// `status=unset|ok|error`, `min_duration_ms`, `max_duration_ms`, `attr=key=value`
/// (repeatable, all must hold on one span), `start_unix_nano`, `end_unix_nano`, `limit`
/// (1..=1000, default 50), `cursor`.
pub(crate) fn trace_query(mut p: Params) -> Result<TraceQuery, DashboardError> {
    let status = match p.string("status")?.as_deref() {
        None => None,
        Some("unset") => Some(StatusFilter::Unset),
        Some("ok") => Some(StatusFilter::Ok),
        Some("error") => Some(StatusFilter::Error),
        Some(other) => {
            return Err(DashboardError::bad_param(format!(
                "query parameter \"status\" must be unset, ok or error, got {other:?}"
            )))
        }
    };
    let min_duration_ns = duration_ms(&mut p, "min_duration_ms")?;
    let max_duration_ns = duration_ms(&mut p, "max_duration_ms")?;
    if let (Some(lo), Some(hi)) = (min_duration_ns, max_duration_ns) {
        if hi < lo {
            return Err(DashboardError::bad_param(
                "max_duration_ms must not be below min_duration_ms",
            ));
        }
    }
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
    let start = p.u64_in("start_unix_nano", 0, u64::MAX)?;
    let end = p.u64_in("end_unix_nano", 0, u64::MAX)?;
    if let (Some(s), Some(e)) = (start, end) {
        if e <= s {
            return Err(DashboardError::bad_param(
                "end_unix_nano must be after start_unix_nano",
            ));
        }
    }
    let q = TraceQuery {
        service: p.string("service")?,
        span_name: p.string("span_name")?,
        tool_name: p.string("tool_name")?,
        status,
        min_duration_ns,
        max_duration_ns,
        attribute: None,
        attributes,
        start_min_unix_nano: start,
        start_max_unix_nano: end,
        limit: p.limit(DEFAULT_PAGE, MAX_PAGE)?,
        cursor: p.string("cursor")?,
    };
    p.finish()?;
    Ok(q)
}

/// `GET /api/v1/traces` → `{"items":[trace summary...],"next_cursor":string|null,
/// "operations":[{"service","span_name","count","p50_ms","p90_ms","p99_ms","max_ms"}]}`;
/// `operations` holds nearest-rank duration percentiles per (service, span name) over the
/// ended spans of the traces in `items`.
pub(crate) async fn search(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let query = trace_query(Params::repeatable(q, &["attr"])?)?;
    let page = ctx.app.storage.search_traces(query).await?;
    let ms = |ns: u64| ns as f64 / 1e6;
    Ok(Json(json!({
        "items": page.items.iter().map(json::trace_summary).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
        "operations": page.operations.iter().map(|o| json!({
            "service": o.service,
            "span_name": o.span_name,
            "count": o.count,
            "p50_ms": ms(o.p50_ns),
            "p90_ms": ms(o.p90_ns),
            "p99_ms": ms(o.p99_ns),
            "max_ms": ms(o.max_ns),
        })).collect::<Vec<_>>(),
    })))
}

/// `GET /api/v1/traces/{trace_id}/otlp` → the stored spans as OTLP/JSON `TracesData`
/// (`otlp.rs`), with `Content-Disposition: attachment; filename="trace-<id>.otlp.json"`;
/// 404 when no span of it is stored.
pub(crate) async fn otlp(
    State(ctx): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Response, DashboardError> {
    let id = trace_id(&id)?;
    Params::new(q)?.finish()?;
    let view = match ctx.app.storage.trace(id).await? {
        Some(v) if !v.spans.is_empty() => v,
        _ => return Err(DashboardError::NotFound(format!("trace {id} not found"))),
    };
    let body = serde_json::to_vec(&TracesData::new(&view))
        .map_err(|e| DashboardError::Io(std::io::Error::other(e)))?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"trace-{id}.otlp.json\""),
            ),
        ],
        body,
    )
        .into_response())
}

/// `GET /api/v1/traces/{trace_id}` → `{"trace_id","resources","scopes","spans","logs"}`
/// (spans and logs point at `resources`/`scopes` by index, see `wire.rs`); `?lean=true`
/// leaves out per-span keys that hold defaults or repeat the answer (`TraceJ::lean`); 404
/// when unknown.
pub(crate) async fn trace(
    State(ctx): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Response, DashboardError> {
    let id = trace_id(&id)?;
    let mut p = Params::new(q)?;
    let lean = match p.string("lean")?.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => {
            return Err(DashboardError::bad_param(format!(
                "query parameter \"lean\" must be true or false, got {v:?}"
            )))
        }
    };
    p.finish()?;
    match ctx.app.storage.trace(id).await? {
        Some(v) => Ok(Json(TraceJ::new(&v).lean(lean)).into_response()),
        None => Err(DashboardError::NotFound(format!("trace {id} not found"))),
    }
}

/// `GET /api/v1/traces/{trace_id}/spans/{span_id}` → one span; a parent only named by its
/// children answers as an `inferred` span; 404 when unknown.
pub(crate) async fn span(
    State(ctx): State<Shared>,
    Path((t, s)): Path<(String, String)>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let (t, s) = (trace_id(&t)?, span_id(&s)?);
    Params::new(q)?.finish()?;
    if let Some(sp) = ctx.app.storage.span(t, s).await? {
        return Ok(Json(json::stored_span(&sp)));
    }
    if let Some(v) = ctx.app.storage.trace(t).await? {
        let child_start = v
            .spans
            .iter()
            .filter(|c| c.span.parent_span_id == Some(s))
            .map(|c| c.span.start_time_unix_nano)
            .min();
        if let Some(start) = child_start {
            return Ok(Json(json::inferred_span(t, s, start)));
        }
    }
    Err(DashboardError::NotFound(format!("span {t}/{s} not found")))
}

/// `GET /api/v1/open-spans[?runner_id=&limit=&cursor=]` → `{"items":[open span...],
/// "next_cursor":string|null}` from the open-span ledger, oldest first (first arrival, then
/// trace id, then span id), a page at a time like the other lists: `limit` 1..=1000
/// (default 100, [`DEFAULT_OPEN_SPANS_PAGE`]), `cursor` the previous page's `next_cursor`
/// (`null` on the last page). The storage reads the page's rows only.
pub(crate) async fn open_spans(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let mut p = Params::new(q)?;
    let query = OpenSpanQuery {
        runner_id: p.string("runner_id")?,
        limit: p.limit(DEFAULT_OPEN_SPANS_PAGE as u64, MAX_OPEN_SPANS_PAGE as u64)?,
        cursor: p.string("cursor")?,
    };
    p.finish()?;
    let now = now_unix_nano();
    let page = ctx.app.storage.open_spans(query).await?;
    let items: Vec<Value> = page.items.iter().map(|r| json::open_span(r, now)).collect();
    Ok(Json(
        json!({ "items": items, "next_cursor": page.next_cursor }),
    ))
}

/// `GET /api/v1/services[?limit=&cursor=]` → `{"items":[name...],"next_cursor"}`: distinct
/// `service.name` values, sorted, a page at a time (`limit` 1..=1000, default 1000: the
/// whole list while it is that short; `cursor` the previous page's `next_cursor`, `null` on
/// the last page). Names grow with what exporters send, so this list is paged like the rest.
pub(crate) async fn services(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let mut p = Params::new(q)?;
    let limit = p.limit(MAX_NAMES_PAGE as u64, MAX_NAMES_PAGE as u64)?;
    let after = p.string("cursor")?;
    p.finish()?;
    let page = ctx.app.storage.services(after, limit).await?;
    Ok(Json(
        json!({ "items": page.items, "next_cursor": page.next_cursor }),
    ))
}

/// `GET /api/v1/span-names[?service=&limit=&cursor=]` → `{"items":[name...],"next_cursor"}`,
/// sorted, paged as [`services`].
pub(crate) async fn span_names(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let mut p = Params::new(q)?;
    let service = p.string("service")?;
    let limit = p.limit(MAX_NAMES_PAGE as u64, MAX_NAMES_PAGE as u64)?;
    let after = p.string("cursor")?;
    p.finish()?;
    let page = ctx.app.storage.span_names(service, after, limit).await?;
    Ok(Json(
        json!({ "items": page.items, "next_cursor": page.next_cursor }),
    ))
}
