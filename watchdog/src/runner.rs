//! One watched runner: its heartbeat tracker, breaker, verdict and lifecycle, and the pure
//! per-runner [`Runner::step`] that decides what an evaluation does (issue 10: the
//! scheduling logic of the worker as a pure function of `now` and its inputs, property-
//! tested below against a small reference model of the heartbeat rule). The worker
//! (`worker.rs`) only feeds it ping results and ledger views and performs its actions.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use stallwatch_storage::control::{BreakerState, RunnerLifecycle};
use stallwatch_storage::labels::HeartbeatLabel;

use crate::breaker::{Breaker, Transition};
use crate::config::WatchdogConfig;
use crate::fusion::{fuse, hold_for_partial_view, Cause, Fused, SpanFacts, Verdict};
use crate::heartbeat::{check_path, HeartbeatFailure, HeartbeatState, HeartbeatTracker};
use crate::ledger::WorstView;
use crate::shapes::SpanKey;

/// What the ledger says about one runner at the instant of a step.
pub(crate) struct LedgerView {
    /// Its worst open tool span.
    pub(crate) worst: Option<WorstView>,
    /// The next SLA or staleness crossing of its spans.
    pub(crate) next_crossing: Option<Instant>,
    /// One of its tool spans was not tracked at the ledger's bound lately
    /// (`Ledger::partial_view`): only a tracked span over its SLA may trip it.
    pub(crate) partial: bool,
}

/// What one [`Runner::step`] decided.
pub(crate) struct Stepped {
    /// A heartbeat ping is due: the worker sends it.
    pub(crate) ping: bool,
    /// Breaker moves, a suspect warning, a trip.
    pub(crate) actions: Vec<Action>,
    /// The verdict the runner entered, when it changed (counted).
    pub(crate) entered: Option<Verdict>,
    /// When the runner next needs a step.
    pub(crate) next: Instant,
}

pub(crate) struct Runner {
    pub(crate) pid: Option<u32>,
    pub(crate) spawned: bool,
    pub(crate) socket: Option<PathBuf>,
    /// A socket path stallwatch can never connect to (over 107 bytes): named, and the
    /// heartbeat counts as not configured rather than lost.
    pub(crate) socket_problem: Option<HeartbeatFailure>,
    pub(crate) hb: HeartbeatTracker,
    pub(crate) breaker: Breaker,
    pub(crate) fused: Fused,
    pub(crate) worst: Option<WorstView>,
    pub(crate) dead: bool,
    /// A HALF_OPEN probe was sent since its process died: a dead spawned runner is probed
    /// once after its cooldown (a restart may have been on its way), then its breaker stays
    /// OPEN until the runner is restarted, re-registered or reset. Probing it every
    /// cooldown made a `breaker.half_open` + `breaker.opened` pair (and their webhooks)
    /// every 15 s, forever, for a runner that had no process to answer.
    pub(crate) probed_dead: bool,
    pub(crate) restarted_since_trip: bool,
    pub(crate) tripped_at: Option<Instant>,
    pub(crate) incarnation: u64,
    pub(crate) published: Option<BoardCode>,
    /// Where it is in its life (board and API `lifecycle`).
    pub(crate) lifecycle: RunnerLifecycle,
    /// Since when it is *stopping* (said goodbye, or its termination began): never tripped
    /// for the missing heartbeat, tripped only past `stopping_timeout`.
    pub(crate) stopping_since: Option<Instant>,
    /// Why it is stopping, when its own heartbeat said so (`BYE`, or its socket gone as
    /// kits remove it at exit): then it is still pinged, and a PONG ends the stopping
    /// (it did not exit after all). `None` when the reaper is stopping it.
    pub(crate) stopping_by: Option<SelfStop>,
    /// The pids of its processes that restarts replaced (newest last, at most
    /// [`PAST_PIDS`]): a span that arrives late from one of them belongs to a dead process.
    pub(crate) past_pids: Vec<u32>,
    /// Until when no trip is made for this runner after stallwatch's own task was starved
    /// ([`Runner::own_stall`]): what reached stallwatch while it could not run (a span's
    /// end in a socket buffer, a queued batch) is read first.
    pub(crate) catch_up_until: Option<Instant>,
}

