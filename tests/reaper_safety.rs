//! Issue 17 end to end on the real binary: the user's files stay whole, and the reaper
//! touches only what it can prove is the runner. Real SQLite file, real child processes,
//! real files; kill -9 of stallwatch where a crash is the point.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::chain::{post_json, process_alive, spawn_runner, SLA_MS};
use crate::support::*;

/// A process started by the test itself (not by stallwatch), killed on drop.
struct Own(Child);

impl Drop for Own {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn own(argv: &[&str], env: &[(&str, &str)]) -> Own {
    let mut c = Command::new(argv[0]);
    c.args(&argv[1..]).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    Own(c.spawn().unwrap())
}

fn start_time(pid: u64) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

fn children(pid: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else {
            continue;
        };
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            let rest = &s[s.rfind(')').unwrap() + 2..];
            if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
                out.push(p);
            }
        }
    }
    out
}

fn delete(server: &Server, id: &str) -> (u16, serde_json::Value) {
    let r = http_client()
        .delete(server.api(&format!("/api/v1/runners/{id}")))
        .bearer_auth(server.token())
        .send()
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().unwrap_or(serde_json::Value::Null))
}

fn config() -> String {
    "[reaper]\ngrace_ms = 500\nmax_restarts = 0\n".into()
}

/// #8: two stallwatch instances, each with a runner `py-tools` that has a child, and an
/// unrelated process carrying `STALLWATCH_RUNNER_ID=py-tools`: a DELETE in one instance
/// ends its runner and that runner's child, and touches nothing else.
#[test]
fn a_delete_in_one_instance_touches_nothing_of_another() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start_with(ServerOpts::new(&dir.path().join("a")).config(&config()));
    let b = Server::start_with(ServerOpts::new(&dir.path().join("b")).config(&config()));
    let argv = ["sh", "-c", "sleep 600 & wait"];
    let ra = spawn_runner(&a, "py-tools", &argv, None, &[]);
    let rb = spawn_runner(&b, "py-tools", &argv, None, &[]);
    let (pa, pb) = (ra["pid"].as_u64().unwrap(), rb["pid"].as_u64().unwrap());
    let bystander = own(&["sleep", "600"], &[("STALLWATCH_RUNNER_ID", "py-tools")]);
    wait_until!(Duration::from_secs(10), "both runners have their child", {
        children(pa).len() == 1 && children(pb).len() == 1
    });
    let (ca, cb) = (children(pa)[0], children(pb)[0]);
    let (st, body) = delete(&a, "py-tools");
    assert_eq!(st, 200, "{body}");
    wait_until!(Duration::from_secs(10), "a's runner and child end", {
        !process_alive(pa) && !process_alive(ca)
    });
    assert!(process_alive(pb), "b's runner untouched");
    assert!(process_alive(cb), "b's runner's child untouched");
    assert!(
        process_alive(bystander.0.id() as u64),
        "a process merely carrying the runner's name is untouched"
    );
    let (st, v) = b.get_json("/api/v1/runners/py-tools");
    assert_eq!(st, 200, "{v}");
}

