//! Runner lifecycle: crash incidents with stderr, restart intensity, attach rules, the
//! termination sequence, no zombies after many kill cycles.

use std::collections::BTreeSet;
use std::time::Duration;

use stallwatch_reaper::platform;
use stallwatch_storage::control::{AttachSpec, RunnerChange, RunnerSpec};
use stallwatch_storage::model::EventKind;
use stallwatch_storage::runners::RunnerRowState;

use crate::common::*;

#[tokio::test]
async fn crash_records_stderr_and_restarts_until_the_intensity_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 300);
    cfg.restart.max_restarts = 2;
    let mut h = harness_with(dir, cfg).await;
    let reply = h
        .register(spawn_spec(
            "crashy",
            &["sh", "-c", "echo 'unhandled rejection: boom' >&2; exit 101"],
        ))
        .await
        .unwrap();
    assert!(reply["pid"].as_u64().unwrap() > 1);
    let crash = h.incident(EventKind::RunnerCrashed, "crashy").await;
    assert_eq!(crash.incident.evidence["exit"]["code"], 101);
    let stderr = crash.incident.evidence["last_stderr"].to_string();
    assert!(stderr.contains("unhandled rejection: boom"), "{stderr}");
    assert!(
        crash
            .incident
            .reason
            .ends_with("exited with exit code 101: unhandled rejection: boom"),
        "{}",
        crash.incident.reason
    );
    h.incident(EventKind::RunnerRestarted, "crashy").await;
    h.incident(EventKind::RunnerRestarted, "crashy").await;
    // Third crash inside the window: give up.
    let gave_up = loop {
        let i = h.incident(EventKind::RunnerCrashed, "crashy").await;
        if i.incident.evidence["gave_up"] == true {
            break i;
        }
    };
    assert!(gave_up.incident.reason.contains("gave up"));
    // The give-up is said in the last crash's own incident, not in a second one.
    assert!(
        gave_up
            .incident
            .reason
            .contains("exited with exit code 101: unhandled rejection: boom; gave up"),
        "{}",
        gave_up.incident.reason
    );
    assert_eq!(gave_up.incident.evidence["exit"]["code"], 101);
    let more = tokio::time::timeout(Duration::from_millis(1500), async {
        loop {
            match h.incidents.recv().await {
                Ok(i) if i.incident.kind == EventKind::RunnerCrashed => break i,
                Ok(_) => continue,
                Err(e) => panic!("event bus: {e}"),
            }
        }
    })
    .await;
    assert!(more.is_err(), "a second runner.crashed: {more:?}");
    wait_for("row gave_up", || true).await;
    let row = h
        .storage
        .runner_row("crashy".into())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state, RunnerRowState::GaveUp);
    let mut registered = 0;
    while let Ok(c) = h.changes.try_recv() {
        if matches!(c, RunnerChange::Registered { ref id, .. } if id == "crashy") {
            registered += 1;
        }
    }
    assert_eq!(registered, 3, "first start + 2 restarts");
}

/// A runner binary still open for writing (ETXTBSY) is started once it is closed, within
/// the retry window; one that stays open is refused naming the cause.
#[tokio::test]
async fn a_runner_binary_still_open_for_writing_is_started_once_closed() {
    use std::os::unix::fs::PermissionsExt;
    let h = harness(300).await;
    let bin_dir = tempfile::tempdir().unwrap();
    let bin = bin_dir.path().join("fresh-runner");
    std::fs::write(&bin, "#!/bin/sh\nexec sleep 30\n").unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let argv = [bin.to_str().unwrap()];
    let writer = std::fs::OpenOptions::new().append(true).open(&bin).unwrap();
    match h.register(spawn_spec("busy-long", &argv)).await {
        Err(e) => assert!(e.to_string().contains("Text file busy"), "{e}"),
        Ok(r) => panic!("a binary held open for writing was started: {r}"),
    }
    let closer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        drop(writer);
    });
    let reply = h.register(spawn_spec("busy-brief", &argv)).await.unwrap();
    closer.await.unwrap();
    let pid = reply["pid"].as_u64().unwrap() as i32;
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    h.delete("busy-brief").await.unwrap();
}

