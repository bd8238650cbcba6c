//! The watchdog task: moves messages around the pure cores and does nothing else.
//!
//! One task owns the open-span ledger, every runner's heartbeat tracker, verdict and
//! breaker. It reads committed telemetry ([`Observation`]) and lifecycle notices
//! ([`RunnerChange`]), starts pings as futures in a `JoinSet` (thousands of runners on the
//! runtime's few threads), and evaluates each runner when it is due (fusion, breaker moves,
//! probes): every runner has one deadline in a `DueSet` (`schedule.rs`), and a wake steps only the
//! runners whose deadline came or whose inputs changed (an observation of its spans, a
//! lifecycle notice), so its cost follows what is due, not how many are registered (issue
//! 17 #10). The board is updated the same way: the runners that changed, and all of them
//! once per `board_interval`. Side effects leave through two helper tasks so the loop never waits on a disk:
//! the *effects* task records each incident through [`EventBus::publish`] and only then
//! sends the [`Trip`] (an incident is written before anything acts on it), and the
//! *persister* task writes ledger changes in batches (one control transaction per batch).
//! The watchdog never sends a signal and never touches a workspace file.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde_json::json;
use stallwatch_storage::control::{
    BreakerState, Observation, ObservedData, RunnerBoard, RunnerChange, RunnerLifecycle,
    RunnerStatus, Trip, WorstSpan,
};
use stallwatch_storage::ledger::LedgerWrite;
use stallwatch_storage::model::{now_unix_nano, EventKind, NewIncident, SpanId, TraceId};
use stallwatch_storage::{EventBus, Storage};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::breaker::{Breaker, Transition};
use crate::clock::MonoClock;
use crate::config::WatchdogConfig;
use crate::effects::{run_effects, run_persister, Effect, EFFECTS_CAPACITY, PERSIST_CAPACITY};
use crate::error::WatchdogError;
use crate::fusion::{Cause, Verdict};
use crate::handle::Command;
pub use crate::handle::WatchdogHandle;
use crate::heartbeat::{check_path, ping, HeartbeatFailure, HeartbeatState};
use crate::ledger::{Applied, Ledger, WorstView};
use crate::runner::{
    heartbeat_socket_usable, probe_outcome, Action, LedgerView, Runner, SelfStop,
    DEGRADED_INCIDENT_EVERY, HEALTHY, MAX_IDLE, STARVED_GAP,
};
use crate::schedule::{DueSet, Schedule};
use crate::shapes::{self, Record, SpanKey};
use crate::stats::WatchdogStats;

mod incidents;
mod lifecycle;

/// Bound of the handle's command queue.
const COMMAND_CAPACITY: usize = 64;

/// A burst of spans not tracked at the ledger's bound ends once none was refused for this
/// long: its start is logged once, and its end once with the count (never a line per span).
pub(crate) const UNTRACKED_BURST_QUIET: Duration = Duration::from_secs(10);

/// The current burst of spans the ledger did not track at its bound.
struct UntrackedBurst {
    /// When its first span was refused.
    since: Instant,
    /// When its latest span was refused.
    last: Instant,
    /// The untracked totals (by `UntrackedSource::index`) before it began.
    before: [u64; 2],
    /// Registered runners whose spans were refused and already named in an incident.
    named: BTreeSet<String>,
    /// Registered runners whose spans were refused, not named yet.
    pending: BTreeSet<String>,
}

/// The watchdog: see the module docs. Start it with [`Watchdog::start`].
pub struct Watchdog;

struct PingDone {
    runner: String,
    incarnation: u64,
    sent: Instant,
    probe: Option<u64>,
    result: Result<Duration, HeartbeatFailure>,
}

