//! Open spans and runner state as real runners end (issue 12) and stallwatch's own trouble
//! (issue 17 #11): every end of a runner closes its open spans at once, the board carries a
//! `lifecycle`, a watch-only runner's breaker recovers, a goodbye is not a lost heartbeat,
//! a span's age counts from its own start, short hex ids are padded, skipped records are
//! counted, and fd exhaustion or a starved stallwatch never trips a healthy runner.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::chain::{
    chain_config, incidents, post_json, process_alive, spawn_runner, wait_incident,
};
use crate::support::*;

fn runners_script(name: &str) -> String {
    test_data(&format!("python/runners/{name}"))
        .display()
        .to_string()
}

fn open_spans_of(server: &Server, id: &str) -> Vec<serde_json::Value> {
    let (st, v) = server.get_json("/api/v1/open-spans");
    assert_eq!(st, 200, "{v}");
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["runner_id"] == id)
        .cloned()
        .collect()
}

/// A kit runner ends inside its tool span (`how`): the span is closed at once with the
/// cause, the exit attributes and an exit event, and leaves the open-span API within 1 s
/// of the incident.
fn assert_end_closes_span(
    how: &str,
    event: &str,
    error_type: &str,
    check: impl Fn(&serde_json::Value),
) {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&chain_config("")));
    let go = dir.path().join("go");
    let id = format!("ends-{how}");
    let py = python();
    spawn_runner(
        &server,
        &id,
        &[
            py.to_str().unwrap(),
            &runners_script("ends.py"),
            how,
            go.to_str().unwrap(),
        ],
        None,
        &[],
    );
    let mut open: Vec<serde_json::Value>;
    wait_until!(Duration::from_secs(30), "the open tool span", {
        open = open_spans_of(&server, &id);
        !open.is_empty()
    });
    let trace_id = open[0]["trace_id"].as_str().unwrap().to_string();
    let span_id = open[0]["span_id"].as_str().unwrap().to_string();
    wait_lifecycle(&server, &id, "running", Duration::from_secs(20));
    std::fs::write(&go, b"").unwrap();
    let inc = wait_incident(&server, &id, event, Duration::from_secs(20));
    let seen = Instant::now();
    // within 1 s of the incident the span is no longer listed as running
    wait_until!(
        Duration::from_secs(1),
        "the open span to leave /api/v1/open-spans",
        open_spans_of(&server, &id).is_empty()
    );
    assert!(seen.elapsed() <= Duration::from_secs(1));
    let (st, span) = server.get_json(&format!("/api/v1/traces/{trace_id}/spans/{span_id}"));
    assert_eq!(st, 200, "{span}");
    assert_eq!(span["state"], "ended", "{span:#}");
    assert_eq!(span["status"]["code"], 2, "{span:#}");
    assert_eq!(
        attr(&span["attributes"], "error.type")["stringValue"],
        error_type,
        "{span:#}"
    );
    check(&span["attributes"]);
    let exit = span["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "runner.exit")
        .unwrap_or_else(|| panic!("no runner.exit event: {span:#}"));
    let end = nanos(&span["end_time_unix_nano"]);
    assert_eq!(nanos(&exit["time_unix_nano"]), end, "{span:#}");
    assert!(
        end <= nanos(&inc["at_unix_nano"]),
        "end after the incident: {span:#} {inc:#}"
    );
    let r = runner(&server, &id);
    assert_eq!(r["lifecycle"], "exited", "{r:#}");
    assert_eq!(r["heartbeat"], "not_running", "{r:#}");
}

#[test]
fn a_crash_inside_a_tool_span_closes_it_as_runner_crashed_with_its_exit_code() {
    assert_end_closes_span("crash", "runner.crashed", "runner_crashed", |a| {
        assert_eq!(attr(a, "process.exit.code")["intValue"], "3", "{a:#}");
    });
}

#[test]
fn a_sigkill_from_outside_closes_the_span_as_killed_with_the_signal() {
    assert_end_closes_span("kill", "runner.crashed", "killed", |a| {
        assert_eq!(
            attr(a, "stallwatch.exit.signal")["stringValue"],
            "SIGKILL",
            "{a:#}"
        );
    });
}

#[test]
fn an_exit_0_inside_a_tool_span_closes_it_as_runner_exited() {
    assert_end_closes_span("exit0", "runner.exited", "runner_exited", |a| {
        assert_eq!(attr(a, "process.exit.code")["intValue"], "0", "{a:#}");
    });
}

