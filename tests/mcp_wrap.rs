//! `stallwatch mcp wrap` against a plain stdio MCP server that misbehaves on cue
//! (`tests/mcp/fake_server.py`), driven line by line: what the SDK servers of `mcp.rs`
//! cannot be made to do (start slowly, crash between two requests, never answer a replayed
//! `initialize`, answer a ping nobody remembers, leave a child behind, keep exiting).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::*;

/// `mcp.rs`'s fast watchdog settings, and a start-up grace (1 s) well below the slow
/// server's 5 s start, so a wrapper that vouched for nobody before `initialize` had it
/// stopped.
fn config() -> String {
    format!("{}startup_grace_ms = 1000\n", crate::mcp::CONFIG)
}

fn fake_server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/fake_server.py")
}

/// A wrapper with its stdin and a reader of its stdout lines.
struct Wrapped {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
    /// Every line the client saw, in order.
    seen: Vec<Value>,
    /// The fake server's log (its incarnations' pids).
    log: PathBuf,
}

impl Wrapped {
    /// `stallwatch mcp wrap` of `fake_server.py MODE LOG`, with `data_dir` (a sidecar's, or
    /// an empty folder: no sidecar) and extra wrapper flags.
    fn start(data_dir: &Path, runner_id: &str, mode: &str, log: &Path, flags: &[&str]) -> Self {
        let mut child = Command::new(bin())
            .args(["mcp", "wrap", "--runner-id", runner_id, "--data-dir"])
            .arg(data_dir)
            .args(flags)
            .arg("--")
            .arg(python())
            .arg(fake_server())
            .arg(mode)
            .arg(log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON from the wrapper ({e}): {line}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Wrapped {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            log: log.to_path_buf(),
        }
    }

    fn send(&mut self, msg: Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    /// The answer to `id`, within `timeout`.
    fn answer(&mut self, id: Value, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        if let Some(v) = self.seen.iter().find(|v| v["id"] == id) {
            return v.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) => {
                    self.seen.push(v.clone());
                    if v["id"] == id {
                        return v;
                    }
                }
                Err(_) => panic!("no answer to {id} within {timeout:?}; saw {:#?}", self.seen),
            }
        }
    }

    /// The batch (a JSON array) that holds the answer to `id`, within `timeout`.
    fn batch_answer(&mut self, id: Value, timeout: Duration) -> Vec<Value> {
        let holds = |v: &Value| {
            v.as_array()
                .is_some_and(|items| items.iter().any(|i| i["id"] == id))
        };
        let deadline = Instant::now() + timeout;
        if let Some(v) = self.seen.iter().find(|v| holds(v)) {
            return v.as_array().cloned().unwrap_or_default();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) => {
                    self.seen.push(v.clone());
                    if holds(&v) {
                        return v.as_array().cloned().unwrap_or_default();
                    }
                }
                Err(_) => panic!(
                    "no batch answering {id} within {timeout:?}; saw {:#?}",
                    self.seen
                ),
            }
        }
    }

    /// Every line that arrives within `d`.
    fn drain(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        while let Ok(v) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push(v);
        }
    }

    fn initialize(&mut self, timeout: Duration) -> Value {
        self.send(
            json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "stallwatch-test", "version": "1"}}}),
        );
        let a = self.answer(json!("init"), timeout);
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        a
    }

    fn call(&mut self, id: Value, tool: &str) {
        self.send(call_message(id, tool));
    }

    /// Waits for the wrapper's exit (stdin kept open): its exit code.
    fn wait_exit(&mut self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "the wrapper did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Wrapped {
    /// Kills the wrapper, and any incarnation a failed test left running: it holds the
    /// test's stderr, and the test run would wait for it.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in incarnations(&self.log) {
            if process_alive(pid) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}

