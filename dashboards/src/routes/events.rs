//! `GET /api/v1/events`: the incident stream as Server-Sent Events.
//!
//! Each event carries `id:` = incident id, `event:` = event name, `data:` = the incident
//! JSON. With `Last-Event-ID` (or `?last_event_id=`), incidents recorded after that id are
//! replayed from storage first, then the stream follows the [`EventBus`] live without gaps
//! or repeats: it subscribes before replaying and skips live ids already sent. A subscriber
//! that falls behind the bus re-reads from storage. Keep-alive comments every 15 s.
//!
//! With `?board=1` the stream also carries `event: board` frames (no `id:`), data
//! `{"items":[runner...]}`: the watchdog's board at connect and then at most once per
//! [`BOARD_INTERVAL`] when it changed, so the UI's Now page is live without polling.
//!
//! [`EventBus`]: stallwatch_storage::EventBus

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use stallwatch_storage::control::RunnerBoard;
use stallwatch_storage::model::Incident;
use stallwatch_storage::IncidentQuery;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::error::DashboardError;
use crate::json;
use crate::params::Params;
use crate::state::{Shared, ShutdownSignal};

/// Keep-alive comment interval.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Least time between two `board` frames.
pub const BOARD_INTERVAL: Duration = Duration::from_secs(1);
/// Incidents read per replay page.
const REPLAY_PAGE: usize = 500;

fn to_event(i: &Incident) -> Event {
    let data = json::incident(i).to_string();
    let ev = Event::default().event(i.incident.kind.as_str()).data(data);
    if i.id > 0 {
        ev.id(i.id.to_string())
    } else {
        ev
    }
}

fn board_event(board: &RunnerBoard) -> Event {
    let items: Vec<serde_json::Value> = board.values().map(json::runner).collect();
    Event::default()
        .event("board")
        .data(serde_json::json!({ "items": items }).to_string())
}

/// Sends incidents after `last` from storage; answers the newest id sent (or `last`).
async fn replay(
    ctx: &Shared,
    mut last: i64,
    tx: &mpsc::Sender<Result<Event, Infallible>>,
) -> Option<i64> {
    loop {
        let page = match ctx.app.storage.incidents_after(last, REPLAY_PAGE).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("sse replay failed: {e}");
                return Some(last);
            }
        };
        let n = page.len();
        for i in &page {
            tx.send(Ok(to_event(i))).await.ok()?;
            last = i.id;
        }
        if n < REPLAY_PAGE {
            return Some(last);
        }
    }
}

async fn pump(
    ctx: Shared,
    mut rx: broadcast::Receiver<Incident>,
    start: Option<i64>,
    tx: mpsc::Sender<Result<Event, Infallible>>,
    shutdown: CancellationToken,
    mut board: Option<watch::Receiver<RunnerBoard>>,
) {
    if let Some(b) = board.as_mut() {
        let frame = board_event(&b.borrow_and_update());
        if tx.send(Ok(frame)).await.is_err() {
            return;
        }
    }
    let mut tick = tokio::time::interval(BOARD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Without Last-Event-ID nothing is replayed; a lagging subscriber then re-reads only
    // from the newest incident at connect time (`floor`), never the whole history.
    let (mut last, floor) = match start {
        Some(after) => match replay(&ctx, after, &tx).await {
            Some(l) => (l, after),
            None => return,
        },
        None => {
            let newest = ctx
                .app
                .storage
                .incidents(IncidentQuery {
                    limit: 1,
                    ..IncidentQuery::default()
                })
                .await
                .ok()
                .and_then(|v| v.first().map(|i| i.id))
                .unwrap_or(0);
            (0, newest)
        }
    };
    loop {
        let got = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tx.closed() => return,
            got = rx.recv() => got,
            _ = tick.tick(), if board.is_some() => {
                if let Some(b) = board.as_mut() {
                    if b.has_changed().unwrap_or(false) {
                        let frame = board_event(&b.borrow_and_update());
                        if tx.send(Ok(frame)).await.is_err() {
                            return;
                        }
                    }
                }
                continue;
            }
        };
        match got {
            Ok(i) if i.id == 0 || i.id > last => {
                if tx.send(Ok(to_event(&i))).await.is_err() {
                    return;
                }
                last = last.max(i.id);
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "sse subscriber lagged; re-reading from storage");
                match replay(&ctx, last.max(floor), &tx).await {
                    Some(l) => last = l,
                    None => return,
                }
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// `GET /api/v1/events` → `text/event-stream`.
pub(crate) async fn stream(
    State(ctx): State<Shared>,
    signal: Option<Extension<ShutdownSignal>>,
    headers: HeaderMap,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Response, DashboardError> {
    let mut p = Params::new(q)?;
    let from_query = p.u64_in("last_event_id", 0, i64::MAX as u64)?;
    let with_board = match p.string("board")?.as_deref() {
        None | Some("0") | Some("false") => false,
        Some("1") | Some("true") => true,
        Some(other) => {
            return Err(DashboardError::bad_param(format!(
                "query parameter \"board\" must be 1 or 0, got {other:?}"
            )))
        }
    };
    p.finish()?;
    let from_header = match headers.get("last-event-id") {
        None => None,
        Some(v) => {
            let s = v.to_str().unwrap_or("").trim();
            if s.is_empty() {
                None
            } else {
                Some(s.parse::<u64>().map_err(|_| {
                    DashboardError::bad_param(format!(
                        "Last-Event-ID must be an incident id, got {s:?}"
                    ))
                })?)
            }
        }
    };
    let start = from_header
        .or(from_query)
        .map(|v| v.min(i64::MAX as u64) as i64);
    let rx = ctx.app.events.subscribe();
    let (tx, out) = mpsc::channel(64);
    let metrics = ctx.http.clone();
    metrics.sse(1);
    let shutdown = signal.map(|Extension(s)| s.0).unwrap_or_default();
    tokio::spawn(async move {
        let board = with_board.then(|| ctx.app.board.clone());
        pump(ctx, rx, start, tx, shutdown, board).await;
        metrics.sse(-1);
    });
    Ok(Sse::new(ReceiverStream::new(out))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}