/// How many replaced pids a runner remembers.
pub(crate) const PAST_PIDS: usize = 8;

/// What a board line shows, compared cheaply to decide whether to republish.
pub(crate) type BoardCode = (
    BreakerState,
    Verdict,
    u8,
    Option<SpanKey>,
    bool,
    RunnerLifecycle,
);

/// A gap this long between two evaluations means the watchdog task itself was starved
/// (or the whole process stopped): its missing pings are stallwatch's fault, so every
/// heartbeat deadline restarts (issue 17 #11). Evaluations normally run at least every
/// [`MAX_IDLE`].
pub(crate) const STARVED_GAP: Duration = Duration::from_millis(2500);
/// At most one `sidecar.degraded` incident per this period.
pub(crate) const DEGRADED_INCIDENT_EVERY: Duration = Duration::from_secs(10);

/// Pings due within this margin are sent together, so 1000 runners cost a few wake-ups
/// per interval rather than one per runner. Only pings move; trip deadlines stay exact.
pub(crate) const PING_SLACK: Duration = Duration::from_millis(20);
/// Longest a runner whose process is gone goes without evaluation (its breaker's deadlines
/// still wake it): each dead runner stepped every [`MAX_IDLE`] cost an idle stallwatch
/// ~2.7 wake-ups/s (issue 16: idle wake-ups).
pub(crate) const DEAD_IDLE: Duration = Duration::from_secs(60);

/// Longest a runner goes without evaluation, whatever its deadlines.
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(1);

/// What a step asks the worker to do (each becomes incidents and maybe a trip).
pub(crate) enum Action {
    HalfOpen(u64),
    Reopened,
    Suspect(HeartbeatState),
    Trip,
}

pub(crate) const HEALTHY: Fused = Fused {
    verdict: Verdict::Healthy,
    trip: false,
    cause: Cause::None,
    trips_at: None,
};

impl Runner {
    pub(crate) fn new(
        id: String,
        pid: Option<u32>,
        socket: Option<PathBuf>,
        spawned: bool,
        now: Instant,
    ) -> Self {
        let socket_problem = socket.as_deref().and_then(|p| check_path(p).err());
        if let Some(p) = &socket_problem {
            tracing::warn!(runner = %id, "heartbeat socket unusable: {p}");
        }
        let configured = socket.is_some() && socket_problem.is_none();
        Self {
            pid,
            spawned,
            socket,
            socket_problem,
            hb: HeartbeatTracker::new(configured, now),
            breaker: Breaker::new(),
            fused: HEALTHY,
            worst: None,
            dead: false,
            probed_dead: false,
            restarted_since_trip: false,
            tripped_at: None,
            incarnation: 0,
            published: None,
            lifecycle: if configured {
                RunnerLifecycle::Starting
            } else {
                RunnerLifecycle::Running
            },
            stopping_since: None,
            stopping_by: None,
            past_pids: Vec::new(),
            catch_up_until: None,
        }
    }

    /// stallwatch's own task could not run until `now` (it woke late): the heartbeat's lost
    /// deadline restarts from `now` (the pings it should have sent were not sent), and no
    /// trip is made before `now + cfg.heartbeat_timeout`, the time a heartbeat gets to
    /// answer, so a span whose end arrived during the stall is read before it is judged.
    /// A stopping runner's limit is not held.
    pub(crate) fn own_stall(&mut self, now: Instant, cfg: &WatchdogConfig) {
        self.hb.own_fault(now);
        let until = now + cfg.heartbeat_timeout;
        self.catch_up_until = Some(self.catch_up_until.map_or(until, |t| t.max(until)));
    }

