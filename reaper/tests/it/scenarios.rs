//! The misbehaving-runner scenarios (cases C22–C26, C29) run as runners under the reaper,
//! each with the outcome its header states.

use std::time::Duration;

use stallwatch_reaper::platform;
use stallwatch_storage::control::{AttachSpec, RunnerSpec};
use stallwatch_storage::model::EventKind;

use crate::common::*;

fn steps(report: &serde_json::Value) -> Vec<String> {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap().to_string())
        .collect()
}

/// C24: SIGTERM ignored (SIG_IGN) or stranded on a helper thread: SIGTERM, grace, SIGKILL,
/// reap; the incident names SIGKILL as the step that ended it.
#[tokio::test]
async fn c24_runner_ignoring_sigterm_is_killed_after_the_grace_period() {
    for mode in ["ignore", "thread"] {
        let mut h = harness(400).await;
        let id = format!("c24-{mode}");
        let script = scenario("s_ignore_sigterm.py");
        h.register(spawn_spec(
            &id,
            &[&python(), script.to_str().unwrap(), mode],
        ))
        .await
        .unwrap();
        h.output(&id, &format!("mode {mode}")).await;
        let pid = h.handle.runner_pid(&id).unwrap();
        h.trip(&id).await;
        let i = h.incident(EventKind::RunnerTerminated, &id).await;
        let r = &i.incident.evidence["report"];
        assert_eq!(r["ended_by"], "sigkill", "{mode}: {r}");
        assert_eq!(r["exit"]["signal"], 9, "{mode}");
        let s = steps(r);
        let term = s.iter().position(|x| x == "sigterm_sent").unwrap();
        let kill = s.iter().position(|x| x == "sigkill_sent").unwrap();
        let reaped = s.iter().position(|x| x == "reaped").unwrap();
        assert!(term < kill && kill < reaped, "{s:?}");
        assert!(r["duration_ms"].as_u64().unwrap() >= 400, "grace respected");
        assert!(i.incident.reason.contains("sigkill"));
        assert!(!running(pid));
        h.shutdown.cancel();
        h.task.await.unwrap();
    }
}

/// C25: descendants that left the group (setsid) or ignore SIGTERM are found and ended;
/// survivors are reported (none here).
#[tokio::test]
async fn c25_escaped_descendants_are_ended_too() {
    let h = harness(500).await;
    let script = scenario("s_escape_process_group.sh");
    h.register(spawn_spec("c25", &["sh", script.to_str().unwrap()]))
        .await
        .unwrap();
    h.output("c25", "spawned 3 sleepers").await;
    let pid = h.handle.runner_pid("c25").unwrap();
    wait_for("three sleepers", || {
        platform::descendants(pid, None).len() >= 3
    })
    .await;
    let before = platform::descendants(pid, None);
    let escaped: Vec<u32> = before
        .iter()
        .filter(|p| p.pgid != pid)
        .map(|p| p.pid)
        .collect();
    assert_eq!(
        escaped.len(),
        1,
        "setsid sleeper left the group: {before:?}"
    );
    let del = h.delete("c25").await.unwrap();
    let r = &del["termination"];
    assert_eq!(
        r["ended_by"], "sigkill",
        "the TERM-ignoring sleeper needs SIGKILL: {r}"
    );
    assert_eq!(r["escaped"][0]["pid"], escaped[0]);
    assert!(steps(r).contains(&"escaped_sigterm_sent".to_string()));
    assert_eq!(del["survivors"].as_array().unwrap().len(), 0);
    for p in &before {
        assert!(!running(p.pid), "descendant {} still running", p.pid);
    }
}

