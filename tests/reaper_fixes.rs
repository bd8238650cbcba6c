//! Regressions found in the reaper by a new user, checked end to end on the real binary.

use std::time::Duration;

use crate::chain::{process_alive, spawn_runner};
use crate::support::Server;

/// A runner spawned through the API, left running by a kill -9 of stallwatch, is re-adopted
/// by the next run's orphan sweep and still stopped at that run's shutdown (it used to be
/// left running, re-parented to pid 1).
#[test]
fn a_spawned_runner_readopted_after_a_crash_is_stopped_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let reg = spawn_runner(&server, "sleeper", &["sleep", "600"], None, &[]);
    let pid = reg["pid"].as_u64().unwrap();
    assert!(process_alive(pid));
    server.crash();
    assert!(process_alive(pid), "a crash does not stop the runner");

    let server = Server::start(&data);
    wait_until!(
        Duration::from_secs(30),
        "the sweep re-adopts the sleeper",
        {
            let (st, v) = server.get_json("/api/v1/runners/sleeper");
            st == 200 && v["pid"].as_u64() == Some(pid) && v["spawned"] == false
        }
    );
    assert!(process_alive(pid));
    let stderr_path = server.stderr_path.clone();
    server.stop();
    wait_until!(
        Duration::from_secs(20),
        format!(
            "adopted sleeper {pid} stopped at shutdown; stderr:\n{}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        ),
        !process_alive(pid)
    );
}

/// Replacing a checkpoint's staging folder by a symlink to a folder outside the workspace
/// must not move that folder's files into the workspace (it used to answer 200 {"files":1}
/// and move them); a checkpoint for an unregistered runner is a 404.
#[test]
fn a_symlinked_staging_folder_is_refused_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let ws = dir.path().join("ws");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "s").unwrap();

    let (st, v) = crate::chain::post_json(
        &server,
        "/api/v1/checkpoints",
        &serde_json::json!({"runner_id": "nobody", "workspace": ws}),
    );
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("runner_not_found")),
        "{v}"
    );

    spawn_runner(&server, "holder", &["sleep", "600"], None, &[]);
    let (st, cp) = crate::chain::post_json(
        &server,
        "/api/v1/checkpoints",
        &serde_json::json!({"runner_id": "holder", "workspace": ws}),
    );
    assert!(st == 200 || st == 201, "{st} {cp}");
    let staging = std::path::PathBuf::from(cp["path"].as_str().unwrap());
    std::fs::remove_dir(&staging).unwrap();
    std::os::unix::fs::symlink(&outside, &staging).unwrap();
    let id = cp["id"].as_str().unwrap();
    for action in ["commit", "rollback"] {
        let (st, v) = crate::chain::post_json(
            &server,
            &format!("/api/v1/checkpoints/{id}/{action}"),
            &serde_json::json!({}),
        );
        assert_eq!(st, 400, "{action}: {v}");
        assert_eq!(v["error"]["code"], "path_escape", "{action}: {v}");
        assert!(outside.join("secret.txt").exists(), "{action}");
        assert!(!ws.join("secret.txt").exists(), "{action}");
    }
    server.stop();
}

