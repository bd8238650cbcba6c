//! The termination sequence: record descendants, SIGTERM to the group, wait up to the grace
//! period, SIGKILL to the group, reap, then end escaped descendants the same way and report
//! survivors (docs/design.md, Reaper; issue 4, Termination). The order is decided by the
//! pure plan in [`crate::plan`]; [`terminate`] executes its actions and feeds back what it
//! observes (issue 10).
//!
//! Identity is proven before every signal: the runner's pidfd held since spawn or attach,
//! or, for a recorded descendant, a pidfd opened now and checked against the start time
//! recorded before the first signal. `kill(-pgid)` is used only while the group leader is an
//! unreaped child of stallwatch (then the group id cannot be reused); otherwise every
//! member is signalled through its own verified pidfd. Each step is written to the action
//! ledger before (`intent`) and after (`done`) it happens, so a restart can finish a
//! half-done termination without repeating a finished step.

use std::collections::{BTreeMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use stallwatch_storage::keys::StopCause;
use stallwatch_storage::model::now_unix_nano;
use stallwatch_storage::runners::ActionRecord;
use stallwatch_storage::Storage;

use crate::plan::{self, Action, Exit, Phase, Plan, Seen};
use crate::platform::{self, ExitInfo, Sig, SignalTarget};
use crate::stats::ReaperStats;

/// Polling interval while waiting for processes to exit.
const POLL: Duration = Duration::from_millis(10);
/// How long to wait for exit after SIGKILL before reporting survivors.
const AFTER_KILL: Duration = Duration::from_secs(5);
/// Between the two looks for marked processes forked after the descendants were recorded
/// (once the leader's group is gone): what a double fork in a SIGTERM handler takes.
pub(crate) const LATE_FORK_SETTLE: Duration = Duration::from_millis(50);

/// The process to stop.
pub struct Target<'a> {
    /// Runner id.
    pub runner_id: &'a str,
    /// The instance mark of a spawned runner (`STALLWATCH_RUNNER_INSTANCE`, carried by its
    /// descendants); `None` for an attached runner, whose descendants are its process tree.
    pub mark: Option<&'a str>,
    /// Leader pid.
    pub pid: u32,
    /// The pidfd held since spawn or attach; `None` when there is no proof of identity.
    pub pidfd: Option<&'a OwnedFd>,
    /// True when the leader is an unreaped child of stallwatch leading its own group:
    /// group signals (`kill(-pgid)`) are allowed and the leader is reaped at the end.
    pub own_child_group: bool,
    /// Cancelled by a second stop signal of stallwatch: the grace period ends at once
    /// ([`crate::plan::Plan::hurry`]). `None`: never hurried.
    pub hurry: Option<&'a tokio_util::sync::CancellationToken>,
    /// The leaders of the other runners registered now: they and their own process trees
    /// are never ended as this runner's descendants, even when they carry its mark (a
    /// process it started and that was registered as a runner of its own). When one shares
    /// the leader's process group, the group is signalled member by member without it.
    pub spare: &'a [u32],
}

/// One recorded process: pid, start time and group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRef {
    /// Pid.
    pub pid: u32,
    /// Start time, clock ticks since boot.
    pub start_time_ticks: u64,
    /// Process group when recorded.
    pub pgid: u32,
}

/// One step as reported in the incident and the DELETE answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// `descendants_recorded`, `sigterm_sent`, `exited`, `sigkill_sent`, `reaped`, ...
    pub step: String,
    /// Ms since the termination began.
    pub at_ms: u64,
    /// Details.
    pub detail: serde_json::Value,
}

/// What a termination did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TerminationReport {
    /// The termination's id (ledger key prefix).
    pub termination_id: String,
    /// Runner id.
    pub runner_id: String,
    /// Why (written as its wire string: `trip: <verdict>`, `delete`, `shutdown`, ...).
    pub cause: StopCause,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Which step ended the runner: `sigterm`, `sigkill`, `already_exited`,
    /// `identity_mismatch` (nothing signalled) or `not_signalled` (no proof of identity).
    pub ended_by: String,
    /// The leader's exit status, when stallwatch reaped it.
    pub exit: Option<ExitInfo>,
    /// Descendants recorded before the first signal that had left the runner's group.
    pub escaped: Vec<ProcRef>,
    /// Recorded processes still alive at the end.
    pub survivors: Vec<ProcRef>,
    /// Processes found below the runner, outside its group and without its instance mark,
    /// when descendants were recorded: not proven to be its own, so left alone
    /// ([`platform::ProcTable::descendants_and_unproven`]).
    #[serde(default)]
    pub unproven: Vec<ProcRef>,
    /// When SIGTERM was sent (or the termination began), ns since the Unix epoch.
    pub sigterm_unix_nano: u64,
    /// When SIGKILL was sent, if it was.
    pub sigkill_unix_nano: Option<u64>,
    /// Ms from the start of the stop to its end; at an ordered shutdown (every runner
    /// stopped together), to this runner's own exit when one was seen.
    pub duration_ms: u64,
}

