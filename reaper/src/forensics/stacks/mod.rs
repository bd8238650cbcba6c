//! Runtime stacks from a runner's kit (the stall forensics hook of issue 18, `docs/design.md`
//! section "Stall forensics"): the header line a kit writes to `STALLWATCH_STACKS_FILE`, the
//! Python `faulthandler` dump it appends on SIGUSR2, and the Node diagnostic report
//! (`process.report`, JSON) it writes on SIGUSR2, parsed into frames; and which frame is the
//! tool's own code.
//!
//! Header (one line, written once at setup):
//! `stallwatch-stacks v1 pid=<pid> signal=SIGUSR2 runtime=python|node[ report=<abs path>][ main_stack=heartbeat]`.
//! stallwatch sends SIGUSR2 only when the header names the runner's pid: SIGUSR2 ends a
//! process that has no handler for it.
//!
//! `threads=heartbeat` (the Python kit): the kit answers `STACKS\n` on its heartbeat socket
//! with `STACKS <json>\n` ([`parse_python_heartbeat_stacks`]): every thread's stack, read
//! by its heartbeat thread with `sys._current_frames()` under the interpreter's lock.
//! stallwatch asks that first and sends SIGUSR2 only when no answer comes (a C call holds
//! the GIL the heartbeat thread needs); the kit's `faulthandler` then dumps the main thread
//! only (`all_threads=False`): walking the other threads from a signal handler read thread
//! states being freed and crashed runners with SIGSEGV.
//!
//! `main_stack=heartbeat` (the Node kit): the kit also answers `STACKS\n` on its heartbeat
//! socket with `STACKS <json>\n` ([`parse_heartbeat_stacks`]): the main thread's JavaScript
//! stack, taken by the kit's agent thread through an in-process inspector session (V8 runs
//! it as an interrupt, so a synchronous busy loop is named while Node's signal-driven
//! report waits for the event loop), and each open tool span's await site (where its code
//! last created a promise: what a promise that never settles is waiting at).

use std::path::{Path, PathBuf};

use serde::Serialize;

mod node;
mod python;

pub use self::node::*;
pub use self::python::*;

/// The header's first word.
pub const HEADER_MAGIC: &str = "stallwatch-stacks";
/// Longest header line read, bytes.
pub const MAX_HEADER_BYTES: usize = 4096;
/// Most bytes of a dump or report read.
pub const MAX_DUMP_BYTES: u64 = 4 << 20;
/// Most bytes of a `STACKS` answer read from a kit's heartbeat socket.
pub const MAX_HEARTBEAT_ANSWER_BYTES: usize = 256 * 1024;
/// Most frames kept per thread (innermost first).
pub const MAX_FRAMES: usize = 48;

/// The runtime a kit reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// CPython with `faulthandler`.
    Python,
    /// Node.js with `process.report`.
    Node,
}

/// A parsed, checked header line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The pid the kit wrote (must be the runner's).
    pub pid: u32,
    /// Its runtime.
    pub runtime: Runtime,
    /// Node: the report file's absolute path.
    pub report: Option<PathBuf>,
    /// `main_stack=heartbeat`: the Node kit answers `STACKS` on its heartbeat socket.
    pub main_stack: bool,
    /// `threads=heartbeat`: the Python kit answers `STACKS` (every thread's stack) on its
    /// heartbeat socket.
    pub threads: bool,
}

/// Parses a header line. Errors name what is wrong (shown as the reason stacks are missing).
pub fn parse_header(line: &str) -> Result<Header, String> {
    let mut words = line.split_whitespace();
    if words.next() != Some(HEADER_MAGIC) {
        return Err("the stacks file has no stallwatch-stacks header".into());
    }
    if words.next() != Some("v1") {
        return Err("the stacks header is not version v1".into());
    }
    let (mut pid, mut signal, mut runtime, mut report) = (None, None, None, None);
    let (mut main_stack, mut threads) = (false, false);
    for w in words {
        match w.split_once('=') {
            Some(("pid", v)) => pid = v.parse::<u32>().ok(),
            Some(("signal", v)) => signal = Some(v.to_string()),
            Some(("runtime", "python")) => runtime = Some(Runtime::Python),
            Some(("runtime", "node")) => runtime = Some(Runtime::Node),
            Some(("runtime", v)) => {
                return Err(format!("unknown runtime {v:?} in the stacks header"))
            }
            Some(("report", v)) => report = Some(PathBuf::from(v)),
            Some(("main_stack", v)) => main_stack = v == "heartbeat",
            Some(("threads", v)) => threads = v == "heartbeat",
            _ => {}
        }
    }
    let pid = pid.ok_or("the stacks header has no valid pid=")?;
    if signal.as_deref() != Some("SIGUSR2") {
        return Err("the stacks header does not name signal=SIGUSR2".into());
    }
    let runtime = runtime.ok_or("the stacks header has no runtime=")?;
    if runtime == Runtime::Node && !report.as_ref().is_some_and(|p| p.is_absolute()) {
        return Err("a node stacks header needs report=<absolute path>".into());
    }
    Ok(Header {
        pid,
        runtime,
        report,
        main_stack,
        threads,
    })
}

