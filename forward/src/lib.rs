//! `[forward]`: sends every span, log record and metric point stallwatch accepted to an
//! upstream OpenTelemetry Collector, Tempo or Jaeger over OTLP (docs/design.md, Beyond one machine).
//!
//! The stored telemetry tables are the durable queue: nothing is copied on the ingest path.
//! One task reads rows after the per-signal cursor (`stallwatch_storage::forward`) through
//! the read-only pool, converts them back to OTLP (`convert`), sends them (`client`), and
//! moves the cursor in a `synchronous=FULL` transaction once the upstream acknowledged
//! them, so a restart resumes there. Delivery is at least once: a request the upstream
//! acknowledged just before a crash, before its cursor moved, is sent again after the
//! restart. A retryable failure keeps the request and waits (`backoff`, honouring
//! `Retry-After` and RetryInfo) while the other signals go on: each signal has its own
//! back-off, so traces sent to an upstream that is down do not hold logs sent to one that
//! is up; a permanent refusal drops the request, counted. The backlog is measured
//! every second; past `max_queue_bytes` the oldest rows are skipped, counted as dropped and
//! logged. Rows deleted by retention before they were forwarded show up as holes in the
//! row ids, or, with nothing left to read, as ids used past the cursor (ids only grow), and
//! are counted too (logged at most once a minute per signal). The task never takes the telemetry writer and never blocks
//! ingest or the watchdog: it only reads, and its conversions run on the blocking pool.

pub mod backoff;
pub mod client;
pub mod config;
pub mod convert;
pub mod error;
pub mod pieces;
pub mod stats;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use stallwatch_storage::forward::{Chunk, ForwardCursor, Signal};
use stallwatch_storage::{Storage, StorageError};
use stallwatch_vocabulary::redact::redact_url;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use backoff::Backoff;
pub use client::{Exporter, Outcome, Request};
pub use config::{Compression, ForwardConfig, Protocol, RawForwardConfig};
pub use error::ForwardError;
pub use stats::{DropReason, ForwardStats};

/// A running forwarder task.
pub struct Forwarder {
    stats: Arc<ForwardStats>,
    token: CancellationToken,
    task: JoinHandle<()>,
}

impl Forwarder {
    /// Starts the forwarder task on the current tokio runtime. It reads the cursors (created
    /// on first use), then forwards until [`Forwarder::stop`].
    ///
    /// Errors: [`ForwardError::Client`] / [`ForwardError::Config`] when the upstream client
    /// cannot be built.
    pub fn start(config: ForwardConfig, storage: Storage) -> Result<Self, ForwardError> {
        let exporter = Exporter::new(&config)?;
        let worker = Worker::new(config, storage, exporter);
        let (stats, token) = (worker.stats.clone(), worker.token.clone());
        let task = stallwatch_vocabulary::task::spawn_boxed(worker.run());
        Ok(Self { stats, token, task })
    }

    /// The counters (a `MetricsSource` for `GET /metrics`).
    pub fn stats(&self) -> Arc<ForwardStats> {
        self.stats.clone()
    }

    /// Stops the task: an export in flight is abandoned (its rows stay queued and are sent
    /// again after the restart). Waits up to `deadline`.
    pub async fn stop(self, deadline: Duration) {
        self.token.cancel();
        if tokio::time::timeout(deadline, self.task).await.is_err() {
            tracing::warn!("forwarder did not stop within {deadline:?}");
        }
    }
}

/// Converts a request on the blocking pool.
type MakeRequest = Box<dyn FnOnce() -> Request + Send>;

/// Splits a chunk into its counts and the conversion of its data.
fn split<T: Send + 'static>(c: Chunk<T>, f: fn(&T) -> Request) -> (Chunk<()>, MakeRequest) {
    let meta = Chunk {
        last_id: c.last_id,
        rows: c.rows,
        items: c.items,
        missing_rows: c.missing_rows,
        undecodable: c.undecodable,
        data: (),
    };
    let data = c.data;
    (meta, Box::new(move || f(&data)))
}