/// A crash that wrote nothing to stderr is reported without a dangling separator.
#[tokio::test]
async fn a_silent_crash_has_a_reason_without_stderr() {
    let mut h = harness(300).await;
    h.register(spawn_spec("silent", &["sh", "-c", "exit 7"]))
        .await
        .unwrap();
    let i = h.incident(EventKind::RunnerCrashed, "silent").await;
    assert_eq!(i.incident.evidence["exit"]["code"], 7);
    assert!(
        i.incident.reason.ends_with("exited with exit code 7"),
        "{}",
        i.incident.reason
    );
    h.delete("silent").await.unwrap();
}

/// A runner that exits cleanly with a background child still running: the child ends
/// with it (docs/design.md, Reaper), and the incident's reason says so, not only its
/// evidence.
#[tokio::test]
async fn a_clean_exit_stops_what_the_runner_left_running_and_says_so() {
    let mut h = harness(300).await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("bg.pid");
    let script = format!("sleep 600 & echo $! > {}; exit 0", pidfile.display());
    h.register(spawn_spec("launcher", &["sh", "-c", &script]))
        .await
        .unwrap();
    let i = h.incident(EventKind::RunnerExited, "launcher").await;
    let bg: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        i.incident.reason.ends_with(&format!(
            "exited cleanly; 1 process it left running stopped with it (pid {bg})"
        )),
        "{}",
        i.incident.reason
    );
    wait_for("background child gone", || !running(bg)).await;
}

