//! The reaper on Windows (docs/platforms.md, Windows).
//!
//! Spawned runners only. Each runner is created suspended with `CREATE_NEW_PROCESS_GROUP`,
//! put into its own Job Object (`JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`, so runners never
//! outlive stallwatch), then resumed, so none of its children can start outside the job.
//! Its heartbeat is the named pipe `\\.\pipe\stallwatch-<hash>`, injected as
//! `STALLWATCH_HEARTBEAT_SOCKET` with the same environment as on Linux. A trip, a `DELETE`
//! or the ordered shutdown stops it: `CTRL_BREAK_EVENT` to its console group (the analogue
//! of SIGTERM), the grace period, then `TerminateJobObject`, which ends the whole tree,
//! escaped children included; after the leader's exit any job member left is ended too.
//! Identity is the process handle held since `CreateProcessW` and the job handle, never a
//! pid. Each step goes to the action ledger; the runner's open spans get stored ends
//! (`error.type` as on Linux, span events `CTRL_BREAK` / `TerminateJobObject`); the exit
//! code is recorded (137 after `TerminateJobObject`); `runner.terminated` /
//! `runner.exited` / `runner.crashed` incidents are written.
//!
//! Workspace checkpoints are the shared [`Checkpoints`] (its Windows filesystem arm): a
//! runner spawned with a `workspace` gets its staging folder as `STALLWATCH_CHECKPOINT_DIR`,
//! a stop (trip, `DELETE`, shutdown) rolls its open checkpoints back as on Linux, and
//! journaled commits a crash interrupted are rolled forward at start.
//!
//! Not on Windows yet, and refused with [`RegisterError::Unsupported`] (HTTP 501) rather
//! than pretended: attaching an existing process, restarts, the orphan sweep, stall
//! forensics and storing the runner's output as logs (its last stderr lines are kept for
//! incidents).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stallwatch_storage::control::{
    valid_runner_id, ControlRequest, RegisterError, Registered, RunnerChange, RunnerDeleted,
    RunnerError, RunnerLifecycle, RunnerSpec, SpawnSpec, SpawnedRunner, Trip,
};
use stallwatch_storage::model::{EventKind, NewIncident, SpanId, TraceId};
use stallwatch_storage::runners::{ActionRecord, RunnerRow, RunnerRowState};
use stallwatch_storage::{EventBus, Storage};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::Checkpoints;
use crate::checkpoint_edge;
use crate::config::ReaperConfig;
use crate::error::ReaperError;
use crate::settle::{Settled, SETTLE_WAIT};
use crate::spans::{self, EndEvent, ExitAttrs};
use crate::stats::ReaperStats;

pub mod platform;
pub mod process;
mod register;
mod stop;

/// What the Windows build cannot do yet (the start of every 501 message).
pub const UNSUPPORTED: &str = "not available in the Windows build yet (docs/platforms.md)";

/// Longest wait for a runner to exit after `TerminateJobObject`.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// stderr lines kept for incidents.
const TAIL_LINES: usize = 20;

fn now_unix_nano() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The named pipe of a runner: `\\.\pipe\stallwatch-<first 16 hex of sha256(data dir, id)>`.
pub fn pipe_path(data_dir: &Path, id: &str) -> PathBuf {
    let mut h = Sha256::new();
    h.update(data_dir.as_os_str().as_encoded_bytes());
    h.update([0]);
    h.update(id.as_bytes());
    let hex = hex::encode(h.finalize());
    PathBuf::from(format!(r"\\.\pipe\stallwatch-{}", &hex[..16]))
}

struct Entry {
    id: String,
    pid: u32,
    instance_id: String,
    job: process::Job,
    /// The exit code once the runner exited.
    exit: watch::Receiver<Option<i32>>,
    /// A stop (trip, DELETE, shutdown) owns the end.
    stopping: AtomicBool,
    /// The end was handled (by the monitor or a stop).
    finished: AtomicBool,
    stop_lock: tokio::sync::Mutex<()>,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Set once its exit or stop is wholly recorded (span ends, runner row, incident, the
    /// watchdog told): a registration of the same id waits for it (as on Linux,
    /// [`crate::settle`]).
    settled: Settled,
}

impl Entry {
    fn exit_code(&self) -> Option<i32> {
        *self.exit.borrow()
    }