/// Rows read from the queue and not yet wholly acknowledged: sent as requests of at most
/// `max_items` items (`pieces`), one at a time; the cursor moves past the rows once the
/// last piece is answered.
struct Pending {
    /// The piece being sent.
    request: Request,
    /// Its items.
    items: u64,
    /// The pieces after it.
    rest: std::collections::VecDeque<(Request, u64)>,
    /// Items of the pieces already answered: acknowledged, and refused (dropped).
    done_sent: u64,
    done_dropped: u64,
    last_id: i64,
    missing_rows: u64,
    undecodable: u64,
    /// Retryable failures of this request so far.
    attempts: u32,
}

struct Worker {
    config: ForwardConfig,
    storage: Storage,
    exporter: Exporter,
    stats: Arc<ForwardStats>,
    token: CancellationToken,
    /// Per signal (traces, logs, metrics): its consecutive failures and next delay.
    backoff: [Backoff; 3],
    /// Per signal: not before this instant (a retry is waiting).
    retry_at: [Option<Instant>; 3],
    cursors: [ForwardCursor; 3],
    pending: [Option<Pending>; 3],
    /// Items per request, per signal: `batch_max_spans`, halved after a too-large refusal.
    max_items: [usize; 3],
    /// Requests acknowledged since `max_items` last changed, per signal.
    acked_since_shrink: [u32; 3],
    /// Per signal: rows found deleted by retention before they were forwarded since the
    /// last warning, and when that warning was logged ([`LOST_WARN_EVERY`]).
    lost_unwarned: [(u64, Option<Instant>); 3],
}

/// Rows deleted by retention before they were forwarded are logged (WARN) at most this
/// often per signal, with their count since the last line; at the size cap under a flood
/// they are found with nearly every request (an outside-style round: 129 WARN lines in
/// 30 s). `/metrics` counts every one at once.
const LOST_WARN_EVERY: Duration = Duration::from_secs(60);

/// Cut-off attempts of one request before it is sent in smaller pieces.
const CUT_OFF_ATTEMPTS: u32 = 2;
/// Acknowledged requests before a shrunk batch size doubles back.
const REGROW_AFTER: u32 = 16;

