//! The telemetry writer: one connection behind a lock, used by its own `std::thread` fed by
//! a bounded queue, committing groups of requests in one `BEGIN IMMEDIATE` transaction and
//! answering each request only after COMMIT returned (docs/design.md, Durability and limits).
//!
//! **The leader commits.** An export that finds the queue empty and the writer idle (its
//! lock free, nothing after the last commit left to do, no retention, checkpoint wait or
//! degraded state pending) commits itself, on its own thread ([`TelemetryWriter::submit`]):
//! with one export in flight the thread hand-offs to the writer and back, each a wake-up
//! (0.1–0.2 ms to be scheduled on a loaded 2-core VM, `perf sched latency`), are gone. Any
//! other export is queued to the writer thread, which groups what is queued as before. A
//! leader opens its transaction without waiting for SQLite's lock (queued when it is held),
//! defers what follows a commit and may take long (merging the trace index, retention) to
//! the thread, wakes the thread whenever its commit left work only the thread does, and
//! never serves the queue.
//!
//! Deduplication of (trace id, span id) happens here: a trace's stored batches come from
//! `trace_index` plus the in-memory map of batches not merged yet (`l0`); a new trace
//! costs one index read and no write; a known trace's copies are folded (an ended copy
//! beats an open one, the first ended copy wins, a second open copy is dropped). Copies that lose are sliced out of the batch before
//! it is stored; a request made only of known spans stores nothing.
//!
//! Log records are deduplicated too (issue 12 #9): an exporter that retries a log export
//! after a timeout or a 503 sends the same records again. A record whose whole stored form
//! (resource, scope, time, observed time, severity, body, attributes, trace and span id:
//! the postcard payload) equals one stored recently is stored once. [`RecentLogs`] keeps a
//! hash → row id of the last `RECENT_LOGS` (commit.rs) records; a hash hit is confirmed by comparing
//! the stored payload, so a collision never drops a record.

use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{oneshot, watch};

use super::bloom::{IdBuild, TraceBloom};
use super::checkpoint::{self, Checkpointer};
use super::encode::{BatchIndex, LogRow, PointRow, PreparedTraces};
use super::log_body::{generation_bytes, BodyIndexWriter};
use super::stats::{RefusedReason, TelemetryStats};
use super::traceidx::L0Map;
use super::RetentionReport;
use crate::config::{telemetry_budget_bytes, wal_budget_bytes, StorageConfig};
use crate::db::open_connection;
use crate::error::{StorageError, Transient, WriteError};
use ids::{first_free_id, IdTable};

mod commit;
pub(in crate::telemetry) use commit::{WAL_RETRY, WAL_WAIT};
mod health;
pub(crate) mod ids;
mod traces;

use commit::RecentLogs;
use health::file_identity;

/// Most requests committed in one transaction.
const MAX_GROUP_REQUESTS: usize = 256;
/// Span ids [`Writer::known_spans`] holds at most (~25 bytes each: ~1.6 MB); a trace with
/// more is read back from its batches at each export, as before.
pub(super) const KNOWN_SPANS_MAX: usize = 65_536;
/// Most payload bytes committed in one transaction: 32 MiB (and at most a quarter of
/// telemetry's budget).
const MAX_GROUP_BYTES: usize = 32 * 1024 * 1024;
/// Size retention starts once telemetry uses more than this share of its budget (the high
/// watermark, 85%) ...
const SIZE_HIGH_PERCENT: u64 = 85;
/// ... and deletes the oldest telemetry down to this share (the low watermark, 75%), so
/// the pages it frees are reused by the next commits and the file stays put.
const SIZE_LOW_PERCENT: u64 = 75;
/// Writer connection page cache: 8 MiB. At 32 MiB a large export's freshly written pages
/// stayed cached, one more copy of its payload in memory (issue 17 #14); the writer mostly
/// appends, so the pages it revisits (indexes, postings) are few. Its effect on the
/// sustained ingest rate was not re-measured with `benches/ingest.rs`.
const WRITER_CACHE_KIB: i64 = 8 * 1024;
/// While degraded and idle, how often the writer probes whether storage is back.
const DEGRADED_PROBE_EVERY: Duration = Duration::from_secs(1);
/// Largest request (its payload bytes, [`Prepared::bytes`]) an export commits itself as
/// leader: 1 MiB. A larger one is committed by the writer thread, so an async worker thread
/// is never held for a long commit.
const LEAD_MAX_BYTES: usize = 1024 * 1024;

/// A transient storage condition the writer is in: the source of `/readyz`'s `degraded`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Degraded {
    /// Which condition.
    pub kind: Transient,
    /// What SQLite (or the file check) said.
    pub detail: String,
}

/// A request prepared on the caller's side.
#[derive(Debug)]
pub(crate) enum Prepared {
    /// A trace export (boxed: the queue's messages stay small).
    Traces(Box<PreparedTraces>),
    /// A trace export encoded in chunks: one `span_batches` row each, all in the same
    /// transaction (the group's).
    TraceChunks(Vec<PreparedTraces>),
    /// A log export.
    Logs(Vec<LogRow>),
    /// A metrics export.
    Metrics(Vec<PointRow>),
}