/// The JSON of a kit's `STACKS <json>` answer line; `ERR <why>` and anything else is an
/// error naming the `kit` (`python`, `node`) and what it said.
pub(crate) fn heartbeat_json(answer: &str, kit: &str) -> Result<serde_json::Value, String> {
    let line = answer.lines().next().unwrap_or_default().trim();
    if let Some(why) = line.strip_prefix("ERR ") {
        return Err(format!("the {kit} kit could not take the stacks: {why}"));
    }
    let json = line.strip_prefix("STACKS ").ok_or_else(|| {
        if line.is_empty() {
            format!("the {kit} kit closed the heartbeat connection without answering STACKS")
        } else {
            format!("the {kit} kit's answer to STACKS is not a STACKS line")
        }
    })?;
    serde_json::from_str(json)
        .map_err(|e| format!("the {kit} kit's STACKS answer is not JSON: {e}"))
}

/// Reads and checks the header of `file` against `pid`. Errors say why no signal is sent.
pub fn read_header(file: &Path, pid: u32) -> Result<Header, String> {
    use std::io::Read;
    let f = std::fs::File::open(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            "the runner's kit wrote no stacks file (no kit, or an old one)".to_string()
        }
        _ => format!("the stacks file cannot be read: {e}"),
    })?;
    let mut buf = Vec::new();
    f.take(MAX_HEADER_BYTES as u64)
        .read_to_end(&mut buf)
        .map_err(|e| format!("the stacks file cannot be read: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    let line = text.lines().next().unwrap_or_default();
    let h = parse_header(line)?;
    if h.pid != pid {
        return Err(format!(
            "the stacks header names pid {}, not the runner's pid {pid}",
            h.pid
        ));
    }
    Ok(h)
}

/// One frame, innermost first in [`ThreadStack::frames`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Frame {
    /// Function name (`<module>` for Python top level, `<anonymous>` for Node).
    pub function: String,
    /// Source file (or URL for Node).
    pub file: String,
    /// 1-based line.
    pub line: Option<u32>,
    /// 1-based column (Node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
    /// True for the frame inside the tool span's code (see [`mark_tool_frames`]).
    pub tool: bool,
}

/// The stack of one thread, or (Node) of one open tool span's await site.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ThreadStack {
    /// The runtime's id for it (Python: `0x...` thread ident; Node: `main`, or
    /// `await:<span id>` for a tool span's await site).
    pub id: String,
    /// The thread's name where the runtime has one (Python `threading`: `MainThread`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the stack is when it is not a thread's (shown as its heading), e.g.
    /// `await site of tool span execute_tool run_notebook`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// True for the main thread.
    pub main: bool,
    /// True for the thread that ran the dump (Python: "Current thread").
    pub current: bool,
    /// Frames, innermost first, at most [`MAX_FRAMES`].
    pub frames: Vec<Frame>,
    /// Frames left out past [`MAX_FRAMES`].
    pub frames_omitted: usize,
}

pub(crate) fn push_frame(stack: &mut ThreadStack, f: Frame) {
    if stack.frames.len() < MAX_FRAMES {
        stack.frames.push(f);
    } else {
        stack.frames_omitted += 1;
    }
}

/// True for frames of the runtime or of installed libraries (never the tool's own code).
pub fn is_library_frame(f: &Frame) -> bool {
    let p = f.file.as_str();
    p.starts_with("node:")
        || p.contains("/node_modules/")
        || p.contains("/site-packages/")
        || p.contains("/dist-packages/")
        || p.contains("/lib/python3")
        || p.contains("/stallwatch_runner/")
        || p.starts_with('<')
}