/// Pids of the fake server's incarnations, from its log, in order of first appearance.
fn incarnations(log: &Path) -> Vec<u64> {
    let mut out = Vec::new();
    for l in std::fs::read_to_string(log).unwrap_or_default().lines() {
        if let Some(pid) = l.split(' ').next().and_then(|p| p.parse().ok()) {
            if !out.contains(&pid) {
                out.push(pid);
            }
        }
    }
    out
}

/// A `tools/call` of `tool` with arguments `a = 1`, `b = 2`.
fn call_message(id: Value, tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": {"a": 1, "b": 2}}})
}

fn is_tripped_error(v: &Value) -> bool {
    v["error"]["code"] == stallwatch_mcp::TRIPPED_ERROR_CODE
}

/// A healthy server is never stopped before it is initialized: one that reads its stdin
/// only 5 s after it starts (a first `npx` fetch, a model loading) and one whose host
/// initializes it lazily, 5 s after the start, both well past the sidecar's 1 s start-up
/// grace. The wrapper answered `ERR mcp_not_ready` until `initialize`, and the sidecar
/// stopped both as unresponsive (the slow one again after each restart).
#[test]
fn a_slowly_starting_or_lazily_initialized_server_is_never_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&config()));
    let log_slow = dir.path().join("slow.log");
    let log_lazy = dir.path().join("lazy.log");
    let mut slow = Wrapped::start(&server.data_dir, "mcp-slow", "slow-start", &log_slow, &[]);
    let mut lazy = Wrapped::start(&server.data_dir, "mcp-lazy", "crash", &log_lazy, &[]);
    let a = slow.initialize(Duration::from_secs(20));
    assert!(a["result"]["serverInfo"].is_object(), "{a}");
    std::thread::sleep(Duration::from_secs(5));
    let a = lazy.initialize(Duration::from_secs(10));
    assert!(a["result"]["serverInfo"].is_object(), "{a}");
    for w in [&mut slow, &mut lazy] {
        w.call(json!(2), "add");
        let a = w.answer(json!(2), Duration::from_secs(10));
        assert_eq!(a["result"]["content"][0]["text"], "3", "{a}");
    }
    for (id, log) in [("mcp-slow", &log_slow), ("mcp-lazy", &log_lazy)] {
        let tripped: Vec<Value> = incidents(&server, id)
            .into_iter()
            .filter(|i| i["event"] == "breaker.opened" || i["event"] == "runner.terminated")
            .collect();
        assert!(tripped.is_empty(), "{id} was stopped: {tripped:#?}");
        assert_eq!(incarnations(log).len(), 1, "{id} was restarted");
    }
}

/// A request the wrapper answered in the server's place (-32001, the server died) is not
/// also sent to the next incarnation: the client, told it failed, may retry it, and the
/// tool would run twice. It arrives 150 ms after the crash, while the wrapper holds lines
/// for the restart.
#[test]
fn a_request_answered_in_the_servers_place_never_reaches_the_next_incarnation() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&config()));
    let log = dir.path().join("crash.log");
    let mut w = Wrapped::start(&server.data_dir, "mcp-crash", "crash", &log, &[]);
    w.initialize(Duration::from_secs(10));
    w.call(json!(1), "crash");
    std::thread::sleep(Duration::from_millis(150));
    w.call(json!(2), "add");
    for id in [1, 2] {
        let a = w.answer(json!(id), Duration::from_secs(10));
        assert!(is_tripped_error(&a), "{id}: {a}");
    }
    // the next incarnation serves (the session goes on) ...
    w.call(json!(3), "add");
    let a = w.answer(json!(3), Duration::from_secs(15));
    assert_eq!(a["result"]["content"][0]["text"], "3", "{a}");
    // ... and never saw request 2; the client got exactly one answer to it
    let pids = incarnations(&log);
    assert_eq!(pids.len(), 2, "{pids:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    let second: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{} ", pids[1])))
        .collect();
    assert!(
        !second
            .iter()
            .any(|l| l.contains("\"id\": 2") || l.contains("\"id\":2")),
        "request 2 reached the restarted server: {second:#?}"
    );
    w.drain(Duration::from_millis(500));
    assert_eq!(w.seen.iter().filter(|v| v["id"] == 2).count(), 1);
}

