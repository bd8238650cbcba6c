//! The reaper task: owns every runner, answers control requests, acts on trips, restarts
//! spawned runners under the restart policy, and reaps zombie children nobody owns.
//!
//! Each runner has one lock around its process state. Whoever holds it (the exit monitor,
//! a termination) is the only one allowed to reap the leader, so `kill(-pgid)` is only sent
//! while the leader is an unreaped child. Unowned zombies (descendants re-parented to
//! stallwatch, a child subreaper) are found by peeking with `waitid(P_ALL, WNOHANG |
//! WNOWAIT)`, then reaped by pid only when no runner owns them and they were already seen on
//! the previous pass, so another owner's `wait` always wins the race (docs/design.md, Linux notes).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stallwatch_storage::control::{
    AttachedRunner, ControlRequest, RegisterError, Registered, RunnerChange, RunnerDeleted,
    RunnerError, RunnerLifecycle, RunnerSpec, SpawnedRunner, Trip,
};
use stallwatch_storage::model::{
    now_unix_nano, AnyValue, EventKind, KeyValue, LogBatch, LogRecord, NewIncident, Resource,
    ResourceLogs, Scope, ScopeLogs, SpanId, TraceId,
};
use stallwatch_storage::runners::{ActionRecord, RunnerRow, RunnerRowState};
use stallwatch_storage::{EventBus, Storage};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::Checkpoints;
use crate::checkpoint_edge;
use crate::config::{ReaperConfig, RestartPolicy};
use crate::ends::EndCause;
use crate::error::ReaperError;
use crate::platform::{self, ExitInfo};
use crate::runner::{self, OutputTail};
use crate::spans::EndEvent;
use crate::stats::ReaperStats;
use crate::terminate::{self, Resume, Target, TerminationReport};

/// Decides whether one more restart fits the policy (pure; `now` given). Drops entries older
/// than the window from `history` and records `now` when the answer is yes.
pub fn allow_restart(history: &mut VecDeque<Instant>, now: Instant, policy: RestartPolicy) -> bool {
    while history
        .front()
        .is_some_and(|t| now.saturating_duration_since(*t) >= policy.window)
    {
        history.pop_front();
    }
    if history.len() as u32 >= policy.max_restarts {
        return false;
    }
    history.push_back(now);
    true
}

/// Pids of spawned runners not yet reaped, process-wide: the unowned-zombie reaper of any
/// reaper instance must never take them (their owner reaps them with their status).
static OWNED_PIDS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// The process side of a runner, behind its lock.
struct ProcState {
    /// Pidfd held since spawn/attach; `None` when identity cannot be proven.
    pidfd: Option<OwnedFd>,
    /// Set once the leader was reaped (spawned) or seen gone (attached).
    finished: bool,
    /// A termination owns the outcome (no restart / crash incident from the monitor).
    stopping: bool,
    /// The last termination's report.
    last_report: Option<TerminationReport>,
}

struct Entry {
    id: String,
    spec: RunnerSpec,
    spawned: bool,
    /// Started by stallwatch, in this run or (re-adopted after a crash) an earlier one:
    /// stopped at shutdown. An adopted one is no longer our child, so it is signalled only
    /// through its pidfd after the identity checks, never by process group.
    stop_at_shutdown: bool,
    pid: u32,
    start_time_ticks: Option<u64>,
    instance_id: String,
    heartbeat_socket: Option<PathBuf>,
    tail: OutputTail,
    readers: Mutex<Vec<JoinHandle<()>>>,
    proc: tokio::sync::Mutex<ProcState>,
    alive: AtomicBool,
}

impl Entry {
    /// The instance mark its descendants carry: spawned runners (of this run or re-adopted)
    /// got `STALLWATCH_RUNNER_INSTANCE=<instance_id>`; an attached process did not.
    fn mark(&self) -> Option<&str> {
        (self.spawned || self.stop_at_shutdown).then_some(self.instance_id.as_str())
    }
}

struct Inner {
    config: ReaperConfig,
    storage: Storage,
    events: EventBus,
    changes: mpsc::Sender<RunnerChange>,
    shutdown: CancellationToken,
    stats: Arc<ReaperStats>,
    checkpoints: Checkpoints,
    runners: Mutex<HashMap<String, Arc<Entry>>>,
    restarts: Mutex<HashMap<String, VecDeque<Instant>>>,
    stopping_all: AtomicBool,
    boot_id: String,
    started_unix_nano: u64,
    forensics: Arc<crate::forensics::Forensics>,
}

/// The reaper (see the crate docs). Built with [`Reaper::start`].
pub struct Reaper;

/// A cheap handle to the running reaper, for `src/` wiring.
#[derive(Clone)]
pub struct ReaperHandle {
    inner: Arc<Inner>,
}

fn internal(e: impl std::fmt::Display) -> RegisterError {
    RegisterError::Internal(e.to_string())
}

