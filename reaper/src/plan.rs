//! The termination sequence as a pure state machine (issue 10: a pure plan pulled out of
//! `terminate()`; `docs/design.md`, Reaper). [`step`] takes the plan's state, the time since
//! the termination began and what was observed, and answers the actions to take now; it
//! does no I/O, so the order of the sequence is property-tested against a small reference
//! model (below). [`crate::terminate`] and `shutdown` perform the same order:
//!
//! record descendants → SIGTERM → SIGCONT (a stopped runner must run to act on SIGTERM;
//! issue 11) → wait up to the grace period → SIGKILL to what is left → wait up to the
//! after-kill bound → reap (own child only) → report survivors.

use std::time::Duration;

/// Where the plan stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Nothing done yet.
    Start,
    /// SIGTERM (and SIGCONT) sent at this offset.
    Terminating(Duration),
    /// SIGKILL sent at this offset.
    Killing(Duration),
    /// Every action is done.
    Done,
}

/// The plan's state: its phase and its fixed bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Where it stands.
    pub phase: Phase,
    /// SIGTERM → SIGKILL grace period.
    pub grace: Duration,
    /// How long to wait for exit after SIGKILL before reporting survivors.
    pub after_kill: Duration,
    /// The leader is our unreaped child (it is reaped at the end).
    pub own_child: bool,
}

/// One thing to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Record the runner's proven descendants (before any signal).
    RecordDescendants,
    /// Send SIGTERM to the runner and its recorded descendants.
    Term,
    /// Send SIGCONT right after SIGTERM.
    Cont,
    /// Send SIGKILL to what is left.
    Kill,
    /// Reap the leader (own child only).
    Reap,
    /// Report which recorded processes are still alive; the plan is over.
    ReportSurvivors,
}

impl Plan {
    /// A new plan.
    pub fn new(grace: Duration, after_kill: Duration, own_child: bool) -> Self {
        Self {
            phase: Phase::Start,
            grace,
            after_kill,
            own_child,
        }
    }
}

fn finish(plan: &mut Plan, out: &mut Vec<Action>) {
    if plan.own_child {
        out.push(Action::Reap);
    }
    out.push(Action::ReportSurvivors);
    plan.phase = Phase::Done;
}

/// Advances the plan: `now` is the time since the termination began, `gone` whether the
/// runner and every recorded descendant have exited. Answers the actions to take now, in
/// order (empty: wait and call again).
pub fn step(plan: &mut Plan, now: Duration, gone: bool) -> Vec<Action> {
    let mut out = Vec::new();
    match plan.phase {
        Phase::Start => {
            out.push(Action::RecordDescendants);
            if gone {
                finish(plan, &mut out);
            } else {
                out.push(Action::Term);
                out.push(Action::Cont);
                plan.phase = Phase::Terminating(now);
            }
        }
        Phase::Terminating(at) => {
            if gone {
                finish(plan, &mut out);
            } else if now.saturating_sub(at) >= plan.grace {
                out.push(Action::Kill);
                plan.phase = Phase::Killing(now);
            }
        }
        Phase::Killing(at) => {
            if gone || now.saturating_sub(at) >= plan.after_kill {
                finish(plan, &mut out);
            }
        }
        Phase::Done => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference model: the whole sequence from when the runner exits (`exit_at`,
    /// `None` = never by itself), checked on the trace the plan produced.
    fn check(
        trace: &[(Duration, Action)],
        grace: Duration,
        after_kill: Duration,
        own: bool,
        exit_at: Option<Duration>,
    ) {
        let acts: Vec<Action> = trace.iter().map(|(_, a)| *a).collect();
        assert_eq!(
            acts.first(),
            Some(&Action::RecordDescendants),
            "descendants first: {acts:?}"
        );
        assert_eq!(
            acts.last(),
            Some(&Action::ReportSurvivors),
            "ends with the report: {acts:?}"
        );
        assert_eq!(
            acts.iter()
                .filter(|a| **a == Action::ReportSurvivors)
                .count(),
            1
        );
        assert_eq!(
            acts.contains(&Action::Reap),
            own,
            "reap only our own child: {acts:?}"
        );
        let term = trace
            .iter()
            .find(|(_, a)| *a == Action::Term)
            .map(|(t, _)| *t);
        if let Some(i) = acts.iter().position(|a| *a == Action::Term) {
            assert_eq!(
                acts.get(i + 1),
                Some(&Action::Cont),
                "SIGCONT right after SIGTERM"
            );
        }
        let kill = trace
            .iter()
            .find(|(_, a)| *a == Action::Kill)
            .map(|(t, _)| *t);
        match (term, kill) {
            (None, k) => {
                assert_eq!(
                    exit_at,
                    Some(Duration::ZERO),
                    "no SIGTERM only when gone at start"
                );
                assert!(k.is_none());
            }
            (Some(t), Some(k)) => {
                assert!(k - t >= grace, "SIGKILL never before the grace period");
                assert!(
                    exit_at.is_none_or(|e| e > k),
                    "SIGKILL only when still alive"
                );
            }
            (Some(t), None) => {
                assert!(
                    exit_at.is_some_and(|e| e < t + grace + Duration::from_millis(20)),
                    "no SIGKILL only when it exited in grace"
                );
            }
        }
        let end = trace.last().map(|(t, _)| *t).unwrap_or_default();
        assert!(
            end <= grace + after_kill + Duration::from_millis(40),
            "bounded: ended at {end:?}"
        );
    }

    proptest! {
        #[test]
        fn the_plan_follows_the_reference_sequence(
            grace_ms in 1u64..200,
            after_ms in 1u64..200,
            own in any::<bool>(),
            exit_ms in proptest::option::of(0u64..600),
            tick_ms in 1u64..20,
            kill_works in any::<bool>(),
        ) {
            let (grace, after_kill) = (Duration::from_millis(grace_ms), Duration::from_millis(after_ms));
            let exit_at = exit_ms.map(Duration::from_millis);
            let mut plan = Plan::new(grace, after_kill, own);
            let mut trace = Vec::new();
            let mut now = Duration::ZERO;
            let mut killed_at = None;
            while plan.phase != Phase::Done {
                let gone = exit_at.is_some_and(|e| now >= e)
                    || (kill_works && killed_at.is_some_and(|k: Duration| now > k));
                for a in step(&mut plan, now, gone) {
                    if a == Action::Kill { killed_at = Some(now); }
                    trace.push((now, a));
                }
                now += Duration::from_millis(tick_ms);
                prop_assert!(now < Duration::from_secs(10), "the plan never ends");
            }
            check(&trace, grace, after_kill, own, exit_at);
        }
    }

    #[test]
    fn a_runner_gone_before_the_first_signal_is_not_signalled() {
        let mut p = Plan::new(Duration::from_millis(100), Duration::from_millis(100), true);
        assert_eq!(
            step(&mut p, Duration::ZERO, true),
            vec![
                Action::RecordDescendants,
                Action::Reap,
                Action::ReportSurvivors
            ]
        );
        assert!(step(&mut p, Duration::from_secs(1), false).is_empty());
    }
}
