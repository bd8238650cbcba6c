//! The telemetry writer thread: one `std::thread` owning its own connection, fed by a
//! bounded queue, committing groups of requests in one `BEGIN IMMEDIATE` transaction and
//! answering each request only after COMMIT returned (docs/design.md, Durability and limits).
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
//! hash → row id of the last [`RECENT_LOGS`] records; a hash hit is confirmed by comparing
//! the stored payload, so a collision never drops a record.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use tokio::sync::{oneshot, watch};

use super::bloom::{IdBuild, TraceBloom};
use super::checkpoint::{self, Checkpointer};
use super::encode::{decode_index, BatchIndex, IdxSpan, LogRow, PointRow, PreparedTraces};
use super::schema::{MERGE_BATCHES, META_MERGED_UPTO};
use super::stats::{RefusedReason, TelemetryStats};
use super::traceidx::{
    batch_trace_ids, encode_batches, fold, indexed_batches, merged_upto, unmerged_map,
};
use super::RetentionReport;
use crate::config::{StorageConfig, CONTROL_RESERVE_BYTES};
use crate::db::open_connection;
use crate::error::{transient_kind, StorageError, Transient, WriteError};
use crate::model::now_unix_nano;

/// Most requests committed in one transaction.
const MAX_GROUP_REQUESTS: usize = 256;
/// Most payload bytes committed in one transaction: 32 MiB.
const MAX_GROUP_BYTES: usize = 32 * 1024 * 1024;
/// Size-based retention keeps telemetry under this share of its budget (~90%).
const SIZE_TARGET_PERCENT: u64 = 90;
/// Least time between two automatic size-driven retention passes.
const SIZE_RETENTION_MIN_GAP: Duration = Duration::from_secs(1);
/// Writer connection page cache: 32 MiB.
const WRITER_CACHE_KIB: i64 = 32 * 1024;
/// While degraded and idle, how often the writer probes whether storage is back.
const DEGRADED_PROBE_EVERY: Duration = Duration::from_secs(1);

/// A transient storage condition the writer is in: the source of `/readyz`'s `degraded`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Degraded {
    /// Which condition.
    pub kind: Transient,
    /// What SQLite (or the file check) said.
    pub detail: String,
}

/// The database file's identity (device, inode), to notice it being deleted or replaced.
#[cfg(unix)]
fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The database file's identity on Windows: (volume serial number, 64-bit file index) from
/// `GetFileInformationByHandle`, the analogue of (device, inode). Not the creation time:
/// NTFS tunnelling can give a re-created file the old one, and Wine reports a creation time
/// that moves with every write (docs/platforms.md).
#[cfg(windows)]
fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::windows::fs::OpenOptionsExt;
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem::{
        GetFileInformationByHandle, BY_HANDLE_FILE_INFORMATION, FILE_FLAG_BACKUP_SEMANTICS,
    };
    // Access 0: attributes only, and std's default sharing, so SQLite's handle is not
    // disturbed.
    let file = std::fs::OpenOptions::new()
        .access_mode(0)
        .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)
        .ok()?;
    // SAFETY: the handle is live for the call (owned by `file`); the structure is plain
    // data the call fills.
    #[allow(unsafe_code)]
    let info = unsafe {
        let mut info: BY_HANDLE_FILE_INFORMATION = std::mem::zeroed();
        if GetFileInformationByHandle(file.as_raw_handle() as _, &mut info) == 0 {
            return None;
        }
        info
    };
    let index = (u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow);
    Some((u64::from(info.dwVolumeSerialNumber), index))
}

/// A request prepared on the caller's side.
#[derive(Debug)]
pub(crate) enum Prepared {
    /// A trace export.
    Traces(PreparedTraces),
    /// A log export.
    Logs(Vec<LogRow>),
    /// A metrics export.
    Metrics(Vec<PointRow>),
}

