//! The whole chain on real stalled runners: a spawned Python runner (using the project's
//! runner kit) misbehaves inside a tool span; the watchdog trips its breaker, the reaper
//! stops it (SIGTERM, grace, SIGKILL), closes its span as an error, rolls back its
//! checkpoint, and a webhook receiver is told. Timings are scaled down through config.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::support::*;
pub use crate::support::{incidents, post_json, process_alive, spawn_runner, wait_incident};

pub const SLA_MS: u64 = 2000;

/// Watchdog and reaper timings scaled for tests; `extra` is appended.
pub fn chain_config(extra: &str) -> String {
    format!(
        "[watchdog]\nheartbeat_interval_ms = 200\nheartbeat_timeout_ms = 3000\nstartup_grace_ms = 15000\n\
         staleness_ms = 4000\nbreaker_cooldown_ms = 60000\ndefault_sla_ms = {SLA_MS}\ntick_ms = 25\n\
         [reaper]\ngrace_ms = 1000\nmax_restarts = 0\n{extra}"
    )
}

/// One received webhook: lowercase header names → values, and the body.
pub type Delivery = (BTreeMap<String, String>, Vec<u8>);

/// A webhook receiver on loopback: answers 200 and keeps each POST.
pub struct Receiver {
    pub url: String,
    pub got: Arc<Mutex<Vec<Delivery>>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut headers = BTreeMap::new();
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.trim_end().split_once(':') {
                        headers.insert(k.to_ascii_lowercase(), v.trim().to_string());
                    }
                }
                let len: usize = headers
                    .get("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0; len];
                let _ = reader.read_exact(&mut body);
                sink.lock().unwrap().push((headers, body));
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        Receiver { url, got }
    }

    pub fn events(&self) -> Vec<serde_json::Value> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| serde_json::from_slice(b).unwrap())
            .collect()
    }
}

pub fn python_runner(
    server: &Server,
    id: &str,
    mode: &str,
    workspace: Option<&Path>,
    env: &[(&str, &str)],
) -> serde_json::Value {
    let py = python();
    let script = test_data("python/runners/stalled.py");
    spawn_runner(
        server,
        id,
        &[py.to_str().unwrap(), script.to_str().unwrap(), mode],
        workspace,
        env,
    )
}

fn hash_tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, hex::encode(Sha256::digest(std::fs::read(&p).unwrap())));
            }
        }
    }
    out
}

/// The common assertions of a runner stopped for overrunning its tool SLA.
fn assert_tool_overrun_handled(
    server: &Server,
    receiver: &Receiver,
    id: &str,
    pid: u64,
    tool: &str,
) {
    let opened = wait_incident(server, id, "breaker.opened", Duration::from_secs(40));
    let reason = opened["reason"].as_str().unwrap();
    assert!(
        reason.contains("overrun") || reason.contains("SLA"),
        "unexpected verdict: {opened:#}"
    );
    assert_eq!(opened["tool_name"], tool, "{opened:#}");

    // Admission is refused at once while OPEN.
    let r = http_client()
        .get(server.api(&format!("/api/v1/runners/{id}/admit")))
        .send()
        .unwrap();
    assert_eq!(r.status(), 503);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let admit: serde_json::Value = r.json().unwrap();
    assert_eq!(admit["state"], "OPEN");
    assert_eq!(admit["admit"], false);

    let terminated = wait_incident(server, id, "runner.terminated", Duration::from_secs(30));
    wait_until!(
        Duration::from_secs(10),
        "the runner process to be gone",
        !process_alive(pid)
    );
    let ev = terminated["evidence"].to_string();
    assert!(ev.contains("SIGTERM"), "no SIGTERM step in {terminated:#}");

    // The hung tool span was closed by stallwatch: ERROR, error.type=timeout, SIGTERM event.
    let trace_id = opened["trace_id"]
        .as_str()
        .expect("breaker.opened names the span's trace");
    let span_id = opened["span_id"].as_str().unwrap();
    let mut span;
    wait_until!(Duration::from_secs(20), "the synthesized span end", {
        let (st, s) = server.get_json(&format!("/api/v1/traces/{trace_id}/spans/{span_id}"));
        span = s;
        st == 200 && span["state"] == "ended"
    });
    assert_eq!(span["status"]["code"], 2, "{span:#}");
    assert_eq!(
        attr(&span["attributes"], "error.type")["stringValue"],
        "timeout",
        "{span:#}"
    );
    let events: Vec<&str> = span["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        events.iter().any(|e| e.contains("SIGTERM")),
        "no SIGTERM span event: {events:?}"
    );
    // Detected after the SLA passed (monotonic: the span started before its start record arrived).
    let start = nanos(&span["start_time_unix_nano"]);
    let opened_at = nanos(&opened["at_unix_nano"]);
    assert!(
        opened_at >= start + SLA_MS * 1_000_000,
        "tripped before the SLA: start {start} opened {opened_at}"
    );
    assert!(
        nanos(&span["end_time_unix_nano"]) >= opened_at,
        "span end precedes the trip"
    );

    // The webhook receiver was told, with a valid signature.
    wait_until!(
        Duration::from_secs(20),
        "the breaker.opened webhook",
        receiver
            .events()
            .iter()
            .any(|e| e["event"] == "breaker.opened" && e["runner_id"] == id)
    );
    let got = receiver.got.lock().unwrap();
    let (headers, body) = got
        .iter()
        .find(|(_, b)| serde_json::from_slice::<serde_json::Value>(b).unwrap()["runner_id"] == id)
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(b"chain-secret").unwrap();
    mac.update(body);
    assert_eq!(
        headers["x-stallwatch-signature"],
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    );
    assert!(!headers["idempotency-key"].is_empty());
}