struct Worker {
    cfg: WatchdogConfig,
    ledger: Ledger,
    clock: MonoClock,
    runners: BTreeMap<String, Runner>,
    pids: HashMap<u32, String>,
    pings: JoinSet<PingDone>,
    effects: mpsc::Sender<Effect>,
    persist: mpsc::Sender<Vec<LedgerWrite>>,
    board: watch::Sender<RunnerBoard>,
    breakers: Arc<RwLock<HashMap<String, Breaker>>>,
    stats: Arc<WatchdogStats>,
    records: Vec<Record>,
    max_in_flight: u32,
    /// When the loop next wakes, and whether that wake is a full pass.
    sched: Schedule,
    /// Each runner's next deadline.
    due: DueSet,
    /// Runners whose board entry may have changed since the last publication.
    board_dirty: BTreeSet<String>,
    /// When the whole board was last rebuilt (its time-dependent fields refreshed).
    last_board_full: Instant,
    /// When `evaluate` last ran (to notice our own task being starved).
    last_eval: Instant,
    /// When the last `sidecar.degraded` incident was raised.
    degraded_at: Option<Instant>,
    /// Reading an observation took longer than [`late_limit`] since the last evaluation:
    /// counted as our own stall there.
    stalled_in_observe: bool,
    /// The burst of spans not tracked at the ledger's bound, while one lasts.
    untracked_burst: Option<UntrackedBurst>,
}

impl Watchdog {
    /// Starts the watchdog on the current tokio runtime.
    ///
    /// Inputs: committed telemetry (`observations`, from the collector after storage),
    /// runner lifecycle notices (`runner_changes`), and `shutdown`. Outputs: `trips` to the
    /// reaper (each sent after its `breaker.opened` incident is recorded through `events`),
    /// the board (through the handle), and ledger rows in `storage`. The task first reloads
    /// the durable ledger, then runs until `shutdown` is cancelled or both input channels
    /// close; on the way out it writes pending ledger changes and incidents.
    pub fn start(
        config: WatchdogConfig,
        storage: Storage,
        events: EventBus,
        observations: mpsc::Receiver<Observation>,
        runner_changes: mpsc::Receiver<RunnerChange>,
        trips: mpsc::Sender<Trip>,
        shutdown: CancellationToken,
    ) -> (WatchdogHandle, JoinHandle<()>) {
        let stats = Arc::new(WatchdogStats::default());
        let (board_tx, board_rx) = watch::channel(RunnerBoard::default());
        let breakers = Arc::new(RwLock::new(HashMap::new()));
        let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_CAPACITY);
        let handle = WatchdogHandle {
            board: board_rx,
            breakers: breakers.clone(),
            commands: cmd_tx,
            stats: stats.clone(),
        };
        let join = tokio::spawn(async move {
            let (effects_tx, effects_rx) = mpsc::channel(EFFECTS_CAPACITY);
            let (persist_tx, persist_rx) = mpsc::channel(PERSIST_CAPACITY);
            let effects_task = tokio::spawn(run_effects(events, trips, effects_rx, stats.clone()));
            let persist_task =
                tokio::spawn(run_persister(storage.clone(), persist_rx, stats.clone()));
            let clock = MonoClock::new();
            let mut ledger = Ledger::new();
            // the durable copy may hold more rows than the bound (a lower max_open_spans, or
            // a file from before the bound): the surplus goes, the rest is reloaded
            let max = config.max_open_spans;
            match storage.ledger_trim(max).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(
                    "open-span ledger: {n} stored rows over max_open_spans = {max} removed at start"
                ),
                Err(e) => tracing::error!("open-span ledger not trimmed to max_open_spans: {e}"),
            }
            match storage.ledger_load(max).await {
                Ok(rows) => ledger.load(rows, &clock, Instant::now()),
                Err(e) => tracing::error!("open-span ledger not reloaded: {e}"),
            }
            let per = config.heartbeat_interval.as_nanos().max(1);
            let max_in_flight = (config.heartbeat_timeout.as_nanos().div_ceil(per) + 1) as u32;
            let config_tick = config.tick;
            let mut w = Worker {
                cfg: config,
                ledger,
                clock,
                runners: BTreeMap::new(),
                pids: HashMap::new(),
                pings: JoinSet::new(),
                effects: effects_tx,
                persist: persist_tx,
                board: board_tx,
                breakers,
                stats,
                records: Vec::new(),
                max_in_flight,
                sched: Schedule::new(Instant::now(), config_tick),
                due: DueSet::default(),
                board_dirty: BTreeSet::new(),
                last_board_full: Instant::now(),
                last_eval: Instant::now(),
                degraded_at: None,
                stalled_in_observe: false,
                untracked_burst: None,
            };
            w.stats
                .ledger_open_spans
                .store(w.ledger.len() as u64, Ordering::Relaxed);
            w.stats.ledger_capacity.store(max as u64, Ordering::Relaxed);
            w.run(observations, runner_changes, cmd_rx, shutdown).await;
            w.flush_ledger(true).await;
            drop(w);
            let _ = effects_task.await;
            let _ = persist_task.await;
        });
        (handle, join)
    }
}

