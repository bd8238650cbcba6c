//! The Windows build under Wine (docs/platforms.md; run by `scripts/test-windows`, which
//! builds `stallwatch.exe` and the `windows-runner.exe` fixture for x86_64-pc-windows-gnu,
//! puts them with the test-only `ProcessPrng` shim DLL in one folder, makes a temporary
//! WINEPREFIX, and sets `STALLWATCH_TEST_WINDOWS_BIN_DIR` and `STALLWATCH_TEST_WINE`).
//!
//! Everything runs for real: the Windows stallwatch binds loopback inside Wine; the real
//! Python OpenTelemetry SDK exporters send to it from Linux; the API is read from Linux;
//! runners are real Windows processes serving the heartbeat named pipe, in Job Objects.
//! Every test here is `#[ignore]`d, so a plain `cargo test` lists them as ignored (never as
//! passed); `scripts/test-windows` runs them with `--ignored`, and there a missing binary,
//! Wine or `STALLWATCH_TEST_WINDOWS_BIN_DIR` fails the test.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{attr, http_client, python, span_named, test_data};

/// Watchdog and reaper timings for Wine: heartbeats every 200 ms, lost after 2 s; an SLA
/// long enough that only a lost heartbeat trips; a 2 s grace period.
const CONFIG: &str = "[watchdog]\nheartbeat_interval_ms = 200\nheartbeat_timeout_ms = 2000\n\
    startup_grace_ms = 30000\nstaleness_ms = 600000\nbreaker_cooldown_ms = 600000\n\
    default_sla_ms = 600000\ntick_ms = 25\n[reaper]\ngrace_ms = 2000\nmax_restarts = 0\n";

/// Why every test here is ignored in a plain run (the `#[ignore]` reason).
const IGNORED: &str = "Windows build under Wine: run scripts/test-windows";

/// Where the Windows binaries are, and the Wine loader. Panics (the test fails) when
/// `scripts/test-windows` did not set them up.
fn setup() -> (PathBuf, PathBuf) {
    setup_with(&[
        "stallwatch.exe",
        "windows-runner.exe",
        "bcryptprimitives.dll",
    ])
}

fn setup_with(files: &[&str]) -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(
        std::env::var_os("STALLWATCH_TEST_WINDOWS_BIN_DIR")
            .unwrap_or_else(|| panic!("STALLWATCH_TEST_WINDOWS_BIN_DIR is not set: {IGNORED}")),
    );
    for f in files {
        assert!(
            dir.join(f).is_file(),
            "{} is missing: scripts/test-windows builds it",
            dir.join(f).display()
        );
    }
    let wine = PathBuf::from(
        std::env::var_os("STALLWATCH_TEST_WINE").unwrap_or_else(|| "/usr/lib/wine/wine64".into()),
    );
    assert!(wine.is_file(), "Wine loader {} is missing", wine.display());
    (dir, wine)
}

/// A Linux path as Wine's `Z:` drive sees it.
fn win(p: &Path) -> String {
    format!("Z:{}", p.display()).replace('/', "\\")
}

struct WinServer {
    child: Child,
    data_dir: PathBuf,
    grpc: SocketAddr,
    http: SocketAddr,
    dashboard: SocketAddr,
    ready_line: String,
    stderr_path: PathBuf,
}

fn wine_command(wine: &Path, exe: &Path) -> Command {
    let mut cmd = Command::new(wine);
    cmd.arg(exe)
        .env("WINEDEBUG", "-all")
        .env("WINEDLLOVERRIDES", "bcryptprimitives=n")
        .env_remove("STALLWATCH_CONFIG")
        .env_remove("DISPLAY");
    cmd
}

impl WinServer {
    fn start(bin: &Path, wine: &Path, root: &Path, config: Option<&str>) -> WinServer {
        Self::start_with_env(bin, wine, root, config, &[])
    }