impl Prepared {
    fn bytes(&self) -> usize {
        match self {
            Prepared::Traces(t) => t.bytes(),
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

/// The writer thread's handle, held by [`crate::Storage`].
pub(crate) struct TelemetryWriter {
    tx: SyncSender<Msg>,
    capacity: usize,
    closed: AtomicBool,
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
        conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024i64)?;
        let page_size: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
        let page_size = page_size.max(512) as u64;
        let budget_bytes = config.max_db_bytes.saturating_sub(CONTROL_RESERVE_BYTES);
        conn.pragma_update(
            None,
            "max_page_count",
            (budget_bytes / page_size).max(1) as i64,
        )?;
        let next_batch_id: i64 = conn.query_row(
            "SELECT coalesce(max(id), 0) + 1 FROM span_batches",
            [],
            |r| r.get(0),
        )?;
        let capacity = config.queue_capacity.max(1);
        let (tx, rx) = mpsc::sync_channel(capacity);
        let stats = Arc::new(TelemetryStats::default());
        let (full_tx, full_rx) = watch::channel(None);
        let (degraded_tx, degraded_rx) = watch::channel(None);
        let identity = file_identity(&config.path);
        let checkpointer = Checkpointer::start(config)?;
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
            page_size,
            used_bytes: 0,
            next_batch_id,
            term_cache: HashMap::new(),
            recent_logs: RecentLogs::default(),
            pending_terms: Vec::new(),
            retention: config.retention,
            l0: HashMap::new(),
            l0_batches: 0,
            merged_upto: 0,
            idx_cache: HashMap::new(),
            bloom: TraceBloom::with_capacity(0),
            l0_new: HashSet::default(),
            retention_interval: config.retention_interval,
            next_retention: Instant::now() + config.retention_interval,
            last_size_retention: None,
        };
        writer.refresh_used()?;
        writer.reload_l0()?;
        writer.rebuild_bloom(0)?;
        let thread = std::thread::Builder::new()
            .name("stallwatch-telemetry-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| StorageError::Task(format!("cannot start the writer thread: {e}")))?;
        Ok(Self {
            tx,
            capacity,
            closed: AtomicBool::new(false),
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

    /// Queues a prepared request with `try_send` and waits for the answer sent after
    /// COMMIT.
    pub(crate) async fn submit(&self, prepared: Prepared) -> Result<(), WriteError> {
        if self.closed.load(Ordering::Acquire) {
            self.stats.count_refused(RefusedReason::Closed, 1);
            return Err(WriteError::Closed);
        }
        let (reply, answer) = oneshot::channel();
        self.stats.queue_depth.fetch_add(1, Ordering::Relaxed);
        match self
            .tx
            .try_send(Msg::Write(WriteRequest { prepared, reply }))
        {
            Ok(()) => {}
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

    /// Asks the writer thread for a retention pass and waits for its report.
    pub(crate) async fn retention(&self) -> Result<RetentionReport, StorageError> {
        let (reply, answer) = oneshot::channel();
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || tx.send(Msg::Retention(reply)))
            .await
            .map_err(|e| StorageError::Task(e.to_string()))?
            .map_err(|_| StorageError::Closed)?;
        answer.await.unwrap_or(Err(StorageError::Closed))
    }

    /// Stops taking writes (they answer [`WriteError::Closed`]), commits what is queued,
    /// and joins the thread.
    pub(crate) async fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let tx = self.tx.clone();
        let _ = tokio::task::spawn_blocking(move || tx.send(Msg::Shutdown)).await;
        let handle = self.thread.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        if let Ok(mut c) = self.checkpointer.lock() {
            c.stop();
        }
    }

    /// Tells the checkpointer that a transaction committed on another connection.
    pub(crate) fn note_commit(&self) {
        if let Ok(c) = self.checkpointer.lock() {
            c.shared.note_commit();
        }
    }
}

/// What one group committed.
#[derive(Default)]
struct Committed {
    spans: u64,
    duplicates: u64,
    logs: u64,
    log_duplicates: u64,
    points: u64,
}

/// Log records remembered for deduplication (by payload hash): an exporter retry arrives
/// within seconds to minutes, long before this many other records.
pub(super) const RECENT_LOGS: usize = 262_144;

/// Hash → row id of recently stored log records, bounded FIFO.
#[derive(Default)]
pub(super) struct RecentLogs {
    by_hash: HashMap<u64, i64>,
    order: VecDeque<u64>,
}

impl RecentLogs {
    fn hash(payload: &[u8]) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        payload.hash(&mut h);
        h.finish()
    }

    fn remember(&mut self, hash: u64, row: i64) {
        if self.by_hash.insert(hash, row).is_none() {
            self.order.push_back(hash);
            while self.order.len() > RECENT_LOGS {
                if let Some(old) = self.order.pop_front() {
                    self.by_hash.remove(&old);
                }
            }
        }
    }
}

pub(super) struct Writer {
    pub(super) conn: Connection,
    ckpt: Arc<checkpoint::Shared>,
    rx: Receiver<Msg>,
    deferred: VecDeque<Msg>,
    pub(super) stats: Arc<TelemetryStats>,
    full_tx: watch::Sender<Option<String>>,
    degraded_tx: watch::Sender<Option<Degraded>>,
    db_path: std::path::PathBuf,
    /// (device, inode) of the database file when opened; `None` if it could not be read.
    identity: Option<(u64, u64)>,
    pub(super) budget_bytes: u64,
    page_size: u64,
    pub(super) used_bytes: u64,
    next_batch_id: i64,
    pub(super) term_cache: HashMap<(String, String), i64>,
    pending_terms: Vec<((String, String), i64)>,
    pub(super) retention: Duration,
    pub(super) l0: HashMap<[u8; 16], Vec<i64>>,
    pub(super) l0_batches: usize,
    pub(super) merged_upto: i64,
    idx_cache: HashMap<i64, Arc<BatchIndex>>,
    /// Every trace id in `trace_index` or `l0` (and stale ones): a miss is a new trace.
    bloom: TraceBloom,
    /// Traces of `l0` that had no `trace_index` row when first stored (merge skips the
    /// read for them).
    pub(super) l0_new: HashSet<[u8; 16], IdBuild>,
    retention_interval: Duration,
    next_retention: Instant,
    last_size_retention: Option<Instant>,
    recent_logs: RecentLogs,
}

impl Writer {
    fn run(mut self) {
        loop {
            let msg = match self.deferred.pop_front() {
                Some(m) => m,
                None => {
                    let mut wait = self
                        .next_retention
                        .saturating_duration_since(Instant::now());
                    let degraded = self.degraded_tx.borrow().is_some();
                    if degraded {
                        wait = wait.min(DEGRADED_PROBE_EVERY);
                    }
                    match self.rx.recv_timeout(wait) {
                        Ok(m) => m,
                        Err(RecvTimeoutError::Timeout) if degraded => {
                            self.probe();
                            continue;
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            self.next_retention = Instant::now() + self.retention_interval;
                            self.last_size_retention = Some(Instant::now());
                            if let Err(e) = self.retention_pass() {
                                tracing::warn!(error = %e, "telemetry retention pass failed");
                            }
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            };
            match msg {
                Msg::Write(first) => self.group(first),
                Msg::Retention(reply) => {
                    let _ = reply.send(self.retention_pass());
                }
                Msg::Shutdown => {
                    self.drain_for_shutdown();
                    break;
                }
            }
        }
        tracing::debug!("telemetry writer stopped");
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
        while reqs.len() < MAX_GROUP_REQUESTS && bytes < MAX_GROUP_BYTES {
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

    /// Serves queued writes (used between retention chunks so ingest keeps flowing).
    pub(super) fn serve_pending(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(Msg::Write(r)) => self.group(r),
                Ok(other) => self.deferred.push_back(other),
                Err(_) => break,
            }
        }
    }

    fn full_reason(&self) -> String {
        format!(
            "telemetry reached its share of max_db_bytes ({} of {} bytes in use; {} bytes are kept for control records)",
            self.used_bytes, self.budget_bytes, CONTROL_RESERVE_BYTES
        )
    }

    pub(super) fn set_full(&mut self, reason: Option<String>) {
        match &reason {
            Some(r) => self.set_degraded(Some(Degraded {
                kind: Transient::Full,
                detail: r.clone(),
            })),
            None => {
                if self.degraded_tx.borrow().as_ref().map(|d| d.kind) == Some(Transient::Full) {
                    self.set_degraded(None);
                }
            }
        }
        self.full_tx.send_if_modified(|cur| {
            if *cur == reason {
                false
            } else {
                if let Some(r) = &reason {
                    tracing::warn!(reason = %r, "telemetry storage full");
                } else {
                    tracing::info!("telemetry storage has room again");
                }
                *cur = reason;
                true
            }
        });
    }

    /// Publishes the writer's condition (`None` = healthy); logs each change once.
    fn set_degraded(&mut self, to: Option<Degraded>) {
        self.degraded_tx.send_if_modified(|cur| {
            if cur.as_ref().map(|d| d.kind) == to.as_ref().map(|d| d.kind) {
                return false;
            }
            match &to {
                Some(d) if d.kind == Transient::Gone => tracing::error!(
                    condition = d.kind.as_str(),
                    detail = %d.detail,
                    "storage gone: telemetry is refused with 503 / UNAVAILABLE; restart stallwatch on a data folder that exists"
                ),
                Some(d) => tracing::warn!(
                    condition = d.kind.as_str(),
                    detail = %d.detail,
                    "storage degraded: telemetry is refused with 503 / UNAVAILABLE until it passes"
                ),
                None => tracing::info!("storage recovered: telemetry is accepted again"),
            }
            *cur = to;
            true
        });
    }

    /// `Some` when the database file is no longer the one opened (deleted, or replaced).
    fn moved_away(&self) -> Option<Degraded> {
        let now = file_identity(&self.db_path);
        if self.identity.is_some() && now == self.identity {
            return None;
        }
        let detail = match now {
            None => format!("database file {} was deleted while running; acknowledging into the unlinked file would lose the data", self.db_path.display()),
            Some(_) => format!("database file {} was replaced while running", self.db_path.display()),
        };
        Some(Degraded {
            kind: Transient::Gone,
            detail,
        })
    }

    /// While degraded and idle: checks whether storage is back (an empty write transaction)
    /// so `/readyz` recovers even when no exporter is retrying.
    fn probe(&mut self) {
        if let Some(gone) = self.moved_away() {
            tracing::error!(detail = %gone.detail, "storage gone");
            self.set_degraded(Some(gone));
            return;
        }
        if self.full_tx.borrow().is_some() {
            // Full episodes end through a successful commit or retention.
            return;
        }
        let r = self
            .conn
            .execute_batch("BEGIN IMMEDIATE; ROLLBACK")
            .inspect_err(|_| {
                let _ = self.conn.execute_batch("ROLLBACK");
            });
        match r {
            Ok(()) => self.set_degraded(None),
            Err(e) => {
                if let Some(kind) = transient_kind(&e) {
                    self.set_degraded(Some(Degraded {
                        kind,
                        detail: e.to_string(),
                    }));
                }
            }
        }
    }

    fn schedule_size_retention(&mut self) {
        let due = self
            .last_size_retention
            .is_none_or(|t| t.elapsed() >= SIZE_RETENTION_MIN_GAP);
        if due {
            self.last_size_retention = Some(Instant::now());
            self.next_retention = Instant::now();
        }
    }

    /// Re-reads the bytes in use (pages minus free pages).
    pub(super) fn refresh_used(&mut self) -> Result<u64, rusqlite::Error> {
        let pages: i64 = self
            .conn
            .pragma_query_value(None, "page_count", |r| r.get(0))?;
        let free: i64 = self
            .conn
            .pragma_query_value(None, "freelist_count", |r| r.get(0))?;
        self.used_bytes = (pages - free).max(0) as u64 * self.page_size;
        self.stats
            .db_used_bytes
            .store(self.used_bytes, Ordering::Relaxed);
        Ok(self.used_bytes)
    }

    pub(super) fn size_target(&self) -> u64 {
        self.budget_bytes / 100 * SIZE_TARGET_PERCENT
    }

    fn commit_group(&mut self, reqs: Vec<WriteRequest>) {
        if let Some(gone) = self.moved_away() {
            self.refuse_unavailable(reqs, gone);
            return;
        }
        if self.used_bytes >= self.budget_bytes {
            let _ = self.refresh_used();
            if self.used_bytes >= self.budget_bytes {
                let reason = self.full_reason();
                self.set_full(Some(reason.clone()));
                self.schedule_size_retention();
                self.stats
                    .count_refused(RefusedReason::StorageFull, reqs.len() as u64);
                for r in reqs {
                    let _ = r.reply.send(Err(WriteError::Full(reason.clone())));
                }
                return;
            }
        }
        if self
            .ckpt
            .writer_should_checkpoint
            .swap(false, Ordering::AcqRel)
        {
            // The WAL outgrew its bound: copy its tail so the next transaction rewinds it.
            if let Err(e) = checkpoint::passive(&self.conn) {
                tracing::debug!(error = %e, "writer-side WAL checkpoint failed");
            }
        }
        let started = Instant::now();
        let saved_next = self.next_batch_id;
        let mut replies = Vec::with_capacity(reqs.len());
        let mut preps = Vec::with_capacity(reqs.len());
        for r in reqs {
            replies.push(r.reply);
            preps.push(r.prepared);
        }
        let outcome = self.write_all(preps);
        match outcome {
            Ok(c) => {
                self.stats.observe_commit(started.elapsed());
                for (k, id) in self.pending_terms.drain(..) {
                    self.term_cache.insert(k, id);
                }
                if self.term_cache.len() > 200_000 {
                    self.term_cache.clear();
                }
                self.stats
                    .spans_committed
                    .fetch_add(c.spans, Ordering::Relaxed);
                self.stats
                    .spans_deduplicated
                    .fetch_add(c.duplicates, Ordering::Relaxed);
                self.stats
                    .logs_committed
                    .fetch_add(c.logs, Ordering::Relaxed);
                if c.log_duplicates > 0 {
                    tracing::debug!(
                        "{} re-sent log records already stored (kept once)",
                        c.log_duplicates
                    );
                }
                self.stats
                    .points_committed
                    .fetch_add(c.points, Ordering::Relaxed);
                // Checked again before acknowledging: a commit into a file unlinked meanwhile
                // is not durable, so the exporter must retry (against the next instance).
                if let Some(gone) = self.moved_away() {
                    tracing::error!(detail = %gone.detail, "storage gone; not acknowledging");
                    self.stats
                        .count_refused(RefusedReason::StorageGone, replies.len() as u64);
                    for r in replies {
                        let _ = r.send(Err(WriteError::Unavailable {
                            kind: gone.kind,
                            detail: gone.detail.clone(),
                        }));
                    }
                    self.set_degraded(Some(gone));
                    return;
                }
                for r in replies {
                    let _ = r.send(Ok(()));
                }
                if self.degraded_tx.borrow().is_some() && self.full_tx.borrow().is_none() {
                    self.set_degraded(None);
                }
                if self.l0_batches >= MERGE_BATCHES {
                    if let Err(e) = self.merge_l0() {
                        tracing::warn!(error = %e, "merging the trace index failed; will retry");
                    }
                }
                self.ckpt.note_commit();
                let _ = self.refresh_used();
                if self.used_bytes < self.budget_bytes {
                    self.set_full(None);
                }
                if self.used_bytes > self.size_target() {
                    self.schedule_size_retention();
                }
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                self.next_batch_id = saved_next;
                self.pending_terms.clear();
                if let Err(e) = self.reload_l0() {
                    tracing::error!(error = %e, "cannot reload the unmerged trace map");
                }
                self.stats.commit_failures.fetch_add(1, Ordering::Relaxed);
                let err = match transient_kind(&e) {
                    Some(Transient::Full) => {
                        let reason = format!("disk full or size cap reached: {e}");
                        self.set_full(Some(reason.clone()));
                        self.schedule_size_retention();
                        self.stats
                            .count_refused(RefusedReason::StorageFull, replies.len() as u64);
                        WriteError::Full(reason)
                    }
                    Some(kind) => {
                        let degraded = Degraded {
                            kind,
                            detail: e.to_string(),
                        };
                        self.stats
                            .count_refused(RefusedReason::from(kind), replies.len() as u64);
                        self.set_degraded(Some(degraded));
                        WriteError::Unavailable {
                            kind,
                            detail: e.to_string(),
                        }
                    }
                    None => {
                        tracing::error!(error = %e, "telemetry commit failed");
                        WriteError::Failed(e.to_string())
                    }
                };
                for r in replies {
                    let _ = r.send(Err(match &err {
                        WriteError::Full(s) => WriteError::Full(s.clone()),
                        WriteError::Unavailable { kind, detail } => WriteError::Unavailable {
                            kind: *kind,
                            detail: detail.clone(),
                        },
                        other => WriteError::Failed(other.to_string()),
                    }));
                }
            }
        }
    }

    /// Answers every request of a group with a transient refusal, counted by its reason.
    fn refuse_unavailable(&mut self, reqs: Vec<WriteRequest>, why: Degraded) {
        self.stats
            .count_refused(RefusedReason::from(why.kind), reqs.len() as u64);
        for r in reqs {
            let _ = r.reply.send(Err(WriteError::Unavailable {
                kind: why.kind,
                detail: why.detail.clone(),
            }));
        }
        self.set_degraded(Some(why));
    }

    fn write_all(&mut self, preps: Vec<Prepared>) -> Result<Committed, rusqlite::Error> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let received = now_unix_nano() as i64;
        let mut c = Committed::default();
        for p in preps {
            match p {
                Prepared::Traces(t) => {
                    let (stored, dups) = self.apply_traces(t, received)?;
                    c.spans += stored;
                    c.duplicates += dups;
                }
                Prepared::Logs(rows) => {
                    let mut st = self.conn.prepare_cached(
                        "INSERT INTO logs(received_unix_nano, time_unix_nano, trace_id, span_id,
                                          payload, service, severity, runner_id)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    )?;
                    let mut same = self
                        .conn
                        .prepare_cached("SELECT payload = ?2 FROM logs WHERE id = ?1")?;
                    // the body index, in the same transaction (migration 3)
                    let mut body = self
                        .conn
                        .prepare_cached("INSERT INTO logs_body(rowid, body) VALUES (?1, ?2)")?;
                    for r in &rows {
                        let hash = RecentLogs::hash(&r.payload);
                        if let Some(&row) = self.recent_logs.by_hash.get(&hash) {
                            let dup: Option<bool> = same
                                .query_row(params![row, r.payload], |x| x.get(0))
                                .optional()?;
                            if dup == Some(true) {
                                c.log_duplicates += 1;
                                continue;
                            }
                        }
                        st.execute(params![
                            received,
                            r.time as i64,
                            r.trace_id.as_ref().map(|t| &t[..]),
                            r.span_id.as_ref().map(|s| &s[..]),
                            r.payload,
                            r.service,
                            r.severity,
                            r.runner_id,
                        ])?;
                        let id = self.conn.last_insert_rowid();
                        body.execute(params![id, r.body])?;
                        self.recent_logs.remember(hash, id);
                        c.logs += 1;
                    }
                }
                Prepared::Metrics(rows) => {
                    let mut st = self.conn.prepare_cached(
                        "INSERT INTO metric_points(received_unix_nano, name, time_unix_nano, payload,
                                                   service, series, value, count, sum)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    )?;
                    for r in &rows {
                        st.execute(params![
                            received,
                            r.name,
                            r.time as i64,
                            r.payload,
                            r.service,
                            r.series,
                            r.value,
                            r.count.map(|c| c as i64),
                            r.sum,
                        ])?;
                    }
                    super::metrics_read::upsert_instruments(&self.conn, &rows)?;
                    c.points += rows.len() as u64;
                }
            }
        }
        self.conn.execute_batch("COMMIT")?;
        Ok(c)
    }

    fn term_id(&mut self, key: &str, value: &str) -> Result<i64, rusqlite::Error> {
        let k = (key.to_string(), value.to_string());
        if let Some(id) = self.term_cache.get(&k) {
            return Ok(*id);
        }
        if let Some((_, id)) = self.pending_terms.iter().find(|(p, _)| *p == k) {
            return Ok(*id);
        }
        self.conn
            .prepare_cached("INSERT INTO terms(key, value) VALUES (?1, ?2) ON CONFLICT DO NOTHING")?
            .execute(params![key, value])?;
        let id: i64 = self
            .conn
            .prepare_cached("SELECT id FROM terms WHERE key = ?1 AND value = ?2")?
            .query_row(params![key, value], |r| r.get(0))?;
        self.pending_terms.push((k, id));
        Ok(id)
    }

    /// Loads (cached) the index of a stored batch.
    fn load_idx(&mut self, id: i64) -> Result<Option<Arc<BatchIndex>>, rusqlite::Error> {
        if let Some(i) = self.idx_cache.get(&id) {
            return Ok(Some(i.clone()));
        }
        let blob: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT idx FROM span_batches WHERE id = ?1")?
            .query_row([id], |r| r.get(0))
            .optional()?;
        let Some(blob) = blob else { return Ok(None) };
        let idx = Arc::new(
            decode_index(&blob).map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?,
        );
        if self.idx_cache.len() >= 64 {
            self.idx_cache.clear();
        }
        self.idx_cache.insert(id, idx.clone());
        Ok(Some(idx))
    }

    /// Re-reads the unmerged trace map after a rollback.
    pub(super) fn reload_l0(&mut self) -> Result<(), rusqlite::Error> {
        self.idx_cache.clear();
        self.l0_new.clear();
        self.merged_upto = merged_upto(&self.conn)?;
        self.l0 = unmerged_map(&self.conn, self.merged_upto)?;
        self.l0_batches = self.conn.query_row(
            "SELECT count(*) FROM span_batches WHERE id > ?1",
            [self.merged_upto],
            |r| r.get::<_, i64>(0),
        )? as usize;
        Ok(())
    }

    /// Rebuilds the trace-id filter from `trace_index` and `l0`, sized for at least
    /// `min_capacity` ids.
    fn rebuild_bloom(&mut self, min_capacity: usize) -> Result<(), rusqlite::Error> {
        let rows: i64 = self
            .conn
            .query_row("SELECT count(*) FROM trace_index", [], |r| r.get(0))?;
        let want = (rows.max(0) as usize + self.l0.len()) * 2;
        let mut bloom = TraceBloom::with_capacity(want.max(min_capacity));
        {
            let mut st = self.conn.prepare("SELECT trace_id FROM trace_index")?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                if let Ok(t) = <[u8; 16]>::try_from(r.get_ref(0)?.as_blob()?) {
                    bloom.insert(&t);
                }
            }
        }
        for t in self.l0.keys() {
            bloom.insert(t);
        }
        self.bloom = bloom;
        Ok(())
    }

    /// Stores one trace request; answers (spans stored, copies dropped as duplicates).
    fn apply_traces(
        &mut self,
        mut p: PreparedTraces,
        received: i64,
    ) -> Result<(u64, u64), rusqlite::Error> {
        let n = p.index.spans.len();
        if n == 0 {
            return Ok((0, p.duplicates));
        }
        let b = self.next_batch_id;
        let mut keep = vec![true; n];
        let mut dups = p.duplicates;
        let traces = std::mem::take(&mut p.traces);
        for (t, positions) in &traces {
            if !self.bloom.may_contain(t) {
                self.l0_new.insert(*t);
                continue; // a new trace: every copy stays
            }
            let mut batches = indexed_batches(&self.conn, t)?;
            if let Some(l) = self.l0.get(t) {
                batches.extend_from_slice(l);
            }
            if batches.is_empty() {
                continue; // a new trace: every copy stays
            }
            batches.sort_unstable();
            batches.dedup();
            let mut idxs = Vec::with_capacity(batches.len());
            for id in batches {
                if let Some(i) = self.load_idx(id)? {
                    idxs.push(i);
                }
            }
            let mut known: HashMap<[u8; 8], bool> = fold(t, idxs.iter().map(|a| a.as_ref()))
                .into_iter()
                .map(|(sid, (bi, pi))| (sid, idxs[bi].spans[pi].ended()))
                .collect();
            for &pos in positions {
                let c = &p.index.spans[pos as usize];
                match known.get(&c.span_id).copied() {
                    None => {
                        known.insert(c.span_id, c.ended());
                    }
                    Some(false) if c.ended() => {
                        known.insert(c.span_id, true);
                    }
                    Some(_) => {
                        keep[pos as usize] = false;
                        dups += 1;
                    }
                }
            }
        }
        let kept = keep.iter().filter(|k| **k).count();
        if kept == 0 {
            return Ok((0, dups));
        }
        if kept < n {
            p.retain(&keep);
        }
        let idx = &p.index;
        let min_start = idx.spans.iter().map(|s| s.start).min().unwrap_or(0);
        let max_start = idx.spans.iter().map(|s| s.start).max().unwrap_or(0);
        let max_duration = idx.spans.iter().map(IdxSpan::duration).max().unwrap_or(0);
        let trace_list = batch_trace_ids(idx);
        let idx_blob = postcard::to_allocvec(idx)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        self.conn
            .prepare_cached(
                "INSERT INTO span_batches(id, received_unix_nano, min_start, max_start, max_duration,
                    span_count, traces, idx, payload)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                b,
                received,
                min_start as i64,
                max_start as i64,
                max_duration.min(i64::MAX as u64) as i64,
                kept as i64,
                trace_list,
                idx_blob,
                p.payload
            ])?;
        let terms = std::mem::take(&mut p.index.terms);
        for (k, v) in &terms {
            let tid = self.term_id(k, v)?;
            self.conn
                .prepare_cached(
                    "INSERT OR IGNORE INTO batch_terms(term_id, batch_id) VALUES (?1, ?2)",
                )?
                .execute(params![tid, b])?;
        }
        for c in trace_list.chunks_exact(16) {
            let mut t = [0u8; 16];
            t.copy_from_slice(c);
            self.l0.entry(t).or_default().push(b);
            self.bloom.insert(&t);
        }
        if self.bloom.overfull() {
            let want = self.bloom.inserted() * 4;
            if let Err(e) = self.rebuild_bloom(want) {
                // Keep the old one (still has every id); retry at the next batch.
                tracing::warn!(error = %e, "rebuilding the trace-id filter failed");
            }
        }
        self.l0_batches += 1;
        self.next_batch_id += 1;
        Ok((kept as u64, dups))
    }

