//! The Node kit's stacks: its diagnostic report (`process.report`, JSON, written on
//! SIGUSR2) and its `STACKS <json>` answer on the heartbeat socket (`main_stack=heartbeat`),
//! parsed into frames (issue 18; `docs/design.md`, Stall forensics).

use super::*;

/// Parses one V8 stack line: `at fn (file:line:col)`, `at file:line:col`, `at async fn (...)`.
pub fn parse_v8_line(line: &str) -> Option<Frame> {
    let t = line.trim().strip_prefix("at ")?;
    let (function, loc) = match t.rfind(" (") {
        Some(i) if t.ends_with(')') => (t[..i].to_string(), &t[i + 2..t.len() - 1]),
        _ => ("<anonymous>".to_string(), t),
    };
    let function = function.trim_start_matches("async ").to_string();
    let (rest, col) = loc.rsplit_once(':')?;
    let (file, ln) = rest.rsplit_once(':')?;
    Some(Frame {
        function,
        file: file.to_string(),
        line: ln.parse().ok(),
        column: col.parse().ok(),
        tool: false,
    })
}

/// What a Node report says: the JavaScript stack of the main thread and the active libuv
/// handles (what an idle loop is waiting for).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeReport {
    /// The main thread's stack (empty when no JavaScript was running).
    pub threads: Vec<ThreadStack>,
    /// Active libuv handle types with their count (`timer: 1`, `tcp: 2`, ...).
    pub active_handles: Vec<(String, usize)>,
}

/// Parses a Node diagnostic report (`process.report` JSON). Errors: not JSON / not a report.
pub fn parse_node_report(text: &str) -> Result<NodeReport, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the node report is not JSON: {e}"))?;
    if v.get("header").is_none() {
        return Err("the node report has no header".into());
    }
    let mut main = ThreadStack {
        id: "main".into(),
        main: true,
        current: true,
        ..Default::default()
    };
    for l in v["javascriptStack"]["stack"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        if let Some(f) = l.as_str().and_then(parse_v8_line) {
            push_frame(&mut main, f);
        }
    }
    Ok(NodeReport {
        threads: vec![main],
        active_handles: active_handles(&v["libuv"]),
    })
}

/// Active libuv handle types with their count, from a report's `libuv` list.
fn active_handles(libuv: &serde_json::Value) -> Vec<(String, usize)> {
    let mut handles: Vec<(String, usize)> = Vec::new();
    for h in libuv.as_array().map(Vec::as_slice).unwrap_or_default() {
        if h["is_active"] != true {
            continue;
        }
        let ty = h["type"].as_str().unwrap_or("?").to_string();
        match handles.iter_mut().find(|(t, _)| *t == ty) {
            Some((_, n)) => *n += 1,
            None => handles.push((ty, 1)),
        }
    }
    handles
}

/// What the Node kit answers to `STACKS` on its heartbeat socket.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeartbeatStacks {
    /// The main thread's JavaScript stack (no frames: no JavaScript was running, the
    /// event loop was free).
    pub main: ThreadStack,
    /// One entry per open tool span: its await site (else where it started).
    pub tools: Vec<ThreadStack>,
    /// How long the main event loop had not turned, ms (the kit's own tick).
    pub loop_blocked_ms: Option<u64>,
    /// Free event loop: its active libuv handles with their count (as in a report).
    pub active_handles: Vec<(String, usize)>,
}

fn v8_frames(stack: &mut ThreadStack, lines: &serde_json::Value) {
    for l in lines.as_array().map(Vec::as_slice).unwrap_or_default() {
        if let Some(f) = l.as_str().and_then(parse_v8_line) {
            push_frame(stack, f);
        }
    }
}

/// Parses the answer line to `STACKS`: `STACKS {"main": [v8 lines], "tools": [{"span_id",
/// "name", "await": [v8 lines], "await_exact": bool, "start": [v8 lines]}],
/// "loop_blocked_ms": N, "libuv": [{"type", "is_active"}] (free loop only)}`, or
/// `ERR <why>`. Errors name what the kit said or what is malformed.
pub fn parse_heartbeat_stacks(answer: &str) -> Result<HeartbeatStacks, String> {
    let v = heartbeat_json(answer, "node")?;
    let mut main = ThreadStack {
        id: "main".into(),
        main: true,
        ..Default::default()
    };
    v8_frames(&mut main, &v["main"]);
    let mut tools = Vec::new();
    for t in v["tools"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let name = t["name"].as_str().unwrap_or("tool span");
        let span = t["span_id"].as_str().unwrap_or_default();
        let (lines, what) = match t["await"].as_array() {
            Some(a) if !a.is_empty() => (&t["await"], "await site"),
            _ => (&t["start"], "start site"),
        };
        let sampled = what == "await site" && t["await_exact"] == false;
        let mut s = ThreadStack {
            id: format!("await:{span}"),
            label: Some(format!(
                "{what} of tool span {name}{}",
                if sampled {
                    " (sampled: its newest promise was not captured)"
                } else {
                    ""
                }
            )),
            ..Default::default()
        };
        v8_frames(&mut s, lines);
        tools.push(s);
    }
    Ok(HeartbeatStacks {
        main,
        tools,
        loop_blocked_ms: v["loop_blocked_ms"].as_u64(),
        active_handles: active_handles(&v["libuv"]),
    })
}