/// A restarted server that never answers the replayed `initialize` is not registered, so
/// the sidecar does not watch it: the wrapper stops it itself after the initialize timeout,
/// answers what was held for it, and gives up under the restart policy, leaving with the
/// server's exit code and no process behind. The client hung for ever before.
#[test]
fn a_restarted_server_that_never_answers_the_replayed_initialize_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&config()));
    let log = dir.path().join("hang.log");
    let mut w = Wrapped::start(
        &server.data_dir,
        "mcp-hang",
        "replay-hang",
        &log,
        &["--initialize-timeout-ms", "1500"],
    );
    w.initialize(Duration::from_secs(10));
    w.call(json!(1), "crash");
    assert!(is_tripped_error(
        &w.answer(json!(1), Duration::from_secs(10))
    ));
    std::thread::sleep(Duration::from_millis(500));
    w.call(json!(2), "add");
    let a = w.answer(json!(2), Duration::from_secs(10));
    assert!(is_tripped_error(&a), "{a}");
    // every later incarnation hangs too: after the restarts the policy allows, it gives up
    let code = w.wait_exit(Duration::from_secs(30));
    assert_eq!(
        code,
        128 + 15,
        "the last incarnation was stopped by SIGTERM"
    );
    let pids = incarnations(&log);
    assert!(pids.len() >= 3, "{pids:?}");
    for pid in pids {
        assert!(!process_alive(pid), "incarnation {pid} left running");
    }
}

/// The wrapper's pings never reach the client, even an answer to one it no longer
/// remembers (it kept the last 64 only, so after a long block late answers leaked out);
/// and a client id that looks like a wrapper ping gets its own answer.
#[test]
fn the_wrappers_ping_answers_never_reach_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ping.log");
    let mut w = Wrapped::start(dir.path(), "mcp-ping", "old-ping", &log, &[]);
    w.initialize(Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(2500));
    w.call(json!("stallwatch-ping-1"), "add");
    let a = w.answer(json!("stallwatch-ping-1"), Duration::from_secs(10));
    assert_eq!(a["result"]["content"][0]["text"], "3", "{a}");
    w.drain(Duration::from_millis(1500));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("stallwatch-ping-"),
        "no wrapper ping reached the server"
    );
    let leaked: Vec<&Value> = w
        .seen
        .iter()
        .filter(|v| {
            v["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("stallwatch-ping-") && id != "stallwatch-ping-1")
        })
        .collect();
    assert!(
        leaked.is_empty(),
        "wrapper pings reached the client: {leaked:#?}"
    );
}

/// Without a sidecar, a SIGTERM to the wrapper stops the server's whole process group
/// (SIGTERM, then SIGKILL after the grace), so a child the server started goes too; and the
/// wrapper leaves at once, its stdin still open (it lingered until the client wrote).
#[test]
fn on_sigterm_the_wrapper_stops_the_server_group_and_leaves_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("group.log");
    let mut w = Wrapped::start(dir.path(), "mcp-group", "grandchild", &log, &[]);
    w.initialize(Duration::from_secs(10));
    let child_file = PathBuf::from(format!("{}.child", log.display()));
    let grandchild: u64 = std::fs::read_to_string(&child_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(process_alive(grandchild));
    let started = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &w.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    w.wait_exit(Duration::from_secs(8));
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    wait_until!(
        Duration::from_secs(5),
        format!("the server's child {grandchild} to end with the wrapper"),
        !process_alive(grandchild)
    );
}

/// A server that keeps exiting: after the restarts the policy allows, the wrapper leaves by
/// itself with the server's exit code (it left with 1, and only once the client wrote).
#[test]
fn giving_up_leaves_with_the_servers_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("exit7.log");
    let mut w = Wrapped::start(dir.path(), "mcp-exit7", "exit7", &log, &[]);
    assert_eq!(w.wait_exit(Duration::from_secs(20)), 7);
}