/// Issue 12 #2: the spans the reaper closes after a trip leave the open-span API and the
/// board within 1 s of `runner.terminated`.
#[test]
fn spans_ended_by_the_reaper_leave_the_now_page_within_a_second_of_termination() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&chain_config("")));
    crate::chain::python_runner(&server, "dl", "deadlock", None, &[]);
    wait_until!(
        Duration::from_secs(30),
        "the open tool span",
        !open_spans_of(&server, "dl").is_empty()
    );
    wait_incident(&server, "dl", "runner.terminated", Duration::from_secs(40));
    wait_until!(
        Duration::from_secs(1),
        "the reaper's span ends to reach the ledger",
        open_spans_of(&server, "dl").is_empty() && runner(&server, "dl")["worst_span"].is_null()
    );
    let r = runner(&server, "dl");
    assert_eq!(r["lifecycle"], "exited", "{r:#}");
}

fn start_goodbye(mode: &str, socket: &Path) -> Child {
    Command::new("python3")
        .arg(runners_script("goodbye.py"))
        .arg(mode)
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Issue 12 #4: a runner attached by pid alone (watched, never signalled) trips when
/// SIGSTOPped, is `detached`, and after SIGCONT goes HALF_OPEN → probe → CLOSED. Its trip
/// ends nothing of it: its checkpoint stays open with what it staged (it was rolled back,
/// the staging folder deleted under the live process).
#[test]
fn a_watch_only_runner_recovers_through_half_open_after_sigcont() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = chain_config("").replace("breaker_cooldown_ms = 60000", "breaker_cooldown_ms = 2000");
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&cfg));
    let sock = dir.path().join("w.sock");
    let child = StoppedOnDrop(start_goodbye("pong", &sock));
    let pid = child.0.id();
    wait_until!(Duration::from_secs(10), "the socket", sock.exists());
    let (st, body) = post_json(
        &server,
        "/api/v1/runners",
        &serde_json::json!({"id": "watched", "heartbeat_socket": sock, "attach": {"pid": pid}}),
    );
    assert!(st == 200 || st == 201, "{st} {body}");
    wait_lifecycle(&server, "watched", "running", Duration::from_secs(10));
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let (st, cp) = post_json(
        &server,
        "/api/v1/checkpoints",
        &serde_json::json!({"runner_id": "watched", "workspace": ws}),
    );
    assert_eq!(st, 201, "{cp}");
    let staged = std::path::PathBuf::from(cp["path"].as_str().unwrap()).join("part.csv");
    std::fs::write(&staged, "a,b\n1,").unwrap();
    let kill = |sig: &str| {
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
    };
    kill("-STOP");
    wait_incident(
        &server,
        "watched",
        "breaker.opened",
        Duration::from_secs(20),
    );
    wait_lifecycle(&server, "watched", "detached", Duration::from_secs(10));
    assert!(
        process_alive(u64::from(pid)),
        "a watch-only runner was signalled"
    );
    assert!(
        staged.exists(),
        "the live runner's checkpoint was rolled back under it"
    );
    kill("-CONT");
    wait_incident(
        &server,
        "watched",
        "breaker.half_open",
        Duration::from_secs(20),
    );
    wait_incident(
        &server,
        "watched",
        "breaker.closed",
        Duration::from_secs(20),
    );
    let r = runner(&server, "watched");
    assert_eq!(r["breaker"], "CLOSED", "{r:#}");
    assert_eq!(r["lifecycle"], "running", "{r:#}");
    drop(child);
}

/// Ends a child that a failed test may have left SIGSTOPped (it would hold the run).
struct StoppedOnDrop(std::process::Child);

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.id().to_string()])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issue 12 #12: a runner that says goodbye (`BYE`) and keeps working at exit longer than
/// the heartbeat timeout is `stopping`, never tripped; it exits cleanly.
#[test]
fn a_goodbye_makes_the_runner_stopping_and_it_is_never_tripped() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&chain_config("")));
    spawn_runner(
        &server,
        "bye",
        &["python3", &runners_script("goodbye.py"), "bye"],
        None,
        &[],
    );
    wait_lifecycle(&server, "bye", "stopping", Duration::from_secs(20));
    wait_incident(&server, "bye", "runner.exited", Duration::from_secs(20));
    let evs: Vec<_> = incidents(&server, "bye")
        .into_iter()
        .map(|i| i["event"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !evs.iter().any(|e| e == "breaker.opened"),
        "tripped: {evs:?}"
    );
    assert_eq!(runner(&server, "bye")["lifecycle"], "exited");
}

