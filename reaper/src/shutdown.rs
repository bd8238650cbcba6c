//! Ordered shutdown of many runners at once (issue 17 #10; `docs/design.md`, Reaper).
//!
//! Stopping runners one after the other costs one grace period each; with thousands that
//! outlives any deadline. Here every runner goes through the same steps *together*: one
//! `/proc` snapshot records every runner's proven descendants before the first signal,
//! SIGTERM (+ SIGCONT) goes to all, one grace period is waited for all, SIGKILL goes to the
//! survivors, own children are reaped. Each phase is written to the action ledger once, in
//! one transaction for all runners (intent before the signals, done after). Identity rules
//! are those of [`crate::terminate`]: the group signal only while the leader is our unreaped
//! child, everything else through a pidfd verified against the recorded start time.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use stallwatch_storage::keys::StopCause;
use stallwatch_storage::model::now_unix_nano;
use stallwatch_storage::runners::ActionRecord;
use stallwatch_storage::Storage;

use crate::platform::{self, ProcTable, Sig, SignalTarget};
use crate::stats::ReaperStats;
use crate::terminate::{self, ProcRef, Step, TerminationReport};

/// Polling interval while waiting for many runners.
const POLL: Duration = Duration::from_millis(25);
/// How long to wait for exit after SIGKILL.
const AFTER_KILL: Duration = Duration::from_secs(5);
/// Members handled between two yields to the runtime: the per-member work (signals,
/// `/proc` reads, pidfd polls) is synchronous, so with thousands of members the loop gives
/// the runtime's other tasks (the watchdog, the control API) their turn this often.
const YIELD_EVERY: usize = 64;

/// Yields to the runtime every [`YIELD_EVERY`] members.
async fn pace(i: usize) {
    if i % YIELD_EVERY == YIELD_EVERY - 1 {
        tokio::task::yield_now().await;
    }
}

/// One runner to stop.
pub struct Member<'a> {
    /// Runner id.
    pub runner_id: &'a str,
    /// Leader pid.
    pub pid: u32,
    /// The pidfd held since spawn or adoption (proof of identity).
    pub pidfd: &'a OwnedFd,
    /// Instance mark of its descendants ([`platform::ProcTable::descendants`]).
    pub mark: Option<&'a str>,
    /// The leader is our unreaped child leading its own group (`kill(-pgid)` allowed).
    pub own_child_group: bool,
}

struct State {
    group: Vec<ProcRef>,
    escaped: Vec<ProcRef>,
    fds: BTreeMap<u32, OwnedFd>,
    report: TerminationReport,
    gone: bool,
}

fn record(table: &ProcTable, m: &Member<'_>) -> (Vec<ProcRef>, Vec<ProcRef>) {
    let leader_pgid = platform::proc_stat(m.pid).map(|s| s.pgid).unwrap_or(m.pid);
    table
        .descendants(m.pid, m.mark)
        .into_iter()
        .map(|p| ProcRef {
            pid: p.pid,
            start_time_ticks: p.start_time_ticks,
            pgid: p.pgid,
        })
        .partition(|p| p.pgid == leader_pgid)
}

fn send(m: &Member<'_>, st: &mut State, sig: Sig, stats: &ReaperStats) -> serde_json::Value {
    let mut detail = if m.own_child_group {
        let r = platform::send_signal(SignalTarget::Group { pgid: m.pid }, sig);
        if sig == Sig::Term {
            let _ = platform::send_signal(SignalTarget::Group { pgid: m.pid }, Sig::Cont);
        }
        match r {
            Ok(()) => {
                terminate::count(stats, sig, 1);
                serde_json::json!({"target": "group", "pgid": m.pid})
            }
            Err(e) => serde_json::json!({"target": "group", "pgid": m.pid, "error": e.to_string()}),
        }
    } else {
        let leader = SignalTarget::Pidfd {
            fd: m.pidfd.as_fd(),
            pid: m.pid,
        };
        let mut n = 0;
        if !platform::pidfd_exited(m.pidfd.as_fd()) && platform::send_signal(leader, sig).is_ok() {
            n += 1;
            terminate::count(stats, sig, 1);
            if sig == Sig::Term {
                let _ = platform::send_signal(leader, Sig::Cont);
            }
        }
        n += terminate::signal_each(&st.group, &mut st.fds, sig, stats);
        serde_json::json!({"target": "each", "signalled": n})
    };
    let live_escaped = terminate::live(&st.escaped);
    if !live_escaped.is_empty() {
        let n = terminate::signal_each(&live_escaped, &mut st.fds, sig, stats);
        detail["escaped_signalled"] = n.into();
    }
    detail
}

