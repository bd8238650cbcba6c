//! One circuit breaker per runner (docs/design.md, Fusion and breakers): a pure state machine
//! that takes `now` and answers the transition it made, if any.
//!
//! CLOSED → OPEN on a trip. OPEN refuses admissions with `retry_after_ms` until the
//! cooldown ends, then goes HALF_OPEN and asks for one probe ping (the caller sends it,
//! bounded by the heartbeat timeout). PONG → CLOSED; anything else, or no answer by the
//! probe deadline → OPEN with a fresh cooldown. A runner that must not be probed (a dead
//! attached runner, until re-registered) stays OPEN, its cooldown renewed silently. A
//! person may reset any state to CLOSED.

use std::time::{Duration, Instant};

use serde::Serialize;
use stallwatch_storage::control::BreakerState;

/// A transition the breaker made; each becomes an incident (`breaker.opened`,
/// `breaker.half_open`, `breaker.closed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// CLOSED → OPEN (trip) or HALF_OPEN → OPEN (probe failed).
    Opened,
    /// OPEN → HALF_OPEN: send probe number `probe` now.
    HalfOpen {
        /// The probe's sequence number; pass it back to [`Breaker::probe_result`].
        probe: u64,
    },
    /// → CLOSED (probe answered, or reset).
    Closed,
}

/// The answer to `GET /api/v1/runners/{id}/admit` (docs/design.md, Interfaces: Control endpoints):
/// 200 when `admit`, else 503 with `Retry-After`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Admission {
    /// Breaker state.
    pub state: BreakerState,
    /// True only in CLOSED.
    pub admit: bool,
    /// Why the breaker is in its state (empty when CLOSED).
    pub reason: String,
    /// In OPEN / HALF_OPEN: ms until an admission could next succeed (≥ 1); `None` when
    /// CLOSED.
    pub retry_after_ms: Option<u64>,
}

/// One runner's breaker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breaker {
    state: BreakerState,
    reason: String,
    open_until: Option<Instant>,
    probe_deadline: Option<Instant>,
    probe_seq: u64,
    /// OPEN with no probe in sight: the cooldown ended and the runner could not be probed
    /// (dead and not restarted, or an attached runner gone until registered again).
    held: bool,
}

/// `retry_after_ms` of a breaker held OPEN with no probe in sight ([`Breaker::poll`] found
/// it could not probe): 1 h (the one definition, in the vocabulary).
pub use stallwatch_storage::control::HELD_RETRY_AFTER_MS;

impl Default for Breaker {
    fn default() -> Self {
        Self::new()
    }
}

fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000) as u64;
    ms.max(1)
}

impl Breaker {
    /// A CLOSED breaker.
    pub fn new() -> Self {
        Self {
            state: BreakerState::Closed,
            reason: String::new(),
            open_until: None,
            probe_deadline: None,
            probe_seq: 0,
            held: false,
        }
    }

    /// Current state.
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Why it is in its state.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// CLOSED → OPEN for `reason`; the cooldown runs until `now + cooldown`. No effect in
    /// other states (already tripped).
    pub fn trip(&mut self, now: Instant, cooldown: Duration, reason: &str) -> Option<Transition> {
        if self.state != BreakerState::Closed {
            return None;
        }
        self.open(now, cooldown, reason.to_string());
        Some(Transition::Opened)
    }

    fn open(&mut self, now: Instant, cooldown: Duration, reason: String) {
        self.state = BreakerState::Open;
        self.reason = reason;
        self.open_until = Some(now + cooldown);
        self.probe_deadline = None;
        self.held = false;
    }

    /// Time-driven moves: OPEN past its cooldown → HALF_OPEN (when `can_probe`; otherwise
    /// the cooldown is renewed without a transition); HALF_OPEN past its probe deadline →
    /// OPEN with a fresh cooldown.
    pub fn poll(
        &mut self,
        now: Instant,
        can_probe: bool,
        cooldown: Duration,
        probe_timeout: Duration,
    ) -> Option<Transition> {
        match self.state {
            BreakerState::Open if self.open_until.is_some_and(|u| now >= u) => {
                if can_probe {
                    self.state = BreakerState::HalfOpen;
                    self.probe_seq += 1;
                    self.probe_deadline = Some(now + probe_timeout);
                    self.open_until = None;
                    self.held = false;
                    Some(Transition::HalfOpen {
                        probe: self.probe_seq,
                    })
                } else {
                    self.open_until = Some(now + cooldown);
                    self.held = true;
                    None
                }
            }
            BreakerState::HalfOpen if self.probe_deadline.is_some_and(|d| now >= d) => {
                self.open(
                    now,
                    cooldown,
                    "probe got no answer within the heartbeat timeout".into(),
                );
                Some(Transition::Opened)
            }
            _ => None,
        }
    }