/// Steps already finished by an earlier run of the same termination (from the ledger).
#[derive(Clone, Debug, Default)]
pub struct Resume {
    /// The termination id to continue.
    pub termination_id: String,
    /// `step` names with a `done` record.
    pub done: HashSet<String>,
    /// When the interrupted termination's SIGTERM was sent (ns since the Unix epoch), if
    /// it was: the grace period goes on from there, it does not end at the resume.
    pub sigterm_unix_nano: Option<u64>,
}

struct Run<'a> {
    storage: &'a Storage,
    report: TerminationReport,
    started: Instant,
    done_before: HashSet<String>,
}

impl Run<'_> {
    async fn ledger(&self, step: &str, phase: &str, pid: Option<u32>, detail: serde_json::Value) {
        let rec = ActionRecord {
            runner_id: self.report.runner_id.clone(),
            termination_id: self.report.termination_id.clone(),
            step: step.into(),
            phase: phase.into(),
            pid,
            detail,
            at_unix_nano: now_unix_nano(),
        };
        if let Err(e) = self.storage.record_action(rec.clone()).await {
            // docs/design.md, Durability: act anyway, keep the record in the log.
            tracing::error!(runner = %rec.runner_id, step, phase, "action ledger write failed: {e}");
        }
    }
    fn push(&mut self, step: &str, detail: serde_json::Value) {
        self.report.steps.push(Step {
            step: step.into(),
            at_ms: self.started.elapsed().as_millis() as u64,
            detail,
        });
    }
    async fn intent(&self, step: &str, pid: Option<u32>) {
        self.ledger(step, "intent", pid, serde_json::json!({}))
            .await;
    }
    async fn done(&mut self, step: &str, pid: Option<u32>, detail: serde_json::Value) {
        self.ledger(step, "done", pid, detail.clone()).await;
        self.push(step, detail);
    }
}

fn leader_exited(t: &Target<'_>) -> bool {
    match t.pidfd {
        Some(fd) => platform::pidfd_exited(fd.as_fd()),
        None => true,
    }
}

/// Signals every live member of `procs` through a verified pidfd (opened now, or reused
/// from `fds`). Answers how many were signalled.
pub(crate) fn signal_each(
    procs: &[ProcRef],
    fds: &mut BTreeMap<u32, OwnedFd>,
    sig: Sig,
    stats: &ReaperStats,
) -> usize {
    let n = signal_each_once(procs, fds, sig, stats);
    if sig == Sig::Term {
        signal_each_once(procs, fds, Sig::Cont, stats);
    }
    n
}

fn signal_each_once(
    procs: &[ProcRef],
    fds: &mut BTreeMap<u32, OwnedFd>,
    sig: Sig,
    stats: &ReaperStats,
) -> usize {
    let mut n = 0;
    for p in procs {
        let fd = match fds.entry(p.pid) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                match platform::open_verified(p.pid, p.start_time_ticks) {
                    Ok(Some(fd)) => v.insert(fd),
                    _ => continue, // gone, or the pid now names another process
                }
            }
        };
        if platform::pidfd_exited(fd.as_fd()) {
            continue;
        }
        match platform::send_signal(
            SignalTarget::Pidfd {
                fd: fd.as_fd(),
                pid: p.pid,
            },
            sig,
        ) {
            Ok(()) => n += 1,
            Err(e) => tracing::debug!(pid = p.pid, "{} not sent: {e}", sig.name()),
        }
    }
    count(stats, sig, n);
    n
}

pub(crate) fn count(stats: &ReaperStats, sig: Sig, n: usize) {
    match sig {
        Sig::Term => stats.sigterm_sent.fetch_add(n as u64, Ordering::Relaxed),
        Sig::Kill => stats.sigkill_sent.fetch_add(n as u64, Ordering::Relaxed),
        Sig::Cont => 0,
    };
}

pub(crate) fn live(procs: &[ProcRef]) -> Vec<ProcRef> {
    procs
        .iter()
        .filter(|p| platform::alive(p.pid, p.start_time_ticks))
        .copied()
        .collect()
}

