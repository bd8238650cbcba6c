//! `stallwatch demo` end to end: the real binary starts its own sidecar and six real
//! Python runners on the kit, and must report every stalled runner tripped, SIGTERMed and
//! (for the half-written CSV) rolled back, the healthy one untouched, the workspace
//! byte-for-byte as before, and clean up after itself.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::chain::process_alive;
use crate::support::*;

const BAD: [&str; 4] = ["py-deadlock", "py-read", "py-gui", "py-csv"];

/// Runs `stallwatch demo ARGS` with a bound; answers (exit code, stdout, stderr).
fn run_demo(args: &[&str], timeout: Duration) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(bin())
        .arg("demo")
        .args(args)
        .env_remove("STALLWATCH_DEMO_PYTHON")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "stallwatch demo did not finish within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (
        status.code(),
        std::fs::read_to_string(&out_path).unwrap(),
        std::fs::read_to_string(&err_path).unwrap(),
    )
}

#[test]
fn demo_trips_the_four_stalled_runners_and_leaves_the_workspace_unchanged() {
    let py = python();
    let (code, out, err) = run_demo(
        &["--python", py.to_str().unwrap()],
        Duration::from_secs(240),
    );
    let ctx = format!("stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(code, Some(0), "{ctx}");
    let lines: Vec<&str> = out.lines().collect();

    // The dashboard URL, and it answered while the demo ran (the demo read the board from it).
    let url = lines
        .iter()
        .find_map(|l| l.strip_prefix("dashboard:"))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no dashboard line; {ctx}"));
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with('/'),
        "{url}"
    );

    for id in BAD {
        let opened = lines
            .iter()
            .find(|l| l.contains(&format!(" {id} ")) && l.contains("breaker.opened"))
            .unwrap_or_else(|| panic!("no breaker.opened line for {id}; {ctx}"));
        assert!(
            opened.contains("tool_overrun") && opened.contains("over its SLA of 3000 ms"),
            "{opened}"
        );
        // The next line: admission refused at once while OPEN.
        let at = lines.iter().position(|l| l == opened).unwrap();
        assert!(
            lines[at + 1].contains("admission now: 503 (OPEN), Retry-After"),
            "{}; {ctx}",
            lines[at + 1]
        );
        let terminated = lines
            .iter()
            .position(|l| l.contains(&format!(" {id} ")) && l.contains("runner.terminated"))
            .unwrap_or_else(|| panic!("no runner.terminated line for {id}; {ctx}"));
        // The next line gives the steps with their times.
        let steps = lines[terminated + 1];
        assert!(
            steps.contains("SIGTERM at ") && steps.contains("reaped"),
            "{steps}; {ctx}"
        );
        assert!(
            steps.contains("exited at ") || steps.contains("SIGKILL at "),
            "{steps}; {ctx}"
        );
        let summary = lines
            .iter()
            .find(|l| l.trim_start().starts_with(id) && l.contains("tripped (tool_overrun)"))
            .unwrap_or_else(|| panic!("no summary line for {id}; {ctx}"));
        assert!(summary.contains("ended by SIG"), "{summary}");
    }
    // Issue 12 #15: the runner whose SIGTERM handler never runs is ended by the SIGKILL
    // after the grace period, and the demo shows it.
    let noterm = lines
        .iter()
        .position(|l| l.contains(" py-noterm ") && l.contains("runner.terminated"))
        .unwrap_or_else(|| panic!("no runner.terminated line for py-noterm; {ctx}"));
    assert!(
        lines[noterm + 1].contains("SIGTERM at ") && lines[noterm + 1].contains("SIGKILL at "),
        "no visible escalation: {}; {ctx}",
        lines[noterm + 1]
    );
    assert!(
        lines.iter().any(|l| l.contains(" py-csv ")
            && l.contains("staged half a CSV")
            && l.contains("\"2,0.\"")),
        "the half-written CSV was not seen in staging; {ctx}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" py-csv ") && l.contains("checkpoint.rolled_back")),
        "no rollback line; {ctx}"
    );
    assert!(
        out.contains("checkpoint rolled back (staging folder deleted)"),
        "{ctx}"
    );
    assert!(
        out.contains("workspace byte-for-byte as before: yes (3 files, SHA-256)"),
        "{ctx}"
    );

    // The healthy runner: no incident line at all except its spawn, CLOSED at the end.
    let healthy: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with('+') && l.contains(" py-ok "))
        .collect();
    assert_eq!(healthy.len(), 1, "{ctx}");
    assert!(
        healthy.iter().all(|l| l.contains("spawned")),
        "healthy runner disturbed: {healthy:?}; {ctx}"
    );
    assert!(
        out.contains(
            "breakers:   py-ok CLOSED, py-deadlock OPEN, py-read OPEN, py-gui OPEN, py-csv OPEN, py-noterm OPEN"
        ),
        "{ctx}"
    );
    let healthy_summary = lines
        .iter()
        .find(|l| {
            l.trim_start().starts_with("py-ok") && l.contains("never tripped, breaker CLOSED")
        })
        .unwrap_or_else(|| panic!("no healthy summary; {ctx}"));
    let traced: usize = healthy_summary
        .rsplit(", ")
        .next()
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        traced >= 3,
        "the healthy runner's tool calls were not traced: {healthy_summary}"
    );
    assert!(
        out.contains("result: everything happened as expected"),
        "{ctx}"
    );

    // Cleaned up: no runner process left, temp folder deleted.
    for l in lines.iter().filter(|l| l.contains(" spawned ")) {
        let pid: u64 = l
            .split("pid ")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        wait_until!(
            Duration::from_secs(10),
            format!("runner pid {pid} to be gone"),
            !process_alive(pid)
        );
    }
    let data_dir = lines
        .iter()
        .find_map(|l| l.strip_prefix("data dir:"))
        .unwrap()
        .trim();
    let root = std::path::Path::new(data_dir).parent().unwrap();
    assert!(!root.exists(), "{} left behind", root.display());
    assert!(
        out.contains(&format!(
            "cleaned up: sidecar stopped, {} deleted",
            root.display()
        )),
        "{ctx}"
    );
}

#[test]
fn demo_without_the_runner_kit_says_how_to_install_it() {
    let (code, out, err) = run_demo(
        &["--python", "/nonexistent/python3"],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains("import stallwatch_runner"), "{err}");
    assert!(
        err.contains("python3 -m venv .venv && .venv/bin/pip install -e integrations/python"),
        "{err}"
    );
    assert!(err.contains("scripts/setup-test-env"), "{err}");
    // Nothing was started: no dashboard line.
    assert!(!out.contains("dashboard:"), "{out}");
}
