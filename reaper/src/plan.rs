//! The termination sequence as a pure state machine (issue 10: a pure plan pulled out of
//! `terminate()`; `docs/design.md`, Reaper). [`advance`] takes the plan's state, the time
//! since the termination began and what was observed ([`Seen`]), and answers the actions to
//! take now; it does no I/O, so the order of the sequence is property-tested against a
//! small reference model (below). [`crate::terminate::terminate`] is a loop that executes
//! these actions and feeds its observations back; `shutdown` performs the same order:
//!
//! record descendants → SIGTERM → SIGCONT (a stopped runner must run to act on SIGTERM;
//! issue 11) → wait up to the grace period → SIGKILL to what is left → wait up to the
//! after-kill bound → reap (own child only) → the same for descendants that escaped the
//! runner's group → report survivors.
//!
//! A resumed termination (a restart of stallwatch found it half done in the action ledger)
//! never repeats a SIGTERM that was sent: it goes straight to SIGKILL.

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
    /// SIGTERM sent to the escaped descendants at this offset.
    EscapedTerminating(Duration),
    /// SIGKILL sent to the escaped descendants at this offset.
    EscapedKilling(Duration),
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
    /// A resumed termination already sent SIGTERM (`sigterm_sent` is done in the ledger).
    pub term_done: bool,
    /// A resumed termination already sent SIGTERM or SIGKILL: no SIGTERM again.
    pub signalled: bool,
}

/// What the executor observed just before a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The leader and every recorded member of its group have exited.
    pub gone: bool,
    /// Every recorded descendant that escaped the group has exited (true when none did).
    pub escaped_gone: bool,
}

/// How the leader was seen to end (the `exited` step's detail).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Gone before any signal: `ended_by` = `already_exited`.
    BeforeTerm,
    /// Gone within the grace period: `ended_by` = `sigterm`.
    AfterTerm,
    /// Gone after SIGKILL (`ended_by` = `sigkill` from the SIGKILL on).
    AfterKill,
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
    /// Record that the leader and its group exited.
    Exited(Exit),
    /// Reap the leader (own child only).
    Reap,
    /// SIGTERM (then SIGCONT) to the escaped descendants still alive.
    TermEscaped,
    /// SIGKILL to the escaped descendants still alive.
    KillEscaped,
    /// Report which recorded processes are still alive; the plan is over.
    ReportSurvivors,
}

impl Action {
    /// The report and action-ledger step this action writes (`docs/design.md`, Reaper):
    /// `descendants_recorded`, `sigterm_sent` (written once SIGCONT followed it),
    /// `sigkill_sent`, `exited`, `reaped`, `escaped_sigterm_sent`, `escaped_sigkill_sent`,
    /// `survivors`; `None` for SIGCONT, which belongs to `sigterm_sent`.
    pub fn step_name(&self) -> Option<&'static str> {
        match self {
            Action::RecordDescendants => Some("descendants_recorded"),
            Action::Term => None,
            Action::Cont => Some("sigterm_sent"),
            Action::Kill => Some("sigkill_sent"),
            Action::Exited(_) => Some("exited"),
            Action::Reap => Some("reaped"),
            Action::TermEscaped => Some("escaped_sigterm_sent"),
            Action::KillEscaped => Some("escaped_sigkill_sent"),
            Action::ReportSurvivors => Some("survivors"),
        }
    }
}

impl Plan {
    /// A new plan.
    pub fn new(grace: Duration, after_kill: Duration, own_child: bool) -> Self {
        Self {
            phase: Phase::Start,
            grace,
            after_kill,
            own_child,
            term_done: false,
            signalled: false,
        }
    }

    /// A plan continuing a termination whose SIGTERM was sent and whose grace period was
    /// interrupted (stallwatch was killed): SIGTERM again, then wait the plan's grace (what
    /// is left of it) before SIGKILL.
    pub fn resumed_in_grace(self) -> Self {
        Self {
            term_done: true,
            signalled: false,
            ..self
        }
    }

