//! `GET /api/v1/events`: the incident stream as Server-Sent Events.
//!
//! Each event carries `id:` = incident id, `event:` = event name, `data:` = the incident
//! JSON. With `Last-Event-ID` (or `?last_event_id=`), incidents recorded after that id are
//! replayed from storage first, then the stream follows the [`EventBus`] live without gaps
//! or repeats: it subscribes before replaying and skips live ids already sent. A subscriber
//! that falls behind the bus re-reads from storage. Keep-alive comments every 5 s.
//!
//! Live incidents may reach the bus out of id order: two publishers whose writes share one
//! group commit (`storage/src/group.rs`) are answered together and race to broadcast, so
//! id 12 can arrive before id 11. The stream therefore never skips "everything at or below
//! the newest id sent"; it keeps the exact set of ids sent above the highest id it knows
//! to be contiguous ([`Sent`]), so 11 is still sent after 12, and nothing is sent twice.
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

/// Keep-alive comment interval. Also how a closed stream is found: the listeners answer
/// half-closed HTTP/1 requests (`stallwatch_storage::listen`), so a client's end of input
/// no longer ends its stream at once; the write after the peer is gone draws its reset, the
/// next fails and ends the connection, so a closed stream's slot comes back within two
/// intervals (10 s).
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);
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

/// The ids a stream has sent: every id at or below `upto` (replayed from storage, or
/// older than the stream), plus the exact ids in `above` sent live out of order.
#[derive(Debug, Default)]
struct Sent {
    upto: i64,
    above: std::collections::BTreeSet<i64>,
}

/// Above this many out-of-order ids the stream re-reads storage to fold them into `upto`
/// (ids can have holes, e.g. an incident held on a full disk and written later, which is
/// never broadcast with its id, so `upto` would never pass it by itself).
const SENT_SET_CAP: usize = 1024;

impl Sent {
    fn new(upto: i64) -> Self {
        Self {
            upto,
            above: Default::default(),
        }
    }

    /// Whether `id` is new, marking it sent. Id 0 (an incident held in memory, not yet
    /// written) is always new.
    fn fresh(&mut self, id: i64) -> bool {
        if id == 0 {
            return true;
        }
        if id <= self.upto || !self.above.insert(id) {
            return false;
        }
        while self.above.remove(&(self.upto + 1)) {
            self.upto += 1;
        }
        true
    }

    /// Whether the out-of-order set grew past [`SENT_SET_CAP`].
    fn needs_resync(&self) -> bool {
        self.above.len() > SENT_SET_CAP
    }

    /// After storage was read up to `newest` (every id at or below it is committed and was
    /// sent or skipped as sent), forget the exact ids.
    fn read_up_to(&mut self, newest: i64) {
        self.upto = self.upto.max(newest);
        let upto = self.upto;
        self.above.retain(|id| *id > upto);
    }
}

/// Sends the incidents after `sent.upto` from storage that `sent` has not sent; answers
/// `None` when the client is gone. A storage error ends the replay early (logged).
async fn replay(
    ctx: &Shared,
    sent: &mut Sent,
    tx: &mpsc::Sender<Result<Event, Infallible>>,
) -> Option<()> {
    let mut last = sent.upto;
    loop {
        let page = match ctx.app.storage.incidents_after(last, REPLAY_PAGE).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("sse replay failed: {e}");
                return Some(());
            }
        };
        let n = page.len();
        for i in &page {
            if !sent.above.contains(&i.id) {
                tx.send(Ok(to_event(i))).await.ok()?;
            }
            last = i.id;
        }
        sent.read_up_to(last);
        if n < REPLAY_PAGE {
            return Some(());
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
) -> Option<()> {
    if let Some(b) = board.as_mut() {
        let frame = board_event(&b.borrow_and_update());
        tx.send(Ok(frame)).await.ok()?;
    }
    let mut tick = tokio::time::interval(BOARD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Without Last-Event-ID nothing is replayed; a lagging subscriber then re-reads only
    // from the newest incident at connect time, never the whole history.
    let mut sent = match start {
        Some(after) => {
            let mut sent = Sent::new(after);
            replay(&ctx, &mut sent, &tx).await?;
            sent
        }
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
            Sent::new(newest)
        }
    };
    loop {
        let got = tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tx.closed() => return None,
            got = rx.recv() => got,
            _ = tick.tick(), if board.is_some() => {
                if let Some(b) = board.as_mut() {
                    if b.has_changed().unwrap_or(false) {
                        let frame = board_event(&b.borrow_and_update());
                        tx.send(Ok(frame)).await.ok()?;
                    }
                }
                continue;
            }
        };
        match got {
            Ok(i) => {
                if sent.fresh(i.id) {
                    tx.send(Ok(to_event(&i))).await.ok()?;
                }
                if sent.needs_resync() {
                    replay(&ctx, &mut sent, &tx).await?;
                }
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "sse subscriber lagged; re-reading from storage");
                replay(&ctx, &mut sent, &tx).await?;
            }
            Err(broadcast::error::RecvError::Closed) => return None,
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
                "query parameter \"board\" must be 1, 0, true or false, got {other:?}"
            )))
        }
    };
    p.finish()?;
    let from_header = crate::params::last_event_id(&headers, "an incident id")?;
    let start = from_header.or(from_query.map(|v| v.min(i64::MAX as u64) as i64));
    let permit = crate::state::stream_permit(&ctx)?;
    let rx = ctx.app.events.subscribe();
    let (tx, out) = mpsc::channel(64);
    let metrics = ctx.http.clone();
    metrics.sse(1);
    let shutdown = signal.map(|Extension(s)| s.0).unwrap_or_default();
    stallwatch_vocabulary::task::spawn_boxed(async move {
        let _permit = permit;
        let board = with_board.then(|| ctx.app.board.clone());
        let _ = pump(ctx, rx, start, tx, shutdown, board).await;
        metrics.sse(-1);
    });
    Ok(Sse::new(ReceiverStream::new(out))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::Sent;

    #[test]
    fn an_id_that_arrives_after_a_higher_one_is_still_sent_once() {
        let mut s = Sent::new(10);
        assert!(s.fresh(12), "12 is new");
        assert!(s.fresh(11), "11 arrived late and must still be sent");
        assert!(!s.fresh(11) && !s.fresh(12), "nothing twice");
        assert_eq!(s.upto, 12, "11 and 12 fold into the contiguous watermark");
        assert!(s.above.is_empty());
        assert!(!s.fresh(9), "replayed ids are not sent again");
        assert!(
            s.fresh(0) && s.fresh(0),
            "held incidents (id 0) always go out"
        );
    }

    #[test]
    fn a_hole_keeps_exact_ids_until_storage_is_read_past_it() {
        let mut s = Sent::new(0);
        assert!(s.fresh(2) && s.fresh(3));
        assert_eq!(s.upto, 0, "id 1 is a hole (held, written later)");
        for id in 4..=(super::SENT_SET_CAP as i64 + 2) {
            assert!(s.fresh(id));
        }
        assert!(s.needs_resync());
        s.read_up_to(super::SENT_SET_CAP as i64 + 2);
        assert!(!s.needs_resync() && s.above.is_empty());
        assert!(!s.fresh(3));
        assert!(s.fresh(super::SENT_SET_CAP as i64 + 3));
    }
}