/// The stalled pair of the goodbye: a runner that says goodbye and never exits is tripped
/// once `stopping_timeout_ms` passes.
#[test]
fn a_goodbye_that_never_exits_is_tripped_after_the_stopping_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = chain_config("").replace("[reaper]", "stopping_timeout_ms = 2000\n[reaper]");
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&cfg));
    spawn_runner(
        &server,
        "hang",
        &["python3", &runners_script("goodbye.py"), "bye_hang"],
        None,
        &[],
    );
    wait_lifecycle(&server, "hang", "stopping", Duration::from_secs(20));
    let opened = wait_incident(&server, "hang", "breaker.opened", Duration::from_secs(20));
    assert!(
        opened["reason"]
            .as_str()
            .unwrap()
            .contains("stopping_timeout_ms"),
        "{opened:#}"
    );
    wait_incident(
        &server,
        "hang",
        "runner.terminated",
        Duration::from_secs(20),
    );
}

/// The healthy pair of the goodbye by socket: a runner whose heartbeat socket is gone for
/// a moment (removed, then bound again) is `stopping` only until it answers again. It was
/// no longer pinged once stopping, so its PONGs were never seen, and it was tripped at the
/// stopping timeout as if it had "said goodbye".
#[test]
fn a_runner_whose_socket_comes_back_is_running_again_and_never_tripped() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = chain_config("").replace("[reaper]", "stopping_timeout_ms = 2000\n[reaper]");
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&cfg));
    spawn_runner(
        &server,
        "rebind",
        &["python3", &runners_script("goodbye.py"), "rebind"],
        None,
        &[],
    );
    wait_lifecycle(&server, "rebind", "running", Duration::from_secs(20));
    wait_lifecycle(&server, "rebind", "stopping", Duration::from_secs(10));
    wait_lifecycle(&server, "rebind", "running", Duration::from_secs(10));
    // Past twice the stopping timeout: still running, never tripped.
    std::thread::sleep(Duration::from_secs(5));
    let r = runner(&server, "rebind");
    assert_eq!(r["lifecycle"], "running", "{r:#}");
    assert_eq!(r["breaker"], "CLOSED", "{r:#}");
    let evs: Vec<_> = incidents(&server, "rebind")
        .into_iter()
        .map(|i| i["event"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !evs.iter()
            .any(|e| e == "breaker.opened" || e == "runner.terminated"),
        "a healthy runner was tripped: {evs:?}"
    );
}

/// The lowest descriptor number `pid` does not hold: with RLIMIT_NOFILE at this value,
/// every new descriptor fails with EMFILE.
fn lowest_free_fd(pid: u32) -> usize {
    let held: std::collections::HashSet<usize> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // every number below the limit must stay taken: descriptors stallwatch closes later
    // (a finished HTTP request) would open holes above 3, never below (its stdin, stdout
    // and stderr live as long as it does)
    (0..).find(|n| !held.contains(n)).unwrap().min(3)
}

