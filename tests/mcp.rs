//! `stallwatch mcp wrap` in front of unmodified MCP servers, driven by unmodified MCP
//! clients (the Python SDK's FastMCP server and stdio client; the Node SDK's server and
//! client), against a real sidecar. The SDKs live in `tests/mcp/.venv` and
//! `tests/mcp/node` (installed by `scripts/setup-test-env`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// Fast watchdog settings so trips and recoveries take seconds: default SLA 2500 ms (below
/// the `slow` tool's 4 s, which only its `_meta` SLA of 9000 ms allows).
pub(crate) const CONFIG: &str = r#"
[watchdog]
heartbeat_interval_ms = 500
heartbeat_timeout_ms = 2000
breaker_cooldown_ms = 2000
default_sla_ms = 2500
suspect_cap_ms = 2000
staleness_ms = 1500
"#;

fn mcp_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

/// The Python with the MCP SDK: `STALLWATCH_TEST_MCP_PYTHON`, else `tests/mcp/.venv`.
fn mcp_python() -> PathBuf {
    if let Some(p) = std::env::var_os("STALLWATCH_TEST_MCP_PYTHON") {
        return PathBuf::from(p);
    }
    let p = mcp_dir().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup-test-env (it installs the Python MCP SDK)",
        p.display()
    );
    p
}

fn start() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(CONFIG));
    (dir, server)
}

fn wrapper_argv(server: &Server, runner_id: &str, cmd: &[&str]) -> Vec<String> {
    let mut v = vec![
        bin().to_string(),
        "mcp".into(),
        "wrap".into(),
        "--runner-id".into(),
        runner_id.into(),
        "--data-dir".into(),
        server.data_dir.display().to_string(),
        "--".into(),
    ];
    v.extend(cmd.iter().map(|s| s.to_string()));
    v
}

/// Runs the Python stdio client scenario against the wrapped FastMCP server; answers its
/// steps by name, and the client's stderr (which carries the wrapper's and server's).
fn run_python(server: &Server, scenario: &str, runner_id: &str) -> (Vec<Value>, String) {
    let py = mcp_python();
    let server_py = mcp_dir().join("server.py");
    let wrapper = wrapper_argv(
        server,
        runner_id,
        &[py.to_str().unwrap(), server_py.to_str().unwrap()],
    );
    let out = Command::new(&py)
        .arg(mcp_dir().join("client.py"))
        .args([
            scenario,
            &format!("http://{}", server.dashboard),
            runner_id,
            "--",
        ])
        .args(&wrapper)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "client failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}\nsidecar:\n{}",
        out.status,
        server.stderr()
    );
    let steps = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (steps, stderr)
}

fn step<'a>(steps: &'a [Value], name: &str) -> &'a Value {
    steps
        .iter()
        .find(|s| s["step"] == name)
        .unwrap_or_else(|| panic!("no step {name} in {steps:#?}"))
}

/// Pids of live processes whose process group is `pgid` (from `/proc/*/stat` field 5).
fn group_members(pgid: u32) -> Vec<u32> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // fields after ")": state(3) ppid(4) pgrp(5)
        if f.len() > 2 && f[2] == pgid.to_string() && f[0] != "Z" {
            out.push(pid);
        }
    }
    out
}

/// The stored span of tool `tool` (the newest trace naming it), once `done(span)` holds.
pub(crate) fn tool_span(server: &Server, tool: &str, done: impl Fn(&Value) -> bool) -> Value {
    let mut found = Value::Null;
    wait_until!(
        Duration::from_secs(20),
        format!("the span of tool {tool}"),
        {
            let (_, page) = server.get_json(&format!("/api/v1/traces?tool_name={tool}"));
            page["items"].as_array().into_iter().flatten().any(|t| {
                let id = t["trace_id"].as_str().unwrap_or_default();
                let (_, trace) = server.get_json(&format!("/api/v1/traces/{id}"));
                let hit = trace["spans"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|s| s["name"] == format!("tools/call {tool}") && done(s));
                if let Some(s) = hit {
                    found = s.clone();
                }
                hit.is_some()
            })
        }
    );
    found
}

