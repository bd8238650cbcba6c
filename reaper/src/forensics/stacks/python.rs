//! The Python kit's stacks: the `faulthandler` dump it appends to the stacks file on
//! SIGUSR2 (the main thread's stack, taken even while a C call holds the GIL) and its
//! `STACKS <json>` answer on the heartbeat socket (`threads=heartbeat`: every thread's
//! stack, read under the interpreter's lock), parsed into frames (issue 18;
//! `docs/design.md`, Stall forensics).

use super::*;

/// Parses one `faulthandler` dump: `Stack (most recent call first):` (the kit's
/// `all_threads=False`: the thread that handled the signal) or `Current thread 0x...` /
/// `Thread 0x...` headings (`all_threads=True`, older kits), then `File "...", line N in f`
/// lines. The thread whose outermost frame is `<module>` is the main thread.
pub fn parse_faulthandler(text: &str) -> Vec<ThreadStack> {
    let mut out: Vec<ThreadStack> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t
            .strip_prefix("Current thread ")
            .map(|r| (r, true))
            .or_else(|| t.strip_prefix("Thread ").map(|r| (r, false)))
            .filter(|(r, _)| r.ends_with("(most recent call first):"))
        {
            let (r, current) = rest;
            out.push(ThreadStack {
                id: r.split_whitespace().next().unwrap_or_default().to_string(),
                current,
                ..Default::default()
            });
        } else if t == "Stack (most recent call first):" {
            out.push(ThreadStack {
                id: "current".into(),
                current: true,
                ..Default::default()
            });
        } else if let Some(f) = t.strip_prefix("File \"") {
            let Some(cur) = out.last_mut() else { continue };
            let Some((file, rest)) = f.split_once("\", line ") else {
                continue;
            };
            let (line_no, func) = rest.split_once(" in ").unwrap_or((rest, "?"));
            push_frame(
                cur,
                Frame {
                    function: func.to_string(),
                    file: file.to_string(),
                    line: line_no.trim().parse().ok(),
                    ..Default::default()
                },
            );
        }
    }
    // The main thread is the one whose outermost frame is the script's top level.
    let main = out
        .iter()
        .position(|s| s.frames.last().is_some_and(|f| f.function == "<module>"));
    if let Some(i) = main {
        out[i].main = true;
    }
    out
}

/// Parses the Python kit's answer to `STACKS`: `STACKS {"threads": [{"id": "0x<16 hex>",
/// "name": str|null, "main": bool, "frames": [{"function", "file", "line"}],
/// "frames_omitted": N}]}` (frames innermost first), or `ERR <why>`. The main thread comes
/// first. Errors name what the kit said or what is malformed.
pub fn parse_python_heartbeat_stacks(answer: &str) -> Result<Vec<ThreadStack>, String> {
    let v = heartbeat_json(answer, "python")?;
    let list = v["threads"]
        .as_array()
        .ok_or("the python kit's STACKS answer has no threads list")?;
    let mut out = Vec::with_capacity(list.len());
    for t in list {
        let mut s = ThreadStack {
            id: t["id"].as_str().unwrap_or_default().to_string(),
            name: t["name"].as_str().map(str::to_string),
            main: t["main"] == true,
            frames_omitted: t["frames_omitted"].as_u64().unwrap_or(0) as usize,
            ..Default::default()
        };
        for f in t["frames"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            push_frame(
                &mut s,
                Frame {
                    function: f["function"].as_str().unwrap_or("?").to_string(),
                    file: f["file"].as_str().unwrap_or_default().to_string(),
                    line: f["line"].as_u64().and_then(|l| u32::try_from(l).ok()),
                    ..Default::default()
                },
            );
        }
        out.push(s);
    }
    out.sort_by_key(|s| !s.main);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = r#"STACKS {"threads":[{"id":"0x00007f3b2ffff640","name":"worker","main":false,"frames":[{"function":"take_two","file":"/w/runner.py","line":61},{"function":"run","file":"/usr/lib/python3.11/threading.py","line":982}],"frames_omitted":0},{"id":"0x00007f3b3e1f6740","name":"MainThread","main":true,"frames":[{"function":"_wait_for_tstate_lock","file":"/usr/lib/python3.11/threading.py","line":1132},{"function":"deadlock","file":"/w/runner.py","line":70},{"function":"<module>","file":"/w/runner.py","line":99}],"frames_omitted":3}]}
"#;

    #[test]
    fn a_stacks_answer_gives_every_thread_main_first() {
        let t = parse_python_heartbeat_stacks(ANSWER).unwrap();
        assert_eq!(t.len(), 2);
        assert!(t[0].main && !t[1].main);
        assert_eq!(t[0].id, "0x00007f3b3e1f6740");
        assert_eq!(t[0].name.as_deref(), Some("MainThread"));
        assert_eq!(t[0].frames[1].function, "deadlock");
        assert_eq!(t[0].frames[1].line, Some(70));
        assert_eq!(t[0].frames_omitted, 3);
        assert_eq!(t[1].frames[0].function, "take_two");
    }

    #[test]
    fn a_bad_stacks_answer_is_an_error_naming_the_kit() {
        let e = parse_python_heartbeat_stacks("ERR busy\n").unwrap_err();
        assert!(e.contains("python kit") && e.contains("busy"), "{e}");
        let e = parse_python_heartbeat_stacks("STACKS {nope").unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        let e = parse_python_heartbeat_stacks("STACKS {}").unwrap_err();
        assert!(e.contains("no threads list"), "{e}");
        let e = parse_python_heartbeat_stacks("").unwrap_err();
        assert!(e.contains("without answering"), "{e}");
    }
}