impl Prepared {
    fn bytes(&self) -> usize {
        match self {
            Prepared::Traces(t) => t.bytes(),
            Prepared::TraceChunks(c) => c.iter().map(PreparedTraces::bytes).sum(),
            Prepared::Logs(l) => l.iter().map(|r| r.payload.len() + 64).sum(),
            Prepared::Metrics(m) => m.iter().map(|r| r.payload.len() + 64).sum(),
        }
    }
}

pub(crate) struct WriteRequest {
    prepared: Prepared,
    reply: oneshot::Sender<Result<(), WriteError>>,
}

pub(crate) enum Msg {
    Write(WriteRequest),
    Retention(oneshot::Sender<Result<RetentionReport, StorageError>>),
    Shutdown,
}

/// The writer, shared by its thread and the exporters that commit as leaders: `None` once
/// the thread stopped (its connection is closed then).
struct Slot {
    writer: Mutex<Option<Writer>>,
    /// The handle was dropped without a shutdown: the thread stops at its next turn.
    gone: AtomicBool,
}

impl Slot {
    /// The writer's lock; a poisoned lock is taken as it is (every panic under it is
    /// caught and recovered from first, see [`Writer::recover_from_panic`]).
    fn lock(&self) -> MutexGuard<'_, Option<Writer>> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The writer thread's handle, held by [`crate::Storage`].
pub(crate) struct TelemetryWriter {
    tx: SyncSender<Msg>,
    capacity: usize,
    closed: AtomicBool,
    slot: Arc<Slot>,
    /// The writer thread, woken by every message queued to it and by a leader that left
    /// work after its commit.
    waker: Thread,
    thread: Mutex<Option<JoinHandle<()>>>,
    checkpointer: Mutex<Checkpointer>,
    pub(crate) stats: Arc<TelemetryStats>,
    pub(crate) full: watch::Receiver<Option<String>>,
    pub(crate) degraded: watch::Receiver<Option<Degraded>>,
}

impl TelemetryWriter {
    /// Opens the writer connection and starts the thread.
    ///
    /// Errors: [`StorageError::Open`] / [`StorageError::Sqlite`] when the connection cannot
    /// be configured.
    pub(crate) fn start(config: &StorageConfig) -> Result<Self, StorageError> {
        let conn = open_connection(
            config,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.pragma_update(None, "synchronous", config.telemetry_synchronous.pragma())?;
        conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
        // After the WAL is rewound its file is truncated back to its share of the cap.
        conn.pragma_update(
            None,
            "journal_size_limit",
            wal_budget_bytes(config.max_db_bytes) as i64,
        )?;
        let page_size: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
        let page_size = page_size.max(512) as u64;
        let budget_bytes = telemetry_budget_bytes(config.max_db_bytes);
        conn.pragma_update(
            None,
            "max_page_count",
            (budget_bytes / page_size).max(1) as i64,
        )?;
        let next_batch_id = first_free_id(&conn, IdTable::SpanBatches)?;
        let next_log_id = first_free_id(&conn, IdTable::Logs)?;
        let next_point_id = first_free_id(&conn, IdTable::MetricPoints)?;
        let body_index = BodyIndexWriter::load(&conn, generation_bytes(budget_bytes))?;
        let capacity = config.queue_capacity.max(1);
        let (tx, rx) = mpsc::sync_channel(capacity);
        let stats = Arc::new(TelemetryStats::default());
        let (full_tx, full_rx) = watch::channel(None);
        let (degraded_tx, degraded_rx) = watch::channel(None);
        let identity = file_identity(&config.path);
        let checkpointer = Checkpointer::start(config)?;
        let now = Instant::now();
        let mut writer = Writer {
            ckpt: checkpointer.shared.clone(),
            conn,
            rx,
            deferred: VecDeque::new(),
            stats: stats.clone(),
            full_tx,
            degraded_tx,
            db_path: config.path.clone(),
            identity,
            budget_bytes,
            max_db_bytes: config.max_db_bytes,
            wal_budget: wal_budget_bytes(config.max_db_bytes),
            busy_timeout: config.busy_timeout,
            wal_path: {
                let mut p = config.path.clone().into_os_string();
                p.push("-wal");
                p.into()
            },
            page_size,
            used_bytes: 0,
            next_batch_id,
            next_log_id,
            next_point_id,
            body_index,
            term_cache: Default::default(),
            recent_logs: RecentLogs::default(),
            pending_terms: Vec::new(),
            retention: config.retention,
            l0: L0Map::default(),
            l0_batches: 0,
            merged_upto: 0,
            idx_cache: HashMap::new(),
            known_spans: Default::default(),
            known_spans_len: 0,
            bloom: TraceBloom::with_capacity(0),
            l0_new: HashSet::default(),
            retention_interval: config.retention_interval,
            next_retention: now + config.retention_interval,
            next_probe: now,
            retaining: false,
            wal_wait_again_at: now,
            stopping: false,
            housekeeping: false,
            leading: false,
            begun: false,
            retain_room: None,
        };
        let orphans = traces::drop_orphan_runs(&writer.conn)?;
        if orphans > 0 {
            tracing::info!(
                rows = orphans,
                "deleted the trace index rows of a compaction an earlier version left unfinished"
            );
        }
        writer.refresh_used()?;
        writer.reload_l0()?;
        writer.rebuild_bloom(0)?;
        let slot = Arc::new(Slot {
            writer: Mutex::new(Some(writer)),
            gone: AtomicBool::new(false),
        });
        let for_thread = slot.clone();
        let thread = std::thread::Builder::new()
            .name("stallwatch-telemetry-writer".into())
            .spawn(move || Writer::run(&for_thread))
            .map_err(|e| StorageError::Task(format!("cannot start the writer thread: {e}")))?;
        Ok(Self {
            tx,
            capacity,
            closed: AtomicBool::new(false),
            slot,
            waker: thread.thread().clone(),
            thread: Mutex::new(Some(thread)),
            checkpointer: Mutex::new(checkpointer),
            stats,
            full: full_rx,
            degraded: degraded_rx,
        })
    }

    /// Refuses at once when shut down or when the queue is already full (so callers skip
    /// encoding a request that cannot be queued).
    pub(crate) fn precheck(&self) -> Result<(), WriteError> {
        if self.closed.load(Ordering::Acquire) {
            self.stats.count_refused(RefusedReason::Closed, 1);
            return Err(WriteError::Closed);
        }
        if self.stats.queue_depth() >= self.capacity {
            self.stats.count_refused(RefusedReason::QueueFull, 1);
            return Err(WriteError::QueueFull {
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Commits a prepared request as leader when the writer is idle ([`Self::lead`]), or
    /// else queues it with `try_send`; either way waits for the answer sent after COMMIT.
    pub(crate) async fn submit(&self, prepared: Prepared) -> Result<(), WriteError> {
        if self.closed.load(Ordering::Acquire) {
            self.stats.count_refused(RefusedReason::Closed, 1);
            return Err(WriteError::Closed);
        }
        let (reply, answer) = oneshot::channel();
        let req = match self.lead(WriteRequest { prepared, reply }) {
            None => return answer.await.unwrap_or(Err(WriteError::Closed)),
            Some(req) => req,
        };
        self.stats.queue_depth.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(Msg::Write(req)) {
            Ok(()) => self.waker.unpark(),
            Err(TrySendError::Full(_)) => {
                self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
                self.stats.count_refused(RefusedReason::QueueFull, 1);
                return Err(WriteError::QueueFull {
                    capacity: self.capacity,
                });
            }
            Err(TrySendError::Disconnected(_)) => {
                self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
                self.stats.count_refused(RefusedReason::Closed, 1);
                return Err(WriteError::Closed);
            }
        }
        answer.await.unwrap_or(Err(WriteError::Closed))
    }

    /// Commits `req` on the calling thread when nothing is queued, the writer's lock is
    /// free and the writer may lead ([`Writer::may_lead`]); `req` is answered then, and
    /// `None` returned. Otherwise gives `req` back, untouched, for the queue.
    ///
    /// The leader opens its transaction without waiting for SQLite's lock; when another
    /// connection holds it, `req` is queued instead. A panic while writing is answered as
    /// on the writer thread (500, the transaction rolled back); a panic elsewhere in the
    /// commit drops `req`'s reply (answered [`WriteError::Closed`], retryable) and the
    /// writer recovers.
    fn lead(&self, req: WriteRequest) -> Option<WriteRequest> {
        if self.stats.queue_depth() > 0 {
            return Some(req);
        }
        let mut guard = match self.slot.writer.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Some(req),
        };
        let Some(w) = guard.as_mut() else {
            return Some(req);
        };
        if !w.may_lead(req.prepared.bytes()) || !w.begin_without_waiting() {
            return Some(req);
        }
        let committed = self.stats.commits();
        w.leading = true;
        let led = catch_unwind(AssertUnwindSafe(|| w.commit_group(vec![req])));
        w.leading = false;
        w.begun = false;
        if !w.conn.is_autocommit() {
            // Only if the commit ended before writing (it cannot while `may_lead` held).
            let _ = w.conn.execute_batch("ROLLBACK");
        }
        if let Err(payload) = led {
            let error = panic_error(payload.as_ref());
            if catch_unwind(AssertUnwindSafe(|| w.recover_from_panic(&error))).is_err() {
                // Recovery itself failed (a bug): the writer is closed, so every queued and
                // later export is answered `Closed` (retryable) instead of waiting.
                *guard = None;
                return None;
            }
        }
        if self.stats.commits() > committed {
            self.stats.led_commits.fetch_add(1, Ordering::Relaxed);
        }
        // The thread sleeps until its next retention pass: it is woken for anything the
        // commit left it (work after the commit, a degraded or full state to probe or
        // retain out of, a WAL past its bound, a pass made due).
        let wake = !w.may_lead(0) || w.next_retention <= Instant::now();
        drop(guard);
        if wake {
            self.waker.unpark();
        }
        None
    }

    /// Asks the writer thread for a retention pass and waits for its report.
    pub(crate) async fn retention(&self) -> Result<RetentionReport, StorageError> {
        let (reply, answer) = oneshot::channel();
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || tx.send(Msg::Retention(reply)))
            .await
            .map_err(|e| StorageError::Task(e.to_string()))?
            .map_err(|_| StorageError::Closed)?;
        self.waker.unpark();
        answer.await.unwrap_or(Err(StorageError::Closed))
    }

    /// Stops taking writes (they answer [`WriteError::Closed`]), commits what is queued,
    /// and joins the thread.
    pub(crate) async fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let tx = self.tx.clone();
        let _ = tokio::task::spawn_blocking(move || tx.send(Msg::Shutdown)).await;
        self.waker.unpark();
        let handle = self.thread.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        if let Ok(mut c) = self.checkpointer.lock() {
            c.stop();
        }
    }

    /// Tells the checkpointer that a transaction committed on another connection (a
    /// control record: a few pages, counted as none of the gathering's bytes).
    pub(crate) fn note_commit(&self) {
        if let Ok(c) = self.checkpointer.lock() {
            c.shared.note_commit(0);
        }
    }
}

impl Drop for TelemetryWriter {
    /// Without a shutdown (a test, an early error), the thread stops at its next turn,
    /// dropping what is queued (answered [`WriteError::Closed`]).
    fn drop(&mut self) {
        self.slot.gone.store(true, Ordering::Release);
        self.waker.unpark();
    }
}

/// A panic's payload as the error its requests are answered with: an internal error (a
/// bug), answered 500 like any other failed commit that is not transient.
pub(super) fn panic_error(payload: &(dyn std::any::Any + Send)) -> rusqlite::Error {
    let what = crate::group::panic_message(payload);
    rusqlite::Error::ToSqlConversionFailure(
        format!("internal error in the telemetry writer (a panic: {what})").into(),
    )
}

/// Test-only panics at named points of the writer, keyed by database path so tests
/// running side by side never take each other's.
#[cfg(test)]
pub(crate) mod inject {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static PANICS: Mutex<Vec<(PathBuf, &'static str)>> = Mutex::new(Vec::new());

    /// The next pass through `at` by the writer of a database under `dir` panics.
    pub(crate) fn panic_once(dir: &Path, at: &'static str) {
        PANICS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((dir.to_path_buf(), at));
    }

    /// Panics if a test asked for it at `at` for `db`.
    pub(crate) fn hit(db: &Path, at: &str) {
        let mut p = PANICS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = p.iter().position(|(d, a)| db.starts_with(d) && *a == at) {
            p.remove(i);
            drop(p);
            panic!("injected by a test at {at}");
        }
    }
}

pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) ckpt: Arc<checkpoint::Shared>,
    rx: Receiver<Msg>,
    deferred: VecDeque<Msg>,
    pub(super) stats: Arc<TelemetryStats>,
    full_tx: watch::Sender<Option<String>>,
    degraded_tx: watch::Sender<Option<Degraded>>,
    pub(super) db_path: std::path::PathBuf,
    /// (device, inode) of the database file when opened; `None` if it could not be read.
    identity: Option<(u64, u64)>,
    pub(super) budget_bytes: u64,
    /// `[storage] max_db_bytes`.
    max_db_bytes: u64,
    /// The WAL's share of `max_db_bytes`, bytes ([`wal_budget_bytes`]).
    pub(super) wal_budget: u64,
    /// `[storage] busy_timeout_ms`, as set on the connection.
    pub(super) busy_timeout: Duration,
    /// `<database>-wal`.
    wal_path: std::path::PathBuf,
    pub(super) page_size: u64,
    pub(super) used_bytes: u64,
    pub(super) next_batch_id: i64,
    /// The id the next log record gets (`ids.rs`).
    pub(super) next_log_id: i64,
    /// The id the next metric point gets (`ids.rs`).
    pub(super) next_point_id: i64,
    /// The newest generation of the log body index (`log_body.rs`).
    pub(super) body_index: BodyIndexWriter,
    pub(super) term_cache: foldhash::HashMap<(String, String), i64>,
    pending_terms: Vec<((String, String), i64)>,
    pub(super) retention: Duration,
    pub(super) l0: L0Map,
    pub(super) l0_batches: usize,
    pub(super) merged_upto: i64,
    idx_cache: HashMap<i64, Arc<BatchIndex>>,
    /// Per trace deduplicated lately: every span id stored of it and whether a stored copy
    /// ended (what folding all its batches gives), kept up to date as its later exports
    /// are stored, so a trace continued over many exports is not read back whole each time
    /// (issue 16: exports of 64 spans continuing 8 traces over 512 exports each took
    /// 11.5 ms each, 154 µs with this; `cargo bench -p stallwatch-storage --bench telemetry
    /// -- --continued 24000 --over 512`).
    /// At most [`KNOWN_SPANS_MAX`] span ids in all; emptied by every rollback and every
    /// retention delete.
    known_spans: foldhash::HashMap<[u8; 16], HashMap<[u8; 8], bool>>,
    /// Span ids in `known_spans`.
    known_spans_len: usize,
    /// Every trace id in `trace_index` or `l0` (and stale ones): a miss is a new trace.
    bloom: TraceBloom,
    /// Traces of `l0` that had no `trace_index` row when first stored: deduplication does
    /// not search the runs for them, retention counts them deleted without a read. Cleared
    /// by every merge and rollback.
    pub(super) l0_new: HashSet<[u8; 16], IdBuild>,
    retention_interval: Duration,
    next_retention: Instant,
    /// While degraded, when the idle writer thread probes storage next.
    next_probe: Instant,
    /// True while a size retention step runs (the groups it serves between its chunks do
    /// not start another).
    pub(super) retaining: bool,
    /// Shutdown was asked: a panic while draining ends the thread instead of waiting for
    /// more (the one waiting to join it would wait forever).
    stopping: bool,
    recent_logs: RecentLogs,
    /// Before this instant the writer does not wait for the WAL again (a wait timed out).
    pub(in crate::telemetry) wal_wait_again_at: Instant,
    /// A leader's commit left work for the writer thread ([`Writer::housekeep`]); no export
    /// leads until it is done.
    pub(super) housekeeping: bool,
    /// An export is committing as leader: what may take long is left to the thread.
    pub(super) leading: bool,
    /// A leader opened the transaction ([`Writer::begin_without_waiting`]).
    pub(super) begun: bool,
    /// Room a leader's commit asked retention for, left to the thread with
    /// [`Writer::housekeeping`] (0: down to the low watermark).
    pub(super) retain_room: Option<u64>,
}

/// What the writer thread does after one turn.
enum Turn {
    /// Takes the next turn at once (the lock is released in between, so a leader may
    /// commit).
    Again,
    /// Nothing to do: sleeps until woken or for this long (the next retention pass or
    /// degraded probe).
    Wait(Duration),
    /// Stops (shutdown, or the handle was dropped).
    Stop,
}

/// Groups served between two transactions of a retention step, at most.
const SERVE_BETWEEN_STEPS: usize = 4;

impl Writer {
    /// The writer thread: turns under the writer's lock, released between turns and while
    /// sleeping, until a shutdown or the handle's drop. The writer is dropped (its
    /// connection closed) when the thread stops.
    fn run(slot: &Slot) {
        loop {
            let mut guard = slot.lock();
            let Some(w) = guard.as_mut() else { break };
            let turn = if slot.gone.load(Ordering::Acquire) {
                Turn::Stop
            } else {
                match catch_unwind(AssertUnwindSafe(|| w.step())) {
                    Ok(turn) => turn,
                    Err(payload) => {
                        let error = panic_error(payload.as_ref());
                        let recovered =
                            catch_unwind(AssertUnwindSafe(|| w.recover_from_panic(&error)));
                        // A recovery that panicked too (a bug) stops the thread: the writer
                        // is closed, so queued and later exports are answered `Closed`
                        // instead of waiting for a thread that is gone.
                        if w.stopping || recovered.is_err() {
                            Turn::Stop
                        } else {
                            Turn::Again
                        }
                    }
                }
            };
            match turn {
                Turn::Again => {}
                Turn::Wait(d) => {
                    drop(guard);
                    std::thread::park_timeout(d);
                }
                Turn::Stop => {
                    *guard = None;
                    break;
                }
            }
        }
        tracing::debug!("telemetry writer stopped");
    }