/// How late a wake may be before it counts as our own stall
/// ([`crate::runner::Runner::own_stall`]): a ping
/// interval (the pings due meanwhile were not sent), at least 250 ms of scheduling noise.
fn late_limit(cfg: &WatchdogConfig) -> Duration {
    cfg.heartbeat_interval.max(Duration::from_millis(250))
}

impl Worker {
    async fn run(
        &mut self,
        mut observations: mpsc::Receiver<Observation>,
        mut changes: mpsc::Receiver<RunnerChange>,
        mut commands: mpsc::Receiver<Command>,
        shutdown: CancellationToken,
    ) {
        let (mut obs_open, mut changes_open) = (true, true);
        let wake = tokio::time::sleep_until(self.sched.next_wake.into());
        tokio::pin!(wake);
        let mut armed = self.sched.next_wake;
        // when the wake should fire at the earliest: its instant, or when it was armed if
        // that instant had already passed (a full pass asked for after an idle spell)
        let mut due_from = armed.max(Instant::now());
        loop {
            if armed != self.sched.next_wake {
                armed = self.sched.next_wake;
                due_from = armed.max(Instant::now());
                wake.as_mut().reset(armed.into());
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(cmd) = commands.recv() => self.command(cmd).await,
                ch = changes.recv(), if changes_open => match ch {
                    Some(ch) => self.runner_change(ch).await,
                    None => changes_open = false,
                },
                Some(done) = self.pings.join_next(), if !self.pings.is_empty() => {
                    if let Ok(done) = done {
                        self.ping_done(done).await;
                    }
                }
                _ = &mut wake => {
                    let now = Instant::now();
                    // how late this wake is: our own task could not run meanwhile
                    let late = now.saturating_duration_since(due_from);
                    self.evaluate(now, late).await;
                    // force a re-arm even when the computed instant is unchanged
                    armed = self.sched.next_wake + Duration::from_nanos(1);
                }
                o = observations.recv(), if obs_open => match o {
                    Some(o) => {
                        // reading a batch is CPU work only: when it took longer than a wake
                        // may be late, this task was stalled in it (a huge batch)
                        let t0 = Instant::now();
                        self.observe(o);
                        self.stalled_in_observe |= t0.elapsed() > late_limit(&self.cfg);
                    }
                    None => obs_open = false,
                },
            }
            if !obs_open && !changes_open {
                break;
            }
        }
    }