/// A child that left the runner's session and dropped its instance mark is not proven to
/// be the runner's: a stop leaves it alone, and says so in the report and the incident.
#[tokio::test]
async fn a_child_without_the_mark_outside_the_group_is_left_alone_and_named() {
    let mut h = harness(300).await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("away.pid");
    let script = format!(
        "setsid env -i sleep 600 & echo $! > {}; exec sleep 600",
        pidfile.display()
    );
    h.register(spawn_spec("parent", &["sh", "-c", &script]))
        .await
        .unwrap();
    wait_for("pid file", || {
        std::fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    let away: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for("the child dropped its mark", || {
        std::fs::read(format!("/proc/{away}/environ")).is_ok_and(|e| e.is_empty())
    })
    .await;
    let del = h.delete("parent").await.unwrap();
    let unproven = del["termination"]["unproven"].as_array().unwrap();
    assert_eq!(unproven.len(), 1, "{del:#}");
    assert_eq!(unproven[0]["pid"], away);
    let i = h.incident(EventKind::RunnerTerminated, "parent").await;
    assert!(
        i.incident.reason.contains(&format!(
            "1 process below it without its instance mark left alone (pid {away})"
        )),
        "{}",
        i.incident.reason
    );
    assert!(
        running(away),
        "a process not proven to be the runner's was signalled"
    );
    let _ = std::process::Command::new("kill")
        .arg(away.to_string())
        .status();
}

#[tokio::test]
async fn clean_exit_is_runner_exited_and_not_restarted() {
    let mut h = harness(300).await;
    h.register(spawn_spec("clean", &["sh", "-c", "echo done"]))
        .await
        .unwrap();
    let i = h.incident(EventKind::RunnerExited, "clean").await;
    assert_eq!(i.incident.evidence["exit"]["code"], 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let row = h.storage.runner_row("clean".into()).await.unwrap().unwrap();
    assert_eq!(row.state, RunnerRowState::Exited);
}

#[tokio::test]
async fn attach_same_id_alive_is_409_dead_is_replaced_and_no_start_time_is_never_signalled() {
    let h = harness(200).await;
    let mut victim = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = victim.id();
    let start = platform::proc_stat(pid).unwrap().start_time_ticks;
    let spec = |start: Option<u64>| RunnerSpec {
        id: "att".into(),
        heartbeat_socket: None,
        spawn: None,
        attach: Some(AttachSpec {
            pid,
            start_time_ticks: start,
        }),
    };
    // Forged start time: refused, nothing signalled.
    let err = h.register(spec(Some(start + 7))).await.unwrap_err();
    assert!(matches!(err, RegisterError::Gone(_)), "{err}");
    // Without a start time: watched, never signalled.
    h.register(spec(None)).await.unwrap();
    assert!(matches!(
        h.register(spec(None)).await.unwrap_err(),
        RegisterError::IdInUse(_)
    ));
    h.trip("att").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        running(pid),
        "a runner without a start time must never be signalled"
    );
    let del = h.delete("att").await.unwrap();
    assert_eq!(del["termination"]["ended_by"], "not_signalled");
    assert!(running(pid));
    // With the right start time: registered, and a DELETE stops it with SIGTERM.
    h.register(spec(Some(start))).await.unwrap();
    let del = h.delete("att").await.unwrap();
    assert_eq!(del["termination"]["ended_by"], "sigterm");
    let _ = victim.wait();
    assert!(!running(pid));
    // Dead attached runner: same id is replaced.
    let mut other = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let opid = other.id();
    let ostart = platform::proc_stat(opid).unwrap().start_time_ticks;
    let mut s2 = spec(Some(ostart));
    s2.attach = Some(AttachSpec {
        pid: opid,
        start_time_ticks: Some(ostart),
    });
    h.register(s2.clone()).await.unwrap();
    other.kill().unwrap();
    let _ = other.wait();
    wait_for("attached runner seen dead", || {
        h.handle
            .runner_info("att")
            .is_some_and(|v| v["alive"] == false)
    })
    .await;
    let mut third = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let tpid = third.id();
    let tstart = platform::proc_stat(tpid).unwrap().start_time_ticks;
    s2.attach = Some(AttachSpec {
        pid: tpid,
        start_time_ticks: Some(tstart),
    });
    h.register(s2)
        .await
        .expect("a dead runner's id is replaced");
    assert_eq!(h.handle.runner_pid("att"), Some(tpid));
    third.kill().unwrap();
    let _ = third.wait();
}

#[tokio::test]
async fn sigterm_obeyed_ends_with_sigterm_and_steps_are_in_the_ledger() {
    let mut h = harness(2000).await;
    h.register(spawn_spec("obey", &["sleep", "60"]))
        .await
        .unwrap();
    let pid = h.handle.runner_pid("obey").unwrap();
    h.trip("obey").await;
    let i = h.incident(EventKind::RunnerTerminated, "obey").await;
    let r = &i.incident.evidence["report"];
    assert_eq!(r["ended_by"], "sigterm");
    assert_eq!(r["exit"]["signal"], 15);
    assert!(!running(pid));
    let actions = h.storage.runner_actions("obey".into(), 100).await.unwrap();
    let steps: Vec<String> = actions
        .iter()
        .map(|a| format!("{}:{}", a.step, a.phase))
        .collect();
    for want in [
        "sigterm_sent:intent",
        "sigterm_sent:done",
        "exited:done",
        "reaped:intent",
        "reaped:done",
        "finished:done",
    ] {
        assert!(
            steps.contains(&want.to_string()),
            "{want} missing from {steps:?}"
        );
    }
    assert!(!steps.iter().any(|s| s.starts_with("sigkill")));
    // Trip → restart under the policy (a trip is a failure).
    h.incident(EventKind::RunnerRestarted, "obey").await;
    h.delete("obey").await.unwrap();
}

#[tokio::test]
async fn no_defunct_after_100_kill_cycles() {
    let h = harness(500).await;
    let mut pids = BTreeSet::new();
    for n in 0..100 {
        let id = "cycle";
        let reply = h
            .register(spawn_spec(id, &["sh", "-c", "sleep 30 & sleep 30 & wait"]))
            .await
            .unwrap_or_else(|e| panic!("cycle {n}: {e}"));
        let pid = reply["pid"].as_u64().unwrap() as u32;
        pids.insert(pid);
        // Its children exist before the kill, so they are recorded and become zombies too.
        wait_for("two sleepers", || {
            platform::descendants(pid, None).len() >= 2
        })
        .await;
        for d in platform::descendants(pid, None) {
            pids.insert(d.pid);
        }
        let del = h.delete(id).await.unwrap();
        assert_eq!(del["survivors"].as_array().unwrap().len(), 0, "cycle {n}");
    }
    wait_for("no zombie of ours left", || {
        let z: BTreeSet<u32> = our_zombies().into_iter().collect();
        z.intersection(&pids).next().is_none()
    })
    .await;
    assert!(pids.iter().all(|p| !running(*p)
        || platform::proc_stat(*p)
            .map(|s| s.ppid != std::process::id())
            .unwrap_or(true)));
}

/// A trip writes the missing end of each open tool span: a copy of the stored span with
/// end = kill time, status ERROR, `error.type = "timeout"`, events SIGTERM (+ rollback),
/// and rolls back the runner's open checkpoint.
#[tokio::test]
async fn trip_writes_span_ends_and_rolls_back_checkpoints() {
    use stallwatch_storage::model::*;
    use std::sync::Arc;
    let mut h = harness(1000).await;
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "stable").unwrap();
    let mut spec = spawn_spec("spans", &["sleep", "60"]);
    spec.spawn.as_mut().unwrap().workspace = Some(ws.path().to_path_buf());
    let reply = h.register(spec).await.unwrap();
    let staging = std::path::PathBuf::from(reply["checkpoint"]["path"].as_str().unwrap());
    let pid = reply["pid"].as_u64().unwrap() as u32;
    assert!(platform::environ_has(
        pid,
        "STALLWATCH_CHECKPOINT_DIR",
        staging.to_str().unwrap()
    ));
    std::fs::write(staging.join("a.txt"), "half").unwrap();
    let (t, s) = (TraceId([7; 16]), SpanId([9; 8]));
    let open = Span {
        trace_id: t,
        span_id: s,
        name: "execute_tool run_notebook".into(),
        start_time_unix_nano: now_unix_nano() - 5_000_000_000,
        attributes: vec![KeyValue::new(
            "gen_ai.tool.name",
            AnyValue::String("run_notebook".into()),
        )],
        ..Default::default()
    };
    let batch = TraceBatch {
        resource_spans: vec![ResourceSpans {
            resource: Resource {
                attributes: vec![KeyValue::new(
                    "stallwatch.runner.id",
                    AnyValue::String("spans".into()),
                )],
                ..Default::default()
            },
            scope_spans: vec![ScopeSpans {
                scope: Scope::default(),
                spans: vec![open.clone()],
            }],
        }],
    };
    h.storage.write_traces(Arc::new(batch)).await.unwrap();
    h.trips
        .send(stallwatch_storage::control::Trip {
            runner_id: "spans".into(),
            verdict: "tool_overrun".into(),
            reason: "over SLA".into(),
            incident_id: None,
            open_spans: vec![(t, s)],
            at_unix_nano: now_unix_nano(),
        })
        .await
        .unwrap();
    let i = h.incident(EventKind::RunnerTerminated, "spans").await;
    assert_eq!(i.incident.evidence["spans_closed"], 1);
    assert_eq!(
        i.incident.evidence["checkpoints_rolled_back"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert!(!staging.exists());
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "stable"
    );
    let stored = h.storage.span(t, s).await.unwrap().expect("span stored");
    let sp = stored.span;
    assert_eq!(sp.name, open.name, "a copy of the original span");
    assert_eq!(sp.status.code, STATUS_ERROR);
    assert_eq!(
        attr(&sp.attributes, "error.type").and_then(AnyValue::as_str),
        Some("timeout")
    );
    assert_eq!(
        sp.end_time_unix_nano,
        i.incident.evidence["report"]["sigterm_unix_nano"]
            .as_u64()
            .unwrap()
    );
    let names: Vec<_> = sp.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["SIGTERM", "rollback"]);
    h.delete("spans").await.unwrap();
}

/// A runner tripped just as it exits on its own (its exit recorded before the trip's stop
/// could begin) still has its open checkpoint rolled back: from the trip on its commits are
/// refused as "being rolled back", and left open it was refused forever, its staging kept.
/// The healthy case beside it: a runner that exits with no trip keeps its checkpoint open
/// for the app to commit.
#[tokio::test]
async fn a_runner_tripped_as_it_exits_on_its_own_still_has_its_checkpoint_rolled_back() {
    use stallwatch_storage::checkpoints::CheckpointState;
    let mut h = harness(1000).await;
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "stable").unwrap();
    let mut staged = Vec::new();
    for id in ["tripped-exit", "plain-exit"] {
        // Stages a half-written file, then exits 0 a second later.
        let mut spec = spawn_spec(
            id,
            &[
                "sh",
                "-c",
                "echo half > \"$STALLWATCH_CHECKPOINT_DIR/a.txt\"; sleep 1",
            ],
        );
        spec.spawn.as_mut().unwrap().workspace = Some(ws.path().to_path_buf());
        let reply = h.register(spec).await.unwrap();
        let cp = reply["checkpoint"]["id"].as_str().unwrap().to_string();
        let staging = std::path::PathBuf::from(reply["checkpoint"]["path"].as_str().unwrap());
        staged.push((id, cp, staging));
    }
    for (id, _, _) in &staged {
        h.incident(EventKind::RunnerExited, id).await;
    }
    // The trip decided while "tripped-exit" was still in its span arrives after its exit.
    h.trip("tripped-exit").await;
    let rolled = h
        .incident(EventKind::CheckpointRolledBack, "tripped-exit")
        .await;
    assert!(
        rolled
            .incident
            .reason
            .contains("exited before it was stopped"),
        "{}",
        rolled.incident.reason
    );
    let (_, cp, staging) = &staged[0];
    let row = h.storage.checkpoint(cp.clone()).await.unwrap().unwrap();
    assert_eq!(row.state, CheckpointState::RolledBack);
    assert!(!staging.exists(), "the tripped runner's staging was kept");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "stable"
    );
    // No trip: its checkpoint stays open, its staged file there to commit.
    let (_, cp, staging) = &staged[1];
    let row = h.storage.checkpoint(cp.clone()).await.unwrap().unwrap();
    assert_eq!(row.state, CheckpointState::Open);
    assert_eq!(
        std::fs::read_to_string(staging.join("a.txt")).unwrap(),
        "half\n"
    );
    h.close().await;
}