/// A runner registered again under the id of one that had just exited, while that exit was
/// still being recorded (its output readers wait up to 500 ms for a process that holds its
/// stdout): the old exit's record landed on the new registration (its row marked exited,
/// the watchdog told it was gone), which was then never watched. The registration now waits
/// for the old record to be written, then takes the id whole.
#[test]
fn a_registration_right_after_an_exit_is_not_taken_for_the_exited_one() {
    use crate::support::{incidents, post_json, runner, spawn_runner};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    spawn_runner(
        &server,
        "again",
        // the child leaves its group and the instance mark (not the runner's own, so left
        // running) and keeps the runner's stdout open for 3 s
        &["sh", "-c", "setsid env -i sleep 3 & sleep 0.5; exit 0"],
        None,
        &[],
    );
    let body = serde_json::json!({"id": "again", "spawn": {"argv": ["sleep", "600"]}});
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let new = loop {
        let (st, v) = post_json(&server, "/api/v1/runners", &body);
        if st == 200 || st == 201 {
            break v;
        }
        assert_eq!(st, 409, "{v}");
        assert!(
            std::time::Instant::now() < deadline,
            "never registered again: {v}"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let pid = new["pid"].as_u64().unwrap();
    let _cleanup = KillOnDrop(vec![pid]);
    // Well past the old exit's record: the new registration is still the one on the board.
    std::thread::sleep(Duration::from_secs(2));
    let r = runner(&server, "again");
    assert_eq!(r["pid"].as_u64(), Some(pid), "{r:#}");
    assert!(process_alive(pid));
    assert_ne!(r["lifecycle"], "exited", "{r:#}");
    let exits: Vec<serde_json::Value> = incidents(&server, "again")
        .into_iter()
        .filter(|i| i["event"] == "runner.exited")
        .collect();
    assert_eq!(exits.len(), 1, "{exits:#?}");
    assert_ne!(
        exits[0]["evidence"]["pid"].as_u64(),
        Some(pid),
        "{exits:#?}"
    );
}

/// A runner that exits cleanly but leaves a child that ignores SIGTERM: its heartbeat goes
/// with it while the child gets its grace period. That was judged a lost heartbeat: the
/// runner was tripped as unresponsive and its breaker left OPEN after a clean exit. It is
/// stopping meanwhile, and its exit is a plain `runner.exited`.
#[test]
fn a_clean_exit_that_leaves_a_child_is_not_a_stall() {
    use crate::support::{incidents, spawn_runner, wait_incident, ServerOpts};
    let dir = tempfile::tempdir().unwrap();
    let cfg = &fast_trips(3000, 1500);
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(cfg));
    spawn_runner(
        &server,
        "leaver",
        &[
            "sh",
            "-c",
            "(trap '' TERM; exec sleep 600) & sleep 0.3; exit 0",
        ],
        None,
        &[],
    );
    wait_incident(&server, "leaver", "runner.exited", Duration::from_secs(15));
    let events: Vec<String> = incidents(&server, "leaver")
        .iter()
        .filter_map(|i| i["event"].as_str().map(String::from))
        .collect();
    assert!(
        !events.iter().any(|e| e == "breaker.opened"),
        "a clean exit was taken for a stall: {events:?}"
    );
    let (_, b) = server.get_json("/api/v1/runners/leaver/admit");
    assert_eq!(b["state"], "CLOSED", "{b}");
}

/// A runner whose SIGTERM handler double-forks a process that leaves its group and ignores
/// SIGTERM, then exits: that process did not exist when the descendants were recorded
/// before the first signal, so it outlived the trip (and stallwatch). Once the group is
/// gone the marked processes are looked for again, and it is ended as an escaped
/// descendant, named in the report.
#[test]
fn a_process_forked_by_the_sigterm_handler_is_ended_with_the_runner() {
    use crate::support::{incidents, python, spawn_runner, wait_incident, ServerOpts};
    let dir = tempfile::tempdir().unwrap();
    let cfg = &fast_trips(1000, 500);
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(cfg));
    let pidfile = dir.path().join("late.pid");
    let script = format!(
        "import os, signal, time\n\
         def on_term(sig, frame):\n\
         \x20   if os.fork() == 0:\n\
         \x20       os.setsid()\n\
         \x20       if os.fork() == 0:\n\
         \x20           signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
         \x20           open({:?}, 'w').write(str(os.getpid()))\n\
         \x20           time.sleep(600)\n\
         \x20       os._exit(0)\n\
         \x20   os._exit(0)\n\
         signal.signal(signal.SIGTERM, on_term)\n\
         time.sleep(600)\n",
        pidfile.display().to_string()
    );
    let py = python();
    spawn_runner(
        &server,
        "forker",
        &[py.to_str().unwrap(), "-c", &script],
        None,
        &[],
    );
    let done = wait_incident(
        &server,
        "forker",
        "runner.terminated",
        Duration::from_secs(30),
    );
    let late: u64 = std::fs::read_to_string(&pidfile)
        .expect("the SIGTERM handler's process ran")
        .trim()
        .parse()
        .unwrap();
    let _cleanup = KillOnDrop(vec![late]);
    wait_until!(
        Duration::from_secs(10),
        format!("the late process {late} to be ended: {done:#}"),
        !process_alive(late)
    );
    let escaped = &done["evidence"]["report"]["escaped"];
    assert!(
        escaped
            .as_array()
            .is_some_and(|e| e.iter().any(|p| p["pid"].as_u64() == Some(late))),
        "{done:#}"
    );
    let _ = incidents(&server, "forker");
}

