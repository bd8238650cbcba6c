//! Tests of the plan executor on real child processes: SIGTERM, SIGKILL after the grace
//! period, a runner already gone.
//!
//! The executor and the plan agree (issue 10): on real processes, every step the
//! executor took is exactly what the plan answers for the observations it made, and
//! the report's steps are exactly those actions' records, in order.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use stallwatch_storage::StorageConfig;

use super::*;

/// Starts `sh -c script` leading its own process group, like a spawned runner.
fn spawn(script: &str) -> (u32, OwnedFd) {
    let child = Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("sh starts");
    let pid = child.id();
    let fd = platform::pidfd_open(pid).expect("pidfd_open (Linux >= 5.3)");
    // reaped by the termination's own Reap step, never by the Child
    drop(child);
    (pid, fd)
}

async fn run_and_check(script: &str, settle: Duration, grace: Duration) -> TerminationReport {
    let dir = tempfile::tempdir().expect("temp dir");
    let storage =
        Storage::open(StorageConfig::new(dir.path().join("stallwatch.db"))).expect("storage");
    let stats = ReaperStats::default();
    let (pid, fd) = spawn(script);
    tokio::time::sleep(settle).await;
    let t = Target {
        runner_id: "r",
        mark: None,
        pid,
        pidfd: Some(&fd),
        own_child_group: true,
        hurry: None,
        spare: &[],
    };
    let (report, trace) = terminate_traced(
        &storage,
        &stats,
        grace,
        t,
        &StopCause::trip("stalled"),
        None,
    )
    .await;
    // 1. the executor did what the plan answers for what it saw, and nothing else
    let mut plan = Plan::new(grace, AFTER_KILL, true);
    for (now, seen, acts, done) in &trace {
        assert_eq!(
            &plan::advance(&mut plan, *now, *seen),
            acts,
            "at {now:?} with {seen:?}"
        );
        plan.actions_done(*done);
    }
    assert_eq!(plan.phase, Phase::Done, "{trace:?}");
    // 2. every action left its record, in the plan's order
    let from_plan: Vec<&str> = trace
        .iter()
        .flat_map(|(_, _, acts, _)| acts.iter().filter_map(|a| a.step_name()))
        .collect();
    let reported: Vec<&str> = report.steps.iter().map(|s| s.step.as_str()).collect();
    assert_eq!(reported, from_plan, "{report:#?}");
    assert!(platform::pidfd_exited(fd.as_fd()), "the runner is gone");
    report
}

#[tokio::test]
async fn executor_and_plan_agree_when_sigterm_is_obeyed() {
    let r = run_and_check(
        "exec sleep 30",
        Duration::from_millis(50),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(r.ended_by, "sigterm", "{r:#?}");
    assert!(r.sigkill_unix_nano.is_none());
    assert_eq!(r.exit.and_then(|e| e.signal), Some(15), "{r:#?}");
}

#[tokio::test]
async fn executor_and_plan_agree_when_sigterm_is_ignored() {
    let grace = Duration::from_millis(300);
    let r = run_and_check("trap '' TERM; sleep 30", Duration::from_millis(100), grace).await;
    assert_eq!(r.ended_by, "sigkill", "{r:#?}");
    let term = r
        .steps
        .iter()
        .find(|s| s.step == "sigterm_sent")
        .map(|s| s.at_ms);
    let kill = r
        .steps
        .iter()
        .find(|s| s.step == "sigkill_sent")
        .map(|s| s.at_ms);
    assert!(
        matches!((term, kill), (Some(t), Some(k)) if k >= t + grace.as_millis() as u64 - 1),
        "SIGKILL before the grace period ended: {r:#?}"
    );
    assert_eq!(r.exit.and_then(|e| e.signal), Some(9), "{r:#?}");
}

#[tokio::test]
async fn executor_and_plan_agree_when_the_runner_is_already_gone() {
    let r = run_and_check("exit 3", Duration::from_millis(300), Duration::from_secs(5)).await;
    assert_eq!(r.ended_by, "already_exited", "{r:#?}");
    assert!(!r.steps.iter().any(|s| s.step.contains("sig")), "{r:#?}");
    assert_eq!(r.exit.and_then(|e| e.code), Some(3), "{r:#?}");
}

#[tokio::test]
async fn executor_and_plan_agree_on_an_escaped_descendant() {
    let r = run_and_check(
        "setsid sleep 30 & sleep 30",
        Duration::from_millis(300),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        r.escaped.len(),
        1,
        "the setsid child escaped the group: {r:#?}"
    );
    assert!(
        r.steps.iter().any(|s| s.step == "escaped_sigterm_sent"),
        "{r:#?}"
    );
    assert!(r.survivors.is_empty(), "{r:#?}");
}