    /// The outcome of probe `probe`: PONG (`ok`) → CLOSED, anything else → OPEN with a fresh
    /// cooldown. Ignored unless the breaker is HALF_OPEN waiting for that very probe.
    pub fn probe_result(
        &mut self,
        now: Instant,
        probe: u64,
        ok: bool,
        cooldown: Duration,
        failure: &str,
    ) -> Option<Transition> {
        if self.state != BreakerState::HalfOpen || probe != self.probe_seq {
            return None;
        }
        if ok {
            *self = Self {
                probe_seq: self.probe_seq,
                ..Self::new()
            };
            Some(Transition::Closed)
        } else {
            self.open(now, cooldown, format!("probe failed: {failure}"));
            Some(Transition::Opened)
        }
    }

    /// Manual reset (`POST /api/v1/runners/{id}/breaker/reset`): any state → CLOSED.
    pub fn reset(&mut self) -> Option<Transition> {
        if self.state == BreakerState::Closed {
            return None;
        }
        *self = Self {
            probe_seq: self.probe_seq,
            ..Self::new()
        };
        Some(Transition::Closed)
    }

    /// The admission answer at `now`. Held OPEN with no probe in sight, `retry_after_ms`
    /// is at least [`HELD_RETRY_AFTER_MS`] and the reason says what ends it.
    pub fn admission(&self, now: Instant) -> Admission {
        let retry_after_ms = match self.state {
            BreakerState::Closed => None,
            BreakerState::Open => {
                let left = self
                    .open_until
                    .map_or(1, |u| ceil_ms(u.saturating_duration_since(now)));
                Some(if self.held {
                    left.max(HELD_RETRY_AFTER_MS)
                } else {
                    left
                })
            }
            BreakerState::HalfOpen => Some(
                self.probe_deadline
                    .map_or(1, |d| ceil_ms(d.saturating_duration_since(now))),
            ),
        };
        let reason = if self.state == BreakerState::Open && self.held {
            format!(
                "{}; no probe until the runner is restarted or registered again, or the breaker is reset",
                self.reason
            )
        } else {
            self.reason.clone()
        };
        Admission {
            state: self.state,
            admit: self.state == BreakerState::Closed,
            reason,
            retry_after_ms,
        }
    }

    /// When the next time-driven move is due (cooldown end or probe deadline).
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.state {
            BreakerState::Closed => None,
            BreakerState::Open => self.open_until,
            BreakerState::HalfOpen => self.probe_deadline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const COOL: u64 = 100;
    const PROBE: u64 = 30;

    /// The tiny reference model: state plus the one deadline that matters, in ms.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum M {
        Closed,
        Open { until: u64, held: bool },
        Half { deadline: u64, probe: u64 },
    }