    /// Remembers `pid` as a process of this runner that a restart replaced.
    pub(crate) fn remember_past_pid(&mut self, pid: u32) {
        self.past_pids.retain(|p| *p != pid);
        self.past_pids.push(pid);
        if self.past_pids.len() > PAST_PIDS {
            self.past_pids.remove(0);
        }
    }

    pub(crate) fn board_code(&self, now: Instant, cfg: &WatchdogConfig) -> BoardCode {
        let hb = if self.socket_problem.is_some() {
            30
        } else {
            self.hb
                .label_code(now, cfg.heartbeat_timeout, cfg.startup_grace)
        };
        (
            self.breaker.state(),
            self.fused.verdict,
            hb,
            self.worst.as_ref().map(|w| w.key),
            self.dead,
            self.lifecycle,
        )
    }

    /// The board's heartbeat label: `not_running` once its process is gone, the socket
    /// problem or latest ping failure when there is one, else the heartbeat state.
    pub(crate) fn heartbeat_label(&self, now: Instant, cfg: &WatchdogConfig) -> HeartbeatLabel {
        if self.dead {
            return HeartbeatLabel::NotRunning;
        }
        if let Some(p) = self.socket_problem.as_ref().or(self.hb.current_failure()) {
            return p.label();
        }
        self.hb
            .state(now, cfg.heartbeat_timeout, cfg.startup_grace)
            .label()
    }

    /// The pure per-runner step: what an evaluation at `now` decides for this runner
    /// (no I/O, no clock read). It starts a due ping (`ping`), polls the breaker
    /// (HALF_OPEN after the cooldown, OPEN again when a probe timed out), fuses heartbeat
    /// and worst open tool span into a verdict (a *stopping* runner is judged only by
    /// its stopping limit), and answers the actions, the verdict entered (if it changed)
    /// and when the runner next needs a step. `view` reads the ledger, only when the
    /// verdict is needed.
    pub(crate) fn step(
        &mut self,
        now: Instant,
        cfg: &WatchdogConfig,
        max_in_flight: u32,
        view: &dyn Fn() -> LedgerView,
    ) -> Stepped {
        let mut out = Stepped {
            ping: false,
            actions: Vec::new(),
            entered: None,
            next: now + MAX_IDLE,
        };
        let pinging = self.breaker.state() == BreakerState::Closed
            && !self.dead
            && (self.stopping_since.is_none() || self.stopping_by.is_some())
            && self.hb.configured();
        if pinging && self.hb.due(now + PING_SLACK, max_in_flight) {
            self.hb.ping_started(now, cfg.heartbeat_interval);
            out.ping = true;
        }
        if pinging && self.hb.in_flight() < max_in_flight {
            out.next = out.next.min(self.hb.next_ping());
        }
        // a dead attached runner is not probed until re-registered; a dead spawned one is
        // probed once (see `probed_dead`); one whose restart policy gave up will never
        // answer again, so it is not probed either. Nor is a live one with no heartbeat
        // socket that was not restarted since the trip: its probe can only fail (only a
        // restart answers for it), so it is held OPEN like a dead one, not sent through
        // HALF_OPEN → OPEN (two incidents and webhooks) every cooldown, forever.
        let unanswerable = self.dead || (self.socket.is_none() && !self.restarted_since_trip);
        let can_probe = (!unanswerable || (self.spawned && !self.probed_dead))
            && self.lifecycle != RunnerLifecycle::GaveUp;
        match self
            .breaker
            .poll(now, can_probe, cfg.breaker_cooldown, cfg.heartbeat_timeout)
        {
            Some(Transition::HalfOpen { probe }) => {
                self.probed_dead |= unanswerable;
                out.actions.push(Action::HalfOpen(probe))
            }
            Some(Transition::Opened) => out.actions.push(Action::Reopened),
            _ => {}
        }
        if self.dead {
            // no process: nothing moves but the breaker (a re-registration wakes it anyway)
            out.next = now + DEAD_IDLE;
        }
        if let Some(d) = self.breaker.next_deadline() {
            out.next = out.next.min(d);
        }
        if self.breaker.state() != BreakerState::Closed || self.dead {
            return out;
        }
        let LedgerView {
            worst,
            next_crossing,
            partial,
        } = view();
        let hb = self.hb.state(now, cfg.heartbeat_timeout, cfg.startup_grace);
        // thresholds are strict (">"): wake just after them
        let after = |t: Instant| t + Duration::from_millis(1);
        let mut f = match self.stopping_since {
            Some(since) => {
                let limit = since + cfg.stopping_timeout;
                out.next = out.next.min(after(limit));
                stopping_verdict(now, limit)
            }
            None => fuse(
                hb,
                worst.as_ref().map(|w| SpanFacts {
                    elapsed: w.elapsed,
                    sla: w.sla,
                    stale: w.stale,
                }),
                now,
                cfg.suspect_cap,
            ),
        };
        if partial && self.stopping_since.is_none() {
            // never kill on a partial view (docs/design.md, "Open spans": the bound)
            f = hold_for_partial_view(f, hb, now, cfg.suspect_cap);
        }
        if let Some(until) = self.catch_up_until {
            if now >= until {
                self.catch_up_until = None;
            } else if f.trip && self.stopping_since.is_none() {
                // judged again once what arrived during our own stall was read
                f.trip = false;
                out.next = out.next.min(until);
            }
        }
        let prev = self.fused;
        self.fused = f;
        self.worst = worst;
        if f.verdict != prev.verdict || f.cause != prev.cause {
            out.entered = Some(f.verdict);
            if f.verdict == Verdict::Suspect {
                out.actions.push(Action::Suspect(hb));
            }
        }
        if f.trip {
            out.actions.push(Action::Trip);
        }
        if let Some(d) = self
            .hb
            .lost_deadline(cfg.heartbeat_timeout, cfg.startup_grace)
        {
            if d >= now {
                out.next = out.next.min(after(d));
            }
        }
        if let Some(c) = next_crossing {
            out.next = out.next.min(after(c));
        }
        if let Some(t) = f.trips_at {
            out.next = out.next.min(t);
        }
        out
    }
}