/// #9: attaching stallwatch's own parent is refused with a clear error; DELETE of an
/// attached sibling ends that sibling and its child only, never its other siblings nor
/// stallwatch's own spawned runner.
#[test]
fn attached_runners_are_stopped_alone_and_ancestors_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("d")).config(&config()));
    let me = std::process::id() as u64;
    let (st, body) = post_json(
        &server,
        "/api/v1/runners",
        &serde_json::json!({"id": "parent", "attach": {"pid": me, "start_time_ticks": start_time(me)}}),
    );
    assert_eq!(st, 400, "{body}");
    assert!(
        body.to_string().contains("ancestor of stallwatch"),
        "a clear reason: {body}"
    );
    let spawned = spawn_runner(&server, "own", &["sleep", "600"], None, &[]);
    let own_pid = spawned["pid"].as_u64().unwrap();
    let sib = own(&["sh", "-c", "sleep 600 & wait"], &[]);
    let other = own(&["sleep", "600"], &[]);
    let sp = sib.0.id() as u64;
    wait_until!(Duration::from_secs(10), "the sibling's child", {
        children(sp).len() == 1
    });
    let sib_child = children(sp)[0];
    let (st, body) = post_json(
        &server,
        "/api/v1/runners",
        &serde_json::json!({"id": "sib", "attach": {"pid": sp, "start_time_ticks": start_time(sp)}}),
    );
    assert!(st == 200 || st == 201, "{body}");
    let (st, body) = delete(&server, "sib");
    assert_eq!(st, 200, "{body}");
    wait_until!(Duration::from_secs(10), "the sibling's child ends", {
        !process_alive(sib_child)
    });
    // The attached sibling is our test's child: it is a zombie until we reap it.
    let _ = sib.0.id();
    assert!(
        process_alive(other.0.id() as u64),
        "another sibling untouched"
    );
    assert!(
        process_alive(own_pid),
        "stallwatch's spawned runner untouched"
    );
    assert!(process_alive(me), "the parent is never signalled");
}

/// #10: ordered shutdown with many runners takes about one grace period and leaves none
/// alive; registering more than `[reaper] max_runners` is refused with a clear error; among
/// them, one runner whose tool span overruns its SLA trips within SLA + a second (the
/// watchdog is not starved by the others) and no other runner is tripped.
/// 300 runners by default to keep the suite's budget (`STALLWATCH_TEST_MANY_RUNNERS=2000`
/// for the full count; the reaper soak binary stops 2,000 without the HTTP front).
#[test]
fn shutdown_with_many_runners_leaves_none_alive() {
    let n: usize = std::env::var("STALLWATCH_TEST_MANY_RUNNERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().unwrap();
    // No heartbeat answers from `sleep`: a long start-up grace keeps the watchdog from
    // tripping runners while thousands register, so shutdown really stops all of them.
    let cfg = format!("[reaper]\ngrace_ms = 1000\nmax_restarts = 0\nmax_runners = {n}\n[watchdog]\nstartup_grace_ms = 600000\ndefault_sla_ms = {SLA_MS}\n");
    let server = Server::start_with(ServerOpts::new(&dir.path().join("d")).config(&cfg));
    let started = Instant::now();
    let pids: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|w| {
                let server = &server;
                s.spawn(move || {
                    (0..n)
                        .filter(|i| i % 8 == w)
                        .map(|i| {
                            let r = spawn_runner(
                                server,
                                &format!("r{i}"),
                                &["sleep", "600"],
                                None,
                                &[],
                            );
                            r["pid"].as_u64().unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    eprintln!("registered {n} runners in {:?}", started.elapsed());
    let (st, body) = post_json(
        &server,
        "/api/v1/runners",
        &serde_json::json!({"id": "one-too-many", "spawn": {"argv": ["sleep", "600"]}}),
    );
    assert_eq!(st, 429, "{body}");
    assert!(body.to_string().contains("max_runners"), "{body}");
    assert_eq!(pids.iter().filter(|p| process_alive(**p)).count(), n);
    // One stalled runner among them: its tool span overruns the SLA.
    let start = unix_nanos();
    let body = serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "many"}},
            {"key": "stallwatch.runner.id", "value": {"stringValue": "r0"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": "5a".repeat(16), "spanId": "5b".repeat(8), "name": "fit_model", "kind": 1,
            "startTimeUnixNano": start.to_string(), "endTimeUnixNano": "0",
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                {"key": "gen_ai.tool.name", "value": {"stringValue": "fit_model"}}]}]}]}]});
    let r = http_client()
        .post(server.otlp_http("/v1/traces"))
        .json(&body)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let opened = wait_incident(&server, "r0", "breaker.opened", Duration::from_secs(30));
    let at = nanos(&opened["at_unix_nano"]);
    let lag_ms = (at.saturating_sub(start) / 1_000_000).saturating_sub(SLA_MS);
    eprintln!("the stalled runner tripped {lag_ms} ms after its {SLA_MS} ms SLA");
    assert!(at >= start + SLA_MS * 1_000_000, "tripped before its SLA");
    assert!(
        lag_ms < 1000,
        "trip {lag_ms} ms late: the watchdog was starved"
    );
    // healthy ones are never tripped
    let (st, page) = server.get_json("/api/v1/incidents?event=breaker.opened&limit=200");
    assert_eq!(st, 200, "{page}");
    let tripped: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["event"] == "breaker.opened")
        .filter_map(|i| i["runner_id"].as_str())
        .collect();
    assert_eq!(tripped, ["r0"], "a healthy runner was tripped");
    wait_until!(Duration::from_secs(10), "the stalled runner is stopped", {
        !process_alive(pids[0])
    });
    let t = Instant::now();
    server.stop();
    let took = t.elapsed();
    let alive = pids.iter().filter(|p| process_alive(**p)).count();
    eprintln!("shutdown with {n} runners took {took:?}; {alive} alive after");
    assert_eq!(alive, 0, "no runner outlives stallwatch");
    assert!(
        took < Duration::from_secs(25),
        "about one grace period, not one per runner: {took:?}"
    );
}