/// The effects of the plan's actions on one termination: what was recorded before the
/// first signal, the pidfds opened so far, and the SIGTERM detail waiting for its SIGCONT.
struct Executor<'a, 't> {
    t: &'a Target<'t>,
    stats: &'a ReaperStats,
    /// Every recorded descendant, then those in the leader's group and those that escaped.
    recorded: Option<Vec<ProcRef>>,
    group: Vec<ProcRef>,
    escaped: Vec<ProcRef>,
    /// Found below the runner without its mark, outside its group: left alone.
    unproven: Vec<ProcRef>,
    fds: BTreeMap<u32, OwnedFd>,
    /// The leader's own SIGTERM was delivered (only then does it get SIGCONT).
    leader_termed: bool,
    /// The `sigterm_sent` detail, written once SIGCONT followed.
    term_detail: Option<serde_json::Value>,
    /// The marked processes were looked for again once the group was gone.
    rescanned: bool,
    /// Another registered runner is in the leader's process group: no group signal.
    group_spared: bool,
    /// What that second look found (also in `escaped`), for the report.
    late: Vec<ProcRef>,
}

impl Executor<'_, '_> {
    /// What the plan needs to know now. The first call records the descendants (before any
    /// signal: the plan's first action writes them down).
    fn observe(&mut self) -> Seen {
        if self.recorded.is_none() {
            let t = self.t;
            let as_ref = |p: platform::ProcStat| ProcRef {
                pid: p.pid,
                start_time_ticks: p.start_time_ticks,
                pgid: p.pgid,
            };
            let table = platform::ProcTable::snapshot();
            let (proven, unproven) = table.descendants_and_unproven(t.pid, t.mark);
            let spared = table.trees_of(t.spare);
            let leader_pgid = platform::proc_stat(t.pid).map(|s| s.pgid).unwrap_or(t.pid);
            self.group_spared = proven
                .iter()
                .any(|p| spared.contains(&p.pid) && p.pgid == leader_pgid);
            let recorded: Vec<ProcRef> = proven
                .into_iter()
                .filter(|p| !spared.contains(&p.pid))
                .map(as_ref)
                .collect();
            self.unproven = unproven.into_iter().map(as_ref).collect();
            (self.group, self.escaped) = recorded.iter().partition(|p| p.pgid == leader_pgid);
            self.recorded = Some(recorded);
        }
        Seen {
            gone: leader_exited(self.t) && live(&self.group).is_empty(),
            escaped_gone: live(&self.escaped).is_empty(),
        }
    }

    /// Once the leader's group is gone: the processes carrying the runner's mark that were
    /// not there when the descendants were recorded (forked since, by a SIGTERM handler
    /// that double-forks and leaves the group, say) are escaped descendants too, ended the
    /// same way. They outlived the trip, and stallwatch, before. Only a spawned runner has a
    /// mark to prove them by.
    fn record_late_escapees(&mut self) {
        let Some(mark) = self.t.mark else { return };
        let table = platform::ProcTable::snapshot();
        let spared = table.trees_of(self.t.spare);
        let (mut proven, _) = table.descendants_and_unproven(self.t.pid, Some(mark));
        proven.retain(|p| !spared.contains(&p.pid));
        let recorded = self.recorded.get_or_insert_with(Vec::new);
        for p in proven {
            let r = ProcRef {
                pid: p.pid,
                start_time_ticks: p.start_time_ticks,
                pgid: p.pgid,
            };
            if !recorded
                .iter()
                .any(|k| k.pid == r.pid && k.start_time_ticks == r.start_time_ticks)
            {
                recorded.push(r);
                self.escaped.push(r);
                self.late.push(r);
            }
        }
    }

    /// Sends `sig` to the leader's group: `kill(-pgid)` while the leader is our unreaped
    /// child, else each member through its verified pidfd. Answers the step's detail.
    fn send_group(&mut self, sig: Sig) -> serde_json::Value {
        let t = self.t;
        if t.own_child_group && !self.group_spared {
            let pgid = t.pid;
            match platform::send_signal(SignalTarget::Group { pgid }, sig) {
                Ok(()) => {
                    count(self.stats, sig, 1);
                    serde_json::json!({"target": "group", "pgid": pgid})
                }
                Err(e) => {
                    serde_json::json!({"target": "group", "pgid": pgid, "error": e.to_string()})
                }
            }
        } else {
            let mut n = 0;
            if let Some(fd) = t.pidfd {
                let leader = SignalTarget::Pidfd {
                    fd: fd.as_fd(),
                    pid: t.pid,
                };
                let skip = sig == Sig::Cont && !self.leader_termed;
                if !skip
                    && !platform::pidfd_exited(fd.as_fd())
                    && platform::send_signal(leader, sig).is_ok()
                {
                    n += 1;
                    if sig == Sig::Term {
                        self.leader_termed = true;
                    }
                }
            }
            n += signal_each_once(&self.group, &mut self.fds, sig, self.stats);
            serde_json::json!({"target": "each", "signalled": n})
        }
    }