fn start_chain(dir: &Path, receiver: &Receiver) -> Server {
    Server::start_with(
        ServerOpts::new(&dir.join("data")).config(&chain_config(&format!(
            "[[alerts.webhook]]\nurl = \"{}\"\nsecret = \"chain-secret\"\n",
            receiver.url
        ))),
    )
}

#[test]
fn deadlocked_tool_is_tripped_terminated_closed_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let server = start_chain(dir.path(), &receiver);
    let reg = python_runner(&server, "py-deadlock", "deadlock", None, &[]);
    let pid = reg["pid"].as_u64().unwrap();
    assert_tool_overrun_handled(&server, &receiver, "py-deadlock", pid, "run_notebook");
}

#[test]
fn read_with_no_timeout_is_tripped_and_terminated() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let server = start_chain(dir.path(), &receiver);
    let reg = python_runner(&server, "py-read", "read_block", None, &[]);
    assert_tool_overrun_handled(
        &server,
        &receiver,
        "py-read",
        reg["pid"].as_u64().unwrap(),
        "run_notebook",
    );
}

#[test]
fn gui_event_loop_is_tripped_and_runners_get_agg() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let server = start_chain(dir.path(), &receiver);
    let reg = python_runner(&server, "py-gui", "gui", None, &[]);
    let pid = reg["pid"].as_u64().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        environ.split(|b| *b == 0).any(|kv| kv == b"MPLBACKEND=Agg"),
        "spawned runner lacks MPLBACKEND=Agg"
    );
    assert_tool_overrun_handled(&server, &receiver, "py-gui", pid, "run_notebook");
}

#[test]
fn half_written_csv_is_rolled_back_and_the_workspace_is_byte_for_byte_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("workspace");
    std::fs::create_dir_all(ws.join("data")).unwrap();
    std::fs::write(
        ws.join("data/results.csv"),
        "step,loss,accuracy\n1,0.5,0.5\n",
    )
    .unwrap();
    std::fs::write(ws.join("notes.md"), "# experiment\n").unwrap();
    let before = hash_tree(&ws);
    let receiver = Receiver::start();
    let server = start_chain(dir.path(), &receiver);
    let reg = python_runner(&server, "py-csv", "half_csv", Some(&ws), &[]);
    let staging = reg["checkpoint"]["path"]
        .as_str()
        .expect("a checkpoint for the workspace")
        .to_string();
    wait_until!(
        Duration::from_secs(30),
        "the half-written CSV",
        Path::new(&staging).join("results.csv").exists()
    );
    assert_tool_overrun_handled(
        &server,
        &receiver,
        "py-csv",
        reg["pid"].as_u64().unwrap(),
        "run_notebook",
    );
    let rolled = wait_incident(
        &server,
        "py-csv",
        "checkpoint.rolled_back",
        Duration::from_secs(20),
    );
    assert!(
        !Path::new(&staging).exists(),
        "staging folder left behind: {rolled:#}"
    );
    let mut after = hash_tree(&ws);
    after.retain(|k, _| !k.starts_with(".workbench"));
    assert_eq!(before, after, "workspace changed");
}

#[test]
fn native_call_holding_the_gil_is_unresponsive_and_tripped() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let server = start_chain(dir.path(), &receiver);
    let reg = python_runner(&server, "py-gil", "gil", None, &[]);
    let opened = wait_incident(&server, "py-gil", "breaker.opened", Duration::from_secs(40));
    assert!(
        opened["reason"].as_str().unwrap().contains("unresponsive")
            || opened["evidence"].to_string().contains("unresponsive"),
        "{opened:#}"
    );
    wait_incident(
        &server,
        "py-gil",
        "runner.terminated",
        Duration::from_secs(30),
    );
    let pid = reg["pid"].as_u64().unwrap();
    wait_until!(
        Duration::from_secs(10),
        "the runner to be gone",
        !process_alive(pid)
    );
}