fn checkpoint(server: &Server, runner: &str, ws: &Path) -> (String, PathBuf) {
    let (st, v) = post_json(
        server,
        "/api/v1/checkpoints",
        &serde_json::json!({"runner_id": runner, "workspace": ws}),
    );
    assert_eq!(st, 201, "{v}");
    (
        v["id"].as_str().unwrap().to_string(),
        PathBuf::from(v["path"].as_str().unwrap()),
    )
}

/// #2: a commit racing a rollback of the same checkpoint: exactly one wins, the other is
/// answered 409, and the workspace holds all of the files or none.
#[test]
fn commit_racing_rollback_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A trip of the runner mid-round would settle the checkpoint under both requests.
    let server = Server::start_with(ServerOpts::new(&dir.path().join("d")).config(&quiet_config()));
    spawn_runner(&server, "tools", &["sleep", "600"], None, &[]);
    for round in 0..3 {
        let ws = dir.path().join(format!("ws{round}"));
        std::fs::create_dir_all(&ws).unwrap();
        let (id, staging) = checkpoint(&server, "tools", &ws);
        stage_files(&staging, 1000);
        let (c, r) = std::thread::scope(|s| {
            let c = s.spawn(|| {
                post_json(
                    &server,
                    &format!("/api/v1/checkpoints/{id}/commit"),
                    &serde_json::json!({}),
                )
            });
            let r = s.spawn(|| {
                post_json(
                    &server,
                    &format!("/api/v1/checkpoints/{id}/rollback"),
                    &serde_json::json!({}),
                )
            });
            (c.join().unwrap(), r.join().unwrap())
        });
        let landed = count_files(&ws);
        assert!(
            (c.0 == 200 && r.0 == 409 && landed == 1000)
                || (r.0 == 200 && c.0 == 409 && landed == 0),
            "round {round}: commit {c:?}, rollback {r:?}, {landed} files landed"
        );
    }
}