/// Waits up to `grace` (less once `hurry` is cancelled) for every member to be gone after
/// SIGTERM, recording each one's exit as it is seen (`ended_by` = `sigterm` unless set).
async fn wait_after_term(
    members: &[Member<'_>],
    states: &mut [State],
    started: Instant,
    grace: Duration,
    hurry: Option<&tokio_util::sync::CancellationToken>,
) {
    let deadline = Instant::now() + grace;
    loop {
        let mut left = 0;
        for (i, (m, st)) in members.iter().zip(states.iter_mut()).enumerate() {
            pace(i).await;
            if !st.gone && all_gone(m, st) {
                st.gone = true;
                if st.report.ended_by.is_empty() {
                    st.report.ended_by = "sigterm".into();
                }
                push(
                    st,
                    started,
                    "exited",
                    serde_json::json!({"after": "SIGTERM"}),
                );
            }
            left += usize::from(!st.gone);
        }
        if left == 0 || Instant::now() >= deadline || hurry.is_some_and(|h| h.is_cancelled()) {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Looks again (twice, [`terminate::LATE_FORK_SETTLE`] apart) for the processes carrying a
/// member's mark that were not there at the first look, records them as escaped, and sends
/// them SIGTERM (+ SIGCONT) through verified pidfds. True when any was found.
async fn late_escapees(
    members: &[Member<'_>],
    states: &mut [State],
    started: Instant,
    stats: &ReaperStats,
) -> bool {
    if members.iter().all(|m| m.mark.is_none()) {
        return false;
    }
    let mut found = vec![Vec::<ProcRef>::new(); members.len()];
    for round in 0..2 {
        if round == 1 {
            tokio::time::sleep(terminate::LATE_FORK_SETTLE).await;
        }
        let table = tokio::task::spawn_blocking(ProcTable::snapshot)
            .await
            .unwrap_or_else(|_| ProcTable::snapshot());
        for (i, (m, st)) in members.iter().zip(states.iter()).enumerate() {
            if m.mark.is_none() {
                continue;
            }
            let (group, escaped) = record(&table, m);
            for p in group.into_iter().chain(escaped) {
                let known = st
                    .group
                    .iter()
                    .chain(&st.escaped)
                    .chain(&found[i])
                    .any(|k| k.pid == p.pid && k.start_time_ticks == p.start_time_ticks);
                if !known {
                    found[i].push(p);
                }
            }
        }
    }
    let mut any = false;
    for ((st, late), i) in states.iter_mut().zip(found).zip(0..) {
        pace(i).await;
        if late.is_empty() {
            continue;
        }
        any = true;
        let n = terminate::signal_each(&late, &mut st.fds, Sig::Term, stats);
        let pids: Vec<u32> = late.iter().map(|p| p.pid).collect();
        st.escaped.extend(late.iter().copied());
        st.report.escaped.extend(late);
        st.gone = false;
        push(
            st,
            started,
            "escaped_sigterm_sent",
            serde_json::json!({"signalled": n, "pids": pids, "found_late": true}),
        );
    }
    any
}

fn all_gone(m: &Member<'_>, st: &State) -> bool {
    platform::pidfd_exited(m.pidfd.as_fd())
        && terminate::live(&st.group).is_empty()
        && terminate::live(&st.escaped).is_empty()
}

fn push(st: &mut State, started: Instant, step: &str, detail: serde_json::Value) {
    st.report.steps.push(Step {
        step: step.into(),
        at_ms: started.elapsed().as_millis() as u64,
        detail,
    });
}

async fn ledger(
    storage: &Storage,
    members: &[Member<'_>],
    states: &[State],
    step: &str,
    phase: &str,
    detail: impl Fn(&State) -> serde_json::Value,
) {
    let at = now_unix_nano();
    let recs: Vec<ActionRecord> = members
        .iter()
        .zip(states)
        .map(|(m, st)| ActionRecord {
            runner_id: m.runner_id.to_string(),
            termination_id: st.report.termination_id.clone(),
            step: step.into(),
            phase: phase.into(),
            pid: Some(m.pid),
            detail: detail(st),
            at_unix_nano: at,
        })
        .collect();
    if recs.is_empty() {
        return;
    }
    if let Err(e) = storage.record_actions(recs).await {
        // Act anyway (`docs/design.md`, Durability); the log keeps the record.
        tracing::error!(step, phase, "action ledger batch write failed: {e}");
    }
}

/// Stops every member together: SIGTERM to all, one grace period, SIGKILL to survivors,
/// reap. Answers one report per member, in order. Never fails: problems are steps. Once
/// `hurry` is cancelled (a second stop signal) the grace period ends at once.
pub async fn stop_all(
    storage: &Storage,
    stats: &ReaperStats,
    grace: Duration,
    members: &[Member<'_>],
    cause: &StopCause,
    hurry: Option<&tokio_util::sync::CancellationToken>,
) -> Vec<TerminationReport> {
    let started = Instant::now();
    stats
        .terminations
        .fetch_add(members.len() as u64, Ordering::Relaxed);
    // one read of /proc for everyone, off the runtime's workers
    let table = tokio::task::spawn_blocking(ProcTable::snapshot)
        .await
        .unwrap_or_else(|_| ProcTable::snapshot());
    let mut states: Vec<State> = Vec::with_capacity(members.len());
    for (i, m) in members.iter().enumerate() {
        pace(i).await;
        states.push({
            let (group, escaped) = record(&table, m);
            let mut st = State {
                report: TerminationReport {
                    termination_id: uuid::Uuid::new_v4().simple().to_string(),
                    runner_id: m.runner_id.to_string(),
                    cause: cause.clone(),
                    steps: Vec::new(),
                    ended_by: String::new(),
                    exit: None,
                    escaped: escaped.clone(),
                    survivors: Vec::new(),
                    unproven: Vec::new(),
                    sigterm_unix_nano: now_unix_nano(),
                    sigkill_unix_nano: None,
                    duration_ms: 0,
                },
                group,
                escaped,
                fds: BTreeMap::new(),
                gone: false,
            };
            let d = serde_json::json!({"group": st.group, "escaped": st.escaped});
            push(&mut st, started, "descendants_recorded", d);
            st
        });
    }
    drop(table);
    ledger(
        storage,
        members,
        &states,
        "descendants_recorded",
        "done",
        |st| serde_json::json!({"group": st.group, "escaped": st.escaped}),
    )
    .await;
    for (i, (m, st)) in members.iter().zip(states.iter_mut()).enumerate() {
        pace(i).await;
        if all_gone(m, st) {
            st.gone = true;
            st.report.ended_by = "already_exited".into();
            push(
                st,
                started,
                "exited",
                serde_json::json!({"before": "sigterm"}),
            );
        }
    }
    // SIGTERM to all.
    ledger(storage, members, &states, "sigterm_sent", "intent", |_| {
        serde_json::json!({})
    })
    .await;
    let now = now_unix_nano();
    for (i, (m, st)) in members.iter().zip(states.iter_mut()).enumerate() {
        pace(i).await;
        if !st.gone {
            st.report.sigterm_unix_nano = now;
            let d = send(m, st, Sig::Term, stats);
            push(st, started, "sigterm_sent", d);
        }
    }
    ledger(storage, members, &states, "sigterm_sent", "done", |_| {
        serde_json::json!({})
    })
    .await;
    // One grace period for all.
    wait_after_term(members, &mut states, started, grace, hurry).await;
    // Marked processes forked since the first look (a SIGTERM handler's double fork that
    // leaves the group and ignores SIGTERM) would outlive stallwatch: SIGTERM them now, and
    // they get a grace period of their own and the SIGKILL after it.
    if late_escapees(members, &mut states, started, stats).await {
        wait_after_term(members, &mut states, started, grace, hurry).await;
    }
    // SIGKILL to the survivors.
    let survivors: Vec<usize> = (0..states.len()).filter(|i| !states[*i].gone).collect();
    if !survivors.is_empty() {
        ledger(storage, members, &states, "sigkill_sent", "intent", |_| {
            serde_json::json!({})
        })
        .await;
        let now = now_unix_nano();
        for (n, i) in survivors.iter().enumerate() {
            pace(n).await;
            let (m, st) = (&members[*i], &mut states[*i]);
            st.report.sigkill_unix_nano = Some(now);
            st.report.ended_by = "sigkill".into();
            let d = send(m, st, Sig::Kill, stats);
            push(st, started, "sigkill_sent", d);
        }
        ledger(
            storage,
            members,
            &states,
            "sigkill_sent",
            "done",
            |st| serde_json::json!({"sent": st.report.sigkill_unix_nano.is_some()}),
        )
        .await;
        let deadline = Instant::now() + AFTER_KILL;
        loop {
            let mut left = 0;
            for (n, i) in survivors.iter().enumerate() {
                pace(n).await;
                let (m, st) = (&members[*i], &mut states[*i]);
                if !st.gone && all_gone(m, st) {
                    st.gone = true;
                    push(
                        st,
                        started,
                        "exited",
                        serde_json::json!({"after": "SIGKILL"}),
                    );
                }
                left += usize::from(!st.gone);
            }
            if left == 0 || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
    }
    // Reap own children; report survivors.
    for (i, (m, st)) in members.iter().zip(states.iter_mut()).enumerate() {
        pace(i).await;
        if m.own_child_group {
            match platform::reap_child(m.pid) {
                Ok(exit) => {
                    st.report.exit = exit;
                    push(st, started, "reaped", serde_json::json!({"exit": exit}));
                }
                Err(e) => push(
                    st,
                    started,
                    "reaped",
                    serde_json::json!({"error": e.to_string()}),
                ),
            }
        }
        let mut recorded = st.group.clone();
        recorded.extend(st.escaped.iter().copied());
        st.report.survivors = terminate::live(&recorded);
        let d = serde_json::json!({"survivors": st.report.survivors});
        push(st, started, "survivors", d);
        // Until its own exit, not until the slowest runner's SIGKILL: all are reaped at the
        // end of the shared phases, and the report says when this one ended.
        st.report.duration_ms = st
            .report
            .steps
            .iter()
            .rev()
            .find(|s| s.step == "exited")
            .map_or_else(|| started.elapsed().as_millis() as u64, |s| s.at_ms);
    }
    ledger(storage, members, &states, "finished", "done", |st| {
        serde_json::json!({"ended_by": st.report.ended_by, "duration_ms": st.report.duration_ms})
    })
    .await;
    states.into_iter().map(|s| s.report).collect()
}