#[test]
fn healthy_runner_under_cpu_load_is_never_tripped() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let server = start_chain(dir.path(), &receiver);
    // Another process keeps a core busy the whole time.
    let mut burner = std::process::Command::new(python())
        .args([
            "-c",
            "import time\nt=time.time()\nwhile time.time()-t<30: pass",
        ])
        .spawn()
        .unwrap();
    python_runner(&server, "py-ok", "healthy", None, &[]);
    // Several SLAs and heartbeat timeouts pass.
    std::thread::sleep(Duration::from_millis(SLA_MS * 4));
    let _ = burner.kill();
    let _ = burner.wait();
    let all = incidents(&server, "py-ok");
    let events: Vec<_> = all
        .iter()
        .map(|i| i["event"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !events
            .iter()
            .any(|e| e.starts_with("breaker.") || e == "runner.terminated"),
        "healthy runner disturbed: {events:?}\n{:#}",
        serde_json::Value::from(all)
    );
    let (st, admit) = server.get_json("/api/v1/runners/py-ok/admit");
    assert_eq!(
        (st, admit["state"].as_str()),
        (200, Some("CLOSED")),
        "{admit}"
    );
    // Its spans were stored and are ended.
    let (_, page) = server.get_json("/api/v1/traces?tool_name=run_notebook");
    assert!(page["items"].as_array().unwrap().len() >= 3, "{page}");
}

#[test]
fn node_runner_dying_of_an_unhandled_rejection_is_a_crash_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let server = start_chain(dir.path(), &receiver);
    let kit = Path::new(env!("CARGO_MANIFEST_DIR")).join("integrations/node");
    let script = format!(
        "const sw = require({:?}); sw.setup({{ heartbeat: false }}); setTimeout(() => Promise.reject(new Error('tokenizer vanished')), 300); setInterval(() => {{}}, 1000);",
        kit.display().to_string()
    );
    spawn_runner(&server, "node-crash", &["node", "-e", &script], None, &[]);
    let crashed = wait_incident(
        &server,
        "node-crash",
        "runner.crashed",
        Duration::from_secs(30),
    );
    let ev = crashed["evidence"].to_string();
    assert!(
        ev.contains("101"),
        "exit code 101 not recorded: {crashed:#}"
    );
    assert!(
        ev.contains("unhandledRejection") && ev.contains("tokenizer vanished"),
        "crash line missing: {crashed:#}"
    );
    wait_until!(
        Duration::from_secs(20),
        "the runner.crashed webhook",
        receiver
            .events()
            .iter()
            .any(|e| e["event"] == "runner.crashed")
    );
}

#[test]
fn half_open_probe_closes_the_breaker_once_the_restarted_runner_answers() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("once");
    let server = Server::start_with(
        ServerOpts::new(&dir.path().join("data")).config(
            &chain_config("")
                .replace("breaker_cooldown_ms = 60000", "breaker_cooldown_ms = 1500")
                .replace("max_restarts = 0", "max_restarts = 2"),
        ),
    );
    python_runner(
        &server,
        "py-once",
        "once",
        None,
        &[("ONCE_MARKER", marker.to_str().unwrap())],
    );
    wait_incident(
        &server,
        "py-once",
        "breaker.opened",
        Duration::from_secs(40),
    );
    wait_incident(
        &server,
        "py-once",
        "runner.restarted",
        Duration::from_secs(30),
    );
    wait_incident(
        &server,
        "py-once",
        "breaker.half_open",
        Duration::from_secs(30),
    );
    wait_incident(
        &server,
        "py-once",
        "breaker.closed",
        Duration::from_secs(30),
    );
    let (st, admit) = server.get_json("/api/v1/runners/py-once/admit");
    assert_eq!(
        (st, admit["state"].as_str()),
        (200, Some("CLOSED")),
        "{admit}"
    );
}

/// Events of `runner` from `kind`s of interest, oldest first.
fn breaker_events(server: &Server, runner: &str) -> Vec<String> {
    incidents(server, runner)
        .iter()
        .filter_map(|i| i["event"].as_str().map(str::to_string))
        .filter(|e| e.starts_with("breaker.") || e == "runner.restarted")
        .collect()
}

/// Chain config for the restart-after-trip cases: a cooldown well over the SLA plus a
/// restart and a slow Python start-up, so the restarted runner lives more than a whole SLA
/// unpinged behind its OPEN breaker.
fn long_cooldown_config() -> String {
    chain_config("")
        .replace("breaker_cooldown_ms = 60000", "breaker_cooldown_ms = 10000")
        .replace("max_restarts = 0", "max_restarts = 2")
}