/// Marks, in each thread, the innermost frame inside the tool's code: a frame whose
/// function is the tool's name; else one in one of `tool_files` (the runner's own
/// scripts); else the innermost frame that is not a library frame. Answers the main
/// thread's marked frame (else the first marked one).
pub fn mark_tool_frames(
    stacks: &mut [ThreadStack],
    tool_name: Option<&str>,
    tool_files: &[String],
) -> Option<Frame> {
    for s in stacks.iter_mut() {
        let by_name = tool_name.and_then(|n| {
            s.frames
                .iter()
                .position(|f| f.function == n || f.function.ends_with(&format!(".{n}")))
        });
        let by_file = || {
            s.frames
                .iter()
                .position(|f| tool_files.iter().any(|t| same_file(&f.file, t)))
        };
        let own = || s.frames.iter().position(|f| !is_library_frame(f));
        if let Some(i) = by_name.or_else(by_file).or_else(own) {
            s.frames[i].tool = true;
        }
    }
    let pick = |main: bool| {
        stacks
            .iter()
            .filter(|s| !main || s.main)
            .find_map(|s| s.frames.iter().find(|f| f.tool).cloned())
    };
    pick(true).or_else(|| pick(false))
}

fn same_file(frame_file: &str, tool_file: &str) -> bool {
    let f = frame_file.trim_start_matches("file://");
    f == tool_file || (!tool_file.is_empty() && f.ends_with(&format!("/{tool_file}")))
}