/// #1: kill -9 during a 1,000-file commit while the runner lives on: the next start settles
/// the commit before anything else (rolled forward if it had reached its journal), so the
/// workspace holds all of the files or none, and the checkpoint is never left `committing`.
#[test]
fn kill9_during_a_commit_is_settled_on_start_while_the_runner_lives() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    for (round, delay_ms) in [30u64, 120, 400].into_iter().enumerate() {
        let server = Server::start_with(ServerOpts::new(&data).config(&config()));
        let ws = dir.path().join(format!("ws{round}"));
        std::fs::create_dir_all(&ws).unwrap();
        let reg = spawn_runner(
            &server,
            &format!("t{round}"),
            &["sleep", "600"],
            Some(&ws),
            &[],
        );
        let pid = reg["pid"].as_u64().unwrap();
        let id = reg["checkpoint"]["id"].as_str().unwrap().to_string();
        let staging = PathBuf::from(reg["checkpoint"]["path"].as_str().unwrap());
        stage_files(&staging, 1000);
        let url = server.api(&format!("/api/v1/checkpoints/{id}/commit"));
        let token = server.token();
        std::thread::spawn(move || {
            let _ = http_client()
                .post(url)
                .bearer_auth(token)
                .json(&serde_json::json!({}))
                .send();
        });
        std::thread::sleep(Duration::from_millis(delay_ms));
        server.crash();
        assert!(process_alive(pid), "the runner survives the crash");
        let server = Server::start_with(ServerOpts::new(&data).config(&config()));
        let (st, page) = server.get_json("/api/v1/checkpoints?limit=100");
        assert_eq!(st, 200, "{page}");
        let state = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id.as_str())
            .map(|c| c["state"].as_str().unwrap_or_default().to_string());
        assert_ne!(
            state.as_deref(),
            Some("committing"),
            "round {round}: settled on start"
        );
        let landed = count_files(&ws);
        assert!(
            landed == 0 || landed == 1000,
            "round {round} (kill after {delay_ms} ms): {landed} of 1000 files in place"
        );
        if landed == 0 {
            assert_eq!(
                state.as_deref(),
                Some("open"),
                "round {round}: nothing moved, still open"
            );
        }
        server.stop();
    }
}

/// #3–#7 and #15 over HTTP: staged symlinks and hard links are refused (400/422), a
/// symlinked workspace folder creates nothing outside, and bad checkpoint paths answer 400,
/// never 500.
#[test]
fn bad_checkpoint_input_is_refused_with_a_clear_4xx() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("d")).config(&config()));
    spawn_runner(&server, "tools", &["sleep", "600"], None, &[]);
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "s").unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    for (ws, why) in [
        (serde_json::json!("relative/ws"), "relative"),
        (serde_json::json!(""), "empty"),
        (serde_json::json!("/"), "the root"),
        (serde_json::json!(file), "a file"),
        (serde_json::json!(dir.path().join("missing")), "missing"),
        (serde_json::json!(dir.path().join("d")), "the data folder"),
    ] {
        let (st, body) = post_json(
            &server,
            "/api/v1/checkpoints",
            &serde_json::json!({"runner_id": "tools", "workspace": ws}),
        );
        assert_eq!(st, 400, "{why}: {body}");
    }
    let commit = |id: &str| {
        post_json(
            &server,
            &format!("/api/v1/checkpoints/{id}/commit"),
            &serde_json::json!({}),
        )
    };
    // A relative symlink, harmless where it sits, would point outside from its new place.
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let (id, staging) = checkpoint(&server, "tools", &ws);
    std::fs::create_dir_all(staging.join("sub")).unwrap();
    std::os::unix::fs::symlink("../../../a", staging.join("sub/link")).unwrap();
    let (st, body) = commit(&id);
    assert_eq!(st, 400, "{body}");
    assert!(!ws.join("sub").exists());
    // A hard link to an outside file.
    let (id, staging) = checkpoint(&server, "tools", &ws);
    if std::fs::hard_link(outside.join("secret.txt"), staging.join("h.txt")).is_ok() {
        let (st, body) = commit(&id);
        assert_eq!(st, 422, "{body}");
        assert!(body.to_string().contains("hard link"), "{body}");
        assert!(!ws.join("h.txt").exists());
    }
    // A symlinked folder already in the workspace: nothing is created outside.
    std::os::unix::fs::symlink(&outside, ws.join("out")).unwrap();
    let (id, staging) = checkpoint(&server, "tools", &ws);
    std::fs::create_dir_all(staging.join("out/sub/deep")).unwrap();
    std::fs::write(staging.join("out/sub/deep/x.txt"), "x").unwrap();
    let (st, body) = commit(&id);
    assert_eq!(st, 400, "{body}");
    let names: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("secret.txt")],
        "nothing created outside"
    );
    // Unknown checkpoint: 404, not 500.
    let (st, body) = commit("0123456789abcdef");
    assert_eq!(st, 404, "{body}");
}