    /// A plan continuing a termination whose `sigterm_sent` (`term_done`) or
    /// `sigkill_sent` steps are already done (`signalled` is true when either is).
    pub fn resumed(self, term_done: bool, kill_done: bool) -> Self {
        Self {
            term_done,
            signalled: term_done || kill_done,
            ..self
        }
    }
}

impl Plan {
    /// A second stop signal of stallwatch (the user pressing Ctrl-C again): no more grace.
    /// The wait after SIGTERM (the leader's group, then the escaped descendants) ends at
    /// the next step and SIGKILL follows, through the same proven paths and recorded
    /// steps as at the end of a grace period.
    pub fn hurry(&mut self) {
        self.grace = Duration::ZERO;
    }

    /// The actions of the latest step were carried out at `at` (time since the termination
    /// began): the wait the plan is in starts from there, so the grace period runs from the
    /// moment SIGTERM was sent and recorded, not from the observation before it.
    pub fn actions_done(&mut self, at: Duration) {
        self.phase = match self.phase {
            Phase::Terminating(t) => Phase::Terminating(t.max(at)),
            Phase::Killing(t) => Phase::Killing(t.max(at)),
            Phase::EscapedTerminating(t) => Phase::EscapedTerminating(t.max(at)),
            Phase::EscapedKilling(t) => Phase::EscapedKilling(t.max(at)),
            p => p,
        };
    }
}

/// The end of the leader's part: reap it (own child), then the escaped descendants, or the
/// report.
fn finish(plan: &mut Plan, now: Duration, seen: Seen, out: &mut Vec<Action>) {
    if plan.own_child {
        out.push(Action::Reap);
    }
    if seen.escaped_gone {
        report(plan, out);
    } else {
        out.push(Action::TermEscaped);
        plan.phase = Phase::EscapedTerminating(now);
    }
}

fn report(plan: &mut Plan, out: &mut Vec<Action>) {
    out.push(Action::ReportSurvivors);
    plan.phase = Phase::Done;
}

/// Advances the plan with no escaped descendants: `gone` whether the runner and every
/// recorded member of its group have exited. See [`advance`].
pub fn step(plan: &mut Plan, now: Duration, gone: bool) -> Vec<Action> {
    advance(
        plan,
        now,
        Seen {
            gone,
            escaped_gone: true,
        },
    )
}