/// Issue 17 #11: stallwatch out of file descriptors (a real RLIMIT_NOFILE lowered with
/// `prlimit` to what it already holds) never trips a healthy runner; it raises
/// `sidecar.degraded`.
#[test]
fn fd_exhaustion_inside_stallwatch_never_trips_a_healthy_runner() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&chain_config("")));
    spawn_runner(
        &server,
        "calm",
        &["python3", &runners_script("goodbye.py"), "pong"],
        None,
        &[],
    );
    wait_lifecycle(&server, "calm", "running", Duration::from_secs(20));
    let sw = server.child.id();
    let held = lowest_free_fd(sw);
    let lim = |n: String| {
        let st = Command::new("prlimit")
            .args(["--pid", &sw.to_string(), &format!("--nofile={n}")])
            .status()
            .expect("prlimit (util-linux) is needed for this test");
        assert!(st.success(), "prlimit failed");
    };
    let (soft, hard) = {
        let limits = std::fs::read_to_string(format!("/proc/{sw}/limits")).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap()
            .to_string();
        let f: Vec<&str> = line.split_whitespace().collect();
        (f[3].to_string(), f[4].to_string())
    };
    // no new descriptor can be opened: every heartbeat connect fails with EMFILE
    lim(format!("{held}:{hard}"));
    // three heartbeat timeouts (3 s each) without a single successful ping
    std::thread::sleep(Duration::from_secs(10));
    lim(format!("{soft}:{hard}"));
    let evs: Vec<_> = incidents(&server, "calm")
        .into_iter()
        .map(|i| i["event"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !evs.iter().any(|e| e == "breaker.opened"),
        "a healthy runner was tripped: {evs:?}"
    );
    // Out of descriptors, SQLite may not open what it needs either, so the incident can be
    // held in memory (storage/src/held.rs) and written once descriptors are back.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let degraded = loop {
        let (st, all) = server.get_json("/api/v1/incidents?limit=200");
        assert_eq!(st, 200);
        let found = all["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["event"] == "sidecar.degraded");
        if found || std::time::Instant::now() > deadline {
            break (found, all);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        degraded.0,
        "no sidecar.degraded incident: {:#}\n{}",
        degraded.1,
        server.stderr()
    );
    let r = runner(&server, "calm");
    assert_eq!(r["breaker"], "CLOSED", "{r:#}");
    assert_eq!(
        r["lifecycle"],
        "running",
        "{r:#}\n{:#?}\n{}",
        incidents(&server, "calm"),
        server.stderr()
    );
}

/// Issue 17 #11: stallwatch itself stopped (SIGSTOP) longer than the heartbeat timeout:
/// its own starved task is never the runner's fault.
#[test]
fn a_stopped_stallwatch_never_trips_a_healthy_runner_when_it_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&chain_config("")));
    spawn_runner(
        &server,
        "calm",
        &["python3", &runners_script("goodbye.py"), "pong"],
        None,
        &[],
    );
    wait_lifecycle(&server, "calm", "running", Duration::from_secs(20));
    let sw = server.child.id().to_string();
    Command::new("kill").args(["-STOP", &sw]).status().unwrap();
    std::thread::sleep(Duration::from_secs(5));
    Command::new("kill").args(["-CONT", &sw]).status().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let evs: Vec<_> = incidents(&server, "calm")
        .into_iter()
        .map(|i| i["event"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !evs.iter().any(|e| e == "breaker.opened"),
        "tripped after a stall of ours: {evs:?}"
    );
    let (_, all) = server.get_json("/api/v1/incidents?limit=200");
    assert!(
        all["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["event"] == "sidecar.degraded"),
        "no sidecar.degraded incident: {all:#}"
    );
}

fn post_snapshot(server: &Server, runner: &str, trace: &str, span: &str, start: u64) {
    let body = serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "late-exporter"}},
            {"key": "stallwatch.runner.id", "value": {"stringValue": runner}}]},
        "scopeSpans": [{"spans": [{
            "traceId": trace, "spanId": span, "name": "fit_model", "kind": 1,
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
}

/// Issue 12 #13: a first export that arrives 1.5 s late (SLA 2 s) trips 0.5 s after its
/// arrival, not 2 s; a start outside the back-dating window counts from arrival.
#[test]
fn the_sla_counts_from_the_span_start_when_plausible() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&chain_config("")));
    for id in ["late", "ancient"] {
        spawn_runner(&server, id, &["sleep", "300"], None, &[]);
    }
    let now = unix_nanos();
    let t0 = Instant::now();
    post_snapshot(
        &server,
        "late",
        &"a1".repeat(16),
        &"b1".repeat(8),
        now - 1_500_000_000,
    );
    post_snapshot(
        &server,
        "ancient",
        &"a2".repeat(16),
        &"b2".repeat(8),
        now - 60_000_000_000,
    );
    wait_incident(&server, "late", "breaker.opened", Duration::from_secs(10));
    let late = t0.elapsed();
    assert!(
        late < Duration::from_millis(1500),
        "tripped {late:?} after arrival"
    );
    // the implausible start counts from arrival: not tripped before the SLA after arrival
    let tripped_early = incidents(&server, "ancient")
        .iter()
        .any(|i| i["event"] == "breaker.opened");
    if t0.elapsed() < Duration::from_millis(1900) {
        assert!(!tripped_early, "a 60 s old start was believed");
    }
    wait_incident(
        &server,
        "ancient",
        "breaker.opened",
        Duration::from_secs(10),
    );
    assert!(t0.elapsed() >= Duration::from_millis(2000));
}

