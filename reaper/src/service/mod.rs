//! The reaper task: owns every runner, answers control requests, acts on trips, restarts
//! spawned runners under the restart policy, and reaps zombie children nobody owns.
//!
//! Each runner has one lock around its process state. Whoever holds it (the exit monitor,
//! a termination) is the only one allowed to reap the leader, so `kill(-pgid)` is only sent
//! while the leader is an unreaped child. Unowned zombies (descendants re-parented to
//! stallwatch, a child subreaper) are found by peeking with `waitid(P_ALL, WNOHANG |
//! WNOWAIT)` on SIGCHLD, then reaped by pid only when no runner owns them and they were
//! first seen at least `zombie_interval` earlier, so another owner's `wait` always wins the
//! race (docs/design.md, Linux notes). With no zombie pending the loop sleeps until the next
//! SIGCHLD (looking every [`ZOMBIE_FALLBACK`] anyway), so an idle stallwatch has no
//! zombie poll waking it (issue 16: idle wake-ups).

mod exits;
mod output;
mod register;
mod restart;
mod stop;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stallwatch_storage::control::{
    ControlRequest, RegisterError, RunnerBoard, RunnerChange, RunnerSpec, Trip,
};
use stallwatch_storage::model::{now_unix_nano, EventKind, NewIncident};
use stallwatch_storage::{EventBus, Storage};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::Checkpoints;
use crate::checkpoint_edge;
use crate::config::ReaperConfig;
use crate::error::ReaperError;
use crate::platform::{self};
use crate::runner::OutputTail;
use crate::settle::Settled;
use crate::stats::ReaperStats;
use crate::terminate::TerminationReport;

pub use restart::allow_restart;

/// How often the unowned-zombie reaper looks with no zombie pending, when SIGCHLD wakes it
/// anyway: a backstop, not the mechanism.
pub const ZOMBIE_FALLBACK: Duration = Duration::from_secs(10);

/// Waits for the next SIGCHLD (never, without a stream).
async fn child_exited(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(sig) => {
            if sig.recv().await.is_none() {
                *s = None;
            }
        }
        None => std::future::pending().await,
    }
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
    /// Set once its exit or stop is wholly recorded (span ends, runner row, incident, the
    /// watchdog told), after `alive` went false: a registration of the same id waits for it
    /// ([`crate::settle`]), or that record landed on the new registration (its spans
    /// closed, its row marked exited, the watchdog told it was gone).
    settled: Settled,
    /// Set when a trip, a DELETE or the shutdown begins stopping it (before its lock is
    /// taken), cleared when that stop sends nothing (no proof of identity): its checkpoints
    /// are then refused a commit, as they are rolled back.
    stop_begun: AtomicBool,
}

impl Entry {
    /// Marks the exit or stop of this registration wholly recorded, waking a registration
    /// of the same id that waits for it.
    fn settle(&self) {
        self.settled.settle();
    }

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
    /// Cancelled by [`ReaperHandle::hurry`]: running terminations skip the rest of their
    /// grace period.
    hurry: CancellationToken,
    /// The trips being handled (termination, rollback, span ends, incident): waited for
    /// before the reaper stops, so an ordered shutdown never cuts one off before its
    /// records are written.
    trip_tasks: tokio_util::task::TaskTracker,
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
            hurry: CancellationToken::new(),
            trip_tasks: tokio_util::task::TaskTracker::new(),
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
        handle
            .inner
            .checkpoints
            .recover_at_start(handle.inner.config.sweep_batch)
            .await;
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
        let sweep_task = stallwatch_vocabulary::task::spawn_boxed(async move {
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
        let task = stallwatch_vocabulary::task::spawn_boxed(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut sigchld = match signal(SignalKind::child()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(
                        "no SIGCHLD stream ({e}): zombies are looked for every {} ms",
                        h.inner.config.zombie_interval.as_millis()
                    );
                    None
                }
            };
            let mut seen: HashMap<u32, Instant> = HashMap::new();
            loop {
                let look_in = if seen.is_empty() && sigchld.is_some() {
                    ZOMBIE_FALLBACK
                } else {
                    h.inner.config.zombie_interval
                };
                tokio::select! {
                    _ = h.inner.shutdown.cancelled() => break,
                    t = trips.recv() => match t {
                        Some(trip) => {
                            let h2 = h.clone();
                            h.inner.trip_tasks.spawn(async move { h2.on_trip(trip).await; });
                        }
                        None => {
                            // No more trips; keep reaping until shutdown.
                            h.inner.shutdown.cancelled().await;
                            break;
                        }
                    },
                    _ = child_exited(&mut sigchld) => h.reap_unowned(&mut seen, false),
                    _ = tokio::time::sleep(look_in) => h.reap_unowned(&mut seen, false),
                }
            }
            h.stop_spawned_runners().await;
            // A trip still being handled (an attached runner in its grace period) finishes
            // and writes its records while storage is still open.
            h.inner.trip_tasks.close();
            h.inner.trip_tasks.wait().await;
            sweep_task.abort();
            let mut none = HashMap::new();
            h.reap_unowned(&mut none, true);
        });
        Ok((handle, task))
    }
}