/// Healthy case (issue 10 #5): a runner restarted after its trip that works normally is
/// probed (HALF_OPEN), answers, goes CLOSED and stays CLOSED: nothing of the dead process
/// re-opens it.
#[test]
fn restarted_runner_that_answers_its_probe_stays_closed() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("once");
    let server = Server::start_with(
        ServerOpts::new(&dir.path().join("data")).config(&long_cooldown_config()),
    );
    python_runner(
        &server,
        "py-back",
        "once",
        None,
        &[("ONCE_MARKER", marker.to_str().unwrap())],
    );
    for event in ["breaker.opened", "runner.restarted", "breaker.closed"] {
        wait_incident(&server, "py-back", event, Duration::from_secs(40));
    }
    // Longer than an SLA and a heartbeat timeout: a span of the dead process, or the
    // restarted runner's own work, would have re-opened it by now.
    std::thread::sleep(Duration::from_millis(SLA_MS * 2));
    let events = breaker_events(&server, "py-back");
    assert_eq!(
        events,
        [
            "breaker.opened",
            "runner.restarted",
            "breaker.half_open",
            "breaker.closed"
        ],
        "the restarted runner's breaker did not stay CLOSED"
    );
    let (st, admit) = server.get_json("/api/v1/runners/py-back/admit");
    assert_eq!(
        (st, admit["state"].as_str()),
        (200, Some("CLOSED")),
        "{admit}"
    );
}

/// Stalled case next to it (issue 10 #5): a restarted runner that stalls again while its
/// breaker is OPEN answers the probe (its heartbeat thread is alive) with a tool span over
/// its SLA: the breaker opens again straight from HALF_OPEN, never CLOSED in between.
#[test]
fn restarted_runner_that_stalls_again_reopens_without_closing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        ServerOpts::new(&dir.path().join("data")).config(&long_cooldown_config()),
    );
    python_runner(&server, "py-again", "deadlock", None, &[]);
    wait_incident(
        &server,
        "py-again",
        "runner.restarted",
        Duration::from_secs(40),
    );
    wait_until!(
        Duration::from_secs(40),
        "a second breaker.opened",
        breaker_events(&server, "py-again")
            .iter()
            .filter(|e| *e == "breaker.opened")
            .count()
            >= 2
    );
    let events = breaker_events(&server, "py-again");
    let second = events
        .iter()
        .enumerate()
        .filter(|(_, e)| *e == "breaker.opened")
        .nth(1)
        .map(|(i, _)| i)
        .unwrap();
    assert_eq!(
        &events[..=second],
        [
            "breaker.opened",
            "runner.restarted",
            "breaker.half_open",
            "breaker.opened"
        ],
        "the probe closed the breaker of a runner stalled over its SLA"
    );
    let reopened = incidents(&server, "py-again")
        .into_iter()
        .filter(|i| i["event"] == "breaker.opened")
        .nth(1)
        .unwrap();
    let reason = reopened["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("over its SLA") && reason.contains("run_notebook"),
        "{reopened:#}"
    );
}

#[test]
fn half_open_probe_reopens_the_breaker_when_the_runner_stays_dead() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(
        &chain_config("").replace("breaker_cooldown_ms = 60000", "breaker_cooldown_ms = 1500"),
    ));
    python_runner(&server, "py-dead", "deadlock", None, &[]);
    wait_incident(
        &server,
        "py-dead",
        "breaker.opened",
        Duration::from_secs(40),
    );
    wait_incident(
        &server,
        "py-dead",
        "breaker.half_open",
        Duration::from_secs(30),
    );
    // The probe finds no PONG (the runner was terminated and not restarted): OPEN again.
    wait_until!(
        Duration::from_secs(30),
        "a second breaker.opened",
        incidents(&server, "py-dead")
            .iter()
            .filter(|i| i["event"] == "breaker.opened")
            .count()
            >= 2
    );
    let (st, _) = server.get_json("/api/v1/runners/py-dead/admit");
    assert_eq!(st, 503);
    // Probed once: with no process to answer, no probe every cooldown (1.5 s) after that,
    // so no half_open/opened pair (and webhook) every cooldown, forever.
    std::thread::sleep(Duration::from_millis(5000));
    let count = |event: &str| {
        incidents(&server, "py-dead")
            .iter()
            .filter(|i| i["event"] == event)
            .count()
    };
    assert_eq!(
        (count("breaker.half_open"), count("breaker.opened")),
        (1, 2),
        "a dead runner is probed once"
    );
    let (st, _) = server.get_json("/api/v1/runners/py-dead/admit");
    assert_eq!(st, 503, "its breaker stays OPEN");
}