    fn start_with_env(
        bin: &Path,
        wine: &Path,
        root: &Path,
        config: Option<&str>,
        env: &[(&str, &str)],
    ) -> WinServer {
        let data_dir = root.join("data");
        let stderr_path = root.join("stallwatch.stderr.log");
        let mut cmd = wine_command(wine, &bin.join("stallwatch.exe"));
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(win(&data_dir))
            .args(["--otlp-grpc-listen", "127.0.0.1:0"])
            .args(["--otlp-http-listen", "127.0.0.1:0"])
            .args(["--dashboard-listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&stderr_path).unwrap()));
        if let Some(toml) = config {
            let p = root.join("stallwatch.toml");
            std::fs::write(&p, toml).unwrap();
            cmd.arg("--config").arg(win(&p));
        }
        let mut child = cmd.spawn().expect("start stallwatch.exe under Wine");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let Ok(line) = rx.recv_timeout(Duration::from_secs(180)) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "stallwatch.exe printed no ready line; stderr:\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        };
        let ready: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("ready line is not JSON ({e}): {line}"));
        assert_eq!(ready["event"], "ready", "{line}");
        let addr = |k: &str| -> SocketAddr { ready[k].as_str().unwrap().parse().unwrap() };
        WinServer {
            grpc: addr("otlp_grpc"),
            http: addr("otlp_http"),
            dashboard: addr("dashboard"),
            ready_line: line,
            child,
            data_dir,
            stderr_path,
        }
    }

    fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("token"))
            .unwrap()
            .trim()
            .to_string()
    }

    fn api(&self, path: &str) -> String {
        format!("http://{}{}", self.dashboard, path)
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    fn get_json(&self, path: &str) -> (u16, serde_json::Value) {
        let r = http_client()
            .get(self.api(path))
            .bearer_auth(self.token())
            .send()
            .unwrap();
        let st = r.status().as_u16();
        (st, r.json().unwrap_or(serde_json::Value::Null))
    }

    fn send(&self, req: reqwest::blocking::RequestBuilder) -> (u16, serde_json::Value) {
        let r = req.bearer_auth(self.token()).send().unwrap();
        let st = r.status().as_u16();
        (st, r.json().unwrap_or(serde_json::Value::Null))
    }

    fn runner(&self, id: &str) -> serde_json::Value {
        self.get_json(&format!("/api/v1/runners/{id}")).1
    }

    fn incident(&self, runner: &str, event: &str, timeout: Duration) -> serde_json::Value {
        let deadline = Instant::now() + timeout;
        loop {
            let (_, page) =
                self.get_json(&format!("/api/v1/incidents?runner_id={runner}&limit=200"));
            if let Some(i) = page["items"]
                .as_array()
                .and_then(|a| a.iter().find(|i| i["event"] == event).cloned())
            {
                return i;
            }
            if Instant::now() > deadline {
                panic!(
                    "no {event} incident for {runner} within {timeout:?}: {page:#}\nstderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `POST /api/v1/shutdown` and wait for the exit code.
    fn shutdown(mut self) -> Option<i32> {
        let (st, _) = self.send(http_client().post(self.api("/api/v1/shutdown")));
        assert!((200..300).contains(&st), "shutdown answered {st}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(
                Instant::now() < deadline,
                "stallwatch.exe did not exit within 60 s of POST /api/v1/shutdown; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for WinServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = http_client()
                .post(self.api("/api/v1/shutdown"))
                .bearer_auth(self.token())
                .send();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
#[ignore = "Windows build under Wine: run scripts/test-windows"]
fn spine_real_python_exporters_reach_the_windows_build() {
    let (bin, wine) = setup();
    let dir = tempfile::tempdir().unwrap();
    let server = WinServer::start(&bin, &wine, dir.path(), None);
    for protocol in ["grpc", "http/protobuf"] {
        let endpoint = match protocol {
            "grpc" => format!("http://{}", server.grpc),
            _ => format!("http://{}", server.http),
        };
        let out = Command::new(python())
            .arg(test_data("python/export_spans.py"))
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
            .env("OTEL_SERVICE_NAME", "py-windows")
            .output()
            .expect("run the python exporter");
        assert!(
            out.status.success(),
            "python exporter ({protocol}) failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ids: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let trace_id = ids["trace_id"].as_str().unwrap();
        let mut trace = serde_json::Value::Null;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let (st, t) = server.get_json(&format!("/api/v1/traces/{trace_id}"));
            trace = t;
            if st == 200
                && trace["spans"].as_array().map(Vec::len) == Some(2)
                && trace["logs"].as_array().is_some_and(|a| !a.is_empty())
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(
            trace["spans"].as_array().map(Vec::len),
            Some(2),
            "{protocol}: {trace:#}\nstderr:\n{}",
            server.stderr()
        );
        let tool = span_named(&trace, "execute_tool read_file");
        assert_eq!(tool["span_id"], ids["tool_span_id"]);
        assert_eq!(tool["parent_span_id"], ids["root_span_id"]);
        assert_eq!(tool["state"], "ended");
        let attrs = &tool["attributes"];
        assert_eq!(attr(attrs, "gen_ai.tool.name")["stringValue"], "read_file");
        assert_eq!(attr(attrs, "file.bytes")["intValue"], "9007199254740993");
    }
}

#[test]
#[ignore = "Windows build under Wine: run scripts/test-windows"]
fn dashboard_api_auth_lock_discovery_and_ordered_shutdown() {
    let (bin, wine) = setup();
    let dir = tempfile::tempdir().unwrap();
    let server = WinServer::start(&bin, &wine, dir.path(), None);
    let token = server.token();
    assert_eq!(token.len(), 64, "token {token:?}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    // The discovery file holds exactly the ready line's object.
    let discovery = server.data_dir.join("ready.json");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&discovery).unwrap()).unwrap();
    let ready: serde_json::Value = serde_json::from_str(&server.ready_line).unwrap();
    assert_eq!(written, ready);
    let r = http_client().get(server.api("/healthz")).send().unwrap();
    assert_eq!(r.status(), 200);
    let (st, runners) = server.get_json("/api/v1/runners");
    assert_eq!(st, 200);
    assert_eq!(runners["items"], serde_json::json!([]));
    // Control needs the token; a foreign Host is refused (DNS rebinding guard).
    let r = http_client()
        .post(server.api("/api/v1/shutdown"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http_client()
        .get(server.api("/api/v1/runners"))
        .header("Host", "evil.example")
        .bearer_auth(&token)
        .send()
        .unwrap();
    assert_eq!(r.status(), 421);
    // Attaching is not available on Windows: a clear 501, not a pretend success.
    let (st, body) = server.send(
        http_client()
            .post(server.api("/api/v1/runners"))
            .json(&serde_json::json!({"id": "att", "attach": {"pid": 4242}})),
    );
    assert_eq!(st, 501, "{body}");
    assert_eq!(body["error"]["code"], "unsupported_platform", "{body}");
    // A second instance on the same data folder is refused by the LockFileEx lock.
    let out = wine_command(&wine, &bin.join("stallwatch.exe"))
        .arg("serve")
        .arg("--data-dir")
        .arg(win(&server.data_dir))
        .args(["--otlp-grpc-listen", "127.0.0.1:0"])
        .args(["--otlp-http-listen", "127.0.0.1:0"])
        .args(["--dashboard-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "a second instance started");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use"), "{err}");
    assert!(server.child.id() > 0);
    // The ordered shutdown: exit 0, discovery file removed.
    assert_eq!(server.shutdown(), Some(0));
    assert!(
        !discovery.exists(),
        "ready.json left after the ordered shutdown"
    );
}

/// Registers a `windows-runner <mode>` runner (with `workspace`, if given); answers the
/// registration.
fn register_runner(
    server: &WinServer,
    bin: &Path,
    id: &str,
    mode: &str,
    markers: &Path,
    workspace: Option<&Path>,
) -> serde_json::Value {
    std::fs::create_dir_all(markers).unwrap();
    let mut spawn = serde_json::json!({
        "argv": [win(&bin.join("windows-runner.exe")), mode, win(markers)],
        "env": {"STALL_AFTER_MS": "3000"},
    });
    if let Some(ws) = workspace {
        spawn["workspace"] = win(ws).into();
    }
    let (st, body) = server.send(
        http_client()
            .post(server.api("/api/v1/runners"))
            .json(&serde_json::json!({"id": id, "spawn": spawn})),
    );
    assert_eq!(st, 201, "{body}\nstderr:\n{}", server.stderr());
    assert!(
        body["heartbeat_socket"]
            .as_str()
            .unwrap()
            .starts_with(r"\\.\pipe\stallwatch-"),
        "{body}"
    );
    body
}

/// Registers a `windows-runner <mode>` runner; answers its pid.
fn spawn_runner(server: &WinServer, bin: &Path, id: &str, mode: &str, markers: &Path) -> u64 {
    register_runner(server, bin, id, mode, markers, None)["pid"]
        .as_u64()
        .unwrap()
}

/// Posts an open tool span (`end_time_unix_nano` 0) for `runner` over OTLP/HTTP JSON.
fn open_tool_span(server: &WinServer, runner: &str, trace: &str, span: &str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        .to_string();
    let body = serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": runner}},
            {"key": "stallwatch.runner.id", "value": {"stringValue": runner}}]},
        "scopeSpans": [{"scope": {"name": "windows-test"}, "spans": [{
            "traceId": trace, "spanId": span, "name": "execute_tool run_cell", "kind": 1,
            "startTimeUnixNano": now, "endTimeUnixNano": "0",
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                {"key": "gen_ai.tool.name", "value": {"stringValue": "run_cell"}}]}]}]}]});
    let r = http_client()
        .post(format!("http://{}/v1/traces", server.http))
        .bearer_auth(server.token())
        .json(&body)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}

fn wait_heartbeat_ok(server: &WinServer, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = server.runner(id);
        if r["heartbeat"] == "ok" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "heartbeat over the named pipe never ok: {r:#}\nstderr:\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The span's stored end: ERROR status and the `error.type` the reaper names.
fn span_end(server: &WinServer, trace: &str) -> serde_json::Value {
    let (st, t) = server.get_json(&format!("/api/v1/traces/{trace}"));
    assert_eq!(st, 200, "{t}");
    span_named(&t, "execute_tool run_cell").clone()
}

/// The names of a span's events.
fn event_names(span: &serde_json::Value) -> Vec<&str> {
    span["events"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["name"].as_str()).collect())
        .unwrap_or_default()
}

fn alive_file_grows(path: &Path) -> bool {
    let a = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    std::thread::sleep(Duration::from_millis(1500));
    let b = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    b > a
}

#[test]
#[ignore = "Windows build under Wine: run scripts/test-windows"]
fn healthy_runner_answers_over_the_named_pipe_and_is_never_tripped() {
    let (bin, wine) = setup();
    let dir = tempfile::tempdir().unwrap();
    let server = WinServer::start(&bin, &wine, dir.path(), Some(CONFIG));
    let markers = dir.path().join("healthy");
    spawn_runner(&server, &bin, "win-healthy", "healthy", &markers);
    wait_heartbeat_ok(&server, "win-healthy");
    let trace = "7a".repeat(16);
    open_tool_span(&server, "win-healthy", &trace, &"7b".repeat(8));
    // Three heartbeat timeouts with an open tool span: never tripped while it answers.
    std::thread::sleep(Duration::from_secs(6));
    let r = server.runner("win-healthy");
    assert_eq!(r["breaker"], "CLOSED", "{r:#}");
    assert_eq!(r["lifecycle"], "running", "{r:#}");
    assert_eq!(r["heartbeat"], "ok", "{r:#}");
    assert!(
        !r["heartbeat_rtt_us"].as_array().unwrap().is_empty(),
        "{r:#}"
    );
    // DELETE: the console break first; a runner that honours it exits within the grace.
    let (st, del) = server.send(http_client().delete(server.api("/api/v1/runners/win-healthy")));
    assert_eq!(st, 200, "{del}");
    assert_eq!(del["removed"], true);
    let term = &del["termination"];
    assert_eq!(term["steps"][0]["step"], "ctrl_break", "{del:#}");
    assert!(term["survivors"].as_array().unwrap().is_empty(), "{del:#}");
    eprintln!("healthy runner DELETE under Wine: {term}");
    if term["ended_by"] == "ctrl_break" {
        assert_eq!(term["exit_code"], 0, "{del:#}");
        assert!(
            markers.join("break").exists(),
            "exited without seeing the break"
        );
    } else {
        // Wine implements no CTRL_BREAK_EVENT (docs/platforms.md): the failed break is
        // recorded with the system's error, and after the grace period the job is ended.
        let error = term["steps"][0]["detail"]["error"]
            .as_str()
            .unwrap_or_default();
        assert!(!error.is_empty(), "the failed break has no error: {del:#}");
        assert_eq!(term["steps"][1]["step"], "terminate_job", "{del:#}");
        assert_eq!(term["ended_by"], "terminate_job", "{del:#}");
        assert_eq!(term["exit_code"], 137, "{del:#}");
        assert!(
            term["duration_ms"].as_u64().unwrap() >= 2000,
            "ended before the 2 s grace period: {del:#}"
        );
    }
}

/// A runner registered again under the id of one that had just exited, while that exit was
/// still being recorded: the old exit's record (spans closed, row marked exited, the
/// watchdog told the runner was gone) landed on the new registration, which was then never
/// watched. The registration waits for the old record (as on Linux, `reaper_fixes.rs`).
/// A failpoint holds the old exit's record back 1.5 s, so the new registration always
/// arrives while it is pending.
#[test]
#[ignore = "Windows build under Wine: run scripts/test-windows"]
fn a_registration_right_after_an_exit_is_not_taken_for_the_exited_one() {
    let (bin, wine) = setup();
    let dir = tempfile::tempdir().unwrap();
    let server = WinServer::start_with_env(
        &bin,
        &wine,
        dir.path(),
        Some(CONFIG),
        &[("STALLWATCH_FAILPOINTS", "reaper.exit_record:1:delay1500")],
    );
    let markers = dir.path().join("again");
    register_runner(&server, &bin, "win-again", "exit", &markers, None);
    let spawn = serde_json::json!({
        "argv": [win(&bin.join("windows-runner.exe")), "healthy", win(&markers)],
    });
    let body = serde_json::json!({"id": "win-again", "spawn": spawn});
    let deadline = Instant::now() + Duration::from_secs(30);
    let new = loop {
        let (st, v) = server.send(
            http_client()
                .post(server.api("/api/v1/runners"))
                .json(&body),
        );
        if st == 201 {
            break v;
        }
        assert_eq!(st, 409, "{v}");
        assert!(Instant::now() < deadline, "never registered again: {v}");
        std::thread::sleep(Duration::from_millis(5));
    };
    let pid = new["pid"].as_u64().unwrap();
    wait_heartbeat_ok(&server, "win-again");
    let trace = "3e".repeat(16);
    open_tool_span(&server, "win-again", &trace, &"3f".repeat(8));
    // Well past the old exit's record: the new registration is the one on the board, and
    // the watchdog still watches it.
    std::thread::sleep(Duration::from_secs(3));
    let r = server.runner("win-again");
    assert_eq!(r["pid"].as_u64(), Some(pid), "{r:#}");
    assert_eq!(r["lifecycle"], "running", "{r:#}");
    assert_eq!(r["heartbeat"], "ok", "{r:#}");
    let (_, page) = server.get_json("/api/v1/incidents?runner_id=win-again&limit=200");
    let exits = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["event"] == "runner.exited")
        .count();
    assert_eq!(exits, 1, "{page:#}");
    let span = span_end(&server, &trace);
    assert_eq!(
        span["state"], "open",
        "the new runner's span was ended: {span:#}"
    );
}

#[test]
#[ignore = "Windows build under Wine: run scripts/test-windows"]
fn deadlocked_runner_is_tripped_stopped_and_its_span_ended() {
    let (bin, wine) = setup();
    let dir = tempfile::tempdir().unwrap();
    let server = WinServer::start(&bin, &wine, dir.path(), Some(CONFIG));
    let markers = dir.path().join("deadlock");
    spawn_runner(&server, &bin, "win-deadlock", "deadlock", &markers);
    wait_heartbeat_ok(&server, "win-deadlock");
    let trace = "5c".repeat(16);
    open_tool_span(&server, "win-deadlock", &trace, &"5d".repeat(8));
    // A lost heartbeat while a fresh tool span runs within its SLA is `suspect`, tripped
    // after min(SLA, 30 s) (docs/design.md, "Fusion and breakers").
    let opened = server.incident("win-deadlock", "breaker.opened", Duration::from_secs(60));
    assert_eq!(
        opened["evidence"]["verdict"], "suspect_timeout",
        "{opened:#}"
    );
    assert_eq!(opened["evidence"]["cause"], "lost_heartbeat", "{opened:#}");
    assert_eq!(opened["evidence"]["heartbeat"], "lost", "{opened:#}");
    assert_eq!(opened["span_id"], "5d".repeat(8), "{opened:#}");
    assert!(
        opened["reason"].as_str().unwrap().contains("no PONG"),
        "{opened:#}"
    );
    let done = server.incident("win-deadlock", "runner.terminated", Duration::from_secs(60));
    let report = &done["evidence"]["report"];
    assert!(
        report["ended_by"] == "ctrl_break" || report["ended_by"] == "terminate_job",
        "{done:#}"
    );
    assert!(
        report["survivors"].as_array().unwrap().is_empty(),
        "{done:#}"
    );
    assert!(
        report["exit_code"].is_number(),
        "exit status not recorded: {done:#}"
    );
    let span = span_end(&server, &trace);
    assert_eq!(span["state"], "ended", "{span:#}");
    assert_eq!(span["status"]["code"], 2, "not ERROR: {span:#}");
    assert_eq!(
        attr(&span["attributes"], "error.type")["stringValue"],
        "timeout"
    );
    let r = server.runner("win-deadlock");
    assert_eq!(r["breaker"], "OPEN", "{r:#}");
}

#[test]
#[ignore = "Windows build under Wine: run scripts/test-windows"]
fn runner_ignoring_the_break_is_ended_with_its_escaped_child_by_terminate_job() {
    let (bin, wine) = setup();
    let dir = tempfile::tempdir().unwrap();
    let server = WinServer::start(&bin, &wine, dir.path(), Some(CONFIG));
    let markers = dir.path().join("escape");
    spawn_runner(&server, &bin, "win-escape", "escape", &markers);
    wait_heartbeat_ok(&server, "win-escape");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !markers.join("child.alive").exists() {
        assert!(
            Instant::now() < deadline,
            "the escaping child never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        alive_file_grows(&markers.join("child.alive")),
        "child not running"
    );
    let trace = "3e".repeat(16);
    open_tool_span(&server, "win-escape", &trace, &"3f".repeat(8));
    let done = server.incident("win-escape", "runner.terminated", Duration::from_secs(90));
    let report = &done["evidence"]["report"];
    assert_eq!(report["ended_by"], "terminate_job", "{done:#}");
    assert_eq!(report["exit_code"], 137, "{done:#}");
    assert!(
        report["survivors"].as_array().unwrap().is_empty(),
        "{done:#}"
    );
    assert!(
        !alive_file_grows(&markers.join("child.alive")),
        "the escaped child outlived TerminateJobObject"
    );
    let span = span_end(&server, &trace);
    assert_eq!(span["status"]["code"], 2, "{span:#}");
    let names = event_names(&span);
    assert!(names.contains(&"TerminateJobObject"), "{span:#}");
}

/// Registers a `windows-runner <mode>` runner with a workspace; answers the registration
/// (its `checkpoint` names the staging folder).
fn spawn_with_workspace(
    server: &WinServer,
    bin: &Path,
    id: &str,
    mode: &str,
    markers: &Path,
    workspace: &Path,
) -> serde_json::Value {
    let body = register_runner(server, bin, id, mode, markers, Some(workspace));
    assert!(body["checkpoint"]["id"].is_string(), "{body:#}");
    body
}

/// Every file (its bytes) and folder below `root`, `.workbench` left out.
fn snapshot(root: &Path) -> std::collections::BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if rel.starts_with(".workbench") {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                out.insert(rel, None);
                stack.push(p);
            } else {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// Waits for `path` to hold a whole JSON document; answers it.
fn wait_for_json(path: &Path) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(v) = serde_json::from_slice(&std::fs::read(path).unwrap_or_default()) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn active_checkpoints(server: &WinServer, runner: &str) -> Vec<serde_json::Value> {
    let (st, page) = server.get_json(&format!("/api/v1/checkpoints?runner_id={runner}"));
    assert_eq!(st, 200, "{page}");
    page["items"].as_array().cloned().unwrap_or_default()
}

#[test]
#[ignore = "Windows build under Wine: run scripts/test-windows"]
fn deadlocked_runner_with_a_workspace_is_rolled_back_byte_for_byte() {
    let (bin, wine) = setup();
    let dir = tempfile::tempdir().unwrap();
    let server = WinServer::start(&bin, &wine, dir.path(), Some(CONFIG));
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::write(ws.join("data.csv"), "a,b\n1,2\n").unwrap();
    std::fs::write(ws.join("sub").join("notes.txt"), "keep me\n").unwrap();
    let before = snapshot(&ws);
    let id = "win-ckpt-trip";
    let body = spawn_with_workspace(&server, &bin, id, "deadlock", &dir.path().join("m"), &ws);
    let cid = body["checkpoint"]["id"].as_str().unwrap().to_string();
    let staging = ws.join(".workbench").join("checkpoints").join(&cid);
    assert!(staging.is_dir(), "no staging folder: {body:#}");
    // The tool stages a changed file and a new folder (before the runner can stall), and
    // the runner its own result through STALLWATCH_CHECKPOINT_DIR.
    std::fs::write(staging.join("data.csv"), "a,b\n9,9\n").unwrap();
    std::fs::create_dir_all(staging.join("new")).unwrap();
    std::fs::write(staging.join("new").join("out.json"), "{}").unwrap();
    wait_heartbeat_ok(&server, id);
    let staged = wait_for_json(&staging.join("runner.json"));
    assert_eq!(staged["checkpoint"], cid.as_str(), "{staged}");
    let open = active_checkpoints(&server, id);
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0]["state"], "open", "{open:?}");
    let trace = "6a".repeat(16);
    open_tool_span(&server, id, &trace, &"6b".repeat(8));
    // Trip, stop, then the runner's open checkpoint is rolled back.
    let done = server.incident(id, "runner.terminated", Duration::from_secs(90));
    assert_eq!(
        done["evidence"]["checkpoints_rolled_back"],
        serde_json::json!([cid]),
        "{done:#}"
    );
    assert_eq!(
        done["evidence"]["checkpoint_errors"],
        serde_json::json!([]),
        "{done:#}"
    );
    let rolled = server.incident(id, "checkpoint.rolled_back", Duration::from_secs(10));
    assert_eq!(
        rolled["evidence"]["checkpoint_id"],
        cid.as_str(),
        "{rolled:#}"
    );
    assert!(!staging.exists(), "the staging folder is left");
    assert_eq!(snapshot(&ws), before, "the workspace changed");
    assert!(active_checkpoints(&server, id).is_empty());
    let span = span_end(&server, &trace);
    assert_eq!(span["status"]["code"], 2, "{span:#}");
    let names = event_names(&span);
    assert!(names.contains(&"rollback"), "{span:#}");
}

#[test]
#[ignore = "Windows build under Wine: run scripts/test-windows"]
fn healthy_commit_lands_the_files_and_refuses_hard_links_and_folder_links() {
    let (bin, wine) = setup();
    let dir = tempfile::tempdir().unwrap();
    let server = WinServer::start(&bin, &wine, dir.path(), Some(CONFIG));
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("data.csv"), "a,b\n1,2\n").unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "outside\n").unwrap();
    let id = "win-ckpt-commit";
    let body = spawn_with_workspace(&server, &bin, id, "healthy", &dir.path().join("m"), &ws);
    let cid = body["checkpoint"]["id"].as_str().unwrap().to_string();
    let staging = ws.join(".workbench").join("checkpoints").join(&cid);
    wait_heartbeat_ok(&server, id);
    wait_for_json(&staging.join("runner.json"));
    std::fs::write(staging.join("data.csv"), "a,b\n3,4\n5,6\n").unwrap();
    std::fs::create_dir_all(staging.join("results")).unwrap();
    std::fs::write(
        staging.join("results").join("summary.json"),
        "{\"ok\": true}",
    )
    .unwrap();
    let before = snapshot(&ws);
    let commit = || {
        server.send(http_client().post(server.api(&format!("/api/v1/checkpoints/{cid}/commit"))))
    };
    // A staged hard link (its content shared with a file outside the workspace): refused
    // from nNumberOfLinks, nothing moved, the checkpoint open again.
    std::fs::hard_link(outside.join("secret.txt"), staging.join("linked.txt")).unwrap();
    let (st, refused) = commit();
    assert_eq!(st, 422, "{refused:#}\nstderr:\n{}", server.stderr());
    assert!(refused.to_string().contains("hard link"), "{refused:#}");
    assert_eq!(
        snapshot(&ws),
        before,
        "a refused commit changed the workspace"
    );
    std::fs::remove_file(staging.join("linked.txt")).unwrap();
    // A staged folder symlink (a reparse point to Wine): refused as a path escape.
    std::os::unix::fs::symlink(&outside, staging.join("escape")).unwrap();
    let (st, refused) = commit();
    assert_eq!(st, 400, "{refused:#}");
    assert_eq!(refused["error"]["code"], "path_escape", "{refused:#}");
    assert!(refused.to_string().contains("reparse point"), "{refused:#}");
    assert_eq!(snapshot(&ws), before);
    std::fs::remove_file(staging.join("escape")).unwrap();
    assert_eq!(active_checkpoints(&server, id)[0]["state"], "open");
    // The healthy commit: every file lands (a replaced one, a new folder), staging gone.
    let (st, ok) = commit();
    assert_eq!(st, 200, "{ok:#}\nstderr:\n{}", server.stderr());
    assert_eq!(ok["state"], "committed", "{ok:#}");
    assert_eq!(ok["files"], 3, "{ok:#}");
    assert_eq!(
        std::fs::read_to_string(ws.join("data.csv")).unwrap(),
        "a,b\n3,4\n5,6\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("results").join("summary.json")).unwrap(),
        "{\"ok\": true}"
    );
    assert!(ws.join("runner.json").is_file());
    assert!(!staging.exists(), "staging left after the commit");
    assert!(!ws
        .join(".workbench")
        .join("checkpoints")
        .join(format!("{cid}.undo"))
        .exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "outside\n"
    );
    let inc = server.incident(id, "checkpoint.committed", Duration::from_secs(10));
    assert_eq!(inc["evidence"]["checkpoint_id"], cid.as_str(), "{inc:#}");
    // Committed is final: a second commit is refused.
    let (st, again) = commit();
    assert_eq!(st, 409, "{again:#}");
    // A second checkpoint through the API, rolled back on request: the workspace stays.
    let (st, created) = server.send(
        http_client()
            .post(server.api("/api/v1/checkpoints"))
            .json(&serde_json::json!({"runner_id": id, "workspace": win(&ws)})),
    );
    assert_eq!(st, 201, "{created:#}");
    let second = created["id"].as_str().unwrap().to_string();
    let staging2 = ws.join(".workbench").join("checkpoints").join(&second);
    std::fs::write(staging2.join("data.csv"), "a,b\n7,7\n").unwrap();
    let after_commit = snapshot(&ws);
    let (st, rb) = server
        .send(http_client().post(server.api(&format!("/api/v1/checkpoints/{second}/rollback"))));
    assert_eq!(st, 200, "{rb:#}");
    assert_eq!(rb["state"], "rolled_back", "{rb:#}");
    assert!(!staging2.exists());
    assert_eq!(snapshot(&ws), after_commit);
    let (st, _) = server.send(http_client().delete(server.api(&format!("/api/v1/runners/{id}"))));
    assert_eq!(st, 200);
}