    fn stderr_tail(&self) -> Vec<String> {
        self.tail
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Waits up to `limit` for the exit; answers the code.
    async fn wait_exit(&self, limit: Duration) -> Option<i32> {
        let mut rx = self.exit.clone();
        let _ = tokio::time::timeout(limit, rx.wait_for(Option::is_some)).await;
        self.exit_code()
    }
}

/// One termination, as the API and incidents show it.
#[derive(Debug, serde::Serialize)]
struct Report {
    termination_id: String,
    cause: String,
    /// `ctrl_break` (exited within the grace period), `terminate_job`, or `already_exited`.
    ended_by: String,
    ctrl_break_unix_nano: u64,
    terminate_unix_nano: Option<u64>,
    exit_code: Option<i32>,
    duration_ms: u64,
    steps: Vec<serde_json::Value>,
    /// Job members still alive at the end (pids).
    survivors: Vec<u32>,
}

struct Inner {
    config: ReaperConfig,
    storage: Storage,
    events: EventBus,
    changes: mpsc::Sender<RunnerChange>,
    shutdown: CancellationToken,
    stats: Arc<ReaperStats>,
    runners: Mutex<HashMap<String, Arc<Entry>>>,
    checkpoints: Checkpoints,
}

/// The reaper (see the module docs). Built with [`Reaper::start`].
pub struct Reaper;

/// A cheap handle to the running reaper, for `src/` wiring.
#[derive(Clone)]
pub struct ReaperHandle {
    inner: Arc<Inner>,
}

impl Reaper {
    /// Spawns the config runners and runs the task that acts on `trips` and stops spawned
    /// runners when `shutdown` is cancelled. Must be called inside a tokio runtime.
    ///
    /// Errors: [`ReaperError::Config`] when a config runner cannot be started.
    pub async fn start(
        config: ReaperConfig,
        storage: Storage,
        events: EventBus,
        mut trips: mpsc::Receiver<Trip>,
        changes: mpsc::Sender<RunnerChange>,
        shutdown: CancellationToken,
    ) -> Result<(ReaperHandle, JoinHandle<()>), ReaperError> {
        let stats = Arc::new(ReaperStats::default());
        let handle = ReaperHandle {
            inner: Arc::new(Inner {
                checkpoints: Checkpoints::new(storage.clone(), events.clone(), stats.clone())
                    .with_data_dir(&config.data_dir),
                config: config.clone(),
                storage,
                events,
                changes,
                shutdown: shutdown.clone(),
                stats,
                runners: Mutex::new(HashMap::new()),
            }),
        };
        // Before anything touches a workspace: finish the commits and rollbacks a crash
        // interrupted (issue 17 #1), as on Linux.
        handle
            .inner
            .checkpoints
            .recover_at_start(handle.inner.config.sweep_batch)
            .await;
        for spec in &config.runners {
            handle
                .register(spec.clone())
                .await
                .map_err(|e| ReaperError::Config(e.to_string()))?;
        }
        let h = handle.clone();
        let task = stallwatch_vocabulary::task::spawn_boxed(async move {
            loop {
                tokio::select! {
                    _ = h.inner.shutdown.cancelled() => break,
                    t = trips.recv() => match t {
                        Some(trip) => {
                            let h2 = h.clone();
                            stallwatch_vocabulary::task::spawn_boxed(async move { h2.on_trip(trip).await });
                        }
                        None => {
                            h.inner.shutdown.cancelled().await;
                            break;
                        }
                    },
                }
            }
            h.stop_spawned_runners().await;
        });
        Ok((handle, task))
    }
}

impl ReaperHandle {
    /// The reaper's counters (a [`stallwatch_storage::MetricsSource`]).
    pub fn stats(&self) -> Arc<ReaperStats> {
        self.inner.stats.clone()
    }

