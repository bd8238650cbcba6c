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
//! Not on Windows yet, and refused with [`RegisterError::Unsupported`] (HTTP 501) rather
//! than pretended: attaching an existing process, workspace checkpoints, restarts, the
//! orphan sweep, stall forensics and storing the runner's output as logs (its last stderr
//! lines are kept for incidents).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stallwatch_storage::control::{
    valid_runner_id, CheckpointError, ControlRequest, RegisterError, Registered, RunnerChange,
    RunnerDeleted, RunnerError, RunnerLifecycle, RunnerSpec, SpawnSpec, SpawnedRunner, Trip,
};
use stallwatch_storage::model::{EventKind, NewIncident, SpanId, TraceId};
use stallwatch_storage::runners::{ActionRecord, RunnerRow, RunnerRowState};
use stallwatch_storage::{EventBus, Storage};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::ReaperConfig;
use crate::error::ReaperError;
use crate::spans::{self, EndEvent, ExitAttrs};
use crate::stats::ReaperStats;

pub mod platform;
pub mod process;

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
        let handle = ReaperHandle {
            inner: Arc::new(Inner {
                config: config.clone(),
                storage,
                events,
                changes,
                shutdown: shutdown.clone(),
                stats: Arc::new(ReaperStats::default()),
                runners: Mutex::new(HashMap::new()),
            }),
        };
        for spec in &config.runners {
            handle
                .register(spec.clone())
                .await
                .map_err(|e| ReaperError::Config(e.to_string()))?;
        }
        let h = handle.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = h.inner.shutdown.cancelled() => break,
                    t = trips.recv() => match t {
                        Some(trip) => {
                            let h2 = h.clone();
                            tokio::spawn(async move { h2.on_trip(trip).await });
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

    /// Answers one control request: `RegisterRunner`, `DeleteRunner`; checkpoint requests
    /// are refused (no checkpoints on Windows yet). Others belong to the watchdog or `src/`.
    pub async fn handle(&self, req: ControlRequest) {
        match req {
            ControlRequest::RegisterRunner { spec, reply } => {
                let _ = reply.send(self.register(spec).await);
            }
            ControlRequest::DeleteRunner { id, reply } => {
                let _ = reply.send(self.delete(&id).await);
            }
            ControlRequest::CreateCheckpoint { reply, .. } => {
                let _ = reply.send(Err(CheckpointError::InvalidWorkspace(format!(
                    "workspace checkpoints are {UNSUPPORTED}"
                ))));
            }
            ControlRequest::CommitCheckpoint { id, reply }
            | ControlRequest::RollbackCheckpoint { id, reply } => {
                let _ = reply.send(Err(CheckpointError::NotFound(format!(
                    "no checkpoint {id}"
                ))));
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

    /// The last resort at a stuck shutdown: `TerminateJobObject` on every live runner's job.
    /// Answers how many jobs were ended.
    pub async fn kill_all_registered(&self) -> usize {
        self.entries()
            .iter()
            .filter(|e| e.exit_code().is_none() && e.job.terminate().is_ok())
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

    async fn register(&self, spec: RunnerSpec) -> Result<Registered, RegisterError> {
        let bad = RegisterError::Invalid;
        if !valid_runner_id(&spec.id) {
            return Err(bad(format!(
                "runner id {:?} must match ^[a-z0-9][a-z0-9._-]{{0,62}}$",
                spec.id
            )));
        }
        let spawn = match (&spec.spawn, &spec.attach) {
            (Some(s), None) => s.clone(),
            (None, Some(_)) => {
                return Err(RegisterError::Unsupported(format!(
                    "runner {}: attaching an existing process is {UNSUPPORTED}",
                    spec.id
                )))
            }
            _ => {
                return Err(bad(format!(
                    "runner {}: exactly one of spawn or attach is required",
                    spec.id
                )))
            }
        };
        validate_spawn(&spec, &spawn)?;
        let cfg = &self.inner.config;
        let live = self
            .entries()
            .iter()
            .filter(|e| e.id != spec.id && e.exit_code().is_none())
            .count();
        if live >= cfg.max_runners {
            return Err(RegisterError::TooMany(format!(
                "{live} runners are registered; the limit is [reaper] max_runners = {}",
                cfg.max_runners
            )));
        }
        if self
            .entry(&spec.id)
            .is_some_and(|e| e.exit_code().is_none())
        {
            return Err(RegisterError::IdInUse(spec.id.clone()));
        }
        let id = spec.id.clone();
        let pipe = spec
            .heartbeat_socket
            .clone()
            .unwrap_or_else(|| pipe_path(&cfg.data_dir, &id));
        let instance_id = uuid::Uuid::new_v4().to_string();
        let env = runner_env(cfg, &id, &spawn, &pipe, &instance_id);
        let (mut child, job, created) = spawn_in_job(&spawn, &env).map_err(|e| {
            RegisterError::SpawnFailed(format!("cannot start runner {id} ({}): {e}", spawn.argv[0]))
        })?;
        let pid = child.id().unwrap_or(0);
        self.inner
            .stats
            .runners_spawned
            .fetch_add(1, Ordering::Relaxed);
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            tokio::spawn(drain(out, None));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(drain(err, Some(tail.clone())));
        }
        let (exit_tx, exit_rx) = watch::channel(None);
        let entry = Arc::new(Entry {
            id: id.clone(),
            pid,
            instance_id: instance_id.clone(),
            job,
            exit: exit_rx,
            stopping: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            stop_lock: tokio::sync::Mutex::new(()),
            tail,
        });
        if let Ok(mut m) = self.inner.runners.lock() {
            m.insert(id.clone(), entry.clone());
        }
        let now = now_unix_nano();
        let row = RunnerRow {
            id: id.clone(),
            spawned: true,
            spec: serde_json::to_value(&spec).unwrap_or_default(),
            pid: Some(pid),
            start_time_ticks: Some(created),
            boot_id: Some(String::new()),
            pgid: Some(pid),
            instance_id: Some(instance_id.clone()),
            heartbeat_socket: Some(pipe.to_string_lossy().into_owned()),
            state: RunnerRowState::Running,
            detail: serde_json::json!({"platform": "windows", "job_object": true}),
            registered_unix_nano: now,
            updated_unix_nano: now,
        };
        if let Err(e) = self.inner.storage.upsert_runner(row).await {
            tracing::error!(runner = %id, "runner row not written: {e}");
        }
        self.incident(
            EventKind::RunnerStarted,
            &id,
            format!("runner {id} started as pid {pid} in its own Job Object"),
            serde_json::json!({"pid": pid, "instance_id": instance_id, "argv": spawn.argv, "socket": pipe}),
            format!("runner.started:{id}:{instance_id}"),
        )
        .await;
        self.notify(RunnerChange::Registered {
            id: id.clone(),
            pid: Some(pid),
            heartbeat_socket: Some(pipe.clone()),
            spawned: true,
            restarted: false,
        })
        .await;
        let h = self.clone();
        let monitored = entry.clone();
        tokio::spawn(async move {
            let code = child.wait().await.ok().and_then(|s| s.code());
            let _ = exit_tx.send(Some(code.unwrap_or(-1)));
            h.on_exit(monitored).await;
        });
        Ok(Registered::Spawned(SpawnedRunner {
            id,
            spawned: true,
            pid,
            start_time_ticks: created,
            instance_id,
            heartbeat_socket: pipe,
            socket_fallback: None,
            checkpoint: None,
        }))
    }

    /// The runner exited by itself: end what is left of its job (the tree goes with its
    /// leader), close its spans, record the exit.
    async fn on_exit(&self, entry: Arc<Entry>) {
        if entry.stopping.load(Ordering::SeqCst) || entry.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        let at = now_unix_nano();
        let code = entry.exit_code();
        let leftovers = entry.job.pids().unwrap_or_default();
        if !leftovers.is_empty() {
            let _ = entry.job.terminate();
        }
        let (state, kind, cause) = if code == Some(0) {
            (
                RunnerRowState::Exited,
                EventKind::RunnerExited,
                "runner_exited",
            )
        } else {
            (
                RunnerRowState::Crashed,
                EventKind::RunnerCrashed,
                "runner_crashed",
            )
        };
        let id = entry.id.clone();
        let why = format!("runner {id} exited with code {}", code.unwrap_or(-1));
        let events = vec![EndEvent {
            name: "runner.exit".into(),
            at_unix_nano: at,
        }];
        let closed = self
            .close_spans(&id, cause, &why, code, at, &events, &[])
            .await;
        let evidence = serde_json::json!({
            "exit_code": code, "job_members_ended": leftovers, "spans_closed": closed,
            "last_stderr": entry.stderr_tail(),
        });
        let _ = self
            .inner
            .storage
            .set_runner_state(id.clone(), state, evidence.clone(), at)
            .await;
        self.incident(
            kind,
            &id,
            why,
            evidence,
            stallwatch_storage::keys::runner_instance(kind, &id, &entry.instance_id),
        )
        .await;
        self.notify(RunnerChange::Gone { id, removed: false }).await;
    }

    /// Stores ends for the runner's open spans (the ledger's plus `known`); answers how
    /// many were written.
    #[allow(clippy::too_many_arguments)]
    async fn close_spans(
        &self,
        runner_id: &str,
        error_type: &str,
        reason: &str,
        code: Option<i32>,
        at: u64,
        events: &[EndEvent],
        known: &[(TraceId, SpanId)],
    ) -> usize {
        let mut keys = known.to_vec();
        match self
            .inner
            .storage
            .ledger_runner_open(runner_id.to_string())
            .await
        {
            Ok(rows) => keys.extend(rows),
            Err(e) => tracing::warn!(runner = runner_id, "open spans not read: {e}"),
        }
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            return 0;
        }
        let attrs = Some(ExitAttrs { code, signal: None });
        let (written, ended) = spans::close_spans_with(
            &self.inner.storage,
            runner_id,
            &keys,
            error_type,
            reason,
            at,
            events,
            attrs,
        )
        .await;
        self.inner
            .stats
            .spans_closed
            .fetch_add(written as u64, Ordering::Relaxed);
        if !ended.is_empty() {
            self.notify(RunnerChange::SpansEnded {
                id: runner_id.to_string(),
                spans: ended,
            })
            .await;
        }
        written
    }

    /// `CTRL_BREAK_EVENT` to the runner's group, the grace period, `TerminateJobObject`;
    /// then any job member left after the leader's exit is ended too. `None` when the runner
    /// had already ended (nothing was sent).
    async fn stop(&self, entry: &Arc<Entry>, cause: &str) -> Option<Report> {
        let _g = entry.stop_lock.lock().await;
        if entry.finished.load(Ordering::SeqCst) {
            return None;
        }
        entry.stopping.store(true, Ordering::SeqCst);
        self.notify(RunnerChange::Lifecycle {
            id: entry.id.clone(),
            lifecycle: RunnerLifecycle::Stopping,
        })
        .await;
        self.inner
            .stats
            .terminations
            .fetch_add(1, Ordering::Relaxed);
        let tid = uuid::Uuid::new_v4().to_string();
        let started = Instant::now();
        let mut steps = Vec::new();
        let break_at = now_unix_nano();
        let mut ended_by = "ctrl_break";
        if entry.exit_code().is_some() {
            ended_by = "already_exited";
        } else {
            let sent = process::ctrl_break(entry.pid);
            let detail = serde_json::json!({
                "pgid": entry.pid, "grace_ms": self.inner.config.grace.as_millis() as u64,
                "error": sent.as_ref().err().map(|e| e.to_string()),
            });
            self.action(
                entry,
                &tid,
                "ctrl_break",
                if sent.is_ok() { "sent" } else { "failed" },
                detail.clone(),
            )
            .await;
            steps.push(serde_json::json!({"step": "ctrl_break", "at_unix_nano": break_at, "detail": detail}));
            if sent.is_ok() {
                self.inner
                    .stats
                    .sigterm_sent
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut terminate_at = None;
        if entry.wait_exit(self.inner.config.grace).await.is_none() {
            ended_by = "terminate_job";
            let at = now_unix_nano();
            terminate_at = Some(at);
            let r = entry.job.terminate();
            self.inner
                .stats
                .sigkill_sent
                .fetch_add(1, Ordering::Relaxed);
            let detail = serde_json::json!({"error": r.as_ref().err().map(|e| e.to_string())});
            self.action(
                entry,
                &tid,
                "terminate_job",
                if r.is_ok() { "sent" } else { "failed" },
                detail.clone(),
            )
            .await;
            steps.push(
                serde_json::json!({"step": "terminate_job", "at_unix_nano": at, "detail": detail}),
            );
            entry.wait_exit(KILL_WAIT).await;
        }
        // The leader is gone; members of its job (escaped children) must not outlive it.
        let left = entry.job.pids().unwrap_or_default();
        if !left.is_empty() {
            let at = now_unix_nano();
            let r = entry.job.terminate();
            let detail = serde_json::json!({"members": left, "error": r.as_ref().err().map(|e| e.to_string())});
            self.action(entry, &tid, "terminate_job_members", "sent", detail.clone())
                .await;
            steps.push(serde_json::json!({"step": "terminate_job_members", "at_unix_nano": at, "detail": detail}));
            let deadline = Instant::now() + KILL_WAIT;
            while Instant::now() < deadline && !entry.job.pids().unwrap_or_default().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let survivors = entry.job.pids().unwrap_or_default();
        let exit_code = entry.exit_code();
        self.action(
            entry,
            &tid,
            "exit",
            "done",
            serde_json::json!({"exit_code": exit_code, "ended_by": ended_by, "survivors": survivors}),
        )
        .await;
        entry.finished.store(true, Ordering::SeqCst);
        Some(Report {
            termination_id: tid,
            cause: cause.to_string(),
            ended_by: ended_by.to_string(),
            ctrl_break_unix_nano: break_at,
            terminate_unix_nano: terminate_at,
            exit_code,
            duration_ms: started.elapsed().as_millis() as u64,
            steps,
            survivors,
        })
    }

    /// After a stop: close the runner's spans, record the end, write the incident.
    async fn after_stop(
        &self,
        entry: &Arc<Entry>,
        report: &Report,
        open_spans: &[(TraceId, SpanId)],
    ) {
        let id = entry.id.clone();
        let cause = report.cause.as_str();
        let mut events = vec![EndEvent {
            name: "CTRL_BREAK".into(),
            at_unix_nano: report.ctrl_break_unix_nano,
        }];
        if let Some(k) = report.terminate_unix_nano {
            events.push(EndEvent {
                name: "TerminateJobObject".into(),
                at_unix_nano: k,
            });
        }
        let error_type = if cause == "delete" {
            "killed"
        } else {
            "timeout"
        };
        let why = format!("runner {id} stopped by stallwatch ({cause})");
        let closed = self
            .close_spans(
                &id,
                error_type,
                &why,
                report.exit_code,
                report.ctrl_break_unix_nano,
                &events,
                open_spans,
            )
            .await;
        let state = if cause == "delete" {
            RunnerRowState::Removed
        } else {
            RunnerRowState::Terminated
        };
        let evidence = serde_json::json!({
            "cause": cause, "report": report, "spans_closed": closed,
            "last_stderr": entry.stderr_tail(),
        });
        let _ = self
            .inner
            .storage
            .set_runner_state(id.clone(), state, evidence.clone(), now_unix_nano())
            .await;
        self.incident(
            EventKind::RunnerTerminated,
            &id,
            format!(
                "runner {id} stopped ({cause}): ended by {} after {} ms{}",
                report.ended_by,
                report.duration_ms,
                if report.survivors.is_empty() {
                    String::new()
                } else {
                    format!(", {} survivors", report.survivors.len())
                }
            ),
            evidence,
            stallwatch_storage::keys::runner_terminated(&id, &report.termination_id),
        )
        .await;
        self.notify(RunnerChange::Gone {
            id,
            removed: cause == "delete",
        })
        .await;
    }

    async fn on_trip(&self, trip: Trip) {
        let Some(entry) = self.entry(&trip.runner_id) else {
            tracing::warn!(runner = %trip.runner_id, "trip for an unknown runner ignored");
            return;
        };
        let tid =
            stallwatch_storage::keys::trip_termination_id(&entry.instance_id, trip.at_unix_nano);
        self.action(
            &entry,
            &tid,
            "open_spans",
            "done",
            serde_json::json!({
                "verdict": trip.verdict, "reason": trip.reason, "incident_id": trip.incident_id,
                "spans": trip.open_spans.iter().map(|(t, s)| [t.to_hex(), s.to_hex()]).collect::<Vec<_>>(),
            }),
        )
        .await;
        let cause = stallwatch_storage::keys::StopCause::trip(trip.verdict.as_str()).to_string();
        if let Some(report) = self.stop(&entry, &cause).await {
            self.after_stop(&entry, &report, &trip.open_spans).await;
        }
    }

    async fn delete(&self, id: &str) -> Result<RunnerDeleted, RunnerError> {
        let Some(entry) = self.entry(id) else {
            return Err(RunnerError::NotFound(format!("no runner {id}")));
        };
        let report = self.stop(&entry, "delete").await;
        match &report {
            Some(r) => self.after_stop(&entry, r, &[]).await,
            None => {
                let _ = self
                    .inner
                    .storage
                    .set_runner_state(
                        id.to_string(),
                        RunnerRowState::Removed,
                        serde_json::json!({"cause": "delete"}),
                        now_unix_nano(),
                    )
                    .await;
                self.notify(RunnerChange::Gone {
                    id: id.to_string(),
                    removed: true,
                })
                .await;
            }
        }
        if let Ok(mut m) = self.inner.runners.lock() {
            if m.get(id).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                m.remove(id);
            }
        }
        let json = |v: &serde_json::Value| v.clone();
        let value = report
            .as_ref()
            .map(|r| serde_json::to_value(r).unwrap_or_default());
        Ok(RunnerDeleted {
            id: id.to_string(),
            removed: true,
            steps: report
                .as_ref()
                .map(|r| r.steps.iter().map(json).collect())
                .unwrap_or_default(),
            survivors: report
                .as_ref()
                .map(|r| {
                    r.survivors
                        .iter()
                        .map(|p| serde_json::json!({"pid": p}))
                        .collect()
                })
                .unwrap_or_default(),
            termination: value,
        })
    }
}

/// The spawn checks of the Linux reaper that apply here, plus: no workspace (checkpoints
/// are not available) and a heartbeat path that is a named pipe.
fn validate_spawn(spec: &RunnerSpec, spawn: &SpawnSpec) -> Result<(), RegisterError> {
    let bad = RegisterError::Invalid;
    if spawn.argv.is_empty() || spawn.argv[0].is_empty() {
        return Err(bad(format!("runner {}: spawn.argv is empty", spec.id)));
    }
    if let Some(k) = spawn
        .env
        .keys()
        .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
    {
        return Err(bad(format!(
            "runner {}: env key {k:?} must be non-empty, without '=' or NUL",
            spec.id
        )));
    }
    if let Some(cwd) = &spawn.cwd {
        if !cwd.is_dir() {
            return Err(bad(format!(
                "runner {}: cwd {} is missing or not a folder",
                spec.id,
                cwd.display()
            )));
        }
    }
    if let Some(p) = &spec.heartbeat_socket {
        if !p.to_string_lossy().starts_with(r"\\.\pipe\") {
            return Err(bad(format!(
                r"runner {}: heartbeat_socket {} must be a named pipe (\\.\pipe\...) on Windows",
                spec.id,
                p.display()
            )));
        }
    }
    if spawn.workspace.is_some() {
        return Err(RegisterError::Unsupported(format!(
            "runner {}: workspace checkpoints are {UNSUPPORTED}",
            spec.id
        )));
    }
    Ok(())
}

/// The injected environment, as on Linux (docs/design.md, Interfaces: Runners): inherited <
/// injected < the runner's own `env`.
fn runner_env(
    config: &ReaperConfig,
    id: &str,
    spawn: &SpawnSpec,
    pipe: &Path,
    instance_id: &str,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("STALLWATCH_RUNNER_ID".into(), id.into());
    env.insert("STALLWATCH_RUNNER_INSTANCE".into(), instance_id.into());
    env.insert(
        "STALLWATCH_HEARTBEAT_SOCKET".into(),
        pipe.to_string_lossy().into_owned(),
    );
    env.insert(
        "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
        config.otlp_endpoint.clone(),
    );
    env.insert("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/protobuf".into());
    if let Some(h) = &config.otlp_headers {
        env.insert("OTEL_EXPORTER_OTLP_HEADERS".into(), h.clone());
    }
    env.insert("OTEL_SERVICE_NAME".into(), id.into());
    env.insert("PYTHONUNBUFFERED".into(), "1".into());
    for (k, v) in &spawn.env {
        env.insert(k.clone(), v.clone());
    }
    let theirs = spawn
        .env
        .get("OTEL_RESOURCE_ATTRIBUTES")
        .map(String::as_str)
        .unwrap_or("");
    env.insert(
        "OTEL_RESOURCE_ATTRIBUTES".into(),
        crate::env::merge_resource_attributes(theirs, id, instance_id),
    );
    env
}

/// Creates the runner suspended in its own console process group, puts it into a fresh
/// Job Object, then resumes it. Answers the child, its job and its creation time (100 ns
/// ticks since 1601, `GetProcessTimes`). On any failure after creation the job is dropped,
/// which ends the process (kill-on-job-close) or the child is killed.
fn spawn_in_job(
    spawn: &SpawnSpec,
    env: &BTreeMap<String, String>,
) -> std::io::Result<(tokio::process::Child, process::Job, u64)> {
    use windows_sys::Win32::System::Threading::{CREATE_NEW_PROCESS_GROUP, CREATE_SUSPENDED};
    let mut cmd = tokio::process::Command::new(&spawn.argv[0]);
    cmd.args(&spawn.argv[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .creation_flags(CREATE_NEW_PROCESS_GROUP | CREATE_SUSPENDED);
    for k in crate::env::SCRUBBED_OTLP_VARIABLES {
        if !spawn.env.contains_key(k) {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env);
    if let Some(cwd) = &spawn.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd.spawn()?;
    let placed: std::io::Result<(process::Job, u64)> = (|| {
        let job = process::Job::new()?;
        let raw = child
            .raw_handle()
            .ok_or_else(|| std::io::Error::other("the runner has no process handle"))?;
        job.assign(raw)?;
        let created = process::creation_time(raw)?;
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("the runner has no pid"))?;
        process::resume_threads(pid)?;
        Ok((job, created))
    })();
    match placed {
        Ok((job, created)) => Ok((child, job, created)),
        Err(e) => {
            let _ = child.start_kill();
            Err(e)
        }
    }
}

/// Reads a runner's output so its pipe never fills; stderr lines go to the tail.
async fn drain<R>(r: R, tail: Option<Arc<Mutex<VecDeque<String>>>>)
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(t) = &tail {
            if let Ok(mut t) = t.lock() {
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
        }
    }
}