    #[derive(Clone, Debug)]
    enum Op {
        Advance(u64),
        Trip,
        Poll { can_probe: bool },
        ProbeCurrent(bool),
        ProbeStale(bool),
        Reset,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..150).prop_map(Op::Advance),
            Just(Op::Trip),
            any::<bool>().prop_map(|can_probe| Op::Poll { can_probe }),
            any::<bool>().prop_map(Op::ProbeCurrent),
            any::<bool>().prop_map(Op::ProbeStale),
            Just(Op::Reset),
        ]
    }

    fn model_step(m: M, op: &Op, now: u64, seq: &mut u64) -> M {
        match (m, op) {
            (M::Closed, Op::Trip) => M::Open {
                until: now + COOL,
                held: false,
            },
            (M::Open { until, .. }, Op::Poll { can_probe: true }) if now >= until => {
                *seq += 1;
                M::Half {
                    deadline: now + PROBE,
                    probe: *seq,
                }
            }
            (M::Open { until, .. }, Op::Poll { can_probe: false }) if now >= until => M::Open {
                until: now + COOL,
                held: true,
            },
            (M::Half { deadline, .. }, Op::Poll { .. }) if now >= deadline => M::Open {
                until: now + COOL,
                held: false,
            },
            (M::Half { .. }, Op::ProbeCurrent(true)) => M::Closed,
            (M::Half { .. }, Op::ProbeCurrent(false)) => M::Open {
                until: now + COOL,
                held: false,
            },
            (_, Op::Reset) => M::Closed,
            (m, _) => m,
        }
    }

    proptest! {
        #[test]
        fn breaker_matches_reference_model(ops in proptest::collection::vec(op(), 1..80)) {
            let t0 = Instant::now();
            let ms = Duration::from_millis;
            let mut b = Breaker::new();
            let mut m = M::Closed;
            let mut now = 0u64;
            let mut seq = 0u64;
            for o in &ops {
                let before = b.state();
                let t = match o {
                    Op::Advance(d) => { now += d; None }
                    Op::Trip => b.trip(t0 + ms(now), ms(COOL), "trip"),
                    Op::Poll { can_probe } => b.poll(t0 + ms(now), *can_probe, ms(COOL), ms(PROBE)),
                    Op::ProbeCurrent(ok) => b.probe_result(t0 + ms(now), b.probe_seq, *ok, ms(COOL), "x"),
                    Op::ProbeStale(ok) => b.probe_result(t0 + ms(now), b.probe_seq.wrapping_sub(1), *ok, ms(COOL), "x"),
                    Op::Reset => b.reset(),
                };
                m = model_step(m, o, now, &mut seq);
                let a = b.admission(t0 + ms(now));
                match m {
                    M::Closed => {
                        prop_assert_eq!(b.state(), BreakerState::Closed);
                        prop_assert!(a.admit);
                        prop_assert_eq!(a.retry_after_ms, None);
                    }
                    M::Open { until, held } => {
                        prop_assert_eq!(b.state(), BreakerState::Open);
                        prop_assert!(!a.admit);
                        let left = until.saturating_sub(now).max(1);
                        let want = if held { left.max(HELD_RETRY_AFTER_MS) } else { left };
                        prop_assert_eq!(a.retry_after_ms, Some(want));
                        prop_assert_eq!(a.reason.contains("no probe until"), held);
                    }
                    M::Half { deadline, probe } => {
                        prop_assert_eq!(b.state(), BreakerState::HalfOpen);
                        prop_assert_eq!(b.probe_seq, probe);
                        prop_assert!(!a.admit);
                        prop_assert_eq!(a.retry_after_ms, Some(deadline.saturating_sub(now).max(1)));
                    }
                }
                // a transition is reported exactly when the state changed (or OPEN re-opened
                // from HALF_OPEN), and only along the design's edges
                match t {
                    Some(Transition::Opened) => prop_assert!(before != BreakerState::Open && b.state() == BreakerState::Open),
                    Some(Transition::HalfOpen { .. }) => prop_assert!(before == BreakerState::Open && b.state() == BreakerState::HalfOpen),
                    Some(Transition::Closed) => prop_assert!(before != BreakerState::Closed && b.state() == BreakerState::Closed),
                    None => prop_assert_eq!(before, b.state()),
                }
            }
        }
    }

    /// A runner that cannot be probed when the cooldown ends (dead, not restarted): the
    /// breaker stays OPEN, and admissions say so with an hour's Retry-After instead of a
    /// cooldown that counts down and starts again forever; once it can be probed, the next
    /// cooldown's end probes as usual (the healthy path).
    #[test]
    fn held_open_without_a_probe_says_so() {
        let t0 = Instant::now();
        let c = Duration::from_millis(15_000);
        let p = Duration::from_millis(5_000);
        let mut b = Breaker::new();
        b.trip(t0, c, "tool_overrun");
        assert_eq!(b.admission(t0).retry_after_ms, Some(15_000), "in cooldown");
        assert_eq!(b.poll(t0 + c, false, c, p), None);
        let a = b.admission(t0 + c);
        assert_eq!(a.retry_after_ms, Some(HELD_RETRY_AFTER_MS));
        assert!(
            a.reason.starts_with("tool_overrun; no probe until"),
            "{}",
            a.reason
        );
        assert_eq!(b.poll(t0 + c + c, false, c, p), None);
        assert_eq!(
            b.admission(t0 + c + c).retry_after_ms,
            Some(HELD_RETRY_AFTER_MS)
        );
        assert!(matches!(
            b.poll(t0 + c * 3, true, c, p),
            Some(Transition::HalfOpen { .. })
        ));
        assert_eq!(b.admission(t0 + c * 3).retry_after_ms, Some(5_000));
    }

    #[test]
    fn half_open_probe_paths() {
        let t0 = Instant::now();
        let c = Duration::from_millis(15_000);
        let p = Duration::from_millis(5_000);
        let mut b = Breaker::new();
        assert_eq!(b.trip(t0, c, "tool_overrun"), Some(Transition::Opened));
        assert_eq!(b.admission(t0).retry_after_ms, Some(15_000));
        assert_eq!(b.poll(t0 + c - Duration::from_millis(1), true, c, p), None);
        let Some(Transition::HalfOpen { probe }) = b.poll(t0 + c, true, c, p) else {
            panic!("expected HALF_OPEN")
        };
        assert_eq!(
            b.probe_result(t0 + c, probe, false, c, "timeout"),
            Some(Transition::Opened)
        );
        assert!(b.reason().contains("timeout"));
        let t1 = t0 + c + c;
        let Some(Transition::HalfOpen { probe }) = b.poll(t1, true, c, p) else {
            panic!("expected HALF_OPEN again")
        };
        assert_eq!(
            b.probe_result(t1, probe, true, c, ""),
            Some(Transition::Closed)
        );
        assert!(b.admission(t1).admit);
    }
}