/// At an ordered shutdown every runner is stopped together and reaped at the end, but each
/// report says when that runner ended: one that exits on SIGTERM is not reported as ending
/// with the one that needed SIGKILL after the grace period.
#[tokio::test]
async fn shutdown_reports_each_runners_own_end() {
    let mut h = harness(600).await;
    h.register(spawn_spec("quick", &["sleep", "60"]))
        .await
        .unwrap();
    // SIGTERM is ignored (and the ignore is inherited by `sleep`): only SIGKILL ends it.
    h.register(spawn_spec(
        "stubborn",
        &["sh", "-c", "trap '' TERM; sleep 60"],
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.shutdown.cancel();
    let mut reports = std::collections::HashMap::new();
    for _ in 0..2 {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let i = tokio::time::timeout(left, h.incidents.recv())
                .await
                .expect("two runner.terminated within 30 s")
                .unwrap();
            if i.incident.kind == EventKind::RunnerTerminated {
                let id = i.incident.runner_id.clone().unwrap();
                reports.insert(id, i.incident.evidence["report"].clone());
                break;
            }
        }
    }
    let ms = |id: &str| reports[id]["duration_ms"].as_u64().unwrap();
    assert_eq!(
        reports["quick"]["ended_by"], "sigterm",
        "{:#}",
        reports["quick"]
    );
    assert_eq!(
        reports["stubborn"]["ended_by"], "sigkill",
        "{:#}",
        reports["stubborn"]
    );
    assert!(
        ms("stubborn") >= 600,
        "the grace period was kept: {}",
        ms("stubborn")
    );
    assert!(
        ms("quick") < 600,
        "the quick runner's report runs to its own exit, not the stubborn one's SIGKILL: {} ms",
        ms("quick")
    );
    h.task.await.unwrap();
}

/// At shutdown only spawned runners are stopped; attached ones are left alone.
#[tokio::test]
async fn shutdown_stops_spawned_runners_only() {
    let h = harness(300).await;
    h.register(spawn_spec("mine", &["sleep", "60"]))
        .await
        .unwrap();
    let mine = h.handle.runner_pid("mine").unwrap();
    let mut theirs = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let tpid = theirs.id();
    let start = platform::proc_stat(tpid).unwrap().start_time_ticks;
    h.register(RunnerSpec {
        id: "theirs".into(),
        heartbeat_socket: None,
        spawn: None,
        attach: Some(AttachSpec {
            pid: tpid,
            start_time_ticks: Some(start),
        }),
    })
    .await
    .unwrap();
    h.shutdown.cancel();
    h.task.await.unwrap();
    assert!(!running(mine), "spawned runner stopped at shutdown");
    assert!(running(tpid), "attached runner left alone");
    let row = h.storage.runner_row("mine".into()).await.unwrap().unwrap();
    assert_eq!(row.state, RunnerRowState::Terminated);
    theirs.kill().unwrap();
    let _ = theirs.wait();
}