    fn observe(&mut self, obs: Observation) {
        stallwatch_storage::failpoint::hit("watchdog.observe");
        self.stats.observations.fetch_add(1, Ordering::Relaxed);
        let mut records = std::mem::take(&mut self.records);
        records.clear();
        // The ids of a trace export's ended spans are applied after its open records, as
        // `Record::Ended` would be, without building a record for each (issue 16: every
        // span of every export passes here).
        let mut ended: &[(TraceId, SpanId)] = &[];
        match &obs.data {
            ObservedData::Spans(b) => shapes::from_traces(b, &mut records),
            ObservedData::Traces { open, ended: ids } => {
                shapes::from_traces(open, &mut records);
                ended = ids.as_slice();
            }
            ObservedData::Logs(b) => {
                let stats = &self.stats;
                shapes::from_logs(b, &mut records, &mut |r| stats.skipped(r))
            }
        }
        if !records.is_empty() || !ended.is_empty() {
            let age = Instant::now().saturating_duration_since(obs.received);
            let unix = now_unix_nano().saturating_sub(age.as_nanos() as u64);
            let pids = &self.pids;
            let lookup = |p: u32| pids.get(&p).cloned();
            let mut changed = 0u64;
            let mut opened = Vec::new();
            let mut touched: BTreeSet<String> = BTreeSet::new();
            let mut refused = false;
            let mut refused_runners: BTreeSet<String> = BTreeSet::new();
            let now = Instant::now();
            let bound = |l: &Ledger, key: &SpanKey| l.get(key).and_then(|e| e.runner.clone());
            for r in &records {
                let key = match r {
                    Record::Open(rec) => rec.key,
                    Record::Ended(k) => *k,
                };
                if let Some(id) = bound(&self.ledger, &key) {
                    touched.insert(id);
                }
                let applied = self.ledger.apply(r, obs.received, unix, &self.cfg, &lookup);
                if let Some(id) = bound(&self.ledger, &key) {
                    touched.insert(id);
                }
                match applied {
                    Applied::Ignored => {}
                    Applied::Untracked => {
                        if let Record::Open(rec) = r {
                            let runner =
                                rec.runner_attr.clone().or_else(|| rec.pid.and_then(lookup));
                            if let Some(id) = runner.filter(|id| self.runners.contains_key(id)) {
                                refused_runners.insert(id);
                            }
                        }
                        refused = true;
                    }
                    Applied::Opened => {
                        changed += 1;
                        if let Record::Open(rec) = r {
                            opened.push((rec.key, rec.pid));
                        }
                    }
                    _ => changed += 1,
                }
            }
            for &(trace_id, span_id) in ended {
                let key = SpanKey { trace_id, span_id };
                // An end only removes an entry, so its runner (if any) is read before.
                if !self.ledger.is_empty() {
                    if let Some(id) = bound(&self.ledger, &key) {
                        touched.insert(id);
                    }
                }
                if self.ledger.close(key) {
                    changed += 1;
                }
            }
            for (key, pid) in opened {
                self.drop_if_from_dead_process(key, pid);
            }
            // only the runners whose spans changed need a new verdict
            for id in touched {
                if self.runners.contains_key(&id) {
                    self.due.set_by(&id, now);
                    self.sched.wake_by(now);
                }
            }
            self.stats
                .ledger_records
                .fetch_add(changed, Ordering::Relaxed);
            self.stats
                .ledger_open_spans
                .store(self.ledger.len() as u64, Ordering::Relaxed);
            if refused {
                self.untracked(now, refused_runners);
            }
        }
        self.records = records;
    }

    /// Spans were not tracked at the ledger's bound (`refused`: the registered runners
    /// among their owners): counts them, logs the start of a burst (once), and marks the
    /// registered runners whose view is now partial (a tool span of theirs was refused,
    /// `Ledger::partial_view`) to name in a `sidecar.degraded` incident at the next
    /// evaluation, once per runner and burst. (A refused span that is no tool span changes
    /// no verdict: it is counted only.)
    fn untracked(&mut self, now: Instant, refused: BTreeSet<String>) {
        use crate::ledger::UntrackedSource;
        let totals = UntrackedSource::ALL.map(|s| self.ledger.untracked(s));
        for s in UntrackedSource::ALL {
            self.stats.ledger_untracked[s.index()].store(totals[s.index()], Ordering::Relaxed);
        }
        let (len, max) = (self.ledger.len(), self.cfg.max_open_spans);
        let burst = self.untracked_burst.get_or_insert_with(|| {
            tracing::warn!(
                "open-span ledger at its bound ({len} spans tracked, max_open_spans = {max}; the last quarter is kept for registered runners): new spans are not tracked, a stall among them may go undetected; counted in stallwatch_watchdog_ledger_untracked_total, logged again when no span was refused for {} s",
                UNTRACKED_BURST_QUIET.as_secs()
            );
            UntrackedBurst {
                since: now,
                last: now,
                before: totals,
                named: BTreeSet::new(),
                pending: BTreeSet::new(),
            }
        });
        burst.last = now;
        let max_sla = self.cfg.sla.max_sla;
        for id in refused {
            if !burst.named.contains(&id) && self.ledger.partial_view(&id, now, max_sla) {
                burst.pending.insert(id);
            }
        }
        if !burst.pending.is_empty() {
            self.sched.wake_by(now);
        }
    }

