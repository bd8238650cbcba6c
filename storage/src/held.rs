//! Control records held in memory while storage is in a transient condition.
//!
//! The watchdog and reaper must act on time while another process holds the SQLite lock,
//! the disk is full, or the file went away (docs/design.md, Durability levels). Their
//! records (incidents, the action ledger, runner rows and their state changes, checkpoint
//! state changes) go through
//! [`Storage::control_or_hold`]: written at once when storage is healthy; otherwise, or when
//! the write fails transiently, queued here **in arrival order**, bounded, and written by a
//! background flusher (every [`FLUSH_EVERY`]) before any newer record, once storage is back.
//! [`Storage::shutdown`] flushes what is held before the writer stops; what still cannot be
//! written then is logged, one ERROR line per record, so nothing vanishes silently.
//!
//! While records are held, every new one queues behind them (a direct write would overtake
//! them), and the direct attempt uses a short busy wait ([`HOLD_BUSY_WAIT`]) instead of the
//! full `busy_timeout`, so a locked file costs an action a quarter second, not five.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::db::Storage;
use crate::error::StorageError;
use crate::model::{Incident, NewIncident};
use crate::runners::{ActionRecord, RunnerRow};

/// Most control records held in memory; past it the oldest is logged and dropped (counted).
pub const MAX_HELD_RECORDS: usize = 100_000;
/// How often the flusher retries while records are held.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// Busy wait of a control write that may be held instead of waiting out `busy_timeout`.
pub const HOLD_BUSY_WAIT: Duration = Duration::from_millis(250);
/// Most held records written in one transaction.
const FLUSH_CHUNK: usize = 512;

/// One control record waiting for storage.
#[derive(Clone, Debug)]
pub enum Held {
    /// An incident ([`crate::EventBus::publish`] already broadcast it with id 0).
    Incident(NewIncident),
    /// A step of the action ledger.
    Action(ActionRecord),
    /// A runner row (registration, restart, state change).
    Runner(RunnerRow),
    /// A runner's state change ([`Storage::set_runner_state`]).
    RunnerState {
        /// Runner id.
        id: String,
        /// New state.
        state: crate::runners::RunnerRowState,
        /// New detail.
        detail: serde_json::Value,
        /// When, ns since the Unix epoch.
        at_unix_nano: u64,
    },
    /// A checkpoint's move to a terminal state after its files were settled
    /// ([`Storage::finish_checkpoint`]), applied only from one of `from`.
    CheckpointFinish {
        /// Checkpoint id.
        id: String,
        /// States it may move from.
        from: Vec<crate::checkpoints::CheckpointState>,
        /// State it moves to.
        to: crate::checkpoints::CheckpointState,
        /// New detail.
        detail: serde_json::Value,
        /// When, ns since the Unix epoch.
        at_unix_nano: u64,
    },
}

impl Held {
    fn apply(&self, tx: &rusqlite::Transaction<'_>) -> Result<bool, StorageError> {
        match self {
            Held::Incident(i) => Ok(crate::incidents::insert_incident_tx(tx, i.clone())?.is_some()),
            Held::Action(a) => crate::runners::insert_action_tx(tx, a),
            Held::Runner(r) => crate::runners::upsert_runner_tx(tx, r).map(|_| true),
            Held::RunnerState {
                id,
                state,
                detail,
                at_unix_nano,
            } => crate::runners::set_runner_state_tx(tx, id, *state, detail, *at_unix_nano),
            Held::CheckpointFinish {
                id,
                from,
                to,
                detail,
                at_unix_nano,
            } => crate::checkpoints::finish_checkpoint_tx(tx, id, from, *to, detail, *at_unix_nano),
        }
    }

    fn describe(&self) -> String {
        match self {
            Held::Incident(i) => format!(
                "incident kind={} runner={} reason={:?} key={}",
                i.kind,
                i.runner_id.as_deref().unwrap_or("-"),
                i.reason,
                i.idempotency_key
            ),
            Held::Action(a) => format!(
                "action runner={} termination={} step={} phase={}",
                a.runner_id, a.termination_id, a.step, a.phase
            ),
            Held::Runner(r) => format!("runner row runner={} state={}", r.id, r.state.as_str()),
            Held::RunnerState { id, state, .. } => {
                format!("runner state runner={id} state={}", state.as_str())
            }
            Held::CheckpointFinish { id, to, .. } => {
                format!("checkpoint state checkpoint={id} state={}", to.as_str())
            }
        }
    }
}

/// The queue and its counters (inside [`Storage`]).
pub(crate) struct HeldQueue {
    queue: std::sync::Mutex<VecDeque<Held>>,
    flusher_running: AtomicBool,
    pub(crate) held_total: AtomicU64,
    pub(crate) dropped_total: AtomicU64,
    /// Records held so far, for [`Storage::held_records`] watchers.
    signal: tokio::sync::watch::Sender<u64>,
}

impl Default for HeldQueue {
    fn default() -> Self {
        Self {
            queue: std::sync::Mutex::default(),
            flusher_running: AtomicBool::default(),
            held_total: AtomicU64::default(),
            dropped_total: AtomicU64::default(),
            signal: tokio::sync::watch::channel(0).0,
        }
    }
}

impl HeldQueue {
    fn push(&self, h: Held) {
        if let Ok(mut q) = self.queue.lock() {
            if q.len() >= MAX_HELD_RECORDS {
                if let Some(old) = q.pop_front() {
                    self.dropped_total.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(record = %old.describe(), "held control record dropped: more than {MAX_HELD_RECORDS} held");
                }
            }
            q.push_back(h);
            self.held_total.fetch_add(1, Ordering::Relaxed);
        }
        self.signal.send_modify(|n| *n += 1);
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.lock().map(|q| q.len()).unwrap_or(0)
    }
}