fn incidents(server: &Server, runner_id: &str) -> Vec<Value> {
    let (_, page) = server.get_json(&format!(
        "/api/v1/incidents?runner_id={runner_id}&limit=200"
    ));
    page["items"].as_array().cloned().unwrap_or_default()
}

pub(crate) fn str_attr<'a>(span: &'a Value, key: &str) -> &'a str {
    attr(&span["attributes"], key)["stringValue"]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string in {span:#}"))
}

#[test]
fn deadlocked_worker_thread_is_stopped_within_sla_and_the_session_goes_on() {
    let (_dir, server) = start();
    let (steps, stderr) = run_python(&server, "deadlock", "mcp-py-deadlock");
    let ctx = || format!("{steps:#?}\n{stderr}");
    let pid = step(&steps, "pid")["text"]
        .as_str()
        .unwrap()
        .parse::<u32>()
        .unwrap();
    let stuck = step(&steps, "stuck");
    assert_eq!(stuck["ok"], false, "{}", ctx());
    assert_eq!(stuck["code"], -32001, "{}", ctx());
    assert_eq!(stuck["data"]["runner_id"], "mcp-py-deadlock", "{}", ctx());
    assert_eq!(stuck["data"]["verdict"], "tool_overrun", "{}", ctx());
    assert!(stuck["data"]["retry_after_ms"].is_u64(), "{}", ctx());
    // SLA 2000 ms from the tool's _meta; the client hears within SLA + 1 s.
    let elapsed = stuck["elapsed_ms"].as_u64().unwrap();
    assert!(
        (2000..3000).contains(&elapsed),
        "answered after {elapsed} ms\n{}",
        ctx()
    );
    // The first server's process group is gone.
    assert!(
        group_members(pid).is_empty(),
        "group {pid} survives: {:?}",
        group_members(pid)
    );
    // The same client session goes on after the restart.
    assert_eq!(step(&steps, "admitted")["ok"], true, "{}", ctx());
    let after = step(&steps, "after");
    assert_eq!(
        (&after["ok"], &after["text"]),
        (&Value::Bool(true), &Value::from("42")),
        "{}",
        ctx()
    );
    assert!(stderr.contains("restarting it"), "{stderr}");
    // The tool span: ERROR, error.type = timeout, with the MCP attributes.
    let span = tool_span(&server, "deadlock", |s| s["state"] == "ended");
    assert_eq!(span["status"]["code"], 2, "{span:#}");
    assert_eq!(str_attr(&span, "error.type"), "timeout", "{span:#}");
    assert_eq!(str_attr(&span, "mcp.method.name"), "tools/call");
    assert_eq!(str_attr(&span, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(str_attr(&span, "network.transport"), "pipe");
    assert_eq!(
        attr(&span["attributes"], "stallwatch.sla_ms")["intValue"],
        "2000"
    );
    assert_eq!(
        span["service_name"], "mcp:stallwatch-test-server",
        "{span:#}"
    );
}

#[test]
fn blocked_event_loop_loses_the_ping_heartbeat_and_trips() {
    let (_dir, server) = start();
    let (steps, stderr) = run_python(&server, "block_loop", "mcp-py-block");
    let ctx = || format!("{steps:#?}\n{stderr}");
    let stuck = step(&steps, "stuck");
    assert_eq!(stuck["code"], -32001, "{}", ctx());
    // Its _meta SLA is 60 s: only the lost heartbeat can have tripped it this soon.
    assert!(stuck["elapsed_ms"].as_u64().unwrap() < 20_000, "{}", ctx());
    let opened = incidents(&server, "mcp-py-block")
        .into_iter()
        .find(|i| i["event"] == "breaker.opened")
        .unwrap_or_else(|| panic!("no breaker.opened\n{}", ctx()));
    assert_eq!(opened["evidence"]["heartbeat"], "lost", "{opened:#}");
    assert_eq!(step(&steps, "after")["ok"], true, "{}", ctx());
}

#[test]
fn slow_tool_within_its_meta_sla_is_never_tripped() {
    let (_dir, server) = start();
    let (steps, stderr) = run_python(&server, "slow", "mcp-py-slow");
    let ctx = || format!("{steps:#?}\n{stderr}");
    let slow = step(&steps, "slow");
    assert_eq!(slow["ok"], true, "{}", ctx());
    assert!(slow["elapsed_ms"].as_u64().unwrap() >= 4000, "{}", ctx());
    assert_eq!(step(&steps, "after")["ok"], true, "{}", ctx());
    let bad: Vec<_> = incidents(&server, "mcp-py-slow")
        .into_iter()
        .filter(|i| {
            let e = i["event"].as_str().unwrap_or_default();
            e.starts_with("breaker.") || e == "runner.terminated" || e == "verdict.suspect"
        })
        .collect();
    assert!(bad.is_empty(), "healthy server disturbed: {bad:#?}");
    // The span joined the caller's trace and carries the _meta SLA.
    let span = tool_span(&server, "slow", |s| s["state"] == "ended");
    assert_eq!(
        span["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{span:#}"
    );
    assert_eq!(span["parent_span_id"], "00f067aa0ba902b7", "{span:#}");
    assert_ne!(span["status"]["code"], 2, "{span:#}");
    assert_eq!(
        attr(&span["attributes"], "stallwatch.sla_ms")["intValue"],
        "9000"
    );
    assert_eq!(str_attr(&span, "gen_ai.tool.name"), "slow");
    assert!(!str_attr(&span, "mcp.session.id").is_empty());
    assert!(!str_attr(&span, "mcp.protocol.version").is_empty());
    assert!(!str_attr(&span, "jsonrpc.request.id").is_empty());
}

#[test]
fn progress_keeps_a_long_tool_fresh_and_cancel_and_tool_errors_are_recorded() {
    let (_dir, server) = start();
    let (steps, stderr) = run_python(&server, "progress", "mcp-py-progress");
    let ctx = || format!("{steps:#?}\n{stderr}");
    let p = step(&steps, "progress");
    assert_eq!(p["ok"], true, "{}", ctx());
    assert!(p["notes"].as_u64().unwrap() >= 10, "{}", ctx());
    let bad: Vec<_> = incidents(&server, "mcp-py-progress")
        .into_iter()
        .filter(|i| {
            let e = i["event"].as_str().unwrap_or_default();
            e.starts_with("breaker.") || e == "runner.terminated" || e == "verdict.suspect"
        })
        .collect();
    assert!(
        bad.is_empty(),
        "a tool reporting progress was disturbed: {bad:#?}\n{}",
        ctx()
    );
    assert_eq!(step(&steps, "cancelled")["answered"], true, "{}", ctx());
    let cancelled = tool_span(&server, "wait", |s| s["state"] == "ended");
    assert_eq!(
        str_attr(&cancelled, "error.type"),
        "cancelled",
        "{cancelled:#}"
    );
    assert_eq!(step(&steps, "fail")["is_error"], true, "{}", ctx());
    let failed = tool_span(&server, "fail", |s| s["state"] == "ended");
    assert_eq!(str_attr(&failed, "error.type"), "tool_error", "{failed:#}");
    assert_eq!(failed["status"]["code"], 2);
    assert_eq!(step(&steps, "after")["text"], "10", "{}", ctx());
}

#[test]
fn a_call_while_the_breaker_is_open_is_refused_at_once() {
    let (_dir, server) = start();
    let (steps, stderr) = run_python(&server, "admission", "mcp-py-admit");
    let ctx = || format!("{steps:#?}\n{stderr}");
    assert_eq!(step(&steps, "stuck")["code"], -32001, "{}", ctx());
    let refused = step(&steps, "refused");
    assert_eq!(refused["code"], -32001, "{}", ctx());
    assert!(refused["elapsed_ms"].as_u64().unwrap() < 500, "{}", ctx());
    assert!(
        refused["data"]["retry_after_ms"].as_u64().unwrap() > 0,
        "{}",
        ctx()
    );
    assert!(
        refused["message"].as_str().unwrap().contains("refused"),
        "{}",
        ctx()
    );
    // Answered by the wrapper, never by the server: its span says so.
    let span =
        tool_span(&server, "add", |s| {
            s["state"] == "ended"
                && s["attributes"].as_array().into_iter().flatten().any(|kv| {
                    kv["key"] == "error.type" && kv["value"]["stringValue"] == "breaker_open"
                })
        });
    assert_eq!(span["status"]["code"], 2, "{span:#}");
    assert_eq!(step(&steps, "after")["ok"], true, "{}", ctx());
}

#[test]
fn without_a_sidecar_the_wrapper_still_relays_and_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let py = mcp_python();
    let out = Command::new(&py)
        .arg(mcp_dir().join("client.py"))
        .args(["slow", "http://127.0.0.1:9", "mcp-none", "--"])
        .args([bin(), "mcp", "wrap", "--data-dir"])
        .arg(dir.path())
        .arg("--")
        .arg(&py)
        .arg(mcp_dir().join("server.py"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(r#""text": "3""#), "{stdout}");
    assert_eq!(
        stderr.matches("no stallwatch sidecar running").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn the_mcp_endpoint_answers_the_real_python_client() {
    let (_dir, server) = start();
    // Something to find: a wrapped server's tool span.
    let (steps, stderr) = run_python(&server, "slow", "mcp-py-endpoint");
    assert_eq!(step(&steps, "slow")["ok"], true, "{steps:#?}\n{stderr}");
    tool_span(&server, "slow", |s| s["state"] == "ended");
    let out = Command::new(mcp_python())
        .arg(mcp_dir().join("http_client.py"))
        .arg(format!("http://{}/mcp", server.dashboard))
        .arg("slow")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(step(&steps, "initialize")["server"], "stallwatch");
    assert_eq!(
        step(&steps, "tools")["names"],
        serde_json::json!([
            "search_traces",
            "get_trace",
            "list_open_spans",
            "list_runners",
            "list_incidents",
            "search_logs"
        ])
    );
    let found = step(&steps, "search_traces");
    assert_eq!(found["is_error"], false, "{found:#}");
    let items = found["structured"]["items"].as_array().unwrap();
    assert!(!items.is_empty(), "{found:#}");
    assert_eq!(
        items[0]["root_service"], "mcp:stallwatch-test-server",
        "{found:#}"
    );
    let bad = step(&steps, "bad_argument");
    assert_eq!(bad["is_error"], true);
    assert!(
        bad["text"].as_str().unwrap().contains("nonsense"),
        "{bad:#}"
    );
    let runners = step(&steps, "list_runners");
    assert!(
        runners["structured"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"] == "mcp-py-endpoint"),
        "{runners:#}"
    );
    // The Host check applies to /mcp as to every dashboard route.
    let resp = http_client()
        .post(format!("http://{}/mcp", server.dashboard))
        .header("host", "evil.example")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 421);
    // A body that is not one JSON-RPC message: 400 with a JSON-RPC error (rmcp answered 415
    // naming its Rust types); one over 1 MiB: 413.
    let post = |body: String| {
        http_client()
            .post(format!("http://{}/mcp", server.dashboard))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body)
            .send()
            .unwrap()
    };
    for (body, code) in [
        ("{not json".to_string(), -32700),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#.into(),
            -32600,
        ),
        (r#"{"id":1,"method":"tools/list"}"#.into(), -32600),
    ] {
        let r = post(body.clone());
        assert_eq!(r.status().as_u16(), 400, "{body}");
        let v: serde_json::Value = r.json().unwrap();
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
        assert!(!v.to_string().contains("JsonRpcMessage"), "{v}");
    }
    let r = post(format!("\"{}\"", "x".repeat(2 << 20)));
    assert_eq!(r.status().as_u16(), 413);
    // An id that is not a string or an integer is an invalid request, not a notification
    // (which would have gone unanswered): 400, -32600.
    for id in ["null", "true", "{\"a\":1}"] {
        let r = post(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#
        ));
        assert_eq!(r.status().as_u16(), 400, "{id}");
        let v: serde_json::Value = r.json().unwrap();
        assert_eq!(v["error"]["code"], -32600, "{id}: {v}");
        assert_eq!(v["id"], serde_json::Value::Null, "{id}: {v}");
    }
    // Params that do not fit the method: the request's own answer, -32602 with its id
    // (rmcp answered 415 in plain text).
    let r = post(r#"{"jsonrpc":"2.0","id":"p1","method":"tools/call","params":{"name":5}}"#.into());
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!(v["id"], "p1", "{v}");
    assert_eq!(v["error"]["code"], -32602, "{v}");
    // An unknown method reaches rmcp, which answers -32601 to its id.
    let r = post(r#"{"jsonrpc":"2.0","id":9,"method":"no/such"}"#.into());
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!(
        (v["id"].as_i64(), v["error"]["code"].as_i64()),
        (Some(9), Some(-32601)),
        "{v}"
    );
    // Origin (MCP Streamable HTTP: servers MUST validate it; 403 when present and invalid):
    // a page on another site is refused, the workbench's own loopback page served.
    let with_origin = |origin: &str| {
        http_client()
            .post(format!("http://{}/mcp", server.dashboard))
            .header("origin", origin)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
            .send()
            .unwrap()
    };
    for origin in [
        "https://evil.example",
        "null",
        "http://127.0.0.1.evil.example:4319",
    ] {
        let r = with_origin(origin);
        assert_eq!(r.status().as_u16(), 403, "{origin}");
        let v: serde_json::Value = r.json().unwrap();
        assert!(
            v["error"]["message"].as_str().unwrap().contains("Origin"),
            "{v}"
        );
    }
    for origin in ["http://localhost:6274", "tauri://localhost"] {
        let r = with_origin(origin);
        assert_eq!(r.status().as_u16(), 200, "{origin}");
        let v: serde_json::Value = r.json().unwrap();
        assert!(v["result"]["tools"].is_array(), "{origin}: {v}");
    }
}

#[test]
fn node_server_and_client_blocked_event_loop_trips_and_the_session_goes_on() {
    let node_dir = mcp_dir().join("node");
    assert!(
        node_dir
            .join("node_modules/@modelcontextprotocol/sdk")
            .exists(),
        "{} lacks the Node MCP SDK: run scripts/setup-test-env",
        node_dir.display()
    );
    let (_dir, server) = start();
    let wrapper = wrapper_argv(
        &server,
        "mcp-node",
        &["node", node_dir.join("server.mjs").to_str().unwrap()],
    );
    let out = Command::new("node")
        .arg(node_dir.join("client.mjs"))
        .args([&format!("http://{}", server.dashboard), "mcp-node", "--"])
        .args(&wrapper)
        .stdin(Stdio::null())
        .output()
        .expect("node must be installed for the mcp tests");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let steps: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let ctx = || format!("{steps:#?}\n{stderr}");
    assert_eq!(
        step(&steps, "initialize")["server"],
        "stallwatch-node-test-server"
    );
    assert_eq!(step(&steps, "first")["text"], "3", "{}", ctx());
    let stuck = step(&steps, "stuck");
    assert_eq!(stuck["code"], -32001, "{}", ctx());
    assert_eq!(stuck["data"]["runner_id"], "mcp-node", "{}", ctx());
    assert!(stuck["elapsed_ms"].as_u64().unwrap() < 20_000, "{}", ctx());
    assert_eq!(step(&steps, "after")["text"], "42", "{}", ctx());
    let span = tool_span(&server, "spin", |s| s["state"] == "ended");
    assert_eq!(
        span["service_name"], "mcp:stallwatch-node-test-server",
        "{span:#}"
    );
    assert_eq!(span["status"]["code"], 2, "{span:#}");
}