    /// One turn: what a leader left after its commit, else the next message, else a due
    /// retention pass or degraded probe, else how long to sleep.
    fn step(&mut self) -> Turn {
        if self.housekeeping {
            self.housekeeping = false;
            self.housekeep();
            return Turn::Again;
        }
        let msg = match self.deferred.pop_front() {
            Some(m) => m,
            None => match self.rx.try_recv() {
                Ok(m) => m,
                Err(TryRecvError::Disconnected) => return Turn::Stop,
                Err(TryRecvError::Empty) => return self.idle(),
            },
        };
        match msg {
            Msg::Write(first) => self.group(first),
            Msg::Retention(reply) => {
                let _ = reply.send(self.retention_pass());
            }
            Msg::Shutdown => {
                self.stopping = true;
                self.drain_for_shutdown();
                return Turn::Stop;
            }
        }
        Turn::Again
    }

    /// Nothing queued: runs a due retention pass or degraded probe, or says how long to
    /// sleep until one is due.
    fn idle(&mut self) -> Turn {
        let now = Instant::now();
        // A due pass runs while degraded too (a full episode ends through a commit or
        // through retention), and always moves the next one forward: a degraded writer
        // whose pass had come due used to wait 0 ms and probe in a loop, one core at 100%
        // (~125,000 `stat` calls a second) until the episode ended.
        if now >= self.next_retention {
            self.next_retention = now + self.retention_interval;
            if let Err(e) = self.retention_pass() {
                tracing::warn!(error = %e, "telemetry retention pass failed");
            }
            return Turn::Again;
        }
        let mut wait = self.next_retention - now;
        if self.degraded_tx.borrow().is_some() {
            if now >= self.next_probe {
                self.next_probe = now + DEGRADED_PROBE_EVERY;
                self.probe();
                return Turn::Again;
            }
            wait = wait.min(self.next_probe - now);
        }
        Turn::Wait(wait)
    }