impl Reaper {
    /// Becomes a child subreaper, spawns the config runners, starts the orphan sweep in the
    /// background, and runs the task that acts on `trips`, reaps unowned zombies, and stops
    /// spawned runners when `shutdown` is cancelled. Must be called inside a tokio runtime.
    ///
    /// Errors: [`ReaperError::Os`] when the subreaper flag or the boot id is refused;
    /// [`ReaperError::Config`] when a config runner cannot be started.
    pub async fn start(
        config: ReaperConfig,
        storage: Storage,
        events: EventBus,
        mut trips: mpsc::Receiver<Trip>,
        changes: mpsc::Sender<RunnerChange>,
        shutdown: CancellationToken,
    ) -> Result<(ReaperHandle, JoinHandle<()>), ReaperError> {
        platform::set_child_subreaper()?;
        let boot_id = platform::boot_id()?;
        let stats = Arc::new(ReaperStats::default());
        let inner = Arc::new(Inner {
            checkpoints: Checkpoints::new(storage.clone(), events.clone(), stats.clone())
                .with_data_dir(&config.data_dir),
            config: config.clone(),
            storage,
            events,
            changes,
            shutdown: shutdown.clone(),
            stats,
            runners: Mutex::new(HashMap::new()),
            restarts: Mutex::new(HashMap::new()),
            stopping_all: AtomicBool::new(false),
            boot_id,
            started_unix_nano: now_unix_nano(),
            forensics: Arc::new(crate::forensics::Forensics::new(&config)),
        });
        let handle = ReaperHandle { inner };
        // Before anything else touches a workspace: finish the commits and rollbacks a crash
        // interrupted, whether or not their runners live (issue 17 #1).
        let (recovered, errors) = handle
            .inner
            .checkpoints
            .recover(handle.inner.config.sweep_batch)
            .await;
        if !recovered.is_empty() || !errors.is_empty() {
            tracing::info!(
                ?recovered,
                ?errors,
                "checkpoints interrupted by a crash settled"
            );
        }
        crate::forensics::start(handle.clone());
        for spec in &config.runners {
            // A process of this id left by a crashed run is settled first, so the sweep
            // and this registration never race over the same id.
            crate::sweep::settle_config_runner(&handle, &spec.id).await;
            handle
                .register(spec.clone(), false)
                .await
                .map_err(|e| ReaperError::Config(e.to_string()))?;
        }
        // The sweep reads rows left by the previous run; it skips runners of this run, so it
        // starts once the config runners are settled and registered.
        let sweeper = handle.clone();
        let sweep_task = tokio::spawn(async move {
            let report = crate::sweep::sweep(&sweeper).await;
            let orphaned: Vec<String> = report
                .orphaned
                .iter()
                .map(|(id, why)| format!("{id} ({why})"))
                .collect();
            tracing::info!(
                adopted = report.adopted.len(),
                adopted_ids = %report.adopted.join(","),
                orphaned = report.orphaned.len(),
                orphaned_ids = %orphaned.join(", "),
                checkpoints_settled = report.checkpoints.len(),
                spans_closed = report.spans_closed,
                errors = report.errors.len(),
                first_error = %report.errors.first().map(String::as_str).unwrap_or(""),
                "orphan sweep finished"
            );
        });
        let h = handle.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(h.inner.config.zombie_interval);
            let mut seen: HashSet<u32> = HashSet::new();
            loop {
                tokio::select! {
                    _ = h.inner.shutdown.cancelled() => break,
                    t = trips.recv() => match t {
                        Some(trip) => {
                            let h2 = h.clone();
                            tokio::spawn(async move { h2.on_trip(trip).await; });
                        }
                        None => {
                            // No more trips; keep reaping until shutdown.
                            h.inner.shutdown.cancelled().await;
                            break;
                        }
                    },
                    _ = tick.tick() => { h.reap_unowned(&mut seen, false); }
                }
            }
            h.stop_spawned_runners().await;
            sweep_task.abort();
            let mut none = HashSet::new();
            h.reap_unowned(&mut none, true);
        });
        Ok((handle, task))
    }
}

impl ReaperHandle {
    /// The reaper's counters (a [`stallwatch_storage::MetricsSource`]).
    pub fn stats(&self) -> Arc<ReaperStats> {
        self.inner.stats.clone()
    }

    /// Answers one control request: `RegisterRunner`, `DeleteRunner`, `CreateCheckpoint`,
    /// `CommitCheckpoint`, `RollbackCheckpoint` (through its oneshot, with the typed answer or
    /// error of each operation). Other requests are ignored (they belong to the watchdog or `src/`).
    pub async fn handle(&self, req: ControlRequest) {
        match req {
            ControlRequest::RegisterRunner { spec, reply } => {
                let _ = reply.send(self.register(spec, true).await);
            }
            ControlRequest::DeleteRunner { id, reply } => {
                let _ = reply.send(self.delete(&id).await);
            }
            ControlRequest::CreateCheckpoint {
                runner_id,
                workspace,
                reply,
            } => {
                let r = if self.entry(&runner_id).is_none() {
                    Err(crate::checkpoint::CheckpointError::RunnerNotFound(
                        runner_id,
                    ))
                } else {
                    self.inner.checkpoints.create(&runner_id, &workspace).await
                };
                let _ = reply.send(checkpoint_edge::reply(r));
            }
            ControlRequest::CommitCheckpoint { id, reply } => {
                let r = self.inner.checkpoints.commit(&id).await;
                let _ = reply.send(checkpoint_edge::reply(r));
            }
            ControlRequest::RollbackCheckpoint { id, reply } => {
                let r = self.inner.checkpoints.rollback(&id, "requested").await;
                let _ = reply.send(checkpoint_edge::reply(r));
            }
            _ => {}
        }
    }

    /// Stops every spawned runner at shutdown, including spawned runners of an earlier run
    /// re-adopted by the orphan sweep; attached runners are left alone. All are stopped
    /// together (`shutdown::stop_all`: SIGTERM to all, one grace period, SIGKILL
    /// to survivors), so this takes about one grace period whatever the count (issue 17
    /// #10). A runner whose lock a DELETE or trip holds finishes its own sequence
    /// concurrently. Answers the reports. No restarts happen afterwards.
    pub async fn stop_spawned_runners(&self) -> Vec<TerminationReport> {
        self.inner.stopping_all.store(true, Ordering::SeqCst);
        let entries: Vec<Arc<Entry>> = self
            .entries()
            .into_iter()
            .filter(|e| e.stop_at_shutdown)
            .collect();
        let mut others = tokio::task::JoinSet::new();
        let mut held = Vec::new();
        for e in &entries {
            match e.proc.try_lock() {
                Ok(g) if g.finished => {}
                Ok(g) if g.pidfd.is_some() => held.push((e, g)),
                _ => {
                    let (h, e) = (self.clone(), e.clone());
                    others.spawn(async move {
                        let r = h.stop(&e, "shutdown", None).await;
                        if let Some(r) = &r {
                            h.after_stop(&e, r, "shutdown", &[]).await;
                        }
                        r
                    });
                }
            }
        }
        let owned: Vec<bool> = held
            .iter()
            .map(|(e, _)| e.spawned && self.owns(e.pid))
            .collect();
        let members: Vec<crate::shutdown::Member<'_>> = held
            .iter()
            .zip(&owned)
            .filter_map(|((e, g), own)| {
                Some(crate::shutdown::Member {
                    runner_id: &e.id,
                    pid: e.pid,
                    pidfd: g.pidfd.as_ref()?,
                    mark: e.mark(),
                    own_child_group: *own,
                })
            })
            .collect();
        let reports = crate::shutdown::stop_all(
            &self.inner.storage,
            &self.inner.stats,
            self.inner.config.grace,
            &members,
            "shutdown",
        )
        .await;
        drop(members);
        let mut after = tokio::task::JoinSet::new();
        let mut out = Vec::new();
        for ((e, mut g), r) in held.into_iter().zip(reports) {
            g.stopping = true;
            g.finished = true;
            g.last_report = Some(r.clone());
            e.alive.store(false, Ordering::SeqCst);
            if let Ok(mut o) = OWNED_PIDS.lock() {
                o.remove(&e.pid);
            }
            drop(g);
            let (h, e, r2) = (self.clone(), e.clone(), r.clone());
            after.spawn(async move {
                h.wait_readers(&e).await;
                h.after_stop(&e, &r2, "shutdown", &[]).await;
            });
            out.push(r);
        }
        while let Some(r) = others.join_next().await {
            if let Ok(Some(r)) = r {
                out.push(r);
            }
        }
        while after.join_next().await.is_some() {}
        out
    }