/// A small tmpfs mounted on `<tempdir>/d` (the data folder; the server's log and config
/// land beside it, outside the mount), unmounted on drop. `None` with a printed reason
/// when mounting is not possible (not root); when `CI` is set and we are root, a failed
/// mount fails the test.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("d");
        std::fs::create_dir_all(&at).unwrap();
        if !rustix::process::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root here: a real full filesystem needs a tmpfs mount"
            );
            eprintln!("SKIP: a real full filesystem needs a tmpfs mount, which needs root");
            return None;
        }
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root here: mounting a tmpfs must work"
            );
            eprintln!("SKIP: mount -t tmpfs failed (no CAP_SYS_ADMIN in this container?)");
            return None;
        }
        Some(Tmpfs { dir })
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("d")
    }

    /// Fills the filesystem to the last byte with `fill`.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.path().join("fill")).unwrap();
        for chunk in [1 << 20, 4096, 512] {
            let block = vec![7u8; chunk];
            while f.write_all(&block).is_ok() {}
        }
        let _ = f.sync_all();
        let free = rustix::fs::statvfs(self.path()).unwrap();
        assert!(free.f_bavail * free.f_frsize < 1 << 20, "the disk is full");
    }

    fn free(&self) {
        std::fs::remove_file(self.path().join("fill")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// `sleep` runners never answer a heartbeat: a long start-up grace keeps the watchdog from
/// tripping them (and settling their checkpoints) in the middle of a test.
fn quiet_config() -> String {
    "[reaper]\ngrace_ms = 500\nmax_restarts = 0\n[watchdog]\nstartup_grace_ms = 600000\n".into()
}

fn readyz(server: &Server) -> serde_json::Value {
    let (st, body) = server.get_json("/readyz");
    assert_eq!(st, 200, "{body}");
    body
}

fn events_of(server: &Server, runner: &str, event: &str) -> usize {
    crate::chain::incidents(server, runner)
        .iter()
        .filter(|i| i["event"] == event)
        .count()
}

/// #13: while the disk is full a DELETE still stops the runner, and every control record
/// of it (ledger, runner row, incident) is held in order and written once space returns;
/// after a restart the orphan sweep finds nothing to contradict (no `runner.orphaned` for
/// the runner already terminated, one `runner.terminated`).
#[test]
fn a_full_disk_episode_and_a_restart_leave_no_contradictory_incidents() {
    let Some(fs) = Tmpfs::mount("48m") else {
        return;
    };
    let opts = || ServerOpts::new(&fs.path()).config(&quiet_config());
    let server = Server::start_with(opts());
    // A reader in another process pins the WAL, so new commits must grow it: on the full
    // disk they fail with SQLITE_FULL instead of reusing old WAL space.
    let mut reader = Command::new(python())
        .args([
            "-c",
            "import sqlite3,sys,time\nc=sqlite3.connect(sys.argv[1])\nc.execute('begin')\nc.execute('select count(*) from runners').fetchall()\nprint('pinned',flush=True)\ntime.sleep(600)",
        ])
        .arg(fs.path().join("stallwatch.db"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(reader.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "pinned");
    }
    fs.fill();
    // Runners registered and deleted while the disk is full: each is spawned and stopped
    // on time, and its records wait in memory, in order.
    let mut ids = Vec::new();
    for i in 0..40 {
        let id = format!("full-{i}");
        let r = spawn_runner(&server, &id, &["sleep", "600"], None, &[]);
        let pid = r["pid"].as_u64().unwrap();
        let (st, body) = delete(&server, &id);
        assert_eq!(st, 200, "{body}");
        wait_until!(Duration::from_secs(10), "runner gone", !process_alive(pid));
        ids.push(id);
        if readyz(&server)["held_records"].as_u64().unwrap_or(0) > 0 && i >= 2 {
            break;
        }
    }
    let held = readyz(&server)["held_records"].as_u64().unwrap_or(0);
    eprintln!(
        "{} runners stopped on the full disk; {held} control records held",
        ids.len()
    );
    assert!(
        held > 0,
        "the full disk refused writes, so records were held"
    );
    let _ = reader.kill();
    let _ = reader.wait();
    fs.free();
    wait_until!(Duration::from_secs(30), "held records written", {
        readyz(&server)["held_records"].as_u64() == Some(0)
    });
    for id in &ids {
        assert_eq!(events_of(&server, id, "runner.terminated"), 1, "{id}");
    }
    server.stop();
    let server = Server::start_with(opts());
    // The sweep runs right after start; give it time to (wrongly) find the runners.
    std::thread::sleep(Duration::from_secs(3));
    let (_, runners) = server.get_json("/api/v1/runners");
    for id in &ids {
        assert_eq!(events_of(&server, id, "runner.orphaned"), 0, "{id}");
        assert_eq!(events_of(&server, id, "runner.terminated"), 1, "{id}");
        assert!(
            !runners.to_string().contains(&format!("\"{id}\"")),
            "a removed runner is not listed again: {runners}"
        );
    }
    server.stop();
}

/// Posts one ended span (`trace_id`, span id `b7ad6b7169203331`, `name`) as OTLP/JSON:
/// the server's answer.
fn post_span(server: &Server, trace_id: &str, name: &str) -> reqwest::blocking::Response {
    let span = serde_json::json!({"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": [{
        "traceId": trace_id, "spanId": "b7ad6b7169203331", "name": name, "kind": 1,
        "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000100000000"}]}]}]});
    http_client()
        .post(server.otlp_http("/v1/traces"))
        .json(&span)
        .send()
        .unwrap()
}