    /// Performs one action of the plan and records it (ledger `intent` before a signal,
    /// `done` after; the report step).
    async fn execute(&mut self, a: Action, run: &mut Run<'_>) {
        let pid = Some(self.t.pid);
        match a {
            Action::RecordDescendants => {
                run.report.escaped = self.escaped.clone();
                run.report.unproven = self.unproven.clone();
                let mut detail = serde_json::json!({"group": self.group, "escaped": self.escaped});
                if !self.unproven.is_empty() {
                    detail["unproven"] = serde_json::json!(self.unproven);
                }
                run.done("descendants_recorded", pid, detail).await;
            }
            Action::Term => {
                run.intent("sigterm_sent", pid).await;
                run.report.sigterm_unix_nano = now_unix_nano();
                self.term_detail = Some(self.send_group(Sig::Term));
            }
            Action::Cont => {
                // A SIGSTOPped group acts on SIGTERM only once it runs again (issue 11).
                self.send_group(Sig::Cont);
                let detail = self.term_detail.take().unwrap_or_default();
                run.done("sigterm_sent", pid, detail).await;
            }
            Action::Kill => {
                run.intent("sigkill_sent", pid).await;
                run.report.sigkill_unix_nano = Some(now_unix_nano());
                let detail = self.send_group(Sig::Kill);
                run.done("sigkill_sent", pid, detail).await;
                run.report.ended_by = "sigkill".into();
            }
            Action::Exited(how) => {
                let (detail, ended_by) = match how {
                    Exit::BeforeTerm => {
                        (serde_json::json!({"before": "sigterm"}), "already_exited")
                    }
                    Exit::AfterTerm => (serde_json::json!({"after": "SIGTERM"}), "sigterm"),
                    Exit::AfterKill => (serde_json::json!({"after": "SIGKILL"}), "sigkill"),
                };
                run.done("exited", pid, detail).await;
                run.report.ended_by = ended_by.into();
            }
            Action::Reap => {
                run.intent("reaped", pid).await;
                let detail = match platform::reap_child(self.t.pid) {
                    Ok(exit) => {
                        run.report.exit = exit;
                        serde_json::json!({"exit": exit})
                    }
                    Err(e) => serde_json::json!({"error": e.to_string()}),
                };
                run.done("reaped", pid, detail).await;
            }
            Action::TermEscaped | Action::KillEscaped => {
                let (step, sig) = match a {
                    Action::TermEscaped => ("escaped_sigterm_sent", Sig::Term),
                    _ => ("escaped_sigkill_sent", Sig::Kill),
                };
                let left = live(&self.escaped);
                run.intent(step, None).await;
                // signal_each follows a SIGTERM with SIGCONT
                let n = signal_each(&left, &mut self.fds, sig, self.stats);
                let pids: Vec<u32> = left.iter().map(|p| p.pid).collect();
                let mut detail = serde_json::json!({"signalled": n, "pids": pids});
                if !self.late.is_empty() {
                    // found only once the group was gone (forked after the first look)
                    detail["found_late"] =
                        serde_json::json!(self.late.iter().map(|p| p.pid).collect::<Vec<_>>());
                    run.report.escaped.append(&mut self.late);
                }
                run.done(step, None, detail).await;
            }
            Action::ReportSurvivors => {
                let survivors = live(self.recorded.as_deref().unwrap_or_default());
                run.report.survivors = survivors.clone();
                run.done(
                    "survivors",
                    None,
                    serde_json::json!({"survivors": survivors}),
                )
                .await;
            }
        }
    }
}

/// One step of a termination as it ran: when, what was seen, what the plan answered (and
/// the executor did), and when those actions were done. Only steps that did something
/// are kept.
pub(crate) type Trace = Vec<(Duration, Seen, Vec<Action>, Duration)>;