/// What made a runner *stopping* from its own heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SelfStop {
    /// It answered `BYE`.
    Goodbye,
    /// Its socket was gone after it had answered (kits remove it first at exit).
    SocketGone,
}

/// The verdict of a *stopping* runner at `now`: healthy until `limit`, then `unresponsive`
/// with cause `stopping_timeout` (a goodbye that never became an exit).
fn stopping_verdict(now: Instant, limit: Instant) -> Fused {
    if now > limit {
        Fused {
            verdict: Verdict::Unresponsive,
            trip: true,
            cause: Cause::StoppingTimeout,
            trips_at: None,
        }
    } else {
        Fused {
            trips_at: Some(limit),
            ..HEALTHY
        }
    }
}

/// The verdict on a HALF_OPEN probe (`docs/design.md`, Fusion and breakers): `Ok` closes
/// the breaker, `Err(why)` opens it again. `answer` is the probe's own result (a PONG, or
/// for a runner without a heartbeat socket a restart since the trip; `Err` names why not);
/// `heartbeat` is what that answer makes the heartbeat (`ok`, or `not_configured`); `worst`
/// is the runner's worst open tool span first seen *after* the trip (the spans from before
/// belong to the tripped process and close with the breaker). An answer closes the breaker
/// only if fusion would not trip the runner at once with it: a PONG from a runner whose
/// tool span is already over its SLA (a restarted runner that stalled again while its
/// breaker was OPEN and unpinged) is no recovery, and closing would only re-open within a
/// tick. With a `partial` view (`Ledger::partial_view`) only a tracked span over its SLA
/// keeps the breaker open: a stale one may not be the worst of the whole view
/// ([`hold_for_partial_view`]), and opening again sends a trip.
pub(crate) fn probe_outcome(
    answer: Result<(), String>,
    heartbeat: HeartbeatState,
    worst: Option<&WorstView>,
    partial: bool,
    now: Instant,
    suspect_cap: Duration,
) -> Result<(), String> {
    answer?;
    let facts = worst.map(|w| SpanFacts {
        elapsed: w.elapsed,
        sla: w.sla,
        stale: w.stale,
    });
    let mut f = fuse(heartbeat, facts, now, suspect_cap);
    if partial {
        f = hold_for_partial_view(f, heartbeat, now, suspect_cap);
    }
    match worst {
        Some(w) if f.trip => Err(format!(
            "the probe was answered but tool span {} is {}: {} ms, SLA {} ms",
            w.tool,
            match f.cause {
                Cause::StaleSpan => "stale",
                _ => "over its SLA",
            },
            w.elapsed.as_millis(),
            w.sla.as_millis()
        )),
        _ => Ok(()),
    }
}