    /// Opens a leader's transaction (`BEGIN IMMEDIATE`) without waiting for SQLite's write
    /// lock: false when another connection holds it (a control commit, an outside tool),
    /// or on any error, and the export is queued to the writer thread, which waits up to
    /// `busy_timeout` off the async threads. The transaction is then the one
    /// [`Writer::write_all`] writes into.
    fn begin_without_waiting(&mut self) -> bool {
        if self.conn.busy_timeout(Duration::ZERO).is_err() {
            return false;
        }
        let begun = self.conn.execute_batch("BEGIN IMMEDIATE").is_ok();
        if self.conn.busy_timeout(self.busy_timeout).is_err() {
            if begun {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
            return false;
        }
        self.begun = begun;
        begun
    }

    /// Whether an export of `bytes` may commit itself now ([`TelemetryWriter::lead`]):
    /// only when the commit is the plain case, with nothing the writer thread must do
    /// first (a message it deferred, work left after the last leader's commit, a WAL past
    /// its bound to checkpoint, retention to make room, a degraded or full state to
    /// probe) and the request is small ([`LEAD_MAX_BYTES`]).
    fn may_lead(&self, bytes: usize) -> bool {
        !self.stopping
            && !self.housekeeping
            && !self.retaining
            && self.deferred.is_empty()
            && bytes <= LEAD_MAX_BYTES
            && self.used_bytes.saturating_add(bytes as u64) <= self.size_high()
            && !self.ckpt.writer_should_checkpoint.load(Ordering::Acquire)
            && self.degraded_tx.borrow().is_none()
            && self.full_tx.borrow().is_none()
    }

    /// After a panic outside a commit (a merge, a retention pass: a bug), the thread goes
    /// on in the state a failed commit leaves: any open transaction rolled back, the batch
    /// id and the index maps re-read from the database, the term cache emptied. The
    /// requests being handled were dropped with their replies, so their exporters get a
    /// retryable answer ([`WriteError::Closed`], 503) and send again; nothing they were
    /// told was stored is lost, since an answer is sent only after COMMIT.
    fn recover_from_panic(&mut self, error: &rusqlite::Error) {
        tracing::error!(%error, "the telemetry writer recovered from a panic (a bug); ingest goes on");
        self.stats.commit_failures.fetch_add(1, Ordering::Relaxed);
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        self.pending_terms.clear();
        self.term_cache.clear();
        self.retaining = false;
        let reread = self
            .reread_ids()
            .and_then(|()| self.reload_l0())
            .and_then(|()| self.refresh_used().map(drop));
        if let Err(e) = reread {
            tracing::error!(error = %e, "cannot re-read the writer's state after a panic");
        }
    }

    /// Re-reads what the ids and the body index generation depend on after a transaction
    /// was rolled back: the counters never go down (`ids.rs`), the generation is the
    /// newest one stored.
    pub(super) fn reread_ids(&mut self) -> Result<(), rusqlite::Error> {
        self.next_batch_id = self
            .next_batch_id
            .max(first_free_id(&self.conn, IdTable::SpanBatches)?);
        self.next_log_id = self
            .next_log_id
            .max(first_free_id(&self.conn, IdTable::Logs)?);
        self.next_point_id = self
            .next_point_id
            .max(first_free_id(&self.conn, IdTable::MetricPoints)?);
        self.body_index = BodyIndexWriter::load(&self.conn, generation_bytes(self.budget_bytes))?;
        Ok(())
    }

    fn drain_for_shutdown(&mut self) {
        let mut pending: Vec<Msg> = self.deferred.drain(..).collect();
        while let Ok(m) = self.rx.try_recv() {
            pending.push(m);
        }
        for m in pending {
            match m {
                Msg::Write(r) => {
                    self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
                    self.commit_group(vec![r]);
                }
                Msg::Retention(reply) => {
                    let _ = reply.send(Err(StorageError::Closed));
                }
                Msg::Shutdown => {}
            }
        }
    }

    /// Takes `first` plus what else is queued (bounded) and commits them together.
    fn group(&mut self, first: WriteRequest) {
        self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
        let mut bytes = first.prepared.bytes();
        let mut reqs = vec![first];
        // A group never takes more than a quarter of telemetry's budget, so at a small cap
        // size retention makes room for it by deleting a few of the oldest batches.
        let max_bytes = MAX_GROUP_BYTES.min((self.budget_bytes / 4) as usize);
        while reqs.len() < MAX_GROUP_REQUESTS && bytes < max_bytes {
            match self.rx.try_recv() {
                Ok(Msg::Write(r)) => {
                    self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
                    bytes += r.prepared.bytes();
                    reqs.push(r);
                }
                Ok(other) => {
                    self.deferred.push_back(other);
                    break;
                }
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => break,
            }
        }
        self.commit_group(reqs);
    }

    /// Serves queued writes (used between retention chunks so ingest keeps flowing): at
    /// most [`SERVE_BETWEEN_STEPS`] groups, then the step goes on. Serving until the queue
    /// was empty never ended while exporters that do not back off resent at once what was
    /// refused as full: the step that would have made room never ran again (a log flood
    /// from two such writers at a 32 MiB cap: 140 of 170 exports refused, the database at
    /// its page limit, `a_log_flood_at_the_cap_stays_within_the_cap`).
    pub(super) fn serve_pending(&mut self) {
        if self.leading {
            // A leader's commit never serves the queue: the thread does, right after.
            return;
        }
        for _ in 0..SERVE_BETWEEN_STEPS {
            match self.rx.try_recv() {
                Ok(Msg::Write(r)) => self.group(r),
                Ok(other) => self.deferred.push_back(other),
                Err(_) => break,
            }
        }
    }

    /// Runs the periodic retention pass at the next idle moment (after a commit failed for
    /// want of room: the disk is full, or control records used their reserve).
    fn schedule_retention(&mut self) {
        self.next_retention = Instant::now();
    }

    /// Re-reads the bytes in use (pages minus free pages).
    pub(super) fn refresh_used(&mut self) -> Result<u64, rusqlite::Error> {
        // Cached statements: this runs after every group commit (issue 16: preparing the
        // two pragmas each time was ~0.5% of the CPU under load).
        let pages: i64 = self
            .conn
            .prepare_cached("PRAGMA page_count")?
            .query_row([], |r| r.get(0))?;
        let free: i64 = self
            .conn
            .prepare_cached("PRAGMA freelist_count")?
            .query_row([], |r| r.get(0))?;
        self.used_bytes = (pages - free).max(0) as u64 * self.page_size;
        self.stats
            .db_used_bytes
            .store(self.used_bytes, Ordering::Relaxed);
        Ok(self.used_bytes)
    }

    /// Size of the `-wal` file (0 when it cannot be read): past [`wal_budget_bytes`] the
    /// writer checkpoints the tail itself before its next group.
    pub(super) fn wal_file_bytes(&self) -> u64 {
        std::fs::metadata(&self.wal_path).map_or(0, |m| m.len())
    }

    /// The high watermark: bytes in use above which size retention starts.
    pub(super) fn size_high(&self) -> u64 {
        self.budget_bytes / 100 * SIZE_HIGH_PERCENT
    }

    /// The low watermark: bytes in use size retention deletes down to.
    pub(super) fn size_low(&self) -> u64 {
        self.budget_bytes / 100 * SIZE_LOW_PERCENT
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::inject;
    use crate::model::{ResourceSpans, ScopeSpans, Span, SpanId, TraceBatch, TraceId};
    use crate::{Storage, StorageConfig, WriteError};

    fn batch(n: u8) -> Arc<TraceBatch> {
        Arc::new(TraceBatch {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        trace_id: TraceId([n; 16]),
                        span_id: SpanId([n; 8]),
                        name: format!("span {n}"),
                        start_time_unix_nano: 1_000,
                        end_time_unix_nano: 2_000,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
    }

    fn open(dir: &tempfile::TempDir) -> Storage {
        let mut c = StorageConfig::new(dir.path().join("stallwatch.db"));
        c.retention_interval = Duration::from_secs(3600);
        Storage::open(c).unwrap()
    }

    /// A panic inside a commit fails that export (500: a bug), stores nothing of it, and
    /// the writer goes on: the next exports, the same one re-sent included, are stored.
    #[tokio::test]
    async fn a_panic_while_writing_fails_that_export_only() {
        let dir = tempfile::tempdir().unwrap();
        let storage = open(&dir);
        storage.write_traces(batch(1)).await.unwrap();
        inject::panic_once(dir.path(), "write");
        match storage.write_traces(batch(2)).await {
            Err(WriteError::Failed(m)) => assert!(m.contains("a panic"), "{m}"),
            other => panic!("expected a failed write, got {other:?}"),
        }
        assert!(storage.trace(TraceId([2; 16])).await.unwrap().is_none());
        storage.write_traces(batch(2)).await.unwrap();
        storage.write_traces(batch(3)).await.unwrap();
        for n in 1..=3 {
            let t = storage.trace(TraceId([n; 16])).await.unwrap();
            assert_eq!(t.map(|t| t.spans.len()), Some(1), "trace {n}");
        }
        storage.shutdown().await;
    }

    /// With one export at a time, each commits itself as leader (the writer thread never
    /// wakes for it); while the writer is busy (its lock held), an export is queued, waits,
    /// and is committed by the thread once the writer is free, never by itself meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_export_leads_when_the_writer_is_idle_and_queues_when_it_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let storage = open(&dir);
        let stats = storage.inner.telemetry.stats.clone();
        for n in 1..=5 {
            storage.write_traces(batch(n)).await.unwrap();
        }
        // The writer thread's own turns (at start, after a queued export) hold the lock
        // for moments, so an export may find it taken and queue: most lead.
        assert!(stats.led_commits() >= 4, "{} of 5 led", stats.led_commits());
        assert_eq!(stats.commits(), 5);
        let led = stats.led_commits();

        let slot = storage.inner.telemetry.slot.clone();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let guard = slot.lock();
            held_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            drop(guard);
        });
        held_rx.recv().unwrap();
        let started = std::time::Instant::now();
        storage.write_traces(batch(6)).await.unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "answered after {:?}, while the writer was busy",
            started.elapsed()
        );
        holder.join().unwrap();
        assert_eq!(
            stats.led_commits(),
            led,
            "the busy writer's export was queued"
        );
        assert_eq!(stats.commits(), 6);
        assert_eq!(stats.queue_depth(), 0);
        for n in 1..=6 {
            let t = storage.trace(TraceId([n; 16])).await.unwrap();
            assert_eq!(t.map(|t| t.spans.len()), Some(1), "trace {n}");
        }
        storage.shutdown().await;
        assert!(
            storage.inner.telemetry.slot.lock().is_none(),
            "the stopped thread closed the writer"
        );
    }