/// Runs the termination sequence on `t`. Never fails: problems are steps in the report.
/// The caller must hold the runner's lock (so nobody else reaps the leader meanwhile) and
/// afterwards reap unowned zombies (escaped descendants re-parented to stallwatch).
///
/// The order is the pure [`crate::plan`]'s: this function only observes, asks the plan
/// what to do, and does it, polling every 10 ms while the plan waits.
///
/// Traced as the `reaper.terminate` span (stored with `--self-traces`).
#[tracing::instrument(name = "reaper.terminate", level = "info", skip_all, fields(cause = %cause))]
pub async fn terminate(
    storage: &Storage,
    stats: &ReaperStats,
    grace: Duration,
    t: Target<'_>,
    cause: &StopCause,
    resume: Option<Resume>,
) -> TerminationReport {
    terminate_traced(storage, stats, grace, t, cause, resume)
        .await
        .0
}

/// [`terminate`], also answering the [`Trace`] of the plan's steps.
pub(crate) async fn terminate_traced(
    storage: &Storage,
    stats: &ReaperStats,
    grace: Duration,
    t: Target<'_>,
    cause: &StopCause,
    resume: Option<Resume>,
) -> (TerminationReport, Trace) {
    stats.terminations.fetch_add(1, Ordering::Relaxed);
    let resume = resume.unwrap_or_else(|| Resume {
        termination_id: uuid::Uuid::new_v4().simple().to_string(),
        done: HashSet::new(),
        sigterm_unix_nano: None,
    });
    let sigterm_before = resume.sigterm_unix_nano;
    let mut run = Run {
        storage,
        started: Instant::now(),
        done_before: resume.done,
        report: TerminationReport {
            termination_id: resume.termination_id,
            runner_id: t.runner_id.to_string(),
            cause: cause.clone(),
            steps: Vec::new(),
            ended_by: String::new(),
            exit: None,
            escaped: Vec::new(),
            survivors: Vec::new(),
            unproven: Vec::new(),
            sigterm_unix_nano: now_unix_nano(),
            sigkill_unix_nano: None,
            duration_ms: 0,
        },
    };
    let mut trace = Trace::new();
    if t.pidfd.is_none() {
        run.done(
            "not_signalled",
            Some(t.pid),
            serde_json::json!({"reason": "no proof of identity (attached without a start time, or pid no longer matches)"}),
        )
        .await;
        run.report.ended_by = "not_signalled".into();
        return (finish(run).await, trace);
    }
    let (term_done, kill_done) = (
        run.done_before.contains("sigterm_sent"),
        run.done_before.contains("sigkill_sent"),
    );
    let mut plan = match sigterm_before.filter(|_| term_done && !kill_done) {
        // A termination interrupted in its grace period (stallwatch was killed): SIGTERM
        // again (harmless to a runner that has it already) and wait what is left of the
        // grace, counted from the first SIGTERM. It got SIGKILL at once on resume.
        Some(at) => {
            let spent = Duration::from_nanos(now_unix_nano().saturating_sub(at));
            Plan::new(grace.saturating_sub(spent), AFTER_KILL, t.own_child_group).resumed_in_grace()
        }
        None => Plan::new(grace, AFTER_KILL, t.own_child_group).resumed(term_done, kill_done),
    };
    let mut x = Executor {
        t: &t,
        stats,
        recorded: None,
        group: Vec::new(),
        escaped: Vec::new(),
        unproven: Vec::new(),
        fds: BTreeMap::new(),
        leader_termed: false,
        term_detail: None,
        rescanned: false,
        group_spared: false,
        late: Vec::new(),
    };
    while plan.phase != Phase::Done {
        if t.hurry.is_some_and(|h| h.is_cancelled()) {
            plan.hurry();
        }
        let mut seen = x.observe();
        if seen.gone && !x.rescanned && t.mark.is_some() {
            // The group is gone: look for marked processes forked since the first look
            // (twice: a SIGTERM handler's double fork may still be on its way).
            x.rescanned = true;
            x.record_late_escapees();
            tokio::time::sleep(LATE_FORK_SETTLE).await;
            x.record_late_escapees();
            seen.escaped_gone = live(&x.escaped).is_empty();
        }
        let now = run.started.elapsed();
        let actions = plan::advance(&mut plan, now, seen);
        if actions.is_empty() {
            tokio::time::sleep(POLL).await;
            continue;
        }
        for a in &actions {
            x.execute(*a, &mut run).await;
        }
        let done = run.started.elapsed();
        plan.actions_done(done);
        trace.push((now, seen, actions, done));
    }
    (finish(run).await, trace)
}

async fn finish(mut run: Run<'_>) -> TerminationReport {
    run.report.duration_ms = run.started.elapsed().as_millis() as u64;
    let summary =
        serde_json::json!({"ended_by": run.report.ended_by, "duration_ms": run.report.duration_ms});
    run.ledger("finished", "done", None, summary).await;
    run.report
}

#[cfg(test)]
mod tests;