/// C23: a parent that never waits; after the kill, its zombies are re-parented to us (child
/// subreaper) and reaped. No <defunct> left.
#[tokio::test]
async fn c23_zombies_of_a_killed_runner_are_reaped() {
    let mut h = harness(500).await;
    let script = scenario("s_zombie_maker.py");
    h.register(spawn_spec("c23", &[&python(), script.to_str().unwrap()]))
        .await
        .unwrap();
    h.output("c23", "left 5 zombies").await;
    let pid = h.handle.runner_pid("c23").unwrap();
    let kids: Vec<u32> = platform::all_processes()
        .into_iter()
        .filter(|p| p.ppid == pid)
        .map(|p| p.pid)
        .collect();
    assert_eq!(kids.len(), 5, "five <defunct> children before the kill");
    h.trip("c23").await;
    h.incident(EventKind::RunnerTerminated, "c23").await;
    wait_for("no zombie of the runner left", || {
        kids.iter()
            .chain([&pid])
            .all(|k| platform::proc_stat(*k).is_err())
    })
    .await;
    // Only this process could reap them: they had been re-parented to it (child subreaper).
    let again = h.handle.runner_pid("c23");
    h.close().await;
    if let Some(p) = again.filter(|p| *p != pid) {
        assert!(!running(p), "the restarted c23 outlived the reaper");
    }
}

/// C26: a tool blocked in a GUI event loop is stopped on a trip; spawned runners get
/// MPLBACKEND=Agg unless the user overrides it.
#[tokio::test]
async fn c26_gui_block_is_stopped_and_mplbackend_defaults_to_agg() {
    let mut h = harness(500).await;
    let script = scenario("s_gui_backend_block.py");
    h.register(spawn_spec("c26", &[&python(), script.to_str().unwrap()]))
        .await
        .unwrap();
    let pid = h.handle.runner_pid("c26").unwrap();
    assert!(platform::environ_has(pid, "MPLBACKEND", "Agg"));
    assert!(platform::environ_has(pid, "PYTHONUNBUFFERED", "1"));
    assert!(platform::environ_has(pid, "STALLWATCH_RUNNER_ID", "c26"));
    assert!(platform::environ_has(
        pid,
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "http/protobuf"
    ));
    let mut over = spawn_spec("c26-user", &[&python(), script.to_str().unwrap()]);
    over.spawn
        .as_mut()
        .unwrap()
        .env
        .insert("MPLBACKEND".into(), "TkAgg".into());
    h.register(over).await.unwrap();
    let opid = h.handle.runner_pid("c26-user").unwrap();
    assert!(
        platform::environ_has(opid, "MPLBACKEND", "TkAgg"),
        "the user's env wins"
    );
    h.output("c26", "GUI").await; // blocked (real plt.show() or the simulated loop)
    h.trip("c26").await;
    let i = h.incident(EventKind::RunnerTerminated, "c26").await;
    assert!(i.incident.evidence["report"]["ended_by"]
        .as_str()
        .unwrap()
        .starts_with("sig"));
    assert!(!running(pid));
    h.delete("c26-user").await.unwrap();
    // the restart policy starts c26 again: the ordered shutdown stops that instance too
    wait_for("c26 started again", || {
        h.handle
            .runner_pid("c26")
            .is_some_and(|p| p != pid && running(p))
    })
    .await;
    let again = h.handle.runner_pid("c26").unwrap();
    h.close().await;
    assert!(!running(again), "the restarted c26 outlived the reaper");
}