    /// A leader never waits for SQLite's write lock on its own (async) thread: while
    /// another connection holds it, the export is queued, and the writer thread waits for
    /// the lock (up to `busy_timeout`) and commits it; the export is stored, not refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_finding_the_database_locked_queues_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let storage = open(&dir);
        storage.write_traces(batch(1)).await.unwrap();
        let stats = storage.inner.telemetry.stats.clone();
        let led = stats.led_commits();
        let path = dir.path().join("stallwatch.db");
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let other = rusqlite::Connection::open(&path).unwrap();
            other.execute_batch("BEGIN IMMEDIATE").unwrap();
            locked_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            other.execute_batch("ROLLBACK").unwrap();
        });
        locked_rx.recv().unwrap();
        let started = std::time::Instant::now();
        storage.write_traces(batch(2)).await.unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "answered after {:?}, while the database was locked",
            started.elapsed()
        );
        holder.join().unwrap();
        assert_eq!(stats.led_commits(), led, "the export was queued, not led");
        assert!(storage.trace(TraceId([2; 16])).await.unwrap().is_some());
        // (the thread may still hold the writer's lock for a moment after answering, a
        // long one on a loaded machine: up to 10 s, an export every 20 ms)
        let until = std::time::Instant::now() + Duration::from_secs(10);
        let mut n = 3u8;
        while stats.led_commits() == led && std::time::Instant::now() < until {
            storage.write_traces(batch(n)).await.unwrap();
            n = n.wrapping_add(1).max(3);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            stats.led_commits() > led,
            "exports lead again once the lock is free"
        );
        storage.shutdown().await;
    }

    /// The trace index merge due after a leader's commit is left to the writer thread,
    /// which the leader wakes for it: the unmerged batches do not stay at the merge
    /// threshold when no export follows.
    #[tokio::test]
    async fn the_writer_thread_merges_what_leaders_committed() {
        let dir = tempfile::tempdir().unwrap();
        let storage = open(&dir);
        let merge_at = crate::telemetry::schema::MERGE_BATCHES;
        // The last export brings the unmerged batches to the threshold: no export follows
        // that would queue and so wake the thread.
        for n in 0..merge_at {
            let mut b = (*batch(1)).clone();
            let span = &mut b.resource_spans[0].scope_spans[0].spans[0];
            span.trace_id = TraceId([
                (n % 251) as u8 + 1,
                (n / 251) as u8 + 1,
                7,
                7,
                7,
                7,
                7,
                7,
                7,
                7,
                7,
                7,
                7,
                7,
                7,
                7,
            ]);
            storage.write_traces(Arc::new(b)).await.unwrap();
        }
        let stats = storage.inner.telemetry.stats.clone();
        assert!(
            stats.led_commits() > merge_at as u64 / 2,
            "{}",
            stats.led_commits()
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let unmerged = storage
                .inner
                .telemetry
                .slot
                .lock()
                .as_ref()
                .map(|w| w.l0_batches)
                .unwrap();
            if unmerged < merge_at {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{unmerged} batches still unmerged"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let t = storage
            .trace(TraceId([1, 1, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]))
            .await
            .unwrap();
        assert_eq!(t.map(|t| t.spans.len()), Some(1));
        storage.shutdown().await;
    }

    /// A panic outside a commit (here a retention pass) loses that request's answer only;
    /// the thread lives on and later exports are stored and deduplicated as before.
    #[tokio::test]
    async fn a_panic_outside_a_commit_leaves_the_writer_running() {
        let dir = tempfile::tempdir().unwrap();
        let storage = open(&dir);
        storage.write_traces(batch(1)).await.unwrap();
        inject::panic_once(dir.path(), "retention");
        assert!(storage.run_retention().await.is_err());
        storage.write_traces(batch(1)).await.unwrap();
        storage.write_traces(batch(4)).await.unwrap();
        assert!(storage.run_retention().await.is_ok());
        let t = storage.trace(TraceId([1; 16])).await.unwrap().unwrap();
        assert_eq!(t.spans.len(), 1, "the re-sent span is kept once");
        assert!(storage.trace(TraceId([4; 16])).await.unwrap().is_some());
        storage.shutdown().await;
    }
}