impl Storage {
    /// Writes a control record now, or holds it (in order, bounded) when storage is in a
    /// transient condition; answers what a direct write answers (`true` = newly written or
    /// held, `false` = its idempotency key was already recorded).
    ///
    /// Errors: only non-transient ones (a constraint, corruption, a bug).
    pub async fn control_or_hold(&self, record: Held) -> Result<bool, StorageError> {
        let must_queue = self.inner.held.len() > 0 || self.transient_now();
        if !must_queue {
            let r = record.clone();
            let direct = self
                .control_with_busy_wait(HOLD_BUSY_WAIT, move |tx| r.apply(tx))
                .await;
            match direct {
                Ok(v) => return Ok(v),
                Err(e) if e.transient().is_none() => return Err(e),
                Err(e) => {
                    tracing::warn!(record = %record.describe(), "control record held in memory: {e}");
                }
            }
        }
        self.inner.held.push(record);
        self.start_flusher();
        Ok(true)
    }

    /// Holds an incident that could not be written (used by [`crate::EventBus`]).
    pub(crate) fn hold(&self, record: Held) {
        tracing::warn!(record = %record.describe(), "control record held in memory");
        self.inner.held.push(record);
        self.start_flusher();
    }

    /// True while records are held or the telemetry writer reports a transient condition.
    pub fn holding(&self) -> bool {
        self.inner.held.len() > 0 || self.transient_now()
    }

    /// Control records held in memory right now.
    pub fn held_len(&self) -> usize {
        self.inner.held.len()
    }

    /// Changes each time a control record is held (the count of records held so far): the
    /// binary frees its disk-space reserve when one was held for a full disk.
    pub fn held_records(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.held.signal.subscribe()
    }

    /// A lock, I/O error or vanished file seen by the telemetry writer (a telemetry-share
    /// "full" is not one: control records have their own reserve and are tried directly).
    fn transient_now(&self) -> bool {
        matches!(
            self.inner
                .telemetry
                .degraded
                .borrow()
                .as_ref()
                .map(|d| d.kind),
            Some(crate::error::Transient::Busy)
                | Some(crate::error::Transient::Locked)
                | Some(crate::error::Transient::Io)
                | Some(crate::error::Transient::Gone)
        )
    }

    fn start_flusher(&self) {
        if self.inner.held.flusher_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        let spawned = tokio::runtime::Handle::try_current().map(|h| {
            h.spawn(async move {
                loop {
                    tokio::time::sleep(FLUSH_EVERY).await;
                    if this.flush_held().await == 0 {
                        break;
                    }
                }
                this.inner
                    .held
                    .flusher_running
                    .store(false, Ordering::Release);
                // A record pushed between the last flush and the flag reset.
                if this.inner.held.len() > 0 {
                    this.start_flusher();
                }
            })
        });
        if spawned.is_err() {
            self.inner
                .held
                .flusher_running
                .store(false, Ordering::Release);
        }
    }

    /// Writes held records, oldest first, in chunks; stops at the first transient failure.
    /// Answers how many are still held.
    pub async fn flush_held(&self) -> usize {
        loop {
            let chunk: Vec<Held> = match self.inner.held.queue.lock() {
                Ok(q) => q.iter().take(FLUSH_CHUNK).cloned().collect(),
                Err(_) => return 0,
            };
            if chunk.is_empty() {
                return 0;
            }
            let n = chunk.len();
            let c = chunk.clone();
            let r = self
                .control_with_busy_wait(HOLD_BUSY_WAIT, move |tx| {
                    for h in &c {
                        h.apply(tx)?;
                    }
                    Ok(())
                })
                .await;
            match r {
                Ok(()) => {
                    if let Ok(mut q) = self.inner.held.queue.lock() {
                        let k = n.min(q.len());
                        q.drain(..k);
                    }
                    tracing::info!(written = n, "held control records written");
                }
                Err(e) if e.transient().is_some() => return self.inner.held.len(),
                Err(e) => {
                    // One bad record must not block the rest: write them one by one.
                    tracing::error!(
                        "writing held control records failed: {e}; retrying one by one"
                    );
                    for h in chunk {
                        let one = h.clone();
                        let r = self
                            .control_with_busy_wait(HOLD_BUSY_WAIT, move |tx| one.apply(tx))
                            .await;
                        if let Err(e) = &r {
                            if e.transient().is_some() {
                                return self.inner.held.len();
                            }
                            tracing::error!(record = %h.describe(), "held control record refused: {e}");
                        }
                        if let Ok(mut q) = self.inner.held.queue.lock() {
                            q.pop_front();
                        }
                    }
                }
            }
        }
    }

    /// At ordered shutdown: retries the held records until `deadline`, then logs what is
    /// left, one ERROR line each.
    pub(crate) async fn flush_held_until(&self, deadline: Instant) {
        while self.flush_held().await > 0 && Instant::now() < deadline {
            tokio::time::sleep(FLUSH_EVERY).await;
        }
        if let Ok(mut q) = self.inner.held.queue.lock() {
            for h in q.drain(..) {
                tracing::error!(record = %h.describe(), "held control record lost at shutdown: storage never came back");
            }
        }
    }

    /// [`Storage::control`] with a busy wait of `wait` instead of `busy_timeout`.
    pub(crate) async fn control_with_busy_wait<T, F>(
        &self,
        wait: Duration,
        f: F,
    ) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StorageError> + Send + 'static,
    {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.control_waiting(wait, f))
            .await
            .map_err(|e| StorageError::Task(e.to_string()))?
    }
}

/// The held incident as broadcast (id 0 until written).
pub(crate) fn held_incident(incident: NewIncident) -> Incident {
    Incident { id: 0, incident }
}