    /// Ends the burst of untracked spans once none was refused for
    /// [`UNTRACKED_BURST_QUIET`], with one log line counting it.
    fn end_untracked_burst(&mut self, now: Instant) {
        use crate::ledger::UntrackedSource;
        let Some(b) = &self.untracked_burst else {
            return;
        };
        if now.saturating_duration_since(b.last) < UNTRACKED_BURST_QUIET {
            return;
        }
        let n = |s: UntrackedSource| self.ledger.untracked(s) - b.before[s.index()];
        tracing::warn!(
            "open-span ledger: {} spans were not tracked in {} s at its bound (max_open_spans = {}), {} of them of registered runners ({}); none refused since",
            n(UntrackedSource::RegisteredRunner) + n(UntrackedSource::Other),
            b.last.saturating_duration_since(b.since).as_secs(),
            self.cfg.max_open_spans,
            n(UntrackedSource::RegisteredRunner),
            b.named.iter().chain(&b.pending).cloned().collect::<Vec<_>>().join(", "),
        );
        self.untracked_burst = None;
    }

    /// A span that arrives after its runner was restarted, from the process the restart
    /// replaced (its `process.pid` is a past pid of the runner), belongs to a dead process:
    /// it is closed at once, like the spans the restart closed (`docs/design.md`, Fusion and
    /// breakers). Without this a late export of the stalled span would re-open the breaker
    /// as soon as the restarted runner's probe closed it.
    fn drop_if_from_dead_process(&mut self, key: SpanKey, pid: Option<u32>) {
        let Some(pid) = pid else { return };
        let dead = self
            .ledger
            .get(&key)
            .and_then(|e| e.runner.as_ref())
            .and_then(|id| self.runners.get(id))
            .is_some_and(|r| r.pid != Some(pid) && r.past_pids.contains(&pid));
        if dead {
            self.ledger.close(key);
        }
    }

    /// The ledger changed outside an observation: count it and write it out now, so
    /// `/api/v1/open-spans` follows within one persister round trip.
    fn ledger_changed(&mut self) {
        self.stats
            .ledger_open_spans
            .store(self.ledger.len() as u64, Ordering::Relaxed);
        if self.ledger.dirty_len() > 0 {
            if let Ok(permit) = self.persist.try_reserve() {
                permit.send(self.ledger.take_writes(&self.clock));
            }
        }
    }

    /// A runner said goodbye (or removed its socket with no tool span open): it becomes
    /// *stopping*; its missing heartbeat never trips it (`docs/design.md`, Runner lifecycle).
    fn begin_stopping(&mut self, id: &str, now: Instant, by: SelfStop) {
        if let Some(r) = self.runners.get_mut(id) {
            if r.stopping_since.is_none() && !r.dead {
                match by {
                    SelfStop::Goodbye => {
                        tracing::info!(runner = %id, "runner said goodbye: stopping")
                    }
                    SelfStop::SocketGone => {
                        tracing::info!(runner = %id, "runner's heartbeat socket is gone: stopping, still pinged")
                    }
                }
                r.stopping_since = Some(now);
                r.stopping_by = Some(by);
                r.lifecycle = RunnerLifecycle::Stopping;
                self.due.set_by(id, now);
                self.board_dirty.insert(id.to_string());
                self.sched.wake_by(now);
            }
        }
    }