impl ReaperHandle {
    /// A second stop signal: every termination running now or later skips the rest of its
    /// grace period and sends SIGKILL at once, through its own proven paths, recording the
    /// step ([`crate::plan::Plan::hurry`]). Call before [`ReaperHandle::kill_all_registered`].
    pub fn hurry(&self) {
        self.inner.hurry.cancel();
    }

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
            req if checkpoint_edge::is_checkpoint(&req) => {
                let registered = |id: &str| self.entry(id).is_some();
                let stopping = |id: &str| {
                    self.entry(id)
                        .is_some_and(|e| e.stop_begun.load(Ordering::SeqCst))
                };
                checkpoint_edge::answer(&self.inner.checkpoints, req, registered, stopping).await;
            }
            _ => {}
        }
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
    /// Lets the forensics CPU sampler follow the watchdog's board, so it reads `/proc` only
    /// for runners that may trip soon instead of every registered one each period (issue
    /// 17 #10; `forensics::needs_sampling`).
    pub fn follow_board(&self, board: tokio::sync::watch::Receiver<RunnerBoard>) {
        self.inner.forensics.follow_board(board);
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

    /// The leader pids of the live registrations other than `id`'s: spared by its
    /// termination ([`crate::terminate::Target::spare`]).
    fn other_leaders(&self, id: &str) -> Vec<u32> {
        self.entries()
            .iter()
            .filter(|e| e.id != id && e.alive.load(Ordering::SeqCst))
            .map(|e| e.pid)
            .collect()
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

    fn owns(&self, pid: u32) -> bool {
        OWNED_PIDS.lock().map(|o| o.contains(&pid)).unwrap_or(false)
    }

    /// Reaps zombie children no runner owns. `seen` maps each unowned zombie to when it was
    /// first seen; without `now`, a zombie is reaped only once it was first seen at least
    /// `zombie_interval` ago (another owner's `wait` wins the race). Zombies gone since
    /// (reaped by their owner) leave `seen`.
    fn reap_unowned(&self, seen: &mut HashMap<u32, Instant>, now: bool) {
        if !platform::any_child_exited() {
            seen.clear();
            return;
        }
        let Ok(owned) = OWNED_PIDS.lock() else { return };
        let at = Instant::now();
        let zombies: HashSet<u32> = platform::zombie_children()
            .into_iter()
            .filter(|p| !owned.contains(p))
            .collect();
        seen.retain(|pid, _| zombies.contains(pid));
        for pid in zombies {
            let first = *seen.entry(pid).or_insert(at);
            if now || at.saturating_duration_since(first) >= self.inner.config.zombie_interval {
                seen.remove(&pid);
                if let Ok(Some(_)) = platform::reap_child(pid) {
                    self.inner
                        .stats
                        .zombies_reaped
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