fn now_unix_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Worker {
    /// A worker with fresh counters and back-offs; its cursors are read when it runs.
    fn new(config: ForwardConfig, storage: Storage, exporter: Exporter) -> Self {
        Worker {
            backoff: std::array::from_fn(|_| Backoff::new(config.retry_initial, config.retry_max)),
            retry_at: [None; 3],
            max_items: [config.batch_max_spans; 3],
            acked_since_shrink: [0; 3],
            config,
            storage,
            exporter,
            stats: Arc::new(ForwardStats::default()),
            token: CancellationToken::new(),
            cursors: [ForwardCursor::default(); 3],
            pending: [None, None, None],
            lost_unwarned: [(0, None); 3],
        }
    }

    /// Moves `signal`'s cursor to `delta.last_id` and adds `delta`'s counters: stored first
    /// (`Storage::forward_advance`, one `synchronous=FULL` transaction), then kept here.
    async fn advance(&mut self, signal: Signal, delta: ForwardCursor) -> Result<(), ForwardError> {
        let from = self.cursors[signal.index()].last_id;
        self.storage
            .forward_advance(signal, from, delta.last_id, delta)
            .await?;
        let c = &mut self.cursors[signal.index()];
        c.last_id = delta.last_id;
        c.sent += delta.sent;
        c.dropped += delta.dropped;
        c.lost_rows += delta.lost_rows;
        Ok(())
    }

    /// Sleeps `d` unless cancelled; answers false when cancelled.
    async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = self.token.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }

    async fn run(mut self) {
        // The cursors; storage errors here are retried (the database may be busy).
        loop {
            match self.storage.forward_cursors().await {
                Ok(c) => {
                    self.cursors = c;
                    break;
                }
                Err(e) => {
                    tracing::error!("forward: cannot read the cursors: {e}");
                    if !self.sleep(self.config.retry_max).await {
                        return;
                    }
                }
            }
        }
        tracing::info!(
            endpoint = %redact_url(&self.config.endpoint),
            traces_url = %redact_url(&self.config.url(Signal::Traces)),
            logs_url = %redact_url(&self.config.url(Signal::Logs)),
            metrics_url = %redact_url(&self.config.url(Signal::Metrics)),
            protocol = ?self.config.protocol,
            traces_after = self.cursors[0].last_id,
            logs_after = self.cursors[1].last_id,
            metrics_after = self.cursors[2].last_id,
            "forwarding telemetry upstream"
        );
        let check_every = Duration::from_millis(config::BACKLOG_CHECK_MS);
        let mut last_check: Option<Instant> = None;
        while !self.token.is_cancelled() {
            if last_check.is_none_or(|t| t.elapsed() >= check_every) {
                last_check = Some(Instant::now());
                if let Err(e) = self.check_backlog().await {
                    tracing::error!("forward: backlog check failed: {e}");
                }
            }
            match self.round().await {
                Ok(true) => {}
                Ok(false) => {
                    if !self.sleep(self.idle_wait()).await {
                        break;
                    }
                }
                Err(e) => {
                    tracing::error!("forward: {e}");
                    if !self.sleep(self.config.retry_initial).await {
                        break;
                    }
                }
            }
        }
        tracing::info!("forwarder stopped");
    }

    /// The wait when a round made no progress: the poll interval, or less when a signal's
    /// retry is due sooner.
    fn idle_wait(&self) -> Duration {
        let now = Instant::now();
        self.retry_at
            .iter()
            .flatten()
            .map(|t| t.saturating_duration_since(now))
            .fold(self.config.poll_interval, Duration::min)
    }

    /// One request per signal with rows, skipping a signal whose retry is not due yet.
    /// Answers true when something was acknowledged (no idle sleep needed).
    async fn round(&mut self) -> Result<bool, ForwardError> {
        let mut progressed = false;
        for (i, signal) in Signal::ALL.into_iter().enumerate() {
            if self.retry_at[i].is_some_and(|t| t > Instant::now()) {
                continue;
            }
            self.retry_at[i] = None;
            if self.pending[i].is_none() {
                self.pending[i] = self.read(signal, self.cursors[i].last_id).await?;
            }
            let Some(p) = &self.pending[i] else { continue };
            // While the upstream works on this request, read and convert the next one
            // (not during an outage: it would only be thrown away).
            let prefetch = self.backoff[i].failures() == 0 && p.rest.is_empty();
            let (outcome, next) = tokio::select! {
                _ = self.token.cancelled() => return Ok(true),
                r = async {
                    tokio::join!(self.exporter.export(&p.request), async {
                        if prefetch {
                            self.read(signal, p.last_id).await
                        } else {
                            Ok(None)
                        }
                    })
                } => r,
            };
            let next = next.unwrap_or_else(|e| {
                tracing::warn!("forward: reading ahead failed: {e}");
                None
            });
            match outcome {
                Outcome::Accepted { rejected, message } => {
                    if self.backoff[i].failures() > 0 {
                        tracing::info!(
                            signal = signal.as_str(),
                            failures = self.backoff[i].failures(),
                            "forward: upstream reachable again"
                        );
                    }
                    self.backoff[i].reset();
                    let rejected = rejected.min(p.items);
                    if rejected > 0 {
                        tracing::warn!(
                            signal = signal.as_str(),
                            rejected,
                            "forward: upstream rejected part of a request: {message}"
                        );
                        self.stats.dropped(signal, DropReason::Refused, rejected);
                    }
                    let sent = p.items - rejected;
                    self.stats.sent(signal, sent);
                    self.regrow(i);
                    progressed = true;
                    if self.next_piece(i, sent, rejected) {
                        continue;
                    }
                    let (sent, dropped) = self.answered(i);
                    self.ack(i, signal, sent, dropped).await?;
                    // The read-ahead starts after the rows just acknowledged: they are next.
                    self.pending[i] = next;
                }
                Outcome::Retry {
                    cut_off: true,
                    error,
                    ..
                } if p.items > 1 && p.attempts >= CUT_OFF_ATTEMPTS => {
                    let max = (p.items / 2).max(1) as usize;
                    tracing::warn!(
                        signal = signal.as_str(),
                        items = p.items,
                        next_max_items = max,
                        "forward: the upstream keeps cutting this request off; sending smaller ones: {error}"
                    );
                    self.stats.retry(&error, now_unix_s());
                    self.shrink(i, max);
                }
                Outcome::Retry { hint, error, .. } => {
                    if let Some(p) = self.pending[i].as_mut() {
                        p.attempts += 1;
                    }
                    let delay = self.backoff[i].next_delay(hint);
                    self.stats.retry(&error, now_unix_s());
                    if self.backoff[i].failures() == 1 {
                        tracing::warn!(
                            signal = signal.as_str(),
                            retry_in_ms = delay.as_millis() as u64,
                            "forward: upstream unavailable, keeping the backlog: {error}"
                        );
                    } else {
                        tracing::debug!(
                            signal = signal.as_str(),
                            retry_in_ms = delay.as_millis() as u64,
                            failures = self.backoff[i].failures(),
                            "forward: still unavailable: {error}"
                        );
                    }
                    self.retry_at[i] = Some(Instant::now() + delay);
                }
                Outcome::Refused {
                    too_large: true,
                    error,
                } if p.items > 1 => {
                    // The same items in smaller requests; the cursor stays, nothing is dropped.
                    let max = (p.items / 2).max(1) as usize;
                    tracing::warn!(
                        signal = signal.as_str(),
                        items = p.items,
                        next_max_items = max,
                        "forward: upstream refused a request as too large; sending smaller ones: {error}"
                    );
                    self.shrink(i, max);
                }
                Outcome::Refused { error, .. } => {
                    tracing::error!(
                        signal = signal.as_str(),
                        items = p.items,
                        "forward: upstream refused a request for good; dropping it: {error}"
                    );
                    self.stats.error(&error, now_unix_s());
                    let items = p.items;
                    self.stats.dropped(signal, DropReason::Refused, items);
                    progressed = true;
                    if self.next_piece(i, 0, items) {
                        continue;
                    }
                    let (sent, dropped) = self.answered(i);
                    self.ack(i, signal, sent, dropped).await?;
                }
            }
        }
        Ok(progressed)
    }

    /// The piece being sent was answered (`sent` items acknowledged, `dropped` refused):
    /// moves to the next piece and answers true, or answers false when it was the last.
    fn next_piece(&mut self, i: usize, sent: u64, dropped: u64) -> bool {
        let Some(p) = self.pending[i].as_mut() else {
            return false;
        };
        p.done_sent += sent;
        p.done_dropped += dropped;
        match p.rest.pop_front() {
            Some((request, items)) => {
                p.request = request;
                p.items = items;
                p.attempts = 0;
                true
            }
            None => false,
        }
    }

    /// Items of the pending rows acknowledged and dropped, over all their pieces.
    fn answered(&self, i: usize) -> (u64, u64) {
        self.pending[i]
            .as_ref()
            .map_or((0, 0), |p| (p.done_sent, p.done_dropped))
    }

    /// The upstream wants smaller requests: from now on at most `max` items each, and the
    /// piece being sent is cut again (the pieces already answered are not sent again).
    fn shrink(&mut self, i: usize, max: usize) {
        self.max_items[i] = max;
        self.acked_since_shrink[i] = 0;
        let Some(p) = self.pending[i].as_mut() else {
            return;
        };
        let current = std::mem::replace(&mut p.request, Request::Traces(Default::default()));
        let mut again = pieces::cut(current, max);
        while let Some(piece) = again.pop_back() {
            p.rest.push_front(piece);
        }
        if let Some((request, items)) = p.rest.pop_front() {
            p.request = request;
            p.items = items;
        }
        p.attempts = 0;
    }

    /// After a success: a batch size halved by a too-large refusal doubles back (up to
    /// `batch_max_spans`) every [`REGROW_AFTER`] acknowledged requests.
    fn regrow(&mut self, i: usize) {
        if self.max_items[i] >= self.config.batch_max_spans {
            return;
        }
        self.acked_since_shrink[i] += 1;
        if self.acked_since_shrink[i] >= REGROW_AFTER {
            self.acked_since_shrink[i] = 0;
            self.max_items[i] = (self.max_items[i] * 2).min(self.config.batch_max_spans);
        }
    }

    /// Moves the cursor past the pending request of `signal`.
    async fn ack(
        &mut self,
        i: usize,
        signal: Signal,
        sent: u64,
        dropped: u64,
    ) -> Result<(), ForwardError> {
        let Some(p) = self.pending[i].take() else {
            return Ok(());
        };
        let delta = ForwardCursor {
            last_id: p.last_id,
            sent,
            dropped: dropped + p.undecodable,
            lost_rows: p.missing_rows,
        };
        self.advance(signal, delta).await?;
        if p.missing_rows > 0 {
            self.note_lost(i, signal, p.missing_rows);
        }
        if p.undecodable > 0 {
            tracing::error!(
                signal = signal.as_str(),
                items = p.undecodable,
                "forward: undecodable stored items skipped"
            );
            self.stats
                .dropped(signal, DropReason::Undecodable, p.undecodable);
        }
        Ok(())
    }

    /// Reads the next request of `signal` after its cursor and converts it on the blocking
    /// pool.
    async fn read(&self, signal: Signal, after: i64) -> Result<Option<Pending>, ForwardError> {
        let max = self.max_items[signal.index()];
        let s = &self.storage;
        let split = match signal {
            Signal::Traces => s
                .forward_read_traces(after, max)
                .await?
                .map(|c| split(c, |d| Request::Traces(convert::traces(d)))),
            Signal::Logs => s
                .forward_read_logs(after, max)
                .await?
                .map(|c| split(c, |d| Request::Logs(convert::logs(d)))),
            Signal::Metrics => s
                .forward_read_metrics(after, max)
                .await?
                .map(|c| split(c, |d| Request::Metrics(convert::metrics(d)))),
        };
        let Some((meta, make)) = split else {
            return Ok(None);
        };
        let Chunk {
            last_id,
            items,
            missing_rows,
            undecodable,
            ..
        } = meta;
        // One stored row is one export as accepted, which may hold more than `max` items.
        let mut rest = tokio::task::spawn_blocking(move || pieces::cut(make(), max))
            .await
            .map_err(|e| ForwardError::Storage(StorageError::Task(e.to_string())))?;
        let (request, first) = rest
            .pop_front()
            .unwrap_or((Request::Traces(Default::default()), 0));
        // Items the conversion did not count into a piece (none today) are sent with the
        // first piece's answer, as before.
        let counted: u64 = first + rest.iter().map(|(_, n)| n).sum::<u64>();
        Ok(Some(Pending {
            request,
            items: first + items.saturating_sub(counted),
            rest,
            done_sent: 0,
            done_dropped: 0,
            last_id,
            missing_rows,
            undecodable,
            attempts: 0,
        }))
    }

    /// Counts rows deleted by retention before they were forwarded, and logs them (WARN)
    /// at most every [`LOST_WARN_EVERY`] per signal, with the count since the last line.
    fn note_lost(&mut self, i: usize, signal: Signal, rows: u64) {
        self.stats.lost_rows(signal, rows);
        let (unwarned, last) = &mut self.lost_unwarned[i];
        *unwarned += rows;
        let now = Instant::now();
        if last.is_none_or(|t| now.duration_since(t) >= LOST_WARN_EVERY) {
            tracing::warn!(
                signal = signal.as_str(),
                rows = *unwarned,
                "forward: rows were deleted by retention before they were forwarded (logged at most once a minute; /metrics counts each)"
            );
            *unwarned = 0;
            *last = Some(now);
        }
    }

    /// Measures the backlog (gauges), restarts a cursor whose table was emptied, and
    /// enforces `max_queue_bytes` by skipping the oldest rows of the largest backlogs.
    async fn check_backlog(&mut self) -> Result<(), ForwardError> {
        let mut backlogs = Vec::with_capacity(3);
        for (i, signal) in Signal::ALL.into_iter().enumerate() {
            let after = self.cursors[i].last_id;
            let b = self.storage.forward_backlog(signal, after).await?;
            if b.rows == 0 {
                let max = self.storage.forward_max_id(signal).await?;
                if max < after {
                    // Emptied table: row ids restarted below the cursor.
                    tracing::info!(
                        signal = signal.as_str(),
                        "forward: table emptied; cursor restarts at 0"
                    );
                    self.advance(signal, ForwardCursor::default()).await?;
                    self.pending[i] = None;
                } else if max > after
                    && self.pending[i].is_none()
                    // read again after `max`: ids only grow, so a row committed after the
                    // first look has an id above `max`, and none up to it can appear
                    && self.storage.forward_backlog(signal, after).await?.rows == 0
                {
                    // Every row after the cursor, up to the largest id used, was deleted
                    // by retention before it was read: counted now, not when the next row
                    // arrives.
                    let delta = ForwardCursor {
                        last_id: max,
                        lost_rows: (max - after) as u64,
                        ..ForwardCursor::default()
                    };
                    self.advance(signal, delta).await?;
                    self.note_lost(i, signal, delta.lost_rows);
                }
            }
            self.stats.backlog(signal, b.rows, b.items, b.bytes);
            backlogs.push((i, signal, b));
        }
        let total: u64 = backlogs.iter().map(|(_, _, b)| b.bytes).sum();
        if total <= self.config.max_queue_bytes {
            return Ok(());
        }
        let mut excess = total - self.config.max_queue_bytes;
        backlogs.sort_by_key(|b| std::cmp::Reverse(b.2.bytes));
        for (i, signal, b) in backlogs {
            if excess == 0 {
                break;
            }
            let after = self.cursors[i].last_id;
            let shed = excess.min(b.bytes);
            let Some(trim) = self.storage.forward_trim(signal, after, shed).await? else {
                continue;
            };
            let missing = ((trim.last_id - after) as u64).saturating_sub(trim.rows);
            let delta = ForwardCursor {
                last_id: trim.last_id,
                sent: 0,
                dropped: trim.items,
                lost_rows: missing,
            };
            self.advance(signal, delta).await?;
            self.pending[i] = None;
            self.stats
                .dropped(signal, DropReason::QueueFull, trim.items);
            if missing > 0 {
                self.stats.lost_rows(signal, missing);
            }
            self.stats.backlog(
                signal,
                b.rows.saturating_sub(trim.rows),
                b.items.saturating_sub(trim.items),
                b.bytes.saturating_sub(trim.bytes),
            );
            tracing::warn!(
                signal = signal.as_str(),
                dropped_items = trim.items,
                dropped_bytes = trim.bytes,
                max_queue_bytes = self.config.max_queue_bytes,
                "forward: backlog over max_queue_bytes; the oldest un-forwarded items were dropped"
            );
            excess = excess.saturating_sub(trim.bytes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stallwatch_storage::model::{AnyValue, LogBatch, LogRecord, ResourceLogs, ScopeLogs};
    use stallwatch_storage::StorageConfig;

    /// Every row after the cursor deleted by retention before it was read, and nothing
    /// newer: the rows are counted lost as soon as the backlog is measured, not when the
    /// next row arrives; a table with rows after the cursor is left to the reads.
    #[tokio::test]
    async fn rows_deleted_before_they_were_read_are_counted_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = StorageConfig::new(dir.path().join("stallwatch.db"));
        cfg.retention = Duration::from_millis(300);
        cfg.retention_interval = Duration::from_secs(3600);
        let storage = Storage::open(cfg).unwrap();
        let logs = |n: u64| {
            std::sync::Arc::new(LogBatch {
                resource_logs: vec![ResourceLogs {
                    scope_logs: vec![ScopeLogs {
                        log_records: (0..n)
                            .map(|i| LogRecord {
                                time_unix_nano: i + 1,
                                body: AnyValue::String(format!("record {i}")),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            })
        };
        storage.write_logs(logs(5)).await.unwrap();
        let raw = RawForwardConfig {
            endpoint: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        };
        let config = ForwardConfig::try_from(raw).unwrap();
        let exporter = Exporter::new(&config).unwrap();
        let mut worker = Worker::new(config, storage.clone(), exporter);
        worker.cursors = storage.forward_cursors().await.unwrap();
        let stats = worker.stats.clone();
        // rows after the cursor: nothing is counted, the reads will take them
        worker.check_backlog().await.unwrap();
        let li = Signal::Logs.index();
        assert_eq!(worker.cursors[li].last_id, 0);
        assert_eq!(stats.lost_rows_of(Signal::Logs), 0);
        // every one deleted by age before it was read
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(storage.run_retention().await.unwrap().logs_deleted, 5);
        worker.check_backlog().await.unwrap();
        assert_eq!(worker.cursors[li].last_id, 5);
        assert_eq!(worker.cursors[li].lost_rows, 5);
        assert_eq!(stats.lost_rows_of(Signal::Logs), 5);
        let stored = storage.forward_cursors().await.unwrap();
        assert_eq!((stored[li].last_id, stored[li].lost_rows), (5, 5));
        // measured again: nothing more
        worker.check_backlog().await.unwrap();
        assert_eq!(stats.lost_rows_of(Signal::Logs), 5);
        storage.shutdown().await;
    }
}
