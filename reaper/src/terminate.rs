//! The termination sequence: record descendants, SIGTERM to the group, wait up to the grace
//! period, SIGKILL to the group, reap, then end escaped descendants the same way and report
//! survivors (docs/design.md, Reaper; issue 4, Termination).
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
use stallwatch_storage::model::now_unix_nano;
use stallwatch_storage::runners::ActionRecord;
use stallwatch_storage::Storage;

use crate::platform::{self, ExitInfo, Sig, SignalTarget};
use crate::stats::ReaperStats;

/// Polling interval while waiting for processes to exit.
const POLL: Duration = Duration::from_millis(10);
/// How long to wait for exit after SIGKILL before reporting survivors.
const AFTER_KILL: Duration = Duration::from_secs(5);

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
    /// Why: `trip`, `delete`, `shutdown`, `resume`.
    pub cause: String,
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
    /// When SIGTERM was sent (or the termination began), ns since the Unix epoch.
    pub sigterm_unix_nano: u64,
    /// When SIGKILL was sent, if it was.
    pub sigkill_unix_nano: Option<u64>,
    /// Total duration, ms.
    pub duration_ms: u64,
}

/// Steps already finished by an earlier run of the same termination (from the ledger).
#[derive(Clone, Debug, Default)]
pub struct Resume {
    /// The termination id to continue.
    pub termination_id: String,
    /// `step` names with a `done` record.
    pub done: HashSet<String>,
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

async fn wait_until(deadline: Instant, mut gone: impl FnMut() -> bool) -> bool {
    loop {
        if gone() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Runs the termination sequence on `t`. Never fails: problems are steps in the report.
/// The caller must hold the runner's lock (so nobody else reaps the leader meanwhile) and
/// afterwards reap unowned zombies (escaped descendants re-parented to stallwatch).
///
/// Traced as the `reaper.terminate` span (stored with `--self-traces`).
#[tracing::instrument(name = "reaper.terminate", level = "info", skip_all, fields(cause = %cause))]
pub async fn terminate(
    storage: &Storage,
    stats: &ReaperStats,
    grace: Duration,
    t: Target<'_>,
    cause: &str,
    resume: Option<Resume>,
) -> TerminationReport {
    stats.terminations.fetch_add(1, Ordering::Relaxed);
    let resume = resume.unwrap_or_else(|| Resume {
        termination_id: uuid::Uuid::new_v4().simple().to_string(),
        done: HashSet::new(),
    });
    let mut run = Run {
        storage,
        started: Instant::now(),
        done_before: resume.done,
        report: TerminationReport {
            termination_id: resume.termination_id,
            runner_id: t.runner_id.to_string(),
            cause: cause.to_string(),
            steps: Vec::new(),
            ended_by: String::new(),
            exit: None,
            escaped: Vec::new(),
            survivors: Vec::new(),
            sigterm_unix_nano: now_unix_nano(),
            sigkill_unix_nano: None,
            duration_ms: 0,
        },
    };
    if t.pidfd.is_none() {
        run.done(
            "not_signalled",
            Some(t.pid),
            serde_json::json!({"reason": "no proof of identity (attached without a start time, or pid no longer matches)"}),
        )
        .await;
        run.report.ended_by = "not_signalled".into();
        return finish(run).await;
    }

    // 1. Record descendants before the first signal.
    let own_group = if t.own_child_group { Some(t.pid) } else { None };
    let recorded: Vec<ProcRef> = platform::descendants(t.pid, t.mark)
        .into_iter()
        .map(|p| ProcRef {
            pid: p.pid,
            start_time_ticks: p.start_time_ticks,
            pgid: p.pgid,
        })
        .collect();
    let leader_pgid = platform::proc_stat(t.pid).map(|s| s.pgid).unwrap_or(t.pid);
    let (group, escaped): (Vec<ProcRef>, Vec<ProcRef>) =
        recorded.iter().partition(|p| p.pgid == leader_pgid);
    run.report.escaped = escaped.clone();
    run.done(
        "descendants_recorded",
        Some(t.pid),
        serde_json::json!({"group": group, "escaped": escaped}),
    )
    .await;

    let mut fds: BTreeMap<u32, OwnedFd> = BTreeMap::new();
    let group_gone = |g: &[ProcRef]| live(g).is_empty();
    let send_group = |sig: Sig, fds: &mut BTreeMap<u32, OwnedFd>| -> serde_json::Value {
        if let Some(pgid) = own_group {
            let sent = platform::send_signal(SignalTarget::Group { pgid }, sig);
            if sig == Sig::Term {
                // A SIGSTOPped group acts on SIGTERM only once it runs again (issue 11).
                let _ = platform::send_signal(SignalTarget::Group { pgid }, Sig::Cont);
            }
            match sent {
                Ok(()) => {
                    count(stats, sig, 1);
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
                if !platform::pidfd_exited(fd.as_fd()) && platform::send_signal(leader, sig).is_ok()
                {
                    n += 1;
                    if sig == Sig::Term {
                        let _ = platform::send_signal(leader, Sig::Cont);
                    }
                }
            }
            n += signal_each(&group, fds, sig, stats);
            serde_json::json!({"target": "each", "signalled": n})
        }
    };

    let already = leader_exited(&t) && group_gone(&group);
    if already && !run.done_before.contains("sigterm_sent") {
        run.done(
            "exited",
            Some(t.pid),
            serde_json::json!({"before": "sigterm"}),
        )
        .await;
        run.report.ended_by = "already_exited".into();
    } else {
        // 2. SIGTERM to the group, bounded grace.
        let mut ended = false;
        if !run.done_before.contains("sigterm_sent") && !run.done_before.contains("sigkill_sent") {
            run.intent("sigterm_sent", Some(t.pid)).await;
            run.report.sigterm_unix_nano = now_unix_nano();
            let d = send_group(Sig::Term, &mut fds);
            run.done("sigterm_sent", Some(t.pid), d).await;
            ended = wait_until(Instant::now() + grace, || {
                leader_exited(&t) && group_gone(&group)
            })
            .await;
            if ended {
                run.done(
                    "exited",
                    Some(t.pid),
                    serde_json::json!({"after": "SIGTERM"}),
                )
                .await;
                run.report.ended_by = "sigterm".into();
            }
        }
        // 3. SIGKILL to the group.
        if !ended {
            run.intent("sigkill_sent", Some(t.pid)).await;
            run.report.sigkill_unix_nano = Some(now_unix_nano());
            let d = send_group(Sig::Kill, &mut fds);
            run.done("sigkill_sent", Some(t.pid), d).await;
            let gone = wait_until(Instant::now() + AFTER_KILL, || {
                leader_exited(&t) && group_gone(&group)
            })
            .await;
            if gone {
                run.done(
                    "exited",
                    Some(t.pid),
                    serde_json::json!({"after": "SIGKILL"}),
                )
                .await;
            }
            run.report.ended_by = "sigkill".into();
        }
    }

    // 4. Reap the leader (only our own child).
    if t.own_child_group {
        run.intent("reaped", Some(t.pid)).await;
        match platform::reap_child(t.pid) {
            Ok(exit) => {
                run.report.exit = exit;
                run.done("reaped", Some(t.pid), serde_json::json!({"exit": exit}))
                    .await;
            }
            Err(e) => {
                run.done(
                    "reaped",
                    Some(t.pid),
                    serde_json::json!({"error": e.to_string()}),
                )
                .await;
            }
        }
    }

    // 5. Escaped descendants: the same sequence, each by verified identity.
    let escaped_live = live(&escaped);
    if !escaped_live.is_empty() {
        run.intent("escaped_sigterm_sent", None).await;
        let n = signal_each(&escaped_live, &mut fds, Sig::Term, stats);
        run.done(
            "escaped_sigterm_sent",
            None,
            serde_json::json!({"signalled": n, "pids": escaped_live.iter().map(|p| p.pid).collect::<Vec<_>>()}),
        )
        .await;
        let ended = wait_until(Instant::now() + grace, || live(&escaped_live).is_empty()).await;
        if !ended {
            let left = live(&escaped_live);
            run.intent("escaped_sigkill_sent", None).await;
            let n = signal_each(&left, &mut fds, Sig::Kill, stats);
            run.done(
                "escaped_sigkill_sent",
                None,
                serde_json::json!({"signalled": n, "pids": left.iter().map(|p| p.pid).collect::<Vec<_>>()}),
            )
            .await;
            wait_until(Instant::now() + AFTER_KILL, || live(&left).is_empty()).await;
        }
    }

    // 6. Survivors.
    let survivors = live(&recorded);
    run.report.survivors = survivors.clone();
    run.done(
        "survivors",
        None,
        serde_json::json!({"survivors": survivors}),
    )
    .await;
    finish(run).await
}

async fn finish(mut run: Run<'_>) -> TerminationReport {
    run.report.duration_ms = run.started.elapsed().as_millis() as u64;
    let summary =
        serde_json::json!({"ended_by": run.report.ended_by, "duration_ms": run.report.duration_ms});
    run.ledger("finished", "done", None, summary).await;
    run.report
}