pub(crate) fn heartbeat_socket_usable(p: &Option<PathBuf>) -> bool {
    p.as_deref().is_some_and(|p| check_path(p).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> WatchdogConfig {
        let raw = crate::config::RawWatchdogConfig {
            heartbeat_interval_ms: Some(200),
            heartbeat_timeout_ms: Some(1000),
            startup_grace_ms: Some(2000),
            stopping_timeout_ms: Some(3000),
            ..Default::default()
        };
        WatchdogConfig::try_from(raw).expect("valid test config")
    }

    fn none() -> LedgerView {
        LedgerView {
            worst: None,
            next_crossing: None,
            partial: false,
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Ev {
        Pong,
        Fail,
        OwnFault,
        Goodbye,
        Nothing,
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            4 => Just(Ev::Pong),
            2 => Just(Ev::Fail),
            1 => Just(Ev::OwnFault),
            1 => Just(Ev::Nothing),
            1 => Just(Ev::Goodbye),
        ]
    }

    /// The reference model of the heartbeat rule with no open span (`docs/design.md`,
    /// Fusion and breakers; issue 12 #12; issue 17 #11): a trip is due exactly when the
    /// runner is not stopping and no PONG came for the timeout since the later of its last
    /// PONG (or the end of its start-up grace) and stallwatch's own last fault, or when it
    /// said goodbye longer than the stopping limit ago; never while the latest ping failed
    /// for a reason of ours.
    #[derive(Default)]
    struct Model {
        last_pong: Option<Duration>,
        own_fault: Option<Duration>,
        own_now: bool,
        goodbye: Option<Duration>,
    }

    impl Model {
        fn trips(&self, t: Duration, c: &WatchdogConfig) -> bool {
            if let Some(g) = self.goodbye {
                return t > g + c.stopping_timeout;
            }
            if self.own_now {
                return false;
            }
            let base = match self.last_pong {
                Some(p) => p + c.heartbeat_timeout,
                None => c.startup_grace,
            };
            let deadline = match self.own_fault {
                Some(f) => base.max(f + c.heartbeat_timeout),
                None => base,
            };
            t > deadline
        }
    }

    fn worst(elapsed: u64, sla: u64, stale: bool) -> WorstView {
        WorstView {
            key: SpanKey {
                trace_id: stallwatch_storage::model::TraceId([1; 16]),
                span_id: stallwatch_storage::model::SpanId([2; 8]),
            },
            tool: "run_notebook".into(),
            elapsed: Duration::from_millis(elapsed),
            sla: Duration::from_millis(sla),
            stale,
            since_last_seen: Duration::ZERO,
        }
    }

    /// A tripped spawned runner whose process is gone is probed once after its cooldown
    /// (a restart may be on its way); when that probe fails its breaker stays OPEN, with
    /// no probe each cooldown, until the runner is re-registered. A live runner is probed
    /// every cooldown as before (the healthy case next to it).
    #[test]
    fn a_dead_runner_is_probed_once_then_left_open_a_live_one_every_cooldown() {
        let c = cfg();
        let t0 = Instant::now();
        let probes = |dead: bool| {
            let socket = Some(PathBuf::from("/tmp/r.sock"));
            let mut r = Runner::new("r".into(), Some(1), socket, true, t0);
            r.dead = dead;
            r.breaker.trip(t0, c.breaker_cooldown, "tool_overrun");
            let mut t = t0;
            let mut n = 0;
            for _ in 0..6 {
                t += c.breaker_cooldown + Duration::from_millis(1);
                let st = r.step(t, &c, 4, &none);
                for a in &st.actions {
                    if let Action::HalfOpen(probe) = a {
                        n += 1;
                        r.breaker.probe_result(
                            t,
                            *probe,
                            false,
                            c.breaker_cooldown,
                            "connection refused",
                        );
                    }
                }
                assert!(st.next > t, "a step always moves on");
                if dead {
                    assert!(st.next <= t + DEAD_IDLE);
                }
            }
            (n, r)
        };
        assert_eq!(probes(false).0, 6, "a live runner: every cooldown");
        let (n, mut r) = probes(true);
        assert_eq!(n, 1, "a dead runner: once");
        assert_eq!(r.breaker.state(), BreakerState::Open);
        // re-registered (a restart): probed again after the cooldown
        r.dead = false;
        r.probed_dead = false;
        let t = t0 + 20 * c.breaker_cooldown;
        let st = r.step(t, &c, 4, &none);
        assert!(
            st.actions.iter().any(|a| matches!(a, Action::HalfOpen(_))),
            "no probe after the re-registration"
        );
    }

    /// A live runner with no heartbeat socket has nothing to answer a probe with: only a
    /// restart since the trip does. Spawned, it is probed once (a restart may be on its
    /// way), attached never; either is then held OPEN with no probe each cooldown, where it
    /// went HALF_OPEN → OPEN (two incidents and webhooks) every cooldown, forever. Once
    /// restarted it is probed again, and one with a socket every cooldown (the case above).
    #[test]
    fn a_runner_without_a_heartbeat_socket_is_not_probed_every_cooldown() {
        let c = cfg();
        let t0 = Instant::now();
        for (spawned, want) in [(true, 1), (false, 0)] {
            let mut r = Runner::new("r".into(), Some(1), None, spawned, t0);
            r.breaker.trip(t0, c.breaker_cooldown, "tool_overrun");
            let mut t = t0;
            let mut n = 0;
            for _ in 0..6 {
                t += c.breaker_cooldown + Duration::from_millis(1);
                let st = r.step(t, &c, 4, &none);
                for a in &st.actions {
                    if let Action::HalfOpen(probe) = a {
                        n += 1;
                        r.breaker.probe_result(
                            t,
                            *probe,
                            false,
                            c.breaker_cooldown,
                            "no heartbeat socket and no restart since the trip",
                        );
                    }
                }
            }
            assert_eq!(n, want, "spawned {spawned}");
            assert_eq!(r.breaker.state(), BreakerState::Open);
            assert!(
                r.breaker.admission(t).retry_after_ms >= Some(crate::breaker::HELD_RETRY_AFTER_MS)
            );
            // restarted since the trip: probed again after the cooldown
            r.restarted_since_trip = true;
            r.probed_dead = false;
            let t = t + 2 * c.breaker_cooldown;
            let st = r.step(t, &c, 4, &none);
            assert!(
                st.actions.iter().any(|a| matches!(a, Action::HalfOpen(_))),
                "spawned {spawned}: no probe after the restart"
            );
        }
    }

    /// Healthy case next to the stalled one (issue 10 #5): a PONG with no span, or with a
    /// span within its SLA, closes the breaker; a PONG while a tool span opened after the
    /// trip is over its SLA does not, and the reason names the span.
    #[test]
    fn probe_closes_only_when_the_answer_would_not_trip_at_once() {
        let now = Instant::now();
        let cap = Duration::from_secs(30);
        let ok = HeartbeatState::Ok;
        assert_eq!(probe_outcome(Ok(()), ok, None, false, now, cap), Ok(()));
        let within = worst(1500, 2000, false);
        assert_eq!(
            probe_outcome(Ok(()), ok, Some(&within), false, now, cap),
            Ok(())
        );
        let over = worst(2500, 2000, false);
        let why = probe_outcome(Ok(()), ok, Some(&over), false, now, cap).unwrap_err();
        assert!(
            why.contains("run_notebook") && why.contains("over its SLA"),
            "{why}"
        );
        // a stale span trips only a runner without a heartbeat (the fusion table)
        let stale = worst(100, 2000, true);
        assert_eq!(
            probe_outcome(Ok(()), ok, Some(&stale), false, now, cap),
            Ok(())
        );
        let nc = HeartbeatState::NotConfigured;
        let why = probe_outcome(Ok(()), nc, Some(&stale), false, now, cap).unwrap_err();
        assert!(why.contains("stale"), "{why}");
        // with a partial view a stale span keeps nothing open; one over its SLA still does
        assert_eq!(
            probe_outcome(Ok(()), nc, Some(&stale), true, now, cap),
            Ok(())
        );
        assert!(probe_outcome(Ok(()), nc, Some(&over), true, now, cap).is_err());
        assert_eq!(
            probe_outcome(Err("timeout".into()), ok, None, false, now, cap),
            Err("timeout".into())
        );
    }

    /// Never kill on a partial view (the open-span ledger's bound): a runner whose lost
    /// heartbeat would trip it at once with no tool span tracked is held *suspect* until
    /// the suspect cap when one of its tool spans was not tracked, then tripped; a tracked
    /// span over its SLA trips it at once all the same. Next to each: the whole view.
    #[test]
    fn a_partial_view_holds_the_trips_a_missing_span_could_prevent() {
        let c = cfg();
        let t0 = Instant::now();
        let view = |worst: Option<WorstView>, partial: bool| {
            move || LedgerView {
                worst: worst.clone(),
                next_crossing: None,
                partial,
            }
        };
        // the heartbeat is lost (no PONG since the start-up grace ended) and no tool span
        // is tracked
        let lost = t0 + c.startup_grace + Duration::from_millis(1);
        let trips = |r: &mut Runner, now: Instant, v: &dyn Fn() -> LedgerView| {
            r.step(now, &c, 4, v)
                .actions
                .iter()
                .any(|a| matches!(a, Action::Trip))
        };
        let sock = Some(PathBuf::from("/tmp/r.sock"));
        let mut whole = Runner::new("r".into(), Some(1), sock.clone(), true, t0);
        assert!(
            trips(&mut whole, lost, &view(None, false)),
            "whole view: unresponsive at once"
        );
        let mut partial = Runner::new("r".into(), Some(1), sock.clone(), true, t0);
        assert!(
            !trips(&mut partial, lost, &view(None, true)),
            "partial view: held"
        );
        assert_eq!(partial.fused.verdict, Verdict::Suspect);
        let since = t0 + c.startup_grace;
        assert_eq!(partial.fused.trips_at, Some(since + c.suspect_cap));
        assert!(
            trips(&mut partial, since + c.suspect_cap, &view(None, true)),
            "then tripped"
        );
        assert_eq!(partial.fused.verdict, Verdict::SuspectTimeout);
        // a tracked span over its SLA trips a partial view at once
        let mut over = Runner::new("r".into(), Some(1), sock, true, t0);
        assert!(trips(
            &mut over,
            t0 + Duration::from_millis(10),
            &view(Some(worst(2500, 2000, false)), true)
        ));
        assert_eq!(over.fused.verdict, Verdict::ToolOverrun);
        // without a heartbeat socket a stale span trips the whole view, not a partial one
        let mut nc = Runner::new("r".into(), Some(1), None, true, t0);
        let stale = Some(worst(100, 2000, true));
        let at = t0 + Duration::from_millis(10);
        assert!(!trips(&mut nc, at, &view(stale.clone(), true)));
        let mut nc_whole = Runner::new("r".into(), Some(1), None, true, t0);
        assert!(trips(&mut nc_whole, at, &view(stale, false)));
    }

    proptest! {
        /// The probe closes the breaker exactly when it was answered and fusion, with that
        /// answer, would not trip: never CLOSED followed by a trip within the same instant.
        #[test]
        fn probe_outcome_agrees_with_fusion(
            answered in any::<bool>(),
            configured in any::<bool>(),
            span in proptest::option::of((0u64..5000, 1u64..4000, any::<bool>())),
        ) {
            let now = Instant::now();
            let cap = Duration::from_secs(30);
            let hb = if configured { HeartbeatState::Ok } else { HeartbeatState::NotConfigured };
            let w = span.map(|(e, s, st)| worst(e, s, st));
            let answer = if answered { Ok(()) } else { Err("no".to_string()) };
            let out = probe_outcome(answer, hb, w.as_ref(), false, now, cap);
            let facts = w.as_ref().map(|w| SpanFacts { elapsed: w.elapsed, sla: w.sla, stale: w.stale });
            let trips = fuse(hb, facts, now, cap).trip;
            prop_assert_eq!(out.is_ok(), answered && !trips);
        }
    }

    proptest! {
        /// The step trips exactly when the model says so (checked up to the first trip).
        #[test]
        fn step_trips_exactly_when_the_heartbeat_model_says(
            events in proptest::collection::vec((0u64..1500, ev()), 1..60)
        ) {
            let c = cfg();
            let t0 = Instant::now();
            let mut r = Runner::new("r".into(), Some(1), Some(PathBuf::from("/tmp/r.sock")), true, t0);
            let mut m = Model::default();
            let mut t = Duration::ZERO;
            for (adv, e) in events {
                t += Duration::from_millis(adv);
                let now = t0 + t;
                match e {
                    Ev::Pong => {
                        r.hb.ping_finished(now, now, &Ok(Duration::from_micros(50)), 0);
                        m.last_pong = Some(t);
                        m.own_now = false;
                    }
                    Ev::Fail => {
                        r.hb.ping_finished(now, now, &Err(HeartbeatFailure::Timeout), 0);
                        m.own_now = false;
                    }
                    Ev::OwnFault => {
                        r.hb.ping_finished(now, now, &Err(HeartbeatFailure::OwnFault("EMFILE".into())), 0);
                        m.own_fault = Some(t);
                        m.own_now = true;
                    }
                    Ev::Goodbye => {
                        if r.stopping_since.is_none() {
                            r.stopping_since = Some(now);
                            r.lifecycle = RunnerLifecycle::Stopping;
                            m.goodbye = Some(t);
                        }
                    }
                    Ev::Nothing => {}
                }
                let st = r.step(now, &c, 4, &none);
                let tripped = st.actions.iter().any(|a| matches!(a, Action::Trip));
                prop_assert_eq!(tripped, m.trips(t, &c), "at {:?} after {:?}", t, e);
                if tripped {
                    break;
                }
            }
        }

        /// A runner whose every ping is answered never trips, whatever the timing within
        /// the heartbeat timeout.
        #[test]
        fn a_runner_that_always_answers_never_trips(gaps in proptest::collection::vec(1u64..900, 1..80)) {
            let c = cfg();
            let t0 = Instant::now();
            let mut r = Runner::new("r".into(), Some(1), Some(PathBuf::from("/tmp/r.sock")), true, t0);
            let mut now = t0;
            for g in gaps {
                now += Duration::from_millis(g);
                r.hb.ping_finished(now, now, &Ok(Duration::from_micros(50)), 0);
                let st = r.step(now, &c, 4, &none);
                prop_assert!(!st.actions.iter().any(|a| matches!(a, Action::Trip)));
                prop_assert_eq!(r.fused.verdict, Verdict::Healthy);
            }
        }
    }
}
