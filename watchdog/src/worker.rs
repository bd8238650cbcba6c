//! The watchdog task: moves messages around the pure cores and does nothing else.
//!
//! One task owns the open-span ledger, every runner's heartbeat tracker, verdict and
//! breaker. It reads committed telemetry ([`Observation`]) and lifecycle notices
//! ([`RunnerChange`]), starts pings as futures in a `JoinSet` (thousands of runners on the
//! runtime's few threads), and every `tick` evaluates each runner: fusion, breaker moves,
//! probes. Side effects leave through two helper tasks so the loop never waits on a disk:
//! the *effects* task records each incident through [`EventBus::publish`] and only then
//! sends the [`Trip`] (an incident is written before anything acts on it), and the
//! *persister* task writes ledger changes in batches (one control transaction per batch).
//! The watchdog never sends a signal and never touches a workspace file.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde_json::json;
use stallwatch_storage::control::{
    BreakerState, Observation, ObservedData, RunnerBoard, RunnerChange, RunnerLifecycle,
    RunnerStatus, Trip, WorstSpan,
};
use stallwatch_storage::ledger::LedgerWrite;
use stallwatch_storage::model::{now_unix_nano, EventKind, NewIncident};
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
    heartbeat_socket_usable, probe_outcome, Action, LedgerView, Runner, DEGRADED_INCIDENT_EVERY,
    HEALTHY, MAX_IDLE, STARVED_GAP,
};
use crate::shapes::{self, Record, SpanKey};
use crate::stats::WatchdogStats;