    async fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Reset { id, reply } => {
                let now = Instant::now();
                let out = match self.runners.get_mut(&id) {
                    None => Err(WatchdogError::UnknownRunner(id.clone())),
                    Some(r) => {
                        if r.breaker.reset().is_some() {
                            let configured = r.hb.configured();
                            r.hb.restart(configured, now);
                            self.after_close(&id, now, "breaker reset by a person")
                                .await;
                        }
                        Ok(())
                    }
                };
                self.board_dirty.insert(id.clone());
                if self.runners.contains_key(&id) {
                    self.due.set_by(&id, now);
                    self.sched.wake_by(now);
                }
                self.publish_board(now);
                let _ = reply.send(out);
            }
        }
    }

    /// Asks for an evaluation of `id` at once (its inputs changed).
    fn due_now(&mut self, id: &str, now: Instant) {
        if self.runners.contains_key(id) {
            self.due.set_by(id, now);
            self.sched.wake_by(now);
        }
        self.board_dirty.insert(id.to_string());
    }

    /// Evaluates the runners that are due (all of them after our own task was starved),
    /// runs the resulting actions, flushes the ledger, republishes the board, and computes
    /// the next wake-up: the earliest runner deadline, never later than a tick when a full
    /// pass is pending and never later than the board interval.
    async fn evaluate(&mut self, now: Instant, late: Duration) {
        let gap = now.saturating_duration_since(self.last_eval);
        self.last_eval = now;
        let stalled_in_observe = std::mem::take(&mut self.stalled_in_observe);
        if gap > STARVED_GAP || late > late_limit(&self.cfg) || stalled_in_observe {
            // our own task did not run: the pings it should have sent were never sent,
            // and what arrived meanwhile is not read yet (`runner::Runner::own_stall`)
            let cfg = &self.cfg;
            for r in self.runners.values_mut() {
                r.own_stall(now, cfg);
            }
            self.sched.want_full();
        }
        if gap > STARVED_GAP || late > STARVED_GAP {
            let why = format!(
                "the watchdog task did not run for {} ms (stallwatch starved or stopped)",
                gap.max(late).as_millis()
            );
            self.degraded(now, None, why).await;
        }
        let full = self.sched.begin(now);
        let ids: Vec<String> = if full {
            self.runners.keys().cloned().collect()
        } else {
            self.due.take_due(now)
        };
        self.stats
            .evaluations
            .fetch_add(ids.len() as u64, Ordering::Relaxed);
        let mut actions: Vec<(String, Action)> = Vec::new();
        let mut pings: Vec<String> = Vec::new();
        {
            let cfg = &self.cfg;
            let ledger = &self.ledger;
            let stats = &self.stats;
            for id in ids {
                let Some(r) = self.runners.get_mut(&id) else {
                    continue;
                };
                let view = || LedgerView {
                    worst: ledger.worst_for(&id, now, cfg.staleness),
                    next_crossing: ledger.next_crossing(&id, now, cfg.staleness),
                    partial: ledger.partial_view(&id, now, cfg.sla.max_sla),
                };
                let st = r.step(now, cfg, self.max_in_flight, &view);
                if st.ping {
                    pings.push(id.clone());
                }
                if let Some(v) = st.entered {
                    stats.verdict(v);
                }
                let moved = r.published != Some(r.board_code(now, cfg));
                actions.extend(st.actions.into_iter().map(|a| (id.clone(), a)));
                self.due
                    .set(&id, st.next.max(now + Duration::from_millis(1)));
                if moved {
                    self.board_dirty.insert(id);
                }
            }
        }
        for id in pings {
            self.spawn_ping(&id, None);
        }
        for (id, action) in actions {
            match action {
                Action::HalfOpen(probe) => self.half_open(&id, probe, now).await,
                Action::Reopened => {
                    self.reopened(
                        &id,
                        now,
                        "HALF_OPEN probe got no answer within the heartbeat timeout",
                    )
                    .await
                }
                Action::Suspect(hb) => self.suspect(&id, now, hb).await,
                Action::Trip => self.trip(&id, now).await,
            }
            if self.runners.contains_key(&id) {
                self.due.set(&id, now + Duration::from_millis(1));
            }
            self.board_dirty.insert(id);
        }
        self.untracked_incidents().await;
        self.flush_ledger(false).await;
        let mut next_wake = self
            .due
            .earliest()
            .unwrap_or(now + MAX_IDLE)
            .min(now + MAX_IDLE);
        if self.ledger.dirty_len() > 0 {
            // the persister was busy: try again within a tick
            next_wake = next_wake.min(now + self.cfg.tick);
        }
        self.publish_board(now);
        self.sched
            .end(next_wake, self.last_board_full + self.cfg.board_interval);
    }

    async fn flush_ledger(&mut self, last: bool) {
        if self.ledger.dirty_len() == 0 {
            return;
        }
        if last {
            let writes = self.ledger.take_writes(&self.clock);
            let _ = self.persist.send(writes).await;
            return;
        }
        if let Ok(permit) = self.persist.try_reserve() {
            permit.send(self.ledger.take_writes(&self.clock));
        }
    }

    /// Republishes the board: every runner once per `board_interval` (their elapsed
    /// times, retry-after and heartbeat figures move with time; the open-span ledger's
    /// inferred entries are swept then too), else only the runners marked changed, in
    /// place, so a change costs `O(log n)` and not a rebuild of thousands of entries.
    fn publish_board(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_board_full) >= self.cfg.board_interval {
            self.last_board_full = now;
            self.board_dirty.clear();
            self.ledger.sweep_inferred(now, self.cfg.sla.max_sla);
            self.ledger.forget_partial_views(now, self.cfg.sla.max_sla);
            self.end_untracked_burst(now);
            self.stats
                .ledger_open_spans
                .store(self.ledger.len() as u64, Ordering::Relaxed);
            let cfg = &self.cfg;
            let map: BTreeMap<String, RunnerStatus> = self
                .runners
                .iter_mut()
                .map(|(id, r)| (id.clone(), status(id, r, now, cfg)))
                .collect();
            // An empty board stays the same board: watchers (the forensics sampler, the
            // SSE board stream) are not woken each interval for nothing.
            self.board.send_if_modified(|b| {
                if map.is_empty() && b.is_empty() {
                    return false;
                }
                *b = Arc::new(map);
                true
            });
            return;
        }
        if self.board_dirty.is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut self.board_dirty);
        let (cfg, runners) = (&self.cfg, &mut self.runners);
        self.board.send_modify(|board| {
            // readers clone the Arc only for the length of one request: this rarely copies
            let map = Arc::make_mut(board);
            for id in dirty {
                match runners.get_mut(&id) {
                    Some(r) => {
                        let st = status(&id, r, now, cfg);
                        map.insert(id, st);
                    }
                    None => {
                        map.remove(&id);
                    }
                }
            }
        });
    }
}