/// A marked process that double-forked away from a runner while stallwatch was down (so it
/// was re-parented to init, not to stallwatch) is still the runner's: when the re-adopted
/// runner is tripped, it is ended with it. It was never found (the report said no escaped
/// descendants) and lived on.
#[test]
fn a_readopted_runners_escaped_process_under_init_is_ended_with_it() {
    use crate::support::{python, spawn_runner, wait_incident, ServerOpts};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let quiet = &fast_trips(1000, 600_000);
    let server = Server::start_with(ServerOpts::new(&data).config(quiet));
    let pidfile = dir.path().join("away.pid");
    let script = format!(
        "import os, signal, time\n\
         if os.fork() == 0:\n\
         \x20   os.setsid()\n\
         \x20   if os.fork() == 0:\n\
         \x20       signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
         \x20       open({:?}, 'w').write(str(os.getpid()))\n\
         \x20       time.sleep(600)\n\
         \x20   os._exit(0)\n\
         time.sleep(600)\n",
        pidfile.display().to_string()
    );
    let py = python();
    let reg = spawn_runner(
        &server,
        "parent",
        &[py.to_str().unwrap(), "-c", &script],
        None,
        &[],
    );
    let leader = reg["pid"].as_u64().unwrap();
    wait_until!(
        Duration::from_secs(10),
        "the escaped process",
        pidfile.exists()
    );
    let away: u64 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _cleanup = KillOnDrop(vec![leader, away]);
    server.crash();
    // re-adopted by the next run, whose watchdog then finds it unresponsive (no heartbeat)
    let fast = &fast_trips(1000, 500);
    let server = Server::start_with(ServerOpts::new(&data).config(fast));
    let done = wait_incident(
        &server,
        "parent",
        "runner.terminated",
        Duration::from_secs(30),
    );
    wait_until!(
        Duration::from_secs(10),
        format!("the escaped process {away} to be ended: {done:#}"),
        !process_alive(away)
    );
    assert!(!process_alive(leader));
}