/// C29: a heartbeat socket path over 107 bytes falls back to a short path and says why;
/// the runner can bind there (never a bare bind error).
#[tokio::test]
async fn c29_long_socket_path_falls_back_with_a_reason() {
    let base = tempfile::tempdir().unwrap();
    let deep = base.path().join("d".repeat(60)).join("e".repeat(40));
    std::fs::create_dir_all(&deep).unwrap();
    let cfg = config(&deep, 300);
    let h = harness_with(base, cfg).await;
    let bind = "import os,socket; s=socket.socket(socket.AF_UNIX); s.bind(os.environ['STALLWATCH_HEARTBEAT_SOCKET']); print('bound', flush=True); import time; time.sleep(60)";
    let reply = h
        .register(spawn_spec("c29-runner-0001", &[&python(), "-c", bind]))
        .await
        .unwrap();
    let sock = reply["heartbeat_socket"].as_str().unwrap().to_string();
    assert!(sock.len() <= 107, "{sock}");
    let why = reply["socket_fallback"].as_str().unwrap();
    assert!(
        why.contains("107-byte") && why.contains("runner-0001"),
        "{why}"
    );
    h.output("c29-runner-0001", "bound").await;
    assert!(std::path::Path::new(&sock).exists());
    // The case's own script shows the bare failure we avoid.
    let out = std::process::Command::new("bash")
        .arg(scenario("s_long_socket_path.sh"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("bind failed"));
    h.delete("c29-runner-0001").await.unwrap();
}

/// C22, outside a PID namespace: a recorded (pid, start time) whose pid now names another
/// process is never signalled. Used when root or `unshare` is missing, and always run.
#[tokio::test]
async fn c22_forged_start_time_is_never_signalled() {
    let h = harness(200).await;
    let mut victim = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = victim.id();
    let real = platform::proc_stat(pid).unwrap().start_time_ticks;
    let spec = RunnerSpec {
        id: "c22".into(),
        heartbeat_socket: None,
        spawn: None,
        attach: Some(AttachSpec {
            pid,
            start_time_ticks: Some(real.saturating_sub(1)),
        }),
    };
    let err = h.register(spec).await.unwrap_err();
    assert!(matches!(err, RegisterError::Gone(_)), "{err}");
    assert!(
        running(pid),
        "the victim with a different start time was not signalled"
    );
    assert!(platform::open_verified(pid, real - 1).unwrap().is_none());
    victim.kill().unwrap();
    let _ = victim.wait();
}

/// C22 for real: inside a fresh PID namespace (root + util-linux `unshare`), the runner's
/// pid is recycled for a victim through `ns_last_pid`; the reaper must not signal it.
#[tokio::test]
async fn c22_pid_reuse_in_a_pid_namespace() {
    let root = rustix::process::geteuid().is_root();
    let unshare = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !stallwatch_testkit::require(
        root && unshare,
        &format!(
            "C22: PID namespace unavailable (root: {root}, unshare works: {unshare}); \
             covered by c22_forged_start_time_is_never_signalled instead"
        ),
    ) {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(&exe)
        .args([
            "--exact",
            "scenarios::c22_child_in_namespace",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STALLWATCH_C22_CHILD", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("C22 OK: pid reused"), "{text}");
}

/// The namespace side of C22 (runs only when `STALLWATCH_C22_CHILD` is set).
#[tokio::test]
async fn c22_child_in_namespace() {
    if std::env::var("STALLWATCH_C22_CHILD").is_err() {
        return;
    }
    let h = harness(200).await;
    let mut runner = std::process::Command::new("sleep")
        .arg("0.3")
        .spawn()
        .unwrap();
    let rpid = runner.id();
    let rstart = platform::proc_stat(rpid).unwrap().start_time_ticks;
    h.register(RunnerSpec {
        id: "c22ns".into(),
        heartbeat_socket: None,
        spawn: None,
        attach: Some(AttachSpec {
            pid: rpid,
            start_time_ticks: Some(rstart),
        }),
    })
    .await
    .unwrap();
    let _ = runner.wait();
    std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", rpid - 1)).unwrap();
    let mut victim = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    assert_eq!(victim.id(), rpid, "ns_last_pid did not recycle the pid");
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.trip("c22ns").await;
    let del = h.delete("c22ns").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        running(rpid),
        "the victim holding the recycled pid was signalled: {del}"
    );
    // A re-registration with the stale start time is refused too.
    let err = h
        .register(RunnerSpec {
            id: "c22ns".into(),
            heartbeat_socket: None,
            spawn: None,
            attach: Some(AttachSpec {
                pid: rpid,
                start_time_ticks: Some(rstart),
            }),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, RegisterError::Gone(_)), "{err}");
    victim.kill().unwrap();
    let _ = victim.wait();
    println!("C22 OK: pid reused ({rpid}), victim never signalled");
}