/// One runner's board entry (and marks it published).
fn status(id: &str, r: &mut Runner, now: Instant, cfg: &WatchdogConfig) -> RunnerStatus {
    let hb = r.heartbeat_label(now, cfg);
    let adm = r.breaker.admission(now);
    let reason = if r.breaker.state() != BreakerState::Closed {
        r.breaker.reason().to_string()
    } else if r.fused.verdict == Verdict::Suspect {
        format!("suspect: {}", r.fused.cause.as_str())
    } else {
        String::new()
    };
    r.published = Some(r.board_code(now, cfg));
    let verdict = if r.dead && r.breaker.state() == BreakerState::Closed {
        "gone".to_string()
    } else {
        r.fused.verdict.as_str().to_string()
    };
    RunnerStatus {
        id: id.to_string(),
        pid: r.pid,
        spawned: r.spawned,
        lifecycle: r.lifecycle,
        breaker: r.breaker.state(),
        verdict,
        reason,
        retry_after_ms: adm.retry_after_ms,
        heartbeat: hb,
        heartbeat_rtt_us: r.hb.rtt_samples(),
        worst_span: r.worst.as_ref().map(|w| WorstSpan {
            trace_id: w.key.trace_id,
            span_id: w.key.span_id,
            tool_name: w.tool.clone(),
            elapsed_ms: w.elapsed.as_millis() as u64,
            sla_ms: w.sla.as_millis() as u64,
            stale: w.stale,
        }),
    }
}