/// SIGKILLs the given pids when a test ends, passed or not (they would outlive it).
struct KillOnDrop(Vec<u64>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in &self.0 {
            if process_alive(*pid) {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}

/// An ordered shutdown (one SIGTERM) while a trip's termination is in its grace period
/// waits for that trip to be recorded: its `runner.terminated` and the ends of its spans.
/// The shutdown closed storage under it ("span end not written: storage is shutting
/// down"), and the next start closed the span as orphaned.
#[test]
fn an_ordered_shutdown_during_a_trip_keeps_the_trips_records() {
    use crate::support::{incidents, post_json, ServerOpts};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = &fast_trips(2000, 300);
    let mut server = Server::start_with(ServerOpts::new(&data).config(cfg));
    // an attached runner: the shutdown leaves it to its trip (a spawned one it stops itself)
    let mut proc_ = std::process::Command::new("sh")
        .args(["-c", "trap '' TERM; sleep 600"])
        .spawn()
        .unwrap();
    let pid = u64::from(proc_.id());
    let _cleanup = KillOnDrop(vec![pid]);
    let ticks = stallwatch_client::process_start_time_ticks(pid as u32).unwrap();
    let (st, v) = post_json(
        &server,
        "/api/v1/runners",
        &serde_json::json!({"id": "stuck", "attach": {"pid": pid, "start_time_ticks": ticks},
            "heartbeat_socket": dir.path().join("none.sock")}),
    );
    assert_eq!(st, 201, "{v}");
    crate::support::wait_lifecycle(&server, "stuck", "stopping", Duration::from_secs(20));
    assert!(process_alive(pid));
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let t0 = std::time::Instant::now();
    while server.child.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = server.stderr();
    assert!(!log.contains("storage is shutting down"), "{log}");
    drop(server);
    let again = Server::start(&data);
    let events: Vec<String> = incidents(&again, "stuck")
        .iter()
        .filter_map(|i| i["event"].as_str().map(String::from))
        .collect();
    assert!(
        events.iter().any(|e| e == "runner.terminated"),
        "{events:?}\n{log}"
    );
    let _ = proc_.kill();
    let _ = proc_.wait();
}

/// A termination interrupted in its grace period by a crash of stallwatch goes on, at the
/// next start, with what is left of the grace period (counted from the first SIGTERM): the
/// runner got SIGKILL at once on resume, a few milliseconds after the restart.
#[test]
fn a_resumed_termination_keeps_the_rest_of_its_grace_period() {
    use crate::support::{spawn_runner, ServerOpts};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = &fast_trips(6000, 300);
    let server = Server::start_with(ServerOpts::new(&data).config(cfg));
    let reg = spawn_runner(
        &server,
        "slow",
        &["sh", "-c", "trap '' TERM; sleep 600"],
        None,
        &[],
    );
    let pid = reg["pid"].as_u64().unwrap();
    let _cleanup = KillOnDrop(vec![pid]);
    crate::support::wait_lifecycle(&server, "slow", "stopping", Duration::from_secs(20));
    let termed = std::time::Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    server.crash();
    let server = Server::start_with(ServerOpts::new(&data).config(cfg));
    // well inside the 6 s grace that began before the crash
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        process_alive(pid),
        "SIGKILLed {:?} after the first SIGTERM, inside its grace period:\n{}",
        termed.elapsed(),
        server.stderr()
    );
    wait_until!(
        Duration::from_secs(15),
        "the SIGKILL at the end of the grace period",
        !process_alive(pid)
    );
    assert!(
        termed.elapsed() >= Duration::from_millis(5500),
        "ended {:?} after the first SIGTERM",
        termed.elapsed()
    );
}

/// An ordered shutdown: a runner whose SIGTERM handler double-forks a process that leaves
/// its group and ignores SIGTERM does not leave that process running after stallwatch (the
/// shutdown's shared sequence looked for descendants only before the first signal); and a
/// runner that exits on its SIGTERM, taking its heartbeat with it, is not then tripped as
/// unresponsive (every shutdown raised a false `breaker.opened`).
#[test]
fn an_ordered_shutdown_ends_late_forks_and_trips_nobody() {
    use crate::support::{incidents, python, spawn_runner, ServerOpts};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = &fast_trips(2000, 3000);
    let server = Server::start_with(ServerOpts::new(&data).config(cfg));
    let pidfile = dir.path().join("late.pid");
    // serves its heartbeat; on SIGTERM double-forks a process ignoring SIGTERM, then exits
    let forker = format!(
        "import os, signal, socket, threading, time\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.bind(os.environ['STALLWATCH_HEARTBEAT_SOCKET'])\n\
         s.listen(16)\n\
         def serve():\n\
         \x20   while True:\n\
         \x20       c, _ = s.accept()\n\
         \x20       c.recv(64)\n\
         \x20       c.sendall(b'PONG\\n')\n\
         \x20       c.close()\n\
         threading.Thread(target=serve, daemon=True).start()\n\
         def on_term(sig, frame):\n\
         \x20   if os.fork() == 0:\n\
         \x20       os.setsid()\n\
         \x20       if os.fork() == 0:\n\
         \x20           signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
         \x20           open({:?}, 'w').write(str(os.getpid()))\n\
         \x20           time.sleep(600)\n\
         \x20       os._exit(0)\n\
         \x20   os._exit(0)\n\
         if {:?} == 'fork':\n\
         \x20   signal.signal(signal.SIGTERM, on_term)\n\
         time.sleep(600)\n",
        pidfile.display().to_string(),
        "fork"
    );
    let plain = forker.replace("if 'fork' == 'fork':", "if False:");
    let py = python();
    spawn_runner(
        &server,
        "forker",
        &[py.to_str().unwrap(), "-c", &forker],
        None,
        &[],
    );
    spawn_runner(
        &server,
        "plain",
        &[py.to_str().unwrap(), "-c", &plain],
        None,
        &[],
    );
    wait_until!(Duration::from_secs(10), "both heartbeats answered", {
        ["forker", "plain"].iter().all(|id| {
            let (_, v) = server.get_json(&format!("/api/v1/runners/{id}"));
            v["heartbeat"] == "ok"
        })
    });
    let stderr_path = server.stderr_path.clone();
    assert_eq!(server.stop(), Some(0));
    let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let late: u64 = std::fs::read_to_string(&pidfile)
        .expect("the SIGTERM handler's process ran")
        .trim()
        .parse()
        .unwrap();
    let _cleanup = KillOnDrop(vec![late]);
    assert!(!process_alive(late), "outlived stallwatch:\n{log}");
    let again = Server::start(&data);
    for id in ["forker", "plain"] {
        let events: Vec<String> = incidents(&again, id)
            .iter()
            .filter_map(|i| i["event"].as_str().map(String::from))
            .collect();
        assert!(
            !events.iter().any(|e| e == "breaker.opened"),
            "{id} was tripped at shutdown: {events:?}\n{log}"
        );
    }
}

/// A process a runner started, and that was then registered as a runner of its own, is
/// spared when the first runner is stopped, though it carries that runner's mark: it has its
/// own watchdog and breaker, and ending it with its parent was a false kill recorded only
/// as its own `runner.exited`.
#[test]
fn a_registered_runner_is_not_ended_as_another_runners_descendant() {
    use crate::support::{post_json, python, runner, spawn_runner, ServerOpts};
    let dir = tempfile::tempdir().unwrap();
    let quiet = &fast_trips(1000, 600_000);
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(quiet));
    let pidfile = dir.path().join("sub.pid");
    // one child in its own session (escaped), one in the parent's group: both registered
    let script = format!(
        "import os, time\n\
         pids = []\n\
         for own_session in (True, False):\n\
         \x20   pid = os.fork()\n\
         \x20   if pid == 0:\n\
         \x20       if own_session:\n\
         \x20           os.setsid()\n\
         \x20       time.sleep(600)\n\
         \x20       os._exit(0)\n\
         \x20   pids.append(str(pid))\n\
         open({:?}, 'w').write(' '.join(pids))\n\
         time.sleep(600)\n",
        pidfile.display().to_string()
    );
    let py = python();
    spawn_runner(
        &server,
        "parent",
        &[py.to_str().unwrap(), "-c", &script],
        None,
        &[],
    );
    wait_until!(Duration::from_secs(10), "the children", {
        std::fs::read_to_string(&pidfile).is_ok_and(|t| t.split(' ').count() == 2)
    });
    let subs: Vec<u64> = std::fs::read_to_string(&pidfile)
        .unwrap()
        .split(' ')
        .map(|p| p.parse().unwrap())
        .collect();
    let _cleanup = KillOnDrop(subs.clone());
    for (i, pid) in subs.iter().enumerate() {
        let ticks = stallwatch_client::process_start_time_ticks(*pid as u32).unwrap();
        let (st, v) = post_json(
            &server,
            "/api/v1/runners",
            &serde_json::json!({"id": format!("sub{i}"), "attach": {"pid": pid, "start_time_ticks": ticks}}),
        );
        assert_eq!(st, 201, "{v}");
    }
    let r = http_delete(&server, "/api/v1/runners/parent");
    assert!(r == 200 || r == 204, "DELETE answered {r}");
    std::thread::sleep(Duration::from_millis(500));
    for (i, pid) in subs.iter().enumerate() {
        assert!(
            process_alive(*pid),
            "sub{i} ({pid}) was ended with its parent"
        );
        assert_eq!(runner(&server, &format!("sub{i}"))["lifecycle"], "running");
    }
}