fn partial_log(trace: &str, span: &str, parent: Option<&str>) -> serde_json::Value {
    let mut sp = serde_json::json!({"traceId": trace, "spanId": span, "name": "padded_tool",
        "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}}]});
    if let Some(p) = parent {
        sp["parentSpanId"] = p.into();
    }
    let body = serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [sp]}]}]});
    serde_json::json!({
        "timeUnixNano": unix_nanos().to_string(),
        "body": {"stringValue": body.to_string()},
        "attributes": [
            {"key": "span.state", "value": {"stringValue": "heartbeat"}},
            {"key": "log.body.type", "value": {"stringValue": "json/v1"}}]})
}

/// Issue 12 #6: python-contrib's `hex(id)[2:]` ids (no leading zeros) are left-padded,
/// and a record the ledger cannot read is counted by reason in `/metrics`.
#[test]
fn short_hex_partial_span_ids_are_padded_and_skips_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let body = serde_json::json!({"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "contrib"}}]},
        "scopeLogs": [{"logRecords": [
            partial_log("5e1f00000000000000000000000001", "abc1", Some("e0f")),
            partial_log("zz", "abc2", None)]}]}]});
    let r = http_client()
        .post(server.otlp_http("/v1/logs"))
        .json(&body)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let want_trace = "005e1f00000000000000000000000001";
    let mut items: Vec<serde_json::Value>;
    wait_until!(Duration::from_secs(10), "the padded open span", {
        let (_, v) = server.get_json("/api/v1/open-spans");
        items = v["items"].as_array().unwrap().clone();
        items.iter().any(|s| s["span_id"] == "000000000000abc1")
    });
    let s = items
        .iter()
        .find(|s| s["span_id"] == "000000000000abc1")
        .unwrap();
    assert_eq!(s["trace_id"], want_trace, "{s:#}");
    assert_eq!(s["parent_span_id"], "0000000000000e0f", "{s:#}");
    let metrics = http_client()
        .get(server.api("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.contains("stallwatch_ledger_records_skipped_total{reason=\"bad_id\"} 1"),
        "{metrics}"
    );
}

/// Issue 12 #9: an exporter retry of a log export stores each record once; a record that
/// differs only in its time is a new record.
#[test]
fn a_re_sent_log_record_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let trace = "7a".repeat(16);
    let export = |t: u64| {
        serde_json::json!({"resourceLogs": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "retrier"}}]},
            "scopeLogs": [{"scope": {"name": "app"}, "logRecords": [{
                "timeUnixNano": t.to_string(), "observedTimeUnixNano": t.to_string(),
                "severityNumber": 9, "severityText": "INFO",
                "body": {"stringValue": "checkpoint saved"},
                "attributes": [{"key": "step", "value": {"intValue": "3"}}],
                "traceId": trace, "spanId": "7b".repeat(8)}]}]}]})
    };
    let t = unix_nanos();
    for body in [export(t), export(t), export(t + 1)] {
        let r = http_client()
            .post(server.otlp_http("/v1/logs"))
            .json(&body)
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
    let (st, v) = server.get_json(&format!("/api/v1/traces/{trace}"));
    assert_eq!(st, 200, "{v}");
    let logs = v["logs"].as_array().unwrap();
    assert_eq!(logs.len(), 2, "the retry was stored again: {v:#}");
}

fn post_spans(server: &Server, spans: serde_json::Value) {
    let body = serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "dist"}}]},
        "scopeSpans": [{"spans": spans}]}]});
    let r = http_client()
        .post(server.otlp_http("/v1/traces"))
        .json(&body)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}

fn span_json(
    trace: &str,
    id: &str,
    parent: Option<&str>,
    start: u64,
    end: u64,
) -> serde_json::Value {
    let mut s = serde_json::json!({"traceId": trace, "spanId": id, "name": format!("s-{id}"),
        "kind": 1, "startTimeUnixNano": start.to_string(), "endTimeUnixNano": end.to_string()});
    if let Some(p) = parent {
        s["parentSpanId"] = p.into();
    }
    s
}