    /// Answers one control request: `RegisterRunner`, `DeleteRunner` and the checkpoint
    /// requests. Others belong to the watchdog or `src/`.
    pub async fn handle(&self, req: ControlRequest) {
        match req {
            ControlRequest::RegisterRunner { spec, reply } => {
                let _ = reply.send(self.register(spec).await);
            }
            ControlRequest::DeleteRunner { id, reply } => {
                let _ = reply.send(self.delete(&id).await);
            }
            req if checkpoint_edge::is_checkpoint(&req) => {
                let registered = |id: &str| self.entry(id).is_some();
                let stopping = |id: &str| {
                    self.entry(id)
                        .is_some_and(|e| e.stopping.load(Ordering::SeqCst))
                };
                checkpoint_edge::answer(&self.inner.checkpoints, req, registered, stopping).await;
            }
            _ => {}
        }
    }

    /// Stops every live spawned runner at shutdown, all at once (one grace period whatever
    /// the count). Answers the termination reports as JSON.
    pub async fn stop_spawned_runners(&self) -> Vec<serde_json::Value> {
        let mut set = tokio::task::JoinSet::new();
        for e in self.entries() {
            let h = self.clone();
            set.spawn(async move {
                let r = h.stop(&e, "shutdown").await?;
                h.after_stop(&e, &r, &[]).await;
                Some(serde_json::to_value(&r).unwrap_or_default())
            });
        }
        let mut out = Vec::new();
        while let Some(r) = set.join_next().await {
            if let Ok(Some(v)) = r {
                out.push(v);
            }
        }
        out
    }

    /// A second stop signal. Nothing to hurry on Windows: [`ReaperHandle::kill_all_registered`]
    /// ends every runner's Job Object at once, which is proof of identity by construction.
    pub fn hurry(&self) {}

    /// The last resort at a stuck shutdown: `TerminateJobObject` on every live runner's job.
    /// Answers how many jobs were ended.
    pub async fn kill_all_registered(&self) -> usize {
        self.entries()
            .iter()
            .filter(|e| e.exit_code().is_none())
            .filter(|e| {
                // Its exit is this termination, not a crash (as on Linux).
                e.stopping.store(true, Ordering::SeqCst);
                e.job.terminate().is_ok()
            })
            .count()
    }

    fn entries(&self) -> Vec<Arc<Entry>> {
        self.inner
            .runners
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    fn entry(&self, id: &str) -> Option<Arc<Entry>> {
        self.inner
            .runners
            .lock()
            .ok()
            .and_then(|m| m.get(id).cloned())
    }

    async fn notify(&self, change: RunnerChange) {
        if self.inner.changes.send(change).await.is_err() {
            tracing::debug!("runner change not delivered: receiver gone");
        }
    }

    async fn incident(
        &self,
        kind: EventKind,
        runner_id: &str,
        reason: String,
        evidence: serde_json::Value,
        key: String,
    ) {
        let inc = NewIncident {
            kind,
            runner_id: Some(runner_id.to_string()),
            tool_name: None,
            trace_id: None,
            span_id: None,
            reason,
            evidence,
            idempotency_key: key,
            at_unix_nano: now_unix_nano(),
        };
        if let Err(e) = self.inner.events.publish(inc).await {
            tracing::warn!(runner = runner_id, "incident not recorded: {e}");
        }
    }

    async fn action(
        &self,
        entry: &Entry,
        termination_id: &str,
        step: &str,
        phase: &str,
        detail: serde_json::Value,
    ) {
        let _ = self
            .inner
            .storage
            .record_action(ActionRecord {
                runner_id: entry.id.clone(),
                termination_id: termination_id.to_string(),
                step: step.into(),
                phase: phase.into(),
                pid: Some(entry.pid),
                detail,
                at_unix_nano: now_unix_nano(),
            })
            .await;
    }
}