fn http_delete(server: &Server, path: &str) -> u16 {
    crate::support::http_client()
        .delete(server.api(path))
        .bearer_auth(server.token())
        .send()
        .unwrap()
        .status()
        .as_u16()
}

/// An attached runner's process dies, and a new process, already sending tool spans under
/// the same runner id, is attached in its place: the old process's end closes only its own
/// spans (by `process.pid`), and the new process is watched, and tripped when its span
/// passes its SLA. Its span was closed as `runner_exited` with the old exit, and it was
/// never judged again.
#[test]
fn an_attached_runners_replacement_keeps_the_spans_it_already_sent() {
    use crate::support::{http_client, incidents, post_json, unix_nanos, wait_incident};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let ticks = |pid: u32| stallwatch_client::process_start_time_ticks(pid).unwrap();
    let mut old = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let mut new = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let _cleanup = KillOnDrop(vec![u64::from(old.id()), u64::from(new.id())]);
    let attach = |pid: u32| {
        post_json(
            &server,
            "/api/v1/runners",
            &serde_json::json!({"id": "ra", "attach": {"pid": pid, "start_time_ticks": ticks(pid)}}),
        )
    };
    let (st, v) = attach(old.id());
    assert_eq!(st, 201, "{v}");
    // the new process's open tool span (3 s SLA), sent before it is registered
    let trace = "5e".repeat(16);
    let body = serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "tools"}},
            {"key": "stallwatch.runner.id", "value": {"stringValue": "ra"}},
            {"key": "process.pid", "value": {"intValue": new.id().to_string()}}]},
        "scopeSpans": [{"spans": [{"traceId": trace, "spanId": "5f".repeat(8),
            "name": "execute_tool crunch", "kind": 1,
            "startTimeUnixNano": unix_nanos().to_string(), "endTimeUnixNano": "0",
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                {"key": "gen_ai.tool.name", "value": {"stringValue": "crunch"}},
                {"key": "stallwatch.sla_ms", "value": {"intValue": "3000"}}]}]}]}]});
    let r = http_client()
        .post(server.otlp_http("/v1/traces"))
        .json(&body)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let _ = old.kill();
    let _ = old.wait();
    wait_incident(&server, "ra", "runner.exited", Duration::from_secs(10));
    let (st, v) = attach(new.id());
    assert_eq!(st, 201, "{v}");
    let opened = wait_incident(&server, "ra", "breaker.opened", Duration::from_secs(15));
    assert!(
        opened["reason"]
            .as_str()
            .is_some_and(|r| r.contains("crunch")),
        "{opened:#}\n{:#?}",
        incidents(&server, "ra")
    );
    let _ = new.wait();
}

/// Fast trips for the runner-ending tests: a heartbeat every 100 ms, lost after 500 ms, due
/// `startup_grace_ms` after the start (600000: never, for runners serving none); no restarts.
pub(crate) fn fast_trips(grace_ms: u64, startup_grace_ms: u64) -> String {
    format!(
        "[reaper]\ngrace_ms = {grace_ms}\nmax_restarts = 0\n[watchdog]\n\
         heartbeat_interval_ms = 100\nheartbeat_timeout_ms = 500\nstartup_grace_ms = {startup_grace_ms}\n"
    )
}