/// #13: a disk full at start no longer refuses to start: stallwatch frees its reserve,
/// starts degraded, spawns, watches and stops runners, and refuses telemetry with a
/// retryable 503 until space returns; then telemetry is accepted again. #5: the database
/// files are owner-only.
#[test]
fn a_disk_full_at_start_starts_degraded_and_refuses_telemetry_with_503() {
    use std::os::unix::fs::PermissionsExt;
    let Some(fs) = Tmpfs::mount("48m") else {
        return;
    };
    let opts = || ServerOpts::new(&fs.path()).config(&quiet_config());
    let server = Server::start_with(opts());
    assert!(
        fs.path().join("reserve").exists(),
        "reserve written at start"
    );
    server.stop();
    for f in ["stallwatch.db", "stallwatch.db-wal", "stallwatch.db-shm"] {
        if let Ok(m) = std::fs::metadata(fs.path().join(f)) {
            assert_eq!(m.permissions().mode() & 0o777, 0o600, "{f}");
        }
    }
    fs.fill();
    let server = Server::start_with(opts());
    assert!(
        server.stderr().contains("the disk is full at start"),
        "{}",
        server.stderr()
    );
    let post = || {
        post_span(
            &server,
            "0af7651916cd43dd8448eb211c80319c",
            "during-full-disk",
        )
    };
    let r = post();
    assert_eq!(r.status().as_u16(), 503, "telemetry refused while degraded");
    assert!(r.headers().get("retry-after").is_some(), "retryable");
    let ready = readyz(&server);
    assert_eq!(ready["degraded"]["condition"], "full", "{ready}");
    assert!(
        ready["degraded"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("16 MiB")),
        "{ready}"
    );
    let runner = spawn_runner(&server, "full-b", &["sleep", "600"], None, &[]);
    let pid = runner["pid"].as_u64().unwrap();
    assert!(process_alive(pid));
    let (st, body) = delete(&server, "full-b");
    assert_eq!(st, 200, "{body}");
    wait_until!(
        Duration::from_secs(10),
        "runner stopped",
        !process_alive(pid)
    );
    fs.free();
    wait_until!(Duration::from_secs(20), "telemetry accepted again", {
        post().status().as_u16() == 200
    });
    assert!(readyz(&server)["degraded"].is_null());
    server.stop();
}