/// The reaper's own Windows process calls (`reaper/src/windows/process.rs`, compiled into
/// `windows-probe.exe`) and the heartbeat pipe, under Wine, without stallwatch.exe.
#[test]
#[ignore = "Windows build under Wine: run scripts/test-windows"]
fn probe_job_objects_named_pipe_and_console_break_under_wine() {
    let files = [
        "windows-probe.exe",
        "windows-runner.exe",
        "bcryptprimitives.dll",
    ];
    let (bin, wine) = setup_with(&files);
    let dir = tempfile::tempdir().unwrap();
    // The checkpoint part: a folder symlink in the workspace pointing outside it.
    let ckpt = dir.path().join("checkpoint");
    std::fs::create_dir_all(ckpt.join("ws")).unwrap();
    std::fs::create_dir_all(ckpt.join("outside")).unwrap();
    std::os::unix::fs::symlink(ckpt.join("outside"), ckpt.join("ws").join("linked")).unwrap();
    let out = wine_command(&wine, &bin.join("windows-probe.exe"))
        .arg(win(dir.path()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "windows-probe failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("probe output is not JSON ({e}): {text}"));
    eprintln!("windows-probe under Wine: {r:#}");
    // Suspended spawn, AssignProcessToJobObject, creation time, resume: all succeed.
    for k in ["healthy_spawn", "escape_spawn"] {
        for step in ["assign", "creation_time", "resume"] {
            let v = r[k][step].as_str().unwrap_or_default();
            assert!(v.starts_with("ok"), "{k}.{step}: {v}");
        }
    }
    // The heartbeat protocol over the named pipe.
    assert_eq!(r["pong"], "PONG", "{r:#}");
    assert_eq!(r["healthy_in_job"], true, "{r:#}");
    // A healthy runner given the console break either exits 0 having seen it, or (where
    // Wine delivers no break) is ended by TerminateJobObject with code 137.
    if r["break_exit_code"].is_null() {
        assert_eq!(r["healthy_terminated_code"], 137, "{r:#}");
    } else {
        assert_eq!(r["break_exit_code"], 0, "{r:#}");
        assert_eq!(r["break_seen"], true, "{r:#}");
    }
    // The escaped child is still in the runner's job, and TerminateJobObject ends both.
    assert_eq!(r["escaped_child_started"], true, "{r:#}");
    assert_eq!(r["escaped_child_in_job"], true, "{r:#}");
    assert!(r["job_members_before"].as_u64().unwrap() >= 2, "{r:#}");
    assert_eq!(r["break_ignored"], true, "{r:#}");
    assert!(
        r["terminate_job"].as_str().unwrap().starts_with("ok"),
        "{r:#}"
    );
    assert_eq!(r["terminated_exit_code"], 137, "{r:#}");
    assert_eq!(r["job_members_after"], 0, "{r:#}");
    assert_eq!(r["escaped_child_still_running"], false, "{r:#}");
    // JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE: closing the job ends its member.
    assert_eq!(r["close_child_started"], true, "{r:#}");
    assert!(r["kill_on_close_exit_code"].is_number(), "{r:#}");
    // The checkpoint commit step (reaper/src/checkpoint/windows.rs): MoveFileExW replaces
    // the workspace's file and lands a new one; a folder symlink on the way and a `..`
    // path are refused with nothing moved.
    assert_eq!(r["ckpt_replace"], "ok true", "{r:#}");
    assert_eq!(r["ckpt_replaced_content"], "new", "{r:#}");
    assert_eq!(r["ckpt_staged_gone"], true, "{r:#}");
    assert_eq!(r["ckpt_new"], "ok false", "{r:#}");
    assert_eq!(r["ckpt_new_content"], "fresh", "{r:#}");
    let through = r["ckpt_through_link"].as_str().unwrap_or_default();
    assert!(through.contains("reparse point"), "{r:#}");
    assert_eq!(r["ckpt_outside_untouched"], true, "{r:#}");
    assert!(!ckpt.join("outside").join("c.txt").exists());
    let dotdot = r["ckpt_dotdot"].as_str().unwrap_or_default();
    assert!(dotdot.contains("plain names"), "{r:#}");
}