/// `function (file:line)` for the reason line.
pub fn describe_frame(f: &Frame) -> String {
    match f.line {
        Some(l) => format!("{} ({}:{l})", f.function, f.file),
        None => format!("{} ({})", f.function, f.file),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = r#"Thread 0x00007f3b2ffff640 (most recent call first):
  File "/w/tests/data/forensics/runner.py", line 36 in one
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f3b3e1f6740 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 1116 in _wait_for_tstate_lock
  File "/usr/lib/python3.11/threading.py", line 1096 in join
  File "/w/tests/data/forensics/runner.py", line 43 in deadlock
  File "/w/tests/data/forensics/runner.py", line 95 in <module>
"#;

    #[test]
    fn faulthandler_dump_to_frames_with_the_tool_frame() {
        let mut s = parse_faulthandler(DUMP);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].id, "0x00007f3b2ffff640");
        assert!(!s[0].main && s[1].main && s[1].current);
        assert_eq!(s[1].frames[2].function, "deadlock");
        assert_eq!(s[1].frames[2].line, Some(43));
        let files = vec!["/w/tests/data/forensics/runner.py".to_string()];
        let top = mark_tool_frames(&mut s, Some("run_notebook"), &files).unwrap();
        assert_eq!((top.function.as_str(), top.line), ("deadlock", Some(43)));
        assert!(s[0].frames[0].tool);
        // By tool name first.
        let mut s = parse_faulthandler(DUMP);
        let top = mark_tool_frames(&mut s, Some("join"), &files).unwrap();
        assert_eq!(top.function, "join");
    }

    #[test]
    fn headers() {
        let h = parse_header("stallwatch-stacks v1 pid=42 signal=SIGUSR2 runtime=python").unwrap();
        assert_eq!((h.pid, h.runtime), (42, Runtime::Python));
        let n = parse_header(
            "stallwatch-stacks v1 pid=7 signal=SIGUSR2 runtime=node report=/d/run/r.json",
        )
        .unwrap();
        assert_eq!(n.report.unwrap(), PathBuf::from("/d/run/r.json"));
        assert!(!n.main_stack);
        let m = parse_header(
            "stallwatch-stacks v1 pid=7 signal=SIGUSR2 runtime=node report=/r.json main_stack=heartbeat",
        )
        .unwrap();
        assert!(m.main_stack);
        for (bad, why) in [
            ("hello", "no stallwatch-stacks header"),
            (
                "stallwatch-stacks v2 pid=1 signal=SIGUSR2 runtime=python",
                "v1",
            ),
            (
                "stallwatch-stacks v1 pid=x signal=SIGUSR2 runtime=python",
                "pid",
            ),
            (
                "stallwatch-stacks v1 pid=1 signal=SIGUSR1 runtime=python",
                "SIGUSR2",
            ),
            (
                "stallwatch-stacks v1 pid=1 signal=SIGUSR2 runtime=ruby",
                "ruby",
            ),
            (
                "stallwatch-stacks v1 pid=1 signal=SIGUSR2 runtime=node report=rel.json",
                "absolute",
            ),
        ] {
            let e = parse_header(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s");
        std::fs::write(
            &f,
            "stallwatch-stacks v1 pid=9 signal=SIGUSR2 runtime=python\n",
        )
        .unwrap();
        assert!(read_header(&f, 9).is_ok());
        assert!(read_header(&f, 10)
            .unwrap_err()
            .contains("not the runner's pid 10"));
        assert!(read_header(&dir.path().join("none"), 9)
            .unwrap_err()
            .contains("no stacks file"));
    }

    #[test]
    fn heartbeat_stacks_busy_and_awaiting() {
        let answer = serde_json::json!({
            "main": ["at spin (/w/runner.js:44:3)", "at busy (/w/runner.js:50:3)"],
            "tools": [
                {"span_id": "ab", "name": "execute_tool t", "await": ["at waitForever (/w/runner.js:39:9)"], "start": ["at Object.<anonymous> (/w/runner.js:54:4)"]},
                {"span_id": "cd", "name": "execute_tool u", "await": [], "start": ["at go (/w/runner.js:60:1)"]},
                {"span_id": "ef", "name": "execute_tool v", "await": ["at f (/w/a.js:1:1)"], "await_exact": false}
            ],
            "loop_blocked_ms": 7000,
            "libuv": [{"type": "timer", "is_active": true}, {"type": "tcp", "is_active": false}]
        });
        let hb = parse_heartbeat_stacks(&format!("STACKS {answer}\n")).unwrap();
        assert!(hb.main.main);
        assert_eq!(
            (hb.main.frames[0].function.as_str(), hb.main.frames[0].line),
            ("spin", Some(44))
        );
        assert_eq!(hb.loop_blocked_ms, Some(7000));
        assert_eq!(hb.active_handles, vec![("timer".into(), 1)]);
        assert_eq!(hb.tools.len(), 3);
        assert!(hb.tools[2]
            .label
            .as_deref()
            .unwrap()
            .ends_with("(sampled: its newest promise was not captured)"));
        assert_eq!(
            hb.tools[0].label.as_deref(),
            Some("await site of tool span execute_tool t")
        );
        assert_eq!(hb.tools[0].frames[0].function, "waitForever");
        // No await site yet: the start site stands in, and says so.
        assert_eq!(
            hb.tools[1].label.as_deref(),
            Some("start site of tool span execute_tool u")
        );
        assert_eq!(hb.tools[1].frames[0].line, Some(60));
        let mut idle = parse_heartbeat_stacks(&format!(
            "STACKS {}\n",
            serde_json::json!({"main": [], "tools": answer["tools"]})
        ))
        .unwrap();
        let mut all = vec![idle.main.clone()];
        all.append(&mut idle.tools);
        let top = mark_tool_frames(&mut all, Some("t"), &["/w/runner.js".into()]).unwrap();
        assert_eq!((top.function.as_str(), top.line), ("waitForever", Some(39)));
        for (bad, why) in [
            ("ERR main_thread_unreachable\n", "main_thread_unreachable"),
            ("", "without answering"),
            ("PONG\n", "not a STACKS line"),
            ("STACKS {\n", "not JSON"),
        ] {
            let e = parse_heartbeat_stacks(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn node_report_stack_and_handles() {
        let report = serde_json::json!({
            "header": {"trigger": "SIGUSR2"},
            "javascriptStack": {"message": "", "stack": [
                "at spin (/w/tests/data/forensics/runner.js:12:9)",
                "at async handle (/w/tests/data/forensics/runner.js:20:3)",
                "at listOnTimeout (node:internal/timers:573:17)",
                "at /w/x.js:1:1"
            ]},
            "libuv": [
                {"type": "timer", "is_active": true},
                {"type": "tcp", "is_active": true},
                {"type": "tcp", "is_active": true},
                {"type": "pipe", "is_active": false}
            ]
        });
        let mut r = parse_node_report(&report.to_string()).unwrap();
        let f = &r.threads[0].frames;
        assert_eq!(f.len(), 4);
        assert_eq!(
            (f[0].function.as_str(), f[0].line, f[0].column),
            ("spin", Some(12), Some(9))
        );
        assert_eq!(f[1].function, "handle");
        assert_eq!(f[3].function, "<anonymous>");
        assert_eq!(
            r.active_handles,
            vec![("timer".into(), 1), ("tcp".into(), 2)]
        );
        let top = mark_tool_frames(&mut r.threads, Some("handle"), &[]).unwrap();
        assert_eq!(top.line, Some(20));
        assert!(parse_node_report("{").unwrap_err().contains("not JSON"));
        assert!(parse_node_report("{}").unwrap_err().contains("header"));
    }
}