/// Bound of the handle's command queue.
const COMMAND_CAPACITY: usize = 64;

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
    last_board: Instant,
    max_in_flight: u32,
    /// When the loop next wakes to evaluate.
    next_wake: Instant,
    /// Evaluate every runner (not only those due) at the next wake.
    full_pending: bool,
    last_full: Instant,
    /// When `evaluate` last ran (to notice our own task being starved).
    last_eval: Instant,
    /// When the last `sidecar.degraded` incident was raised.
    degraded_at: Option<Instant>,
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
            match storage.ledger_load().await {
                Ok(rows) => ledger.load(rows, &clock, Instant::now()),
                Err(e) => tracing::error!("open-span ledger not reloaded: {e}"),
            }
            let per = config.heartbeat_interval.as_nanos().max(1);
            let max_in_flight = (config.heartbeat_timeout.as_nanos().div_ceil(per) + 1) as u32;
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
                last_board: Instant::now(),
                max_in_flight,
                next_wake: Instant::now(),
                full_pending: true,
                last_full: Instant::now(),
                last_eval: Instant::now(),
                degraded_at: None,
            };
            w.stats
                .ledger_open_spans
                .store(w.ledger.len() as u64, Ordering::Relaxed);
            w.run(observations, runner_changes, cmd_rx, shutdown).await;
            w.flush_ledger(true).await;
            drop(w);
            let _ = effects_task.await;
            let _ = persist_task.await;
        });
        (handle, join)
    }
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
        let wake = tokio::time::sleep_until(self.next_wake.into());
        tokio::pin!(wake);
        let mut armed = self.next_wake;
        loop {
            if armed != self.next_wake {
                armed = self.next_wake;
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
                    self.evaluate(Instant::now()).await;
                    // force a re-arm even when the computed instant is unchanged
                    armed = self.next_wake + Duration::from_nanos(1);
                }
                o = observations.recv(), if obs_open => match o {
                    Some(o) => {
                        self.observe(o);
                        self.want_full();
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
        self.stats.observations.fetch_add(1, Ordering::Relaxed);
        let mut records = std::mem::take(&mut self.records);
        records.clear();
        match &obs.data {
            ObservedData::Spans(b) => shapes::from_traces(b, &mut records),
            ObservedData::Logs(b) => {
                let stats = &self.stats;
                shapes::from_logs(b, &mut records, &mut |r| stats.skipped(r))
            }
        }
        if !records.is_empty() {
            let age = Instant::now().saturating_duration_since(obs.received);
            let unix = now_unix_nano().saturating_sub(age.as_nanos() as u64);
            let pids = &self.pids;
            let lookup = |p: u32| pids.get(&p).cloned();
            let mut changed = 0u64;
            let mut opened = Vec::new();
            for r in &records {
                match self.ledger.apply(r, obs.received, unix, &self.cfg, &lookup) {
                    Applied::Ignored => {}
                    Applied::Opened => {
                        changed += 1;
                        if let Record::Open(rec) = r {
                            opened.push((rec.key, rec.pid));
                        }
                    }
                    _ => changed += 1,
                }
            }
            for (key, pid) in opened {
                self.drop_if_from_dead_process(key, pid);
            }
            self.stats
                .ledger_records
                .fetch_add(changed, Ordering::Relaxed);
            self.stats
                .ledger_open_spans
                .store(self.ledger.len() as u64, Ordering::Relaxed);
        }
        self.records = records;
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

    async fn runner_change(&mut self, ch: RunnerChange) {
        let now = Instant::now();
        match ch {
            RunnerChange::Registered {
                id,
                pid,
                heartbeat_socket,
                spawned,
                restarted,
            } => {
                let existed = self.runners.contains_key(&id);
                if let Some(r) = self.runners.get(&id) {
                    if let Some(old) = r.pid {
                        self.pids.remove(&old);
                    }
                }
                let r = self.runners.entry(id.clone()).or_insert_with(|| {
                    Runner::new(id.clone(), pid, heartbeat_socket.clone(), spawned, now)
                });
                if existed {
                    // a restart or a re-registration: same breaker, new process
                    if let Some(old) = r.pid.filter(|old| Some(*old) != pid) {
                        r.remember_past_pid(old);
                    }
                    let configured = heartbeat_socket_usable(&heartbeat_socket);
                    r.socket_problem = heartbeat_socket
                        .as_deref()
                        .and_then(|p| check_path(p).err());
                    r.socket = heartbeat_socket;
                    r.pid = pid;
                    r.past_pids.retain(|p| Some(*p) != pid);
                    r.spawned = spawned;
                    r.hb.restart(configured, now);
                    r.dead = false;
                    r.incarnation += 1;
                    r.restarted_since_trip = true;
                    r.stopping_since = None;
                    r.lifecycle = if configured {
                        RunnerLifecycle::Starting
                    } else {
                        RunnerLifecycle::Running
                    };
                    if r.breaker.state() == BreakerState::Closed {
                        r.fused = HEALTHY;
                    }
                }
                if existed || restarted {
                    // the old process's open spans died with it
                    for k in self.ledger.runner_spans_before(&id, now) {
                        self.ledger.close(k);
                    }
                }
                if let Some(p) = pid {
                    self.pids.insert(p, id.clone());
                    self.ledger.bind_pid(p, &id);
                }
                self.sync_breaker(&id);
            }
            RunnerChange::Gone { id, removed } => {
                if removed {
                    if let Some(r) = self.runners.remove(&id) {
                        if let Some(p) = r.pid {
                            self.pids.remove(&p);
                        }
                    }
                    if let Ok(mut m) = self.breakers.write() {
                        m.remove(&id);
                    }
                } else if let Some(r) = self.runners.get_mut(&id) {
                    r.dead = true;
                    r.stopping_since = None;
                    r.worst = None;
                    if r.lifecycle != RunnerLifecycle::GaveUp {
                        r.lifecycle = RunnerLifecycle::Exited;
                    }
                }
                // its process is gone: none of its spans can still be running, and the
                // reaper has written the ends it could (the ledger learns of every end)
                for k in self.ledger.runner_spans_before(&id, now) {
                    self.ledger.close(k);
                }
                self.ledger_changed();
            }
            RunnerChange::Lifecycle { id, lifecycle } => {
                if let Some(r) = self.runners.get_mut(&id) {
                    r.lifecycle = lifecycle;
                    match lifecycle {
                        RunnerLifecycle::Stopping => {
                            r.stopping_since.get_or_insert(now);
                        }
                        _ => r.stopping_since = None,
                    }
                }
            }
            RunnerChange::SpansEnded { id, spans } => {
                for (trace_id, span_id) in spans {
                    self.ledger.close(SpanKey { trace_id, span_id });
                }
                if let Some(r) = self.runners.get_mut(&id) {
                    r.worst = None;
                }
                self.ledger_changed();
            }
        }
        self.stats
            .runners
            .store(self.runners.len() as u64, Ordering::Relaxed);
        self.publish_board(now, true);
        self.want_full();
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

    /// Raises `sidecar.degraded` (at most once per [`DEGRADED_INCIDENT_EVERY`]): stallwatch's
    /// own trouble hid a heartbeat; no runner is blamed (issue 17 #11).
    async fn degraded(&mut self, now: Instant, runner: Option<&str>, why: String) {
        tracing::error!(runner = runner.unwrap_or("-"), "stallwatch degraded: {why}");
        if self
            .degraded_at
            .is_some_and(|t| now.saturating_duration_since(t) < DEGRADED_INCIDENT_EVERY)
        {
            return;
        }
        self.degraded_at = Some(now);
        self.stats.sidecar_degraded.fetch_add(1, Ordering::Relaxed);
        let at = now_unix_nano();
        self.emit(Effect::Incident(NewIncident {
            kind: EventKind::SidecarDegraded,
            runner_id: None,
            tool_name: None,
            trace_id: None,
            span_id: None,
            reason: format!("stallwatch itself is degraded: {why}; heartbeats count as unknown, no runner is tripped for them"),
            evidence: json!({"runner": runner, "why": why}),
            idempotency_key: format!("sidecar.degraded/{at}"),
            at_unix_nano: at,
        }))
        .await;
    }

    /// A runner said goodbye (or removed its socket with no tool span open): it becomes
    /// *stopping*; its missing heartbeat never trips it (`docs/design.md`, Runner lifecycle).
    fn begin_stopping(&mut self, id: &str, now: Instant) {
        if let Some(r) = self.runners.get_mut(id) {
            if r.stopping_since.is_none() && !r.dead {
                tracing::info!(runner = %id, "runner said goodbye: stopping");
                r.stopping_since = Some(now);
                r.lifecycle = RunnerLifecycle::Stopping;
                r.next_eval = now;
                self.next_wake = self.next_wake.min(now);
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
                self.publish_board(now, true);
                self.want_full();
                let _ = reply.send(out);
            }
        }
    }

    fn spawn_ping(&mut self, id: &str, probe: Option<u64>) {
        let Some(r) = self.runners.get_mut(id) else {
            return;
        };
        let Some(path) = r.socket.clone() else { return };
        self.stats.heartbeats_sent.fetch_add(1, Ordering::Relaxed);
        let timeout = self.cfg.heartbeat_timeout;
        let runner = id.to_string();
        let incarnation = r.incarnation;
        self.pings.spawn(async move {
            let sent = Instant::now();
            let result = ping(&path, timeout).await;
            PingDone {
                runner,
                incarnation,
                sent,
                probe,
                result,
            }
        });
    }

    async fn ping_done(&mut self, d: PingDone) {
        let now = Instant::now();
        match &d.result {
            Ok(_) => self.stats.heartbeats_ok.fetch_add(1, Ordering::Relaxed),
            Err(f) => {
                self.stats.heartbeat_failed(f);
                0
            }
        };
        let cooldown = self.cfg.breaker_cooldown;
        let Some(r) = self.runners.get_mut(&d.runner) else {
            return;
        };
        match d.probe {
            None => {
                if d.incarnation == r.incarnation {
                    r.hb.ping_finished(d.sent, now, &d.result, now_unix_nano() / 1_000_000);
                    let had_pong = r.hb.last_pong().is_some();
                    match &d.result {
                        Ok(_) if r.lifecycle == RunnerLifecycle::Starting => {
                            r.lifecycle = RunnerLifecycle::Running;
                        }
                        Err(HeartbeatFailure::Goodbye) => self.begin_stopping(&d.runner, now),
                        Err(HeartbeatFailure::SocketMissing)
                            if had_pong && self.ledger.runner_tool_spans(&d.runner).is_empty() =>
                        {
                            // the kits remove the socket first at exit
                            self.begin_stopping(&d.runner, now)
                        }
                        Err(HeartbeatFailure::OwnFault(e)) => {
                            let why = format!("heartbeat of runner {} not sent: {e}", d.runner);
                            self.degraded(now, Some(&d.runner), why).await;
                        }
                        _ => {}
                    }
                    let Some(r) = self.runners.get_mut(&d.runner) else {
                        return;
                    };
                    r.next_eval = r.next_eval.min(r.hb.next_ping().max(now));
                    self.next_wake = self.next_wake.min(r.next_eval);
                    return;
                } else {
                    // a ping of a previous incarnation: only release its in-flight slot
                    r.hb.ping_finished(d.sent, now, &Err(HeartbeatFailure::Timeout), 0);
                }
                // a freed in-flight slot may make a ping due at once
                r.next_eval = r.next_eval.min(r.hb.next_ping().max(now));
                self.next_wake = self.next_wake.min(r.next_eval);
            }
            Some(probe) => {
                let answer = d.result.as_ref().map(|_| ()).map_err(|f| f.to_string());
                let worst = r.tripped_at.and_then(|t| {
                    self.ledger
                        .worst_first_seen_after(&d.runner, t, now, self.cfg.staleness)
                });
                let outcome = probe_outcome(
                    answer,
                    HeartbeatState::Ok,
                    worst.as_ref(),
                    now,
                    self.cfg.suspect_cap,
                );
                let failure = outcome.err().unwrap_or_default();
                let ok = failure.is_empty();
                let t = r.breaker.probe_result(now, probe, ok, cooldown, &failure);
                match t {
                    Some(Transition::Closed) => {
                        r.hb.restart(r.hb.configured(), now);
                        r.hb.pong_at(now);
                        if r.lifecycle == RunnerLifecycle::Detached
                            || r.lifecycle == RunnerLifecycle::Starting
                        {
                            r.lifecycle = RunnerLifecycle::Running;
                        }
                        self.after_close(&d.runner, now, "probe answered PONG")
                            .await;
                    }
                    Some(Transition::Opened) => {
                        let reason = format!("HALF_OPEN probe failed: {failure}");
                        self.reopened(&d.runner, now, &reason).await;
                    }
                    _ => {}
                }
                self.publish_board(now, true);
            }
        }
    }

    /// After → CLOSED: drop the open spans of the tripped process, clear the verdict,
    /// record `breaker.closed`.
    async fn after_close(&mut self, id: &str, now: Instant, why: &str) {
        let Some(r) = self.runners.get_mut(id) else {
            return;
        };
        let tripped_at = r.tripped_at.take();
        r.fused = HEALTHY;
        r.worst = None;
        r.restarted_since_trip = false;
        if let Some(t) = tripped_at {
            for k in self.ledger.runner_spans_before(id, t) {
                self.ledger.close(k);
            }
        }
        let ev = self.evidence(id, now);
        self.sync_breaker(id);
        self.emit(Effect::Incident(incident(
            EventKind::BreakerClosed,
            id,
            None,
            format!("breaker of runner {id} CLOSED: {why}"),
            ev,
            format!("breaker.closed/{id}/{}", now_unix_nano()),
        )))
        .await;
    }

    async fn reopened(&mut self, id: &str, now: Instant, reason: &str) {
        let open_spans: Vec<_> = self
            .ledger
            .runner_tool_spans(id)
            .into_iter()
            .map(|k| (k.trace_id, k.span_id))
            .collect();
        if let Some(r) = self.runners.get_mut(id) {
            r.tripped_at = Some(now);
        }
        let ev = self.evidence(id, now);
        self.sync_breaker(id);
        let at = now_unix_nano();
        let inc = incident(
            EventKind::BreakerOpened,
            id,
            None,
            format!("breaker of runner {id} OPEN again: {reason}"),
            ev,
            format!("breaker.opened/{id}/probe/{at}"),
        );
        let trip = Trip {
            runner_id: id.to_string(),
            verdict: "probe_failed".into(),
            reason: reason.to_string(),
            incident_id: None,
            open_spans,
            at_unix_nano: at,
        };
        self.emit(Effect::IncidentThenTrip(inc, trip)).await;
    }

    fn sync_breaker(&self, id: &str) {
        if let (Some(r), Ok(mut m)) = (self.runners.get(id), self.breakers.write()) {
            m.insert(id.to_string(), r.breaker.clone());
        }
    }

    async fn emit(&self, e: Effect) {
        if self.effects.send(e).await.is_err() {
            self.stats.incident_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn evidence(&self, id: &str, now: Instant) -> serde_json::Value {
        let Some(r) = self.runners.get(id) else {
            return json!({});
        };
        let hb =
            r.hb.state(now, self.cfg.heartbeat_timeout, self.cfg.startup_grace);
        let span = r.worst.as_ref().map(|w| {
            json!({
                "trace_id": w.key.trace_id.to_hex(),
                "span_id": w.key.span_id.to_hex(),
                "tool_name": w.tool,
                "elapsed_ms": w.elapsed.as_millis() as u64,
                "sla_ms": w.sla.as_millis() as u64,
                "stale": w.stale,
                "since_last_seen_ms": w.since_last_seen.as_millis() as u64,
            })
        });
        json!({
            "verdict": r.fused.verdict.as_str(),
            "cause": r.fused.cause.as_str(),
            "heartbeat": hb.as_str(),
            "heartbeat_failure": r.socket_problem.as_ref().or(r.hb.current_failure()).map(|f| f.as_str()),
            "last_pong_age_ms": r.hb.last_pong().map(|p| now.saturating_duration_since(p).as_millis() as u64),
            "rtt_us": r.hb.last_rtt_us(),
            "pid": r.pid,
            "span": span,
        })
    }

    /// Asks for an evaluation of every runner at the next wake (at most once per tick).
    fn want_full(&mut self) {
        if !self.full_pending {
            self.full_pending = true;
            self.next_wake = self.next_wake.min(self.last_full + self.cfg.tick);
        }
    }

    /// Evaluates the runners that are due (or all of them after a change), runs the
    /// resulting actions, flushes the ledger, republishes the board, and computes the next
    /// wake-up: the earliest runner deadline, never later than a tick when a full pass is
    /// pending and never later than the board interval.
    async fn evaluate(&mut self, now: Instant) {
        let gap = now.saturating_duration_since(self.last_eval);
        self.last_eval = now;
        if gap > STARVED_GAP {
            // our own task did not run: the pings it should have sent were never sent
            for r in self.runners.values_mut() {
                r.hb.own_fault(now);
            }
            self.full_pending = true;
            let why = format!(
                "the watchdog task did not run for {} ms (stallwatch starved or stopped)",
                gap.as_millis()
            );
            self.degraded(now, None, why).await;
        }
        let full = self.full_pending && now >= self.last_full + self.cfg.tick;
        if full {
            self.full_pending = false;
            self.last_full = now;
        }
        let mut actions: Vec<(String, Action)> = Vec::new();
        let mut pings: Vec<String> = Vec::new();
        let mut changed = false;
        let mut next_wake = now + MAX_IDLE;
        {
            let cfg = &self.cfg;
            let ledger = &self.ledger;
            let stats = &self.stats;
            for (id, r) in self.runners.iter_mut() {
                if !full && r.next_eval > now {
                    next_wake = next_wake.min(r.next_eval);
                    continue;
                }
                let view = || LedgerView {
                    worst: ledger.worst_for(id, now, cfg.staleness),
                    next_crossing: ledger.next_crossing(id, now, cfg.staleness),
                };
                let st = r.step(now, cfg, self.max_in_flight, &view);
                if st.ping {
                    pings.push(id.clone());
                }
                if let Some(v) = st.entered {
                    stats.verdict(v);
                }
                actions.extend(st.actions.into_iter().map(|a| (id.clone(), a)));
                let next = st.next;
                r.next_eval = next.max(now + Duration::from_millis(1));
                next_wake = next_wake.min(r.next_eval);
                changed |= r.published != Some(r.board_code(now, cfg));
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
            if let Some(r) = self.runners.get_mut(&id) {
                r.next_eval = now + Duration::from_millis(1);
                next_wake = next_wake.min(r.next_eval);
            }
            changed = true;
        }
        if full {
            self.ledger.sweep_inferred(now, self.cfg.sla.max_sla);
            self.stats
                .ledger_open_spans
                .store(self.ledger.len() as u64, Ordering::Relaxed);
        }
        self.flush_ledger(false).await;
        if self.ledger.dirty_len() > 0 {
            self.want_full();
        }
        self.publish_board(now, changed);
        next_wake = next_wake.min(self.last_board + self.cfg.board_interval);
        if self.full_pending {
            next_wake = next_wake.min(self.last_full + self.cfg.tick);
        }
        self.next_wake = next_wake;
    }

    async fn half_open(&mut self, id: &str, probe: u64, now: Instant) {
        let ev = self.evidence(id, now);
        self.sync_breaker(id);
        self.emit(Effect::Incident(incident(
            EventKind::BreakerHalfOpen,
            id,
            None,
            format!("breaker of runner {id} HALF_OPEN after its cooldown: sending one probe ping"),
            ev,
            format!("breaker.half_open/{id}/{}", now_unix_nano()),
        )))
        .await;
        let Some(r) = self.runners.get_mut(id) else {
            return;
        };
        if r.socket.is_some() && r.socket_problem.is_none() {
            self.spawn_ping(id, Some(probe));
        } else {
            // no heartbeat socket to probe: only a restart since the trip counts as an answer
            let answer = if r.restarted_since_trip && !r.dead {
                Ok(())
            } else {
                Err("no heartbeat socket and no restart since the trip".to_string())
            };
            let worst = r.tripped_at.and_then(|t| {
                self.ledger
                    .worst_first_seen_after(id, t, now, self.cfg.staleness)
            });
            let outcome = probe_outcome(
                answer,
                HeartbeatState::NotConfigured,
                worst.as_ref(),
                now,
                self.cfg.suspect_cap,
            );
            let failure = outcome.err().unwrap_or_default();
            let ok = failure.is_empty();
            let cooldown = self.cfg.breaker_cooldown;
            match r.breaker.probe_result(now, probe, ok, cooldown, &failure) {
                Some(Transition::Closed) => {
                    r.hb.restart(r.hb.configured(), now);
                    self.after_close(id, now, "runner restarted since the trip")
                        .await
                }
                Some(Transition::Opened) => self.reopened(id, now, &failure).await,
                _ => {}
            }
        }
    }

    async fn suspect(&mut self, id: &str, now: Instant, hb: HeartbeatState) {
        let Some(r) = self.runners.get(id) else {
            return;
        };
        let Some(w) = r.worst.clone() else { return };
        let reason = match r.fused.cause {
            Cause::StaleSpan => format!(
                "tool span {} of runner {id} is stale: no refresh for {} ms (limit {} ms)",
                w.tool,
                w.since_last_seen.as_millis(),
                self.cfg.staleness.as_millis()
            ),
            _ => format!(
                "runner {id} lost its heartbeat ({}) while tool span {} is within its SLA of {} ms: a native call may hold the GIL; trips after {} ms",
                hb.as_str(),
                w.tool,
                w.sla.as_millis(),
                w.sla.min(self.cfg.suspect_cap).as_millis()
            ),
        };
        let ev = self.evidence(id, now);
        let key = format!(
            "verdict.suspect/{id}/{}/{}/{}",
            r.fused.cause.as_str(),
            w.key.trace_id,
            w.key.span_id
        );
        let mut inc = incident(EventKind::VerdictSuspect, id, Some(&w), reason, ev, key);
        inc.tool_name = Some(w.tool.clone());
        self.emit(Effect::Incident(inc)).await;
    }

    async fn trip(&mut self, id: &str, now: Instant) {
        let cooldown = self.cfg.breaker_cooldown;
        let Some(r) = self.runners.get_mut(id) else {
            return;
        };
        let f = r.fused;
        let reason = match (&r.worst, f.cause) {
            (_, Cause::StoppingTimeout) => format!(
                "{}: runner {id} said goodbye but did not exit within stopping_timeout_ms ({} ms)",
                f.verdict.as_str(),
                self.cfg.stopping_timeout.as_millis()
            ),
            (Some(w), Cause::OverSla) => format!(
                "{}: tool span {} of runner {id} ran {} ms, over its SLA of {} ms",
                f.verdict.as_str(),
                w.tool,
                w.elapsed.as_millis(),
                w.sla.as_millis()
            ),
            (Some(w), Cause::StaleSpan) => format!(
                "{}: tool span {} of runner {id} stopped refreshing {} ms ago",
                f.verdict.as_str(),
                w.tool,
                w.since_last_seen.as_millis()
            ),
            (Some(w), Cause::LostHeartbeat) => format!(
                "{}: runner {id} answered no PONG for {} ms while tool span {} ran",
                f.verdict.as_str(),
                r.hb.last_pong()
                    .map_or(0, |p| now.saturating_duration_since(p).as_millis()),
                w.tool
            ),
            _ => format!(
                "{}: runner {id} answered no PONG within the heartbeat timeout ({} ms){}",
                f.verdict.as_str(),
                self.cfg.heartbeat_timeout.as_millis(),
                r.hb.current_failure()
                    .map(|e| format!(", last failure: {e}"))
                    .unwrap_or_default()
            ),
        };
        if r.breaker.trip(now, cooldown, &reason).is_none() {
            return;
        }
        r.tripped_at = Some(now);
        r.restarted_since_trip = false;
        self.stats.trips.fetch_add(1, Ordering::Relaxed);
        let worst = r.worst.clone();
        let open_spans: Vec<_> = self
            .ledger
            .runner_tool_spans(id)
            .into_iter()
            .map(|k| (k.trace_id, k.span_id))
            .collect();
        let ev = self.evidence(id, now);
        self.sync_breaker(id);
        let at = now_unix_nano();
        let key = match &worst {
            Some(w) if f.cause != Cause::LostNoSpan => format!(
                "breaker.opened/{id}/{}/{}/{}",
                f.verdict.as_str(),
                w.key.trace_id,
                w.key.span_id
            ),
            _ => format!("breaker.opened/{id}/{}/{at}", f.verdict.as_str()),
        };
        let mut inc = incident(
            EventKind::BreakerOpened,
            id,
            worst.as_ref(),
            reason.clone(),
            ev,
            key,
        );
        inc.at_unix_nano = at;
        let trip = Trip {
            runner_id: id.to_string(),
            verdict: f.verdict.as_str().to_string(),
            reason,
            incident_id: None,
            open_spans,
            at_unix_nano: at,
        };
        self.emit(Effect::IncidentThenTrip(inc, trip)).await;
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

    fn publish_board(&mut self, now: Instant, changed: bool) {
        if !changed && now.saturating_duration_since(self.last_board) < self.cfg.board_interval {
            return;
        }
        self.last_board = now;
        let cfg = &self.cfg;
        let mut map = BTreeMap::new();
        for (id, r) in self.runners.iter_mut() {
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
            map.insert(
                id.clone(),
                RunnerStatus {
                    id: id.clone(),
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
                },
            );
        }
        self.board.send_replace(Arc::new(map));
    }
}

fn incident(
    kind: EventKind,
    runner: &str,
    span: Option<&WorstView>,
    reason: String,
    evidence: serde_json::Value,
    idempotency_key: String,
) -> NewIncident {
    NewIncident {
        kind,
        runner_id: Some(runner.to_string()),
        tool_name: span.map(|w| w.tool.clone()),
        trace_id: span.map(|w| w.key.trace_id),
        span_id: span.map(|w| w.key.span_id),
        reason,
        evidence,
        idempotency_key,
        at_unix_nano: now_unix_nano(),
    }
}