/// A data folder on a read-only filesystem, already private (0700): the start fails
/// naming the read-only filesystem where it writes, not a chmod it had no need of.
#[test]
fn a_read_only_data_folder_is_refused_naming_the_read_only_filesystem() {
    let Some(fs) = Tmpfs::mount("8m") else {
        return;
    };
    let ok = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(fs.path())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "remount read-only");
    let out = Command::new(bin())
        .args(["serve", "--data-dir"])
        .arg(fs.path())
        .args([
            "--otlp-grpc-listen",
            "127.0.0.1:0",
            "--otlp-http-listen",
            "127.0.0.1:0",
            "--dashboard-listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("Read-only file system"), "{err}");
    assert!(!err.contains("cannot set mode"), "{err}");
}

/// The disk filling while stallwatch runs: the reserve is freed for control records, so a
/// runner's row and the incidents of its stop are stored (they were held in memory, lost at
/// shutdown, while the 8 MiB reserve sat unused), and telemetry is refused with 503 until
/// space returns, when the reserve is made again and telemetry accepted.
#[test]
fn a_disk_that_fills_while_running_frees_the_reserve_for_control_records() {
    let Some(fs) = Tmpfs::mount("48m") else {
        return;
    };
    let opts = || ServerOpts::new(&fs.path()).config(&quiet_config());
    let server = Server::start_with(opts());
    assert!(
        fs.path().join("reserve").exists(),
        "reserve written at start"
    );
    let runner = spawn_runner(&server, "keepme", &["sleep", "600"], None, &[]);
    let pid = runner["pid"].as_u64().unwrap();
    fs.fill();
    let late = spawn_runner(&server, "late", &["sleep", "600"], None, &[]);
    let late_pid = late["pid"].as_u64().unwrap();
    let (st, body) = delete(&server, "keepme");
    assert_eq!(st, 200, "{body}");
    wait_until!(
        Duration::from_secs(10),
        "runner stopped",
        !process_alive(pid)
    );
    wait_until!(
        Duration::from_secs(20),
        "the reserve freed",
        !fs.path().join("reserve").exists()
    );
    let post = || {
        post_span(
            &server,
            "0af7651916cd43dd8448eb211c80319d",
            "on-a-full-disk",
        )
    };
    assert_eq!(
        post().status().as_u16(),
        503,
        "telemetry refused on a full disk"
    );
    // for as long as it refuses, not only until the writer's own condition passes (the
    // freed reserve lets its next probe succeed)
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(post().status().as_u16(), 503, "still refused");
    let ready = readyz(&server);
    assert_eq!(ready["degraded"]["condition"], "full", "{ready}");
    assert!(
        server
            .stderr()
            .contains("the disk is full: telemetry refused"),
        "{}",
        server.stderr()
    );
    let first_log_path = server.stderr_path.clone();
    server.stop();
    let first_log = std::fs::read_to_string(first_log_path).unwrap_or_default();
    assert!(
        !process_alive(late_pid),
        "a spawned runner outlived shutdown"
    );

    let again = Server::start_with(opts());
    let events = |id: &str| -> Vec<String> {
        let (_, all) = again.get_json(&format!("/api/v1/incidents?runner_id={id}&limit=100"));
        all["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["event"].as_str().map(str::to_owned))
            .collect()
    };
    let keepme = events("keepme");
    assert!(
        keepme.iter().any(|e| e == "runner.terminated"),
        "the stop's incident was lost: {keepme:?}\n{first_log}"
    );
    let late = events("late");
    assert!(
        late.iter().any(|e| e == "runner.started") && late.iter().any(|e| e == "runner.terminated"),
        "the incidents of a runner started on the full disk were lost: {late:?}\n{first_log}"
    );
    again.stop();
    fs.free();
    let last = Server::start_with(opts());
    assert!(fs.path().join("reserve").exists(), "the reserve made again");
    last.stop();
}

/// A checkpoint of a runner being stopped by a trip is rolled back, never committed: a
/// commit asked for during the runner's grace period (the runner wrote its files while it
/// was stuck) is refused with 409, and the staged file never reaches the workspace. It was
/// committed (half-written output in the workspace), and the trip's rollback found nothing.
#[test]
fn a_commit_during_a_trips_termination_is_refused_and_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::reaper_fixes::fast_trips(4000, 300);
    let server = Server::start_with(ServerOpts::new(&dir.path().join("d")).config(&cfg));
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    // serves no heartbeat (tripped as unresponsive) and ignores SIGTERM (a grace period)
    let reg = spawn_runner(
        &server,
        "stuck",
        &["sh", "-c", "trap '' TERM; sleep 600"],
        None,
        &[],
    );
    let pid = reg["pid"].as_u64().unwrap();
    let (id, staging) = checkpoint(&server, "stuck", &ws);
    std::fs::write(staging.join("results.csv"), "a,b\n1,").unwrap();
    wait_lifecycle(&server, "stuck", "stopping", Duration::from_secs(20));
    assert!(process_alive(pid), "still in its grace period");
    let (st, v) = post_json(
        &server,
        &format!("/api/v1/checkpoints/{id}/commit"),
        &serde_json::json!({}),
    );
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (409, Some("not_open")),
        "{v}"
    );
    wait_incident(
        &server,
        "stuck",
        "checkpoint.rolled_back",
        Duration::from_secs(20),
    );
    assert!(
        !ws.join("results.csv").exists(),
        "the half-written file reached the workspace"
    );
}