    /// Merges the unmerged batches' traces into `trace_index` in one transaction.
    pub(super) fn merge_l0(&mut self) -> Result<(), rusqlite::Error> {
        if self.l0_batches == 0 {
            return Ok(());
        }
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let out = (|| -> Result<(), rusqlite::Error> {
            let mut keys: Vec<[u8; 16]> = self.l0.keys().copied().collect();
            keys.sort_unstable();
            for t in keys {
                let mut list = if self.l0_new.contains(&t) {
                    Vec::new()
                } else {
                    indexed_batches(&self.conn, &t)?
                };
                if let Some(l) = self.l0.get(&t) {
                    list.extend_from_slice(l);
                }
                list.sort_unstable();
                list.dedup();
                self.conn
                    .prepare_cached(
                        "INSERT OR REPLACE INTO trace_index(trace_id, batches) VALUES (?1, ?2)",
                    )?
                    .execute(params![&t[..], encode_batches(&list)])?;
            }
            self.conn.execute(
                "INSERT OR REPLACE INTO telemetry_meta(key, value) VALUES (?1, ?2)",
                params![META_MERGED_UPTO, self.next_batch_id - 1],
            )?;
            Ok(())
        })();
        match out.and_then(|()| self.conn.execute_batch("COMMIT")) {
            Ok(()) => {
                self.merged_upto = self.next_batch_id - 1;
                self.l0.clear();
                self.l0_new.clear();
                self.l0_batches = 0;
                Ok(())
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                let _ = self.reload_l0();
                Err(e)
            }
        }
    }
}