/// Advances the plan: `now` is the time since the termination began, `seen` what was
/// observed just now. Answers the actions to take now, in order (empty: wait and call
/// again).
pub fn advance(plan: &mut Plan, now: Duration, seen: Seen) -> Vec<Action> {
    let mut out = Vec::new();
    match plan.phase {
        Phase::Start => {
            out.push(Action::RecordDescendants);
            if seen.gone && !plan.term_done {
                out.push(Action::Exited(Exit::BeforeTerm));
                finish(plan, now, seen, &mut out);
            } else if plan.signalled {
                out.push(Action::Kill);
                plan.phase = Phase::Killing(now);
            } else {
                out.push(Action::Term);
                out.push(Action::Cont);
                plan.phase = Phase::Terminating(now);
            }
        }
        Phase::Terminating(at) => {
            if seen.gone {
                out.push(Action::Exited(Exit::AfterTerm));
                finish(plan, now, seen, &mut out);
            } else if now.saturating_sub(at) >= plan.grace {
                out.push(Action::Kill);
                plan.phase = Phase::Killing(now);
            }
        }
        Phase::Killing(at) => {
            if seen.gone {
                out.push(Action::Exited(Exit::AfterKill));
                finish(plan, now, seen, &mut out);
            } else if now.saturating_sub(at) >= plan.after_kill {
                finish(plan, now, seen, &mut out);
            }
        }
        Phase::EscapedTerminating(at) => {
            if seen.escaped_gone {
                report(plan, &mut out);
            } else if now.saturating_sub(at) >= plan.grace {
                out.push(Action::KillEscaped);
                plan.phase = Phase::EscapedKilling(now);
            }
        }
        Phase::EscapedKilling(at) => {
            if seen.escaped_gone || now.saturating_sub(at) >= plan.after_kill {
                report(plan, &mut out);
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

    proptest! {
        /// Escaped descendants get the same sequence, only after the leader's part (and its
        /// reap): SIGTERM, SIGKILL no sooner than the grace period and only while one is
        /// alive, then the report, bounded.
        #[test]
        fn escaped_descendants_follow_the_leader(
            grace_ms in 1u64..200,
            after_ms in 1u64..200,
            own in any::<bool>(),
            exit_ms in 0u64..300,
            escaped_exit_ms in proptest::option::of(0u64..900),
            tick_ms in 1u64..20,
        ) {
            let (grace, after_kill) = (Duration::from_millis(grace_ms), Duration::from_millis(after_ms));
            let mut plan = Plan::new(grace, after_kill, own);
            let mut trace = Vec::new();
            let mut now = Duration::ZERO;
            while plan.phase != Phase::Done {
                let seen = Seen {
                    gone: now >= Duration::from_millis(exit_ms),
                    escaped_gone: escaped_exit_ms.is_some_and(|e| now >= Duration::from_millis(e)),
                };
                for a in advance(&mut plan, now, seen) {
                    trace.push((now, seen, a));
                }
                now += Duration::from_millis(tick_ms);
                prop_assert!(now < Duration::from_secs(10), "the plan never ends");
            }
            let acts: Vec<Action> = trace.iter().map(|(_, _, a)| *a).collect();
            prop_assert_eq!(acts.last(), Some(&Action::ReportSurvivors));
            let leader_end = acts.iter().rposition(|a| matches!(a, Action::Exited(_) | Action::Reap | Action::Kill));
            let term_esc = trace.iter().position(|(_, _, a)| *a == Action::TermEscaped);
            if let Some(i) = term_esc {
                prop_assert!(leader_end.is_some_and(|l| l < i), "escaped after the leader: {:?}", acts);
                prop_assert!(!trace[i].1.escaped_gone, "signalled only while one is alive");
                if let Some(j) = trace.iter().position(|(_, _, a)| *a == Action::KillEscaped) {
                    prop_assert!(trace[j].0 - trace[i].0 >= grace, "no SIGKILL before the grace period");
                    prop_assert!(!trace[j].1.escaped_gone);
                }
                let end = trace.last().map(|(t, _, _)| *t).unwrap_or_default();
                prop_assert!(end - trace[i].0 <= grace + after_kill + Duration::from_millis(40));
            } else {
                prop_assert!(!acts.contains(&Action::KillEscaped));
            }
        }

        /// A resumed termination never sends SIGTERM again once it was sent (or SIGKILL
        /// was); it goes straight to SIGKILL unless the runner is gone and was never
        /// signalled.
        #[test]
        fn a_resumed_termination_never_repeats_sigterm(
            term_done in any::<bool>(),
            kill_done in any::<bool>(),
            gone in any::<bool>(),
        ) {
            let mut plan = Plan::new(Duration::from_millis(50), Duration::from_millis(50), false)
                .resumed(term_done, kill_done);
            let first = step(&mut plan, Duration::ZERO, gone);
            if term_done || kill_done {
                prop_assert!(!first.contains(&Action::Term), "{:?}", first);
            }
            // gone and never sent SIGTERM: recorded as exited, nothing to kill
            let exited_unsignalled = gone && !term_done;
            let expect_kill = (term_done || kill_done) && !exited_unsignalled;
            prop_assert_eq!(first.contains(&Action::Kill), expect_kill, "{:?}", first);
        }
    }

    #[test]
    fn a_runner_gone_before_the_first_signal_is_not_signalled() {
        let mut p = Plan::new(Duration::from_millis(100), Duration::from_millis(100), true);
        assert_eq!(
            step(&mut p, Duration::ZERO, true),
            vec![
                Action::RecordDescendants,
                Action::Exited(Exit::BeforeTerm),
                Action::Reap,
                Action::ReportSurvivors
            ]
        );
        assert!(step(&mut p, Duration::from_secs(1), false).is_empty());
    }
}