/// Another user's process is never a runner, even when stallwatch runs as root and could
/// signal it: an attach of one (with its start time, so it would be signalled) is refused
/// 400 naming its user. It was accepted, and a DELETE killed it.
#[test]
fn another_users_process_cannot_be_attached() {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root here: starting another user's process needs root"
        );
        eprintln!("SKIP: starting another user's process needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("d")).config(&quiet_config()));
    let mut other = Own(Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sleep",
            "60",
        ])
        .spawn()
        .unwrap());
    let pid = u64::from(other.0.id());
    wait_until!(Duration::from_secs(5), "setpriv to become user 65534", {
        std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == 65534)
    });
    let (st, v) = post_json(
        &server,
        "/api/v1/runners",
        &serde_json::json!({"id": "theirs", "attach": {"pid": pid, "start_time_ticks": start_time(pid)}}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("belongs to user 65534")),
        "{v}"
    );
    assert!(other.0.try_wait().unwrap().is_none(), "it was signalled");
    // a setuid program another user started: real uid 65534, effective uid 0
    let mut setuid = Own(Command::new(python())
        .args([
            "-c",
            "import os, time; os.setresuid(65534, 0, 65534); time.sleep(60)",
        ])
        .spawn()
        .unwrap());
    let pid = u64::from(setuid.0.id());
    wait_until!(Duration::from_secs(5), "the real uid to become 65534", {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t65534\t0")))
    });
    let (st, v) = post_json(
        &server,
        "/api/v1/runners",
        &serde_json::json!({"id": "setuid", "attach": {"pid": pid, "start_time_ticks": start_time(pid)}}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(setuid.0.try_wait().unwrap().is_none(), "it was signalled");
}