    /// Past the shutdown deadline: SIGKILL every spawned runner still registered (its group
    /// while it is our unreaped child, else through its pidfd) and reap our own, so
    /// stallwatch never exits with a spawned runner alive (issue 17 #10). Never waits on a
    /// runner's lock. Answers how many were signalled.
    pub async fn kill_all_registered(&self) -> usize {
        let mut n = 0;
        let mut reap = Vec::new();
        for e in self.entries().into_iter().filter(|e| e.stop_at_shutdown) {
            let own = e.spawned && self.owns(e.pid);
            let Ok(g) = e.proc.try_lock() else {
                if own {
                    // Held by a sequence that missed the deadline: the group is still pinned.
                    let pgid = e.pid;
                    n += usize::from(
                        platform::send_signal(
                            platform::SignalTarget::Group { pgid },
                            platform::Sig::Kill,
                        )
                        .is_ok(),
                    );
                    reap.push(e.pid);
                }
                continue;
            };
            let Some(fd) = g.pidfd.as_ref() else { continue };
            if g.finished || platform::pidfd_exited(platform::borrow(fd)) {
                continue;
            }
            let target = if own {
                platform::SignalTarget::Group { pgid: e.pid }
            } else {
                platform::SignalTarget::Pidfd {
                    fd: platform::borrow(fd),
                    pid: e.pid,
                }
            };
            n += usize::from(platform::send_signal(target, platform::Sig::Kill).is_ok());
            if own {
                reap.push(e.pid);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !reap.is_empty() && Instant::now() < deadline {
            reap.retain(|pid| !matches!(platform::reap_child(*pid), Ok(Some(_))));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        n
    }

    /// The termination report of `id`'s last stop, if any (for tests and the DELETE answer).
    pub async fn last_report(&self, id: &str) -> Option<TerminationReport> {
        let e = self.entry(id)?;
        let st = e.proc.lock().await;
        st.last_report.clone()
    }

    /// What the reaper knows of runner `id`: `{"id","spawned","pid","start_time_ticks",
    /// "instance_id","heartbeat_socket","alive"}`; `None` when it is not registered.
    pub fn runner_info(&self, id: &str) -> Option<serde_json::Value> {
        let e = self.entry(id)?;
        Some(serde_json::json!({
            "id": e.id, "spawned": e.spawned, "pid": e.pid,
            "start_time_ticks": e.start_time_ticks, "instance_id": e.instance_id,
            "heartbeat_socket": e.heartbeat_socket, "alive": e.alive.load(Ordering::SeqCst),
        }))
    }

    /// The last stdout lines of runner `id` (bounded by `tail_lines`), oldest first.
    pub fn runner_output(&self, id: &str, stream: &str) -> Vec<String> {
        self.entry(id)
            .map(|e| e.tail.lines(stream))
            .unwrap_or_default()
    }

    /// The pid of runner `id` while it is registered.
    pub fn runner_pid(&self, id: &str) -> Option<u32> {
        self.entry(id).map(|e| e.pid)
    }

    pub(crate) fn storage(&self) -> &Storage {
        &self.inner.storage
    }
    pub(crate) fn checkpoints(&self) -> &Checkpoints {
        &self.inner.checkpoints
    }
    pub(crate) fn config(&self) -> &ReaperConfig {
        &self.inner.config
    }
    pub(crate) fn boot_id(&self) -> &str {
        &self.inner.boot_id
    }
    pub(crate) fn started_unix_nano(&self) -> u64 {
        self.inner.started_unix_nano
    }
    pub(crate) fn stats_ref(&self) -> &ReaperStats {
        &self.inner.stats
    }
    pub(crate) fn forensics(&self) -> Arc<crate::forensics::Forensics> {
        self.inner.forensics.clone()
    }
    pub(crate) fn events(&self) -> &EventBus {
        &self.inner.events
    }
    pub(crate) fn shutdown_token(&self) -> &CancellationToken {
        &self.inner.shutdown
    }
    /// `(id, pid, instance_id)` of every live runner (the forensics CPU sampler's list).
    pub(crate) fn forensics_runners(&self) -> Vec<(String, u32, String)> {
        let live = self
            .entries()
            .into_iter()
            .filter(|e| e.alive.load(Ordering::SeqCst));
        live.map(|e| (e.id.clone(), e.pid, e.instance_id.clone()))
            .collect()
    }
    /// What forensics needs of live runner `id`; its pidfd only when no termination holds
    /// the runner's lock (so forensics never waits for one).
    pub(crate) async fn forensics_subject(&self, id: &str) -> Option<crate::forensics::Subject> {
        let e = self.entry(id).filter(|e| e.alive.load(Ordering::SeqCst))?;
        let pidfd = e
            .proc
            .try_lock()
            .ok()
            .and_then(|st| st.pidfd.as_ref()?.try_clone().ok());
        let argv = e
            .spec
            .spawn
            .as_ref()
            .map(|s| s.argv.clone())
            .unwrap_or_default();
        let (pid, instance_id) = (e.pid, e.instance_id.clone());
        Some(crate::forensics::Subject {
            runner_id: e.id.clone(),
            instance_id,
            pid,
            pidfd,
            spawned: e.spawned,
            argv,
            heartbeat_socket: e.heartbeat_socket.clone(),
        })
    }

    fn entries(&self) -> Vec<Arc<Entry>> {
        self.inner
            .runners
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
    fn entry(&self, id: &str) -> Option<Arc<Entry>> {
        self.inner.runners.lock().ok()?.get(id).cloned()
    }
    pub(crate) fn is_current(&self, id: &str, instance_id: Option<&str>) -> bool {
        self.entry(id)
            .is_some_and(|e| Some(e.instance_id.as_str()) == instance_id)
    }

    pub(crate) async fn notify(&self, change: RunnerChange) {
        if self.inner.changes.send(change).await.is_err() {
            tracing::debug!("runner change not delivered: receiver gone");
        }
    }

    pub(crate) async fn incident(
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

    /// `POST /api/v1/runners` (and config runners): same id alive → 409, dead → replaced.
    async fn register(
        &self,
        spec: RunnerSpec,
        from_api: bool,
    ) -> Result<Registered, RegisterError> {
        runner::validate_spec(&spec)?;
        self.check_capacity(&spec.id)?;
        if let Some(old) = self.entry(&spec.id) {
            if old.alive.load(Ordering::SeqCst) {
                return Err(RegisterError::IdInUse(spec.id.clone()));
            }
        }
        let _ = from_api;
        if spec.spawn.is_some() {
            self.spawn_runner(spec, false)
                .await
                .map(Registered::Spawned)
        } else {
            self.attach_runner(spec, None)
                .await
                .map(Registered::Attached)
        }
    }

    /// Refuses a new runner once `[reaper] max_runners` live runners are registered
    /// (replacing a registered id does not count twice).
    fn check_capacity(&self, id: &str) -> Result<(), RegisterError> {
        let max = self.inner.config.max_runners;
        let live = self
            .inner
            .runners
            .lock()
            .map(|m| {
                m.values()
                    .filter(|e| e.id != id && e.alive.load(Ordering::SeqCst))
                    .count()
            })
            .unwrap_or(0);
        if live >= max {
            return Err(RegisterError::TooMany(format!(
                "{live} runners are registered; the limit is [reaper] max_runners = {max}"
            )));
        }
        Ok(())
    }

    async fn spawn_runner(
        &self,
        spec: RunnerSpec,
        restarted: bool,
    ) -> Result<SpawnedRunner, RegisterError> {
        let Some(spawn) = spec.spawn.clone() else {
            return Err(RegisterError::Invalid("no spawn section".into()));
        };
        let id = spec.id.clone();
        let cfg = &self.inner.config;
        let sock = runner::choose_socket_path(&cfg.data_dir, &id, spec.heartbeat_socket.as_deref());
        if let Some(why) = &sock.fallback_reason {
            tracing::warn!(runner = %id, "{why}");
        }
        runner::prepare_socket_dir(&sock.path).map_err(|e| {
            RegisterError::SocketDir(format!(
                "preparing heartbeat socket folder for {}: {e}",
                sock.path.display()
            ))
        })?;
        let checkpoint = match &spawn.workspace {
            Some(ws) => Some(
                self.inner
                    .checkpoints
                    .create(&id, ws)
                    .await
                    .map_err(|e| RegisterError::Checkpoint(e.into()))?,
            ),
            None => None,
        };
        let instance_id = uuid::Uuid::new_v4().to_string();
        let env = runner::runner_env(
            cfg,
            &id,
            &spawn,
            &sock.path,
            checkpoint
                .as_ref()
                .map(|c| (c.path.as_path(), c.id.as_str())),
            &instance_id,
        );
        // Spawn and record the pid under the OWNED_PIDS lock: the unowned-zombie reaper holds
        // it while reaping, so a runner that exits at once is never taken from its owner.
        let proc = {
            let mut owned = OWNED_PIDS
                .lock()
                .map_err(|_| internal("owned pid set poisoned"))?;
            let p = runner::spawn_process(&spawn, &env).map_err(|e| {
                let what = match &spawn.cwd {
                    Some(cwd) if !cwd.is_dir() => {
                        format!("cwd {} is missing or not a folder", cwd.display())
                    }
                    _ => spawn.argv[0].clone(),
                };
                RegisterError::SpawnFailed(format!("cannot start runner {id} ({what}): {e}"))
            })?;
            owned.insert(p.pid);
            p
        };
        self.inner
            .stats
            .runners_spawned
            .fetch_add(1, Ordering::Relaxed);
        let tail = OutputTail::new(cfg.tail_lines);
        let entry = Arc::new(Entry {
            id: id.clone(),
            spec: spec.clone(),
            spawned: true,
            stop_at_shutdown: true,
            pid: proc.pid,
            start_time_ticks: Some(proc.start_time_ticks),
            instance_id: instance_id.clone(),
            heartbeat_socket: Some(sock.path.clone()),
            tail: tail.clone(),
            readers: Mutex::new(Vec::new()),
            proc: tokio::sync::Mutex::new(ProcState {
                pidfd: Some(proc.pidfd),
                finished: false,
                stopping: false,
                last_report: None,
            }),
            alive: AtomicBool::new(true),
        });
        let mut readers = Vec::new();
        if let Ok(out) = tokio::process::ChildStdout::from_std(proc.stdout) {
            readers.push(spawn_reader(
                out,
                "stdout",
                tail.clone(),
                id.clone(),
                instance_id.clone(),
                self.inner.storage.clone(),
            ));
        }
        if let Ok(err) = tokio::process::ChildStderr::from_std(proc.stderr) {
            readers.push(spawn_reader(
                err,
                "stderr",
                tail,
                id.clone(),
                instance_id.clone(),
                self.inner.storage.clone(),
            ));
        }
        if let Ok(mut r) = entry.readers.lock() {
            *r = readers;
        }
        if let Ok(mut m) = self.inner.runners.lock() {
            m.insert(id.clone(), entry.clone());
        }
        let now = now_unix_nano();
        let detail = serde_json::json!({
            "socket_fallback": sock.fallback_reason,
            "checkpoint_id": checkpoint.as_ref().map(|c| c.id.clone()),
        });
        let row = RunnerRow {
            id: id.clone(),
            spawned: true,
            spec: serde_json::to_value(&spec).unwrap_or_default(),
            pid: Some(proc.pid),
            start_time_ticks: Some(proc.start_time_ticks),
            boot_id: Some(self.inner.boot_id.clone()),
            pgid: Some(proc.pid),
            instance_id: Some(instance_id.clone()),
            heartbeat_socket: Some(sock.path.to_string_lossy().into_owned()),
            state: RunnerRowState::Running,
            detail: detail.clone(),
            registered_unix_nano: now,
            updated_unix_nano: now,
        };
        if let Err(e) = self.inner.storage.upsert_runner(row).await {
            tracing::error!(runner = %id, "runner row not written: {e}");
        }
        let kind = if restarted {
            EventKind::RunnerRestarted
        } else {
            EventKind::RunnerStarted
        };
        self.incident(
            kind,
            &id,
            format!("runner {id} started as pid {}", proc.pid),
            serde_json::json!({"pid": proc.pid, "instance_id": instance_id, "argv": spawn.argv, "socket": sock.path, "socket_fallback": sock.fallback_reason}),
            format!("{}:{id}:{instance_id}", kind.as_str()),
        )
        .await;
        self.notify(RunnerChange::Registered {
            id: id.clone(),
            pid: Some(proc.pid),
            heartbeat_socket: Some(sock.path.clone()),
            spawned: true,
            restarted,
        })
        .await;
        self.start_monitor(entry);
        Ok(SpawnedRunner {
            id,
            spawned: true,
            pid: proc.pid,
            start_time_ticks: proc.start_time_ticks,
            instance_id,
            heartbeat_socket: sock.path,
            socket_fallback: sock.fallback_reason,
            checkpoint: checkpoint.map(Into::into),
        })
    }

    /// Attaches an existing process. `adopt` carries a ledger `Resume` when the orphan sweep
    /// re-adopts a runner whose termination was half done.
    pub(crate) async fn attach_runner(
        &self,
        spec: RunnerSpec,
        adopt: Option<(RunnerRow, Option<Resume>)>,
    ) -> Result<AttachedRunner, RegisterError> {
        let Some(att) = spec.attach.clone() else {
            return Err(RegisterError::Invalid("no attach section".into()));
        };
        let id = spec.id.clone();
        let me = std::process::id();
        let kernel_thread = platform::proc_stat(att.pid).is_ok_and(|s| s.is_kernel_thread());
        let ancestor = platform::is_own_ancestor(att.pid);
        if att.pid <= 2 || att.pid == me || kernel_thread || ancestor {
            let why = if att.pid == me {
                "it is stallwatch itself"
            } else if ancestor {
                "it is an ancestor of stallwatch (stopping it would stop stallwatch's own parents and their other children)"
            } else if kernel_thread || att.pid == 2 {
                "it is a kernel thread"
            } else {
                "it is init"
            };
            return Err(RegisterError::Invalid(format!(
                "pid {} cannot be a runner: {why}",
                att.pid
            )));
        }
        let pidfd = match att.start_time_ticks {
            Some(t) => match platform::open_verified(att.pid, t).map_err(internal)? {
                Some(fd) => Some(fd),
                None => {
                    return Err(RegisterError::Gone(format!(
                        "no live process {} with start time {t}",
                        att.pid
                    )))
                }
            },
            None => {
                // Watched, never signalled: the pidfd only tells us when it exits.
                if platform::proc_stat(att.pid).is_err() {
                    return Err(RegisterError::Gone(format!("no live process {}", att.pid)));
                }
                None
            }
        };
        let watch_fd = match &pidfd {
            Some(fd) => fd.try_clone().ok(),
            None => platform::pidfd_open(att.pid).ok(),
        };
        let instance_id = adopt
            .as_ref()
            .and_then(|(r, _)| r.instance_id.clone())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let entry = Arc::new(Entry {
            id: id.clone(),
            spec: spec.clone(),
            spawned: false,
            stop_at_shutdown: adopt.as_ref().is_some_and(|(r, _)| r.spawned),
            pid: att.pid,
            start_time_ticks: att.start_time_ticks,
            instance_id: instance_id.clone(),
            heartbeat_socket: spec.heartbeat_socket.clone(),
            tail: OutputTail::new(1),
            readers: Mutex::new(Vec::new()),
            proc: tokio::sync::Mutex::new(ProcState {
                pidfd,
                finished: false,
                stopping: false,
                last_report: None,
            }),
            alive: AtomicBool::new(true),
        });
        if let Ok(mut m) = self.inner.runners.lock() {
            m.insert(id.clone(), entry.clone());
        }
        let now = now_unix_nano();
        let row = RunnerRow {
            id: id.clone(),
            spawned: adopt.as_ref().is_some_and(|(r, _)| r.spawned),
            spec: serde_json::to_value(&spec).unwrap_or_default(),
            pid: Some(att.pid),
            start_time_ticks: att.start_time_ticks,
            boot_id: Some(self.inner.boot_id.clone()),
            pgid: platform::proc_stat(att.pid).ok().map(|s| s.pgid),
            instance_id: Some(instance_id.clone()),
            heartbeat_socket: spec
                .heartbeat_socket
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned()),
            state: RunnerRowState::Running,
            detail: serde_json::json!({"adopted": adopt.is_some()}),
            registered_unix_nano: adopt.as_ref().map_or(now, |(r, _)| r.registered_unix_nano),
            updated_unix_nano: now,
        };
        if let Err(e) = self.inner.storage.upsert_runner(row).await {
            tracing::error!(runner = %id, "runner row not written: {e}");
        }
        self.notify(RunnerChange::Registered {
            id: id.clone(),
            pid: Some(att.pid),
            heartbeat_socket: spec.heartbeat_socket.clone(),
            spawned: false,
            restarted: false,
        })
        .await;
        if let Some(fd) = watch_fd {
            self.start_attached_monitor(entry.clone(), fd);
        }
        if let Some((_, Some(resume))) = adopt {
            let h = self.clone();
            tokio::spawn(async move {
                if let Some(r) = h.stop(&entry, "resume", Some(resume)).await {
                    h.after_stop(&entry, &r, "resume", &[]).await;
                }
            });
        }
        Ok(AttachedRunner {
            id,
            spawned: false,
            pid: att.pid,
            start_time_ticks: att.start_time_ticks,
            signalled_on_trip: att.start_time_ticks.is_some(),
            instance_id,
        })
    }

    fn start_monitor(&self, entry: Arc<Entry>) {
        let h = self.clone();
        tokio::spawn(async move {
            let fd = {
                let st = entry.proc.lock().await;
                st.pidfd.as_ref().and_then(|f| f.try_clone().ok())
            };
            let Some(fd) = fd else { return };
            let Ok(afd) = platform::async_pidfd(fd) else {
                return;
            };
            tokio::select! {
                _ = afd.readable() => {}
                _ = h.inner.shutdown.cancelled() => return,
            }
            h.on_spawned_exit(entry).await;
        });
    }

    fn start_attached_monitor(&self, entry: Arc<Entry>, fd: OwnedFd) {
        let h = self.clone();
        tokio::spawn(async move {
            let Ok(afd) = platform::async_pidfd(fd) else {
                return;
            };
            tokio::select! {
                _ = afd.readable() => {}
                _ = h.inner.shutdown.cancelled() => return,
            }
            let mut st = entry.proc.lock().await;
            entry.alive.store(false, Ordering::SeqCst);
            if st.finished || st.stopping {
                return;
            }
            st.finished = true;
            drop(st);
            let id = entry.id.clone();
            let now = now_unix_nano();
            let why = format!("attached runner {id} exited");
            h.end_runner_spans(&id, EndCause::Exited, &why, None, now, Vec::new(), &[])
                .await;
            let _ = h
                .inner
                .storage
                .set_runner_state(
                    id.clone(),
                    RunnerRowState::Exited,
                    serde_json::json!({"reason": "attached process exited"}),
                    now,
                )
                .await;
            h.incident(
                EventKind::RunnerExited,
                &id,
                format!(
                    "attached runner {id} (pid {}) exited; not probed again until re-registered",
                    entry.pid
                ),
                serde_json::json!({"pid": entry.pid}),
                format!("runner.exited:{id}:{}", entry.instance_id),
            )
            .await;
            h.notify(RunnerChange::Gone { id, removed: false }).await;
        });
    }

    async fn on_spawned_exit(&self, entry: Arc<Entry>) {
        let exit_at = now_unix_nano();
        let mut st = entry.proc.lock().await;
        if st.finished || st.stopping {
            return;
        }
        // Leftover members of its group would outlive it: end them while the leader is
        // still an unreaped child (the group id stays pinned).
        let leftovers = platform::descendants(entry.pid, entry.mark());
        let mut report = None;
        if !leftovers.is_empty() {
            let r = terminate::terminate(
                &self.inner.storage,
                &self.inner.stats,
                self.inner.config.grace,
                Target {
                    runner_id: &entry.id,
                    mark: entry.mark(),
                    pid: entry.pid,
                    pidfd: st.pidfd.as_ref(),
                    own_child_group: true,
                },
                "exit_cleanup",
                None,
            )
            .await;
            report = Some(r);
        }
        let exit = match &report {
            Some(r) => r.exit,
            None => platform::reap_child(entry.pid).ok().flatten(),
        };
        st.finished = true;
        entry.alive.store(false, Ordering::SeqCst);
        if let Ok(mut o) = OWNED_PIDS.lock() {
            o.remove(&entry.pid);
        }
        drop(st);
        self.wait_readers(&entry).await;
        let id = entry.id.clone();
        let exit = exit.unwrap_or(ExitInfo {
            code: None,
            signal: None,
        });
        let stderr = entry.tail.lines("stderr");
        let stdout = entry.tail.lines("stdout");
        let success = exit.success();
        let (kind, state) = if success {
            (EventKind::RunnerExited, RunnerRowState::Exited)
        } else {
            (EventKind::RunnerCrashed, RunnerRowState::Crashed)
        };
        let evidence = serde_json::json!({
            "pid": entry.pid, "exit": exit, "last_stderr": stderr, "last_stdout": stdout,
            "leftovers": report,
        });
        let _ = self
            .inner
            .storage
            .set_runner_state(id.clone(), state, evidence.clone(), now_unix_nano())
            .await;
        let last = stderr.last().cloned().unwrap_or_default();
        let reason = if success {
            format!("runner {id} exited cleanly")
        } else {
            format!("runner {id} exited with {}: {last}", exit.describe())
        };
        let cause = EndCause::of_exit(&exit);
        self.end_runner_spans(&id, cause, &reason, Some(&exit), exit_at, Vec::new(), &[])
            .await;
        self.incident(
            kind,
            &id,
            reason,
            evidence,
            format!("{}:{id}:{}", kind.as_str(), entry.instance_id),
        )
        .await;
        self.notify(RunnerChange::Gone {
            id: id.clone(),
            removed: false,
        })
        .await;
        if !success {
            self.maybe_restart(&entry, &format!("exited with {}", exit.describe()))
                .await;
        }
    }

    async fn wait_readers(&self, entry: &Entry) {
        let readers: Vec<JoinHandle<()>> = entry
            .readers
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default();
        for r in readers {
            // A grandchild may hold the pipe open; do not wait for it forever.
            let _ = tokio::time::timeout(Duration::from_millis(500), r).await;
        }
    }

    async fn maybe_restart(&self, entry: &Arc<Entry>, why: &str) {
        if !entry.spawned
            || self.inner.stopping_all.load(Ordering::SeqCst)
            || self.inner.shutdown.is_cancelled()
        {
            return;
        }
        let id = entry.id.clone();
        let policy = self.inner.config.restart;
        let allowed = self
            .inner
            .restarts
            .lock()
            .map(|mut m| allow_restart(m.entry(id.clone()).or_default(), Instant::now(), policy))
            .unwrap_or(false);
        if !allowed {
            if policy.max_restarts > 0 {
                self.lifecycle(&id, RunnerLifecycle::GaveUp).await;
            }
            let _ = self
                .inner
                .storage
                .set_runner_state(
                    id.clone(),
                    RunnerRowState::GaveUp,
                    serde_json::json!({"reason": why}),
                    now_unix_nano(),
                )
                .await;
            if policy.max_restarts == 0 {
                // Restarts are off: nothing was given up, and the trip or exit already has
                // its own incident. A "crashed" here would misname a deliberate stop.
                return;
            }
            self.incident(
                EventKind::RunnerCrashed,
                &id,
                format!(
                    "runner {id} {why}; gave up: the restart policy allows {} restarts in {} ms",
                    policy.max_restarts,
                    policy.window.as_millis()
                ),
                serde_json::json!({"gave_up": true, "max_restarts": policy.max_restarts, "window_ms": policy.window.as_millis() as u64, "last_stderr": entry.tail.lines("stderr")}),
                format!("runner.gave_up:{id}:{}", entry.instance_id),
            )
            .await;
            return;
        }
        // Still the current entry? (a DELETE or a new registration may have replaced it)
        if !self.is_current(&id, Some(&entry.instance_id)) {
            return;
        }
        self.inner
            .stats
            .runners_restarted
            .fetch_add(1, Ordering::Relaxed);
        self.lifecycle(&id, RunnerLifecycle::Restarting).await;
        if let Err(e) = self.spawn_runner(entry.spec.clone(), true).await {
            tracing::error!(runner = %id, "restart failed: {e}");
        }
    }

    /// Runs the termination sequence on `entry` (holding its lock), unless it is already
    /// finished. Answers `None` when there was nothing to stop.
    async fn stop(
        &self,
        entry: &Arc<Entry>,
        cause: &str,
        resume: Option<Resume>,
    ) -> Option<TerminationReport> {
        let mut st = entry.proc.lock().await;
        if st.finished {
            return None;
        }
        st.stopping = true;
        self.lifecycle(&entry.id, RunnerLifecycle::Stopping).await;
        let _ = self
            .inner
            .storage
            .set_runner_state(
                entry.id.clone(),
                RunnerRowState::Stopping,
                serde_json::json!({"cause": cause}),
                now_unix_nano(),
            )
            .await;
        let own_child = entry.spawned && self.owns(entry.pid);
        let report = terminate::terminate(
            &self.inner.storage,
            &self.inner.stats,
            self.inner.config.grace,
            Target {
                runner_id: &entry.id,
                mark: entry.mark(),
                pid: entry.pid,
                pidfd: st.pidfd.as_ref(),
                own_child_group: own_child,
            },
            cause,
            resume,
        )
        .await;
        if report.ended_by == "not_signalled" {
            st.stopping = false;
            st.last_report = Some(report.clone());
            return Some(report);
        }
        st.finished = true;
        st.last_report = Some(report.clone());
        entry.alive.store(false, Ordering::SeqCst);
        if let Ok(mut o) = OWNED_PIDS.lock() {
            o.remove(&entry.pid);
        }
        drop(st);
        self.wait_readers(entry).await;
        Some(report)
    }

    fn owns(&self, pid: u32) -> bool {
        OWNED_PIDS.lock().map(|o| o.contains(&pid)).unwrap_or(false)
    }

    /// After a stop: roll back the runner's open checkpoints, write the missing span ends,
    /// record `runner.terminated`, update the row, tell the watchdog.
    async fn after_stop(
        &self,
        entry: &Arc<Entry>,
        report: &TerminationReport,
        cause: &str,
        open_spans: &[(TraceId, SpanId)],
    ) {
        let id = entry.id.clone();
        let (rolled, errors) = self
            .inner
            .checkpoints
            .settle_runner(
                Some(&id),
                &format!("runner {id} stopped ({cause})"),
                self.inner.config.sweep_batch,
            )
            .await;
        let rollback_at = now_unix_nano();
        let mut events = vec![EndEvent {
            name: "SIGTERM".into(),
            at_unix_nano: report.sigterm_unix_nano,
        }];
        if let Some(k) = report.sigkill_unix_nano {
            events.push(EndEvent {
                name: "SIGKILL".into(),
                at_unix_nano: k,
            });
        }
        if !rolled.is_empty() {
            events.push(EndEvent {
                name: "rollback".into(),
                at_unix_nano: rollback_at,
            });
        }
        let end_cause = if cause == "delete" {
            EndCause::Killed
        } else {
            EndCause::Timeout
        };
        let why = format!("runner {id} stopped by stallwatch ({cause})");
        let exit = report.exit.as_ref();
        let at = report.sigterm_unix_nano;
        let closed = self
            .end_runner_spans(&id, end_cause, &why, exit, at, events, open_spans)
            .await;
        if !open_spans.is_empty() {
            let _ = self
                .inner
                .storage
                .record_action(ActionRecord {
                    runner_id: id.clone(),
                    termination_id: report.termination_id.clone(),
                    step: "spans_closed".into(),
                    phase: "done".into(),
                    pid: None,
                    detail: serde_json::json!({"written": closed}),
                    at_unix_nano: now_unix_nano(),
                })
                .await;
        }
        let forensics = self
            .inner
            .forensics
            .take(&id)
            .filter(|_| cause.starts_with("trip"));
        let state = if cause == "delete" {
            RunnerRowState::Removed
        } else if report.ended_by == "not_signalled" {
            // Watched, never signalled (no proof of identity): it may still be running.
            RunnerRowState::Running
        } else {
            RunnerRowState::Terminated
        };
        let mut evidence = serde_json::json!({
            "cause": cause, "report": report, "checkpoints_rolled_back": rolled,
            "checkpoint_errors": errors, "spans_closed": closed,
            "last_stderr": entry.tail.lines("stderr"),
        });
        if let (Some(fx), Some(obj)) = (&forensics, evidence.as_object_mut()) {
            obj.extend(fx.fields.clone());
        }
        let _ = self
            .inner
            .storage
            .set_runner_state(id.clone(), state, evidence.clone(), now_unix_nano())
            .await;
        if report.ended_by != "not_signalled" {
            self.incident(
                EventKind::RunnerTerminated,
                &id,
                format!(
                    "runner {id} stopped ({cause}): ended by {} after {} ms{}{}",
                    report.ended_by,
                    report.duration_ms,
                    if report.survivors.is_empty() {
                        String::new()
                    } else {
                        format!(", {} survivors", report.survivors.len())
                    },
                    forensics
                        .map(|f| format!("; why: {}", f.reason_line))
                        .unwrap_or_default()
                ),
                evidence,
                format!("runner.terminated:{id}:{}", report.termination_id),
            )
            .await;
        }
        if report.ended_by == "not_signalled" && cause != "delete" {
            // still running, never signalled: watched on, its breaker recovers as usual
            self.lifecycle(&id, RunnerLifecycle::Detached).await;
            return;
        }
        self.notify(RunnerChange::Gone {
            id,
            removed: cause == "delete",
        })
        .await;
    }

    #[tracing::instrument(name = "reaper.trip", level = "info", skip_all, fields(runner_id = %trip.runner_id, verdict = %trip.verdict))]
    async fn on_trip(&self, trip: Trip) {
        let Some(entry) = self.entry(&trip.runner_id) else {
            tracing::warn!(runner = %trip.runner_id, "trip for an unknown runner ignored");
            return;
        };
        let _ = self
            .inner
            .storage
            .record_action(ActionRecord {
                runner_id: entry.id.clone(),
                termination_id: format!("trip-{}-{}", entry.instance_id, trip.at_unix_nano),
                step: "open_spans".into(),
                phase: "done".into(),
                pid: Some(entry.pid),
                detail: serde_json::json!({
                    "verdict": trip.verdict, "reason": trip.reason, "incident_id": trip.incident_id,
                    "spans": trip.open_spans.iter().map(|(t, s)| [t.to_hex(), s.to_hex()]).collect::<Vec<_>>(),
                }),
                at_unix_nano: now_unix_nano(),
            })
            .await;
        let cause = format!("trip: {}", trip.verdict);
        let fx = self.inner.forensics.enabled();
        if let Some(subject) = self.forensics_subject(&entry.id).await.filter(|_| fx) {
            self.inner
                .forensics
                .before_kill(&self.inner.storage, &trip, subject)
                .await;
        }
        let stopped = self.stop(&entry, &cause, None).await;
        if stopped
            .as_ref()
            .is_none_or(|r| r.ended_by == "not_signalled")
        {
            self.inner.forensics.take(&entry.id);
        }
        if let Some(report) = stopped {
            self.after_stop(&entry, &report, &cause, &trip.open_spans)
                .await;
            if report.ended_by != "not_signalled" {
                self.maybe_restart(&entry, &format!("was stopped by a trip ({})", trip.verdict))
                    .await;
            }
        }
    }

    pub(crate) async fn delete(&self, id: &str) -> Result<RunnerDeleted, RunnerError> {
        let Some(entry) = self.entry(id) else {
            return Err(RunnerError::NotFound(format!("no runner {id}")));
        };
        let report = self.stop(&entry, "delete", None).await;
        if let Some(r) = &report {
            self.after_stop(&entry, r, "delete", &[]).await;
        } else {
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
        if let Ok(mut m) = self.inner.runners.lock() {
            if m.get(id).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                m.remove(id);
            }
        }
        Ok(deleted_answer(id, report.as_ref()))
    }

    /// Reaps zombie children no runner owns. Without `now`, a zombie is reaped only when it
    /// was already seen on the previous pass (another owner's `wait` wins the race).
    fn reap_unowned(&self, seen: &mut HashSet<u32>, now: bool) {
        if !platform::any_child_exited() {
            seen.clear();
            return;
        }
        let Ok(owned) = OWNED_PIDS.lock() else { return };
        let zombies: HashSet<u32> = platform::zombie_children()
            .into_iter()
            .filter(|p| !owned.contains(p))
            .collect();
        for pid in &zombies {
            if now || seen.contains(pid) {
                if let Ok(Some(_)) = platform::reap_child(*pid) {
                    self.inner
                        .stats
                        .zombies_reaped
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        *seen = zombies;
    }
}

/// Lines per OTLP log batch written from a runner's output.
const LOG_BATCH_LINES: usize = 64;
/// Longest a captured line waits before its batch is written.
const LOG_FLUSH: Duration = Duration::from_millis(250);

/// Reads a runner's stdout or stderr line by line: keeps the tail for incidents and stores
/// the lines as OTLP log records (`log.iostream` = `stdout`/`stderr`, resource
/// `service.name`, `stallwatch.runner.id`, `service.instance.id`), in small batches.
fn spawn_reader<R>(
    r: R,
    stream: &'static str,
    tail: OutputTail,
    id: String,
    instance_id: String,
    storage: Storage,
) -> JoinHandle<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut lines = BufReader::new(r).lines();
        let mut pending: Vec<LogRecord> = Vec::new();
        loop {
            let next = if pending.is_empty() {
                Ok(lines.next_line().await)
            } else {
                tokio::time::timeout(LOG_FLUSH, lines.next_line()).await
            };
            let eof = match next {
                Ok(Ok(Some(line))) => {
                    tail.push(stream, line.clone());
                    let now = now_unix_nano();
                    pending.push(LogRecord {
                        time_unix_nano: now,
                        observed_time_unix_nano: now,
                        severity_number: if stream == "stderr" { 13 } else { 9 },
                        severity_text: if stream == "stderr" { "WARN" } else { "INFO" }.into(),
                        body: AnyValue::String(line),
                        attributes: vec![KeyValue::new(
                            "log.iostream",
                            AnyValue::String(stream.into()),
                        )],
                        ..Default::default()
                    });
                    if pending.len() < LOG_BATCH_LINES {
                        continue;
                    }
                    false
                }
                Ok(_) => true,   // EOF or read error
                Err(_) => false, // flush timer
            };
            if !pending.is_empty() {
                let batch = output_batch(&id, &instance_id, std::mem::take(&mut pending));
                if let Err(e) = storage.write_logs(Arc::new(batch)).await {
                    tracing::debug!(runner = %id, stream, "runner output not stored as logs: {e}");
                }
            }
            if eof {
                break;
            }
        }
    })
}

fn output_batch(id: &str, instance_id: &str, records: Vec<LogRecord>) -> LogBatch {
    let s = |v: &str| AnyValue::String(v.to_string());
    LogBatch {
        resource_logs: vec![ResourceLogs {
            resource: Resource {
                attributes: vec![
                    KeyValue::new("service.name", s(id)),
                    KeyValue::new("stallwatch.runner.id", s(id)),
                    KeyValue::new("service.instance.id", s(instance_id)),
                ],
                ..Default::default()
            },
            scope_logs: vec![ScopeLogs {
                scope: Scope {
                    name: crate::spans::SCOPE_NAME.into(),
                    ..Default::default()
                },
                log_records: records,
            }],
        }],
    }
}

/// The DELETE answer: the termination report travels as its serialized JSON (its types are
/// the termination module's own).
fn deleted_answer(id: &str, report: Option<&TerminationReport>) -> RunnerDeleted {
    fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
        serde_json::to_value(v).unwrap_or_default()
    }
    RunnerDeleted {
        id: id.to_string(),
        removed: true,
        termination: report.map(json),
        steps: report
            .map(|r| r.steps.iter().map(json).collect())
            .unwrap_or_default(),
        survivors: report
            .map(|r| r.survivors.iter().map(json).collect())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_intensity_limit() {
        let p = RestartPolicy {
            max_restarts: 2,
            window: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        let mut h = VecDeque::new();
        assert!(allow_restart(&mut h, t0, p));
        assert!(allow_restart(&mut h, t0 + Duration::from_secs(1), p));
        assert!(!allow_restart(&mut h, t0 + Duration::from_secs(2), p));
        assert!(allow_restart(&mut h, t0 + Duration::from_secs(11), p));
    }
}