/// A server that closes its stdout but keeps running can answer nothing more: without a
/// sidecar (which would see its pings go unanswered) the client waited for ever. The
/// wrapper stops it once `exit_wait` passes without its exit, answers the call in its
/// place, and the restarted server serves the session.
#[test]
fn a_server_that_closes_its_stdout_is_stopped_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("mute.log");
    let mut w = Wrapped::start(dir.path(), "mcp-mute", "close-stdout", &log, &[]);
    w.initialize(Duration::from_secs(10));
    w.call(json!(1), "close");
    let a = w.answer(json!(1), Duration::from_secs(10));
    assert!(is_tripped_error(&a), "{a}");
    w.call(json!(2), "add");
    let a = w.answer(json!(2), Duration::from_secs(10));
    assert_eq!(a["result"]["content"][0]["text"], "3", "{a}");
    let pids = incarnations(&log);
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(!process_alive(pids[0]), "the mute incarnation still runs");
}

/// JSON-RPC batches (MCP 2025-03-26 allows them) are tracked like lone requests: a healthy
/// batch is answered by the server as one batch, and a batch in flight when the server dies
/// is answered in its place, as one batch of -32001 errors, its tool span ended as an error.
/// The client of such a batch waited for ever: only lone requests were tracked.
#[test]
fn a_batch_in_flight_when_the_server_dies_is_answered_in_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&config()));
    let log = dir.path().join("batch.log");
    let mut w = Wrapped::start(&server.data_dir, "mcp-batch", "crash", &log, &[]);
    w.initialize(Duration::from_secs(10));
    // healthy: answered by the server, as one batch, both calls
    w.send(json!([
        call_message(json!("b1"), "add"),
        call_message(json!("b2"), "add")
    ]));
    let answers = w.batch_answer(json!("b1"), Duration::from_secs(10));
    assert_eq!(answers.len(), 2, "{answers:#?}");
    for a in &answers {
        assert_eq!(a["result"]["content"][0]["text"], "3", "{a}");
    }
    // the server dies with a batch in flight: both of its requests answered, in one batch
    w.send(json!([
        call_message(json!("c1"), "add"),
        call_message(json!("c2"), "crash"),
        {"jsonrpc": "2.0", "method": "notifications/progress",
         "params": {"progressToken": "t", "progress": 1}}
    ]));
    let answers = w.batch_answer(json!("c1"), Duration::from_secs(10));
    let ids: Vec<&Value> = answers.iter().map(|a| &a["id"]).collect();
    assert_eq!(ids, [&json!("c1"), &json!("c2")], "{answers:#?}");
    assert!(answers.iter().all(is_tripped_error), "{answers:#?}");
    // the session goes on with the next incarnation
    w.call(json!(3), "add");
    let a = w.answer(json!(3), Duration::from_secs(15));
    assert_eq!(a["result"]["content"][0]["text"], "3", "{a}");
    let span = crate::mcp::tool_span(&server, "crash", |s| s["state"] == "ended");
    assert_eq!(span["status"]["code"], 2, "{span:#}");
    // ended by the wrapper (`crashed`) or, first, by the sidecar, which saw the runner exit
    let ty = crate::mcp::str_attr(&span, "error.type");
    assert!(ty == "crashed" || ty == "runner_exited", "{span:#}");
    w.drain(Duration::from_millis(300));
    for id in ["c1", "c2"] {
        let answered = w
            .seen
            .iter()
            .flat_map(|v| v.as_array().cloned().unwrap_or_else(|| vec![v.clone()]))
            .filter(|v| v["id"] == id)
            .count();
        assert_eq!(answered, 1, "{id} answered {answered} times: {:#?}", w.seen);
    }
}