/// Issue 12 #8 and #5 in the read API: a remote parent is `missing`, an open child's
/// parent `inferred`; a Logfire pending twin is not drawn or counted once its real span
/// is stored.
#[test]
fn remote_parents_are_missing_and_pending_twins_are_hidden_once_the_real_span_is_known() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let t = unix_nanos();
    let (remote, open, twins) = ("c1".repeat(16), "c2".repeat(16), "c3".repeat(16));
    post_spans(
        &server,
        serde_json::json!([span_json(
            &remote,
            &"d1".repeat(8),
            Some(&"ee".repeat(8)),
            t,
            t + 5
        )]),
    );
    post_spans(
        &server,
        serde_json::json!([span_json(
            &open,
            &"d2".repeat(8),
            Some(&"ef".repeat(8)),
            t,
            0
        )]),
    );
    let mut twin = span_json(&twins, &"d4".repeat(8), Some(&"d3".repeat(8)), t, t);
    twin["attributes"] =
        serde_json::json!([{"key": "logfire.span_type", "value": {"stringValue": "pending_span"}}]);
    post_spans(
        &server,
        serde_json::json!([
            twin,
            span_json(&twins, &"d5".repeat(8), Some(&"d3".repeat(8)), t, t + 2)
        ]),
    );
    // before the real span arrives, the twin says its parent is running
    let (_, v) = server.get_json(&format!("/api/v1/traces/{twins}"));
    assert_eq!(v["span_count"], 2, "{v:#}");
    assert!(
        v["spans"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["span_id"] == "d3".repeat(8) && s["state"] == "inferred"),
        "{v:#}"
    );
    post_spans(
        &server,
        serde_json::json!([span_json(&twins, &"d3".repeat(8), None, t, t + 10)]),
    );

    let (_, v) = server.get_json(&format!("/api/v1/traces/{remote}"));
    let spans = v["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 1, "a remote parent was made up: {v:#}");
    assert_eq!(spans[0]["parent_state"], "missing", "{v:#}");

    let (_, v) = server.get_json(&format!("/api/v1/traces/{open}"));
    let child = span_named(&v, &format!("s-{}", "d2".repeat(8)));
    assert_eq!(child["parent_state"], "inferred", "{v:#}");
    assert!(v["spans"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["span_id"] == "ef".repeat(8) && s["state"] == "inferred"));

    let (_, v) = server.get_json(&format!("/api/v1/traces/{twins}"));
    let ids: Vec<&str> = v["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["span_id"].as_str().unwrap())
        .collect();
    assert_eq!(v["span_count"], 2, "{v:#}");
    assert!(
        !ids.contains(&"d4".repeat(8).as_str()),
        "the pending twin is drawn: {ids:?}"
    );
    assert_eq!(ids.len(), 2, "{ids:?}");
}

/// The interpreter of one of the test setup's side venvs (`scripts/setup-test-env`):
/// `$VAR`, else `<repo>/<venv>/bin/python`. Missing, the test fails with the fix.
fn side_python(var: &str, venv: &str) -> std::path::PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return p.into();
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(venv)
        .join("bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup-test-env (or set {var})",
        p.display()
    );
    p
}

/// Runs a library's script that opens a tool span bound to `runner`, and checks the
/// open-span ledger sees it while it runs and drops it when it ends.
fn assert_library_open_span(py: &Path, script: &str, runner: &str) {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&chain_config("")));
    let go = dir.path().join("go");
    let endpoint = format!("http://{}", server.http);
    let mut child = Command::new(py)
        .arg(test_data(&format!("python/{script}")))
        .args([endpoint.as_str(), runner, go.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut open: Vec<serde_json::Value>;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        open = open_spans_of(&server, runner);
        if !open.is_empty() {
            break;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "{script} exited ({st}) before its span was seen open\n{}",
                server.stderr()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{script}: no open span seen\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(open[0]["tool_name"], "fit_model", "{open:#?}");
    assert_eq!(open[0]["state"], "open", "{open:#?}");
    std::fs::write(&go, b"").unwrap();
    let st = child.wait().unwrap();
    assert!(st.success(), "{script} failed: {st}");
    wait_until!(
        Duration::from_secs(10),
        "the ended span to leave the ledger",
        open_spans_of(&server, runner).is_empty()
    );
}

/// Issue 12 #7: PyPI `partial-span-processor` 0.0.9 (`partial.event` heartbeat | stop),
/// the real package in its own venv.
#[test]
fn the_published_partial_span_processor_is_the_fourth_shape() {
    let py = side_python("STALLWATCH_TEST_PARTIAL_PYTHON", ".venv-partial");
    assert_library_open_span(&py, "partial_span_processor_runner.py", "psp");
}

/// Issue 12 #11: the README's Logfire wiring (`send_to_logfire=False` +
/// `additional_span_processors` with an OTLP exporter) sends its pending spans, so a
/// running Logfire span is watched; tested with the real `logfire` package.
#[test]
fn logfire_wired_as_the_readme_says_sends_its_pending_spans() {
    let py = side_python("STALLWATCH_TEST_LOGFIRE_PYTHON", ".venv-logfire");
    assert_library_open_span(&py, "logfire_pending.py", "lf");
}

/// Issue 12 #2 and #3 in Chromium: on the Now page (loaded once, live over SSE) the crashed
/// runner's tool span stops being drawn as running within 1 s of `runner.crashed`, and its
/// card shows the `exited` lifecycle.
#[test]
fn now_page_in_chromium_drops_a_crashed_runner_s_span_within_a_second() {
    use crate::browser::{find_binary, Driver, PAGE_WAIT};
    find_binary(
        "STALLWATCH_CHROMIUM",
        &["/usr/bin/chromium", "/usr/bin/chromium-browser"],
    );
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(
        // The runner must not be tripped while the browser starts: this test is about a
        // crash ending the span, so its SLA is far longer than the page takes to load.
        &chain_config("").replace(
            &format!("default_sla_ms = {}", crate::chain::SLA_MS),
            "default_sla_ms = 60000",
        ),
    ));
    let go = dir.path().join("go");
    let py = python();
    spawn_runner(
        &server,
        "crashy",
        &[
            py.to_str().unwrap(),
            &runners_script("ends.py"),
            "crash",
            go.to_str().unwrap(),
        ],
        None,
        &[],
    );
    let mut open: Vec<serde_json::Value>;
    wait_until!(Duration::from_secs(30), "the open tool span", {
        open = open_spans_of(&server, "crashy");
        !open.is_empty()
    });
    let span_id = open[0]["span_id"].as_str().unwrap().to_string();
    let profile = tempfile::tempdir().unwrap();
    let d = Driver::start(profile.path());
    d.goto(&server.api("/#/"));
    let row = format!("document.querySelector('tr.open-span[data-span-id=\"{span_id}\"]')");
    d.wait_for(
        "the running tool span on the Now page",
        PAGE_WAIT,
        &format!("return {row} !== null"),
    );
    d.wait_for(
        "the running lifecycle on the runner card",
        PAGE_WAIT,
        "const c = document.querySelector('.runner[data-runner-id=\"crashy\"]'); return c && c.dataset.lifecycle === 'running'",
    );
    std::fs::write(&go, b"").unwrap();
    wait_incident(&server, "crashy", "runner.crashed", Duration::from_secs(20));
    d.wait_for(
        "the crashed runner's span to leave the Now page within 1 s",
        Duration::from_secs(1),
        &format!("return {row} === null"),
    );
    d.wait_for(
        "the exited lifecycle on the runner card",
        Duration::from_secs(5),
        "const c = document.querySelector('.runner[data-runner-id=\"crashy\"]'); return c && c.dataset.lifecycle === 'exited' && c.innerText.includes('exited')",
    );
}

/// One OTLP/HTTP protobuf export of `n` never-ending `execute_tool` spans of nobody (no
/// runner id, no pid): the report's flood (the report sent 5,000 a request).
fn flood_export(seed: u64, n: u64) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;
    let now = unix_nanos();
    let spans = (0..n)
        .map(|i| {
            let mut trace = [0u8; 16];
            trace[..8].copy_from_slice(&(seed + 1).to_be_bytes());
            trace[8..].copy_from_slice(&(i / 8 + 1).to_be_bytes());
            Span {
                trace_id: trace.to_vec(),
                span_id: (seed << 32 | (i + 1)).to_be_bytes().to_vec(),
                name: format!("execute_tool read_file {}", i % 97),
                kind: 1,
                start_time_unix_nano: now,
                end_time_unix_nano: 0,
                attributes: vec![
                    crate::spine::kv("gen_ai.operation.name", crate::spine::s("execute_tool")),
                    crate::spine::kv("gen_ai.tool.name", crate::spine::s("read_file")),
                ],
                ..Default::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![crate::spine::kv("service.name", crate::spine::s("flood"))],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// The outside tester's report: 100,000 never-ending spans of nobody grew the open-span
/// ledger without limit, and one read of `/api/v1/open-spans` answered every row (34 MB at
/// 100k, 1.4 GB of peak memory for eight reads). Now the ledger holds at most
/// `max_open_spans` (here 1,000, of which spans of no registered runner fill 750): the
/// first 750 are tracked, the rest counted in `/metrics` and logged once for the burst;
/// the list comes a page at a time, oldest first, each span once, with the other lists'
/// `limit`/`cursor` rules; and a registered runner's stuck tool span, sent after the flood,
/// is still tracked and trips its runner.
#[test]
fn an_open_span_flood_is_bounded_and_the_open_span_list_is_paged() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = chain_config("").replace("[reaper]", "max_open_spans = 1000\n[reaper]");
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&cfg));
    for k in 0..5 {
        let r = crate::spine::post_protobuf(&server, "/v1/traces", flood_export(k, 1000));
        assert_eq!(r.status(), 200, "export {k}");
    }
    let untracked = "stallwatch_watchdog_ledger_untracked_total{source=\"other\"} ";
    wait_until!(
        Duration::from_secs(20),
        "the flood counted as untracked",
        server.metric(untracked) == Some(4250)
    );
    // healthy: the spans below the bound are tracked, and listed
    assert_eq!(
        server.metric("stallwatch_watchdog_ledger_open_spans "),
        Some(750)
    );
    assert_eq!(
        server.metric("stallwatch_watchdog_ledger_capacity "),
        Some(1000)
    );
    // the list (the durable copy, written in batches after the ledger) ...
    wait_until!(
        Duration::from_secs(20),
        "the tracked spans written",
        server.get_json("/api/v1/open-spans?limit=1000").1["items"]
            .as_array()
            .is_some_and(|a| a.len() == 750)
    );
    // ... a page at a time: 100 by default, with a cursor
    let (st, first) = server.get_json("/api/v1/open-spans");
    assert_eq!(st, 200, "{first}");
    assert_eq!(first["items"].as_array().unwrap().len(), 100);
    assert!(first["next_cursor"].is_string(), "{}", first["next_cursor"]);
    // every page of 300: each tracked span once, oldest first (first arrival, ids)
    let mut seen: Vec<(u64, String, String)> = Vec::new();
    let mut sizes = Vec::new();
    let mut path = "/api/v1/open-spans?limit=300".to_string();
    loop {
        let (st, page) = server.get_json(&path);
        assert_eq!(st, 200, "{page}");
        let items = page["items"].as_array().unwrap();
        sizes.push(items.len());
        seen.extend(items.iter().map(|s| {
            (
                nanos(&s["first_seen_unix_nano"]),
                s["trace_id"].as_str().unwrap().to_string(),
                s["span_id"].as_str().unwrap().to_string(),
            )
        }));
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/api/v1/open-spans?limit=300&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(sizes, vec![300, 300, 150]);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen, sorted, "oldest first, each span once");
    // a runner's filter reads its own spans only (none here), at once
    let (st, none) = server.get_json("/api/v1/open-spans?runner_id=none");
    assert_eq!(st, 200, "{none}");
    assert_eq!(none["items"], serde_json::json!([]));
    assert!(none["next_cursor"].is_null());
    // refused like the other lists' bad values
    for (path, code, needle) in [
        (
            "/api/v1/open-spans?limit=0",
            "invalid_parameter",
            "\"limit\"",
        ),
        (
            "/api/v1/open-spans?limit=1001",
            "invalid_parameter",
            "1 to 1000",
        ),
        (
            "/api/v1/open-spans?cursor=%21%21",
            "invalid_cursor",
            "invalid cursor",
        ),
        ("/api/v1/open-spans?page=2", "invalid_parameter", "\"page\""),
    ] {
        let (st, body) = server.get_json(path);
        assert_eq!(st, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], code, "{path}: {body}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{path}: {msg}");
    }
    // one log line for the burst, not one per span
    let stderr = server.stderr();
    assert_eq!(
        stderr.matches("open-span ledger at its bound (").count(),
        1,
        "{stderr}"
    );
    // a registered runner's stuck tool span, after the flood: tracked in the reserve, and
    // its runner tripped
    spawn_runner(&server, "stuck", &["sleep", "300"], None, &[]);
    wait_until!(
        Duration::from_secs(10),
        "the watchdog to know the runner",
        server.metric("stallwatch_watchdog_runners ") == Some(1)
    );
    post_snapshot(
        &server,
        "stuck",
        &"5c".repeat(16),
        &"5d".repeat(8),
        unix_nanos(),
    );
    wait_until!(
        Duration::from_secs(10),
        "the stuck span listed",
        server.get_json("/api/v1/open-spans?runner_id=stuck").1["items"]
            .as_array()
            .is_some_and(|a| a.len() == 1)
    );
    let opened = wait_incident(&server, "stuck", "breaker.opened", Duration::from_secs(10));
    assert!(
        opened["reason"].as_str().unwrap().contains("fit_model"),
        "{opened:#}"
    );
    assert_eq!(server.metric(untracked), Some(4250));
}
