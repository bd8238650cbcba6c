//! The web UI of a running `stallwatch serve` in a real headless Chromium (Debian's
//! `chromium` + `chromium-driver`), driven over the W3C WebDriver protocol with a few JSON
//! calls (the harness in the testkit crate).
//!
//! One whole-system run: a real Python OpenTelemetry SDK exporter feeds the server → the
//! Traces page lists its trace and the waterfall shows both spans; a real Python runner
//! (project kit) deadlocks inside a tool span → before its SLA passes the trace view draws
//! that span as running and the Now page shows the runner and the open span; with the
//! Incidents page loaded and never reloaded, the trip (`breaker.opened`, then
//! `runner.terminated`) appears live over Server-Sent Events. Screenshots land in
//! `tests/artifacts/e2e-*.png` (gitignored). A second run loads the Now page more times than
//! Chromium's 6 connections per host, leaving each for the back/forward cache with its live
//! stream open, and bounds every load (issue 13's ~1 min stalled navigation).
//!
//! Missing Chromium or chromedriver is a failure with the install hint, never a skip.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::chain::{chain_config, incidents, python_runner, SLA_MS};
use crate::support::*;

/// The tool SLA of this test, ms: long enough that a loaded 2-core box can load the trace
/// view and the Now page while the span is still within it (the chain tests use 2000 ms).
const BROWSER_SLA_MS: u64 = 20_000;
pub(crate) use stallwatch_testkit::{find_binary, Driver, PAGE_WAIT};

/// Runs tests/python/export_spans.py (OTLP gRPC) against `server`; answers its ids.
fn export_python_trace(server: &Server) -> Value {
    let out = Command::new(python())
        .arg(test_data("python/export_spans.py"))
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{}", server.grpc),
        )
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_SERVICE_NAME", "py-browser")
        .output()
        .expect("run python exporter");
    assert!(
        out.status.success(),
        "python exporter failed (is the venv installed? see README):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn ui_in_chromium_shows_exported_traces_a_running_tool_span_and_a_live_trip() {
    // Fail (not skip) before anything else when the browser is missing.
    find_binary(
        "STALLWATCH_CHROMIUM",
        &["/usr/bin/chromium", "/usr/bin/chromium-browser"],
    );
    find_binary(
        "STALLWATCH_CHROMEDRIVER",
        &["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"],
    );
    let dir = tempfile::tempdir().unwrap();
    let config = chain_config("").replace(
        &format!("default_sla_ms = {SLA_MS}"),
        &format!("default_sla_ms = {BROWSER_SLA_MS}"),
    );
    assert!(config.contains(&format!("default_sla_ms = {BROWSER_SLA_MS}")));
    let server = Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&config));
    let ui = |hash: &str| server.api(&format!("/{hash}"));

    // 1. A real Python SDK exporter feeds it.
    let ids = export_python_trace(&server);
    let trace_id = ids["trace_id"].as_str().unwrap().to_string();
    let root_id = ids["root_span_id"].as_str().unwrap().to_string();
    let tool_id = ids["tool_span_id"].as_str().unwrap().to_string();
    wait_until!(Duration::from_secs(30), "the exported spans in the API", {
        let (st, t) = server.get_json(&format!("/api/v1/traces/{trace_id}"));
        st == 200 && t["spans"].as_array().map(|a| a.len()) == Some(2)
    });

    let profile = tempfile::tempdir().unwrap();
    let d = Driver::start(profile.path());

    // The Traces page lists it, with its service and root span name.
    d.goto(&ui("#/traces"));
    let row = d.wait_for(
        "the exported trace in the trace list",
        PAGE_WAIT,
        &format!(
            "const e = document.querySelector('tr.trace-row[data-trace-id=\"{trace_id}\"]'); \
             return e ? e.innerText : null"
        ),
    );
    let row = row.as_str().unwrap();
    assert!(
        row.contains("py-browser"),
        "trace row lacks its service: {row}"
    );
    assert!(
        row.contains("invoke_agent"),
        "trace row lacks its root span: {row}"
    );
    let traces_png = d.screenshot("e2e-traces.png");

    // Its waterfall (reached by clicking the row) shows both spans by name, both ended.
    d.js(&format!(
        "document.querySelector('tr.trace-row[data-trace-id=\"{trace_id}\"]').click(); return true"
    ));
    let rows = d.wait_for(
        "two waterfall rows",
        PAGE_WAIT,
        "const r = document.querySelectorAll('#waterfall .wf-row'); \
         return r.length === 2 ? Array.from(r).map(e => [e.dataset.spanId, e.dataset.state, \
         e.querySelector('.wf-name').innerText]) : null",
    );
    let rows = rows.as_array().unwrap();
    let find = |id: &str| -> &Value {
        rows.iter()
            .find(|r| r[0] == id)
            .unwrap_or_else(|| panic!("span {id} not in the waterfall: {rows:?}"))
    };
    assert!(
        find(&root_id)[2].as_str().unwrap().contains("invoke_agent"),
        "{rows:?}"
    );
    assert!(
        find(&tool_id)[2]
            .as_str()
            .unwrap()
            .contains("execute_tool read_file"),
        "{rows:?}"
    );
    assert_eq!(find(&root_id)[1], "ended", "{rows:?}");
    assert_eq!(find(&tool_id)[1], "ended", "{rows:?}");
    // The exporter set an ERROR status on the tool span: its bar is drawn as an error.
    assert_eq!(
        d.js(&format!(
            "return !!document.querySelector('.wf-row[data-span-id=\"{tool_id}\"] .wf-bar.error')"
        )),
        json!(true)
    );
    let trace_png = d.screenshot("e2e-trace.png");

    // 2. A real Python runner deadlocks inside its tool span (SLA BROWSER_SLA_MS).
    let runner = "py-browser-deadlock";
    let reg = python_runner(&server, runner, "deadlock", None, &[]);
    let pid = reg["pid"].as_u64().unwrap();
    let mut open = Value::Null;
    wait_until!(Duration::from_secs(60), "the runner's open tool span", {
        let (st, page) = server.get_json(&format!("/api/v1/open-spans?runner_id={runner}"));
        assert_eq!(st, 200, "{page}");
        if let Some(o) = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["tool_name"] == "run_notebook")
        {
            open = o.clone();
        }
        !open.is_null()
    });
    let span_trace = open["trace_id"].as_str().unwrap().to_string();
    let span_id = open["span_id"].as_str().unwrap().to_string();

    // The trace view draws it as running (open state, `.wf-bar.open`, "running" label and
    // details) while it is still within its SLA.
    d.goto(&ui(&format!("#/span/{span_trace}/{span_id}")));
    let running = d.wait_for(
        "the runner's tool span drawn as running",
        PAGE_WAIT,
        &format!(
            "const r = document.querySelector('#waterfall .wf-row[data-span-id=\"{span_id}\"]'); \
             const det = document.getElementById('span-details'); \
             return r && r.dataset.state === 'open' && r.querySelector('.wf-bar.open') \
               && r.querySelector('.wf-label.running') && det && det.dataset.spanId === '{span_id}' \
               ? [r.innerText, det.innerText] : null"
        ),
    );
    let (row, details) = (running[0].as_str().unwrap(), running[1].as_str().unwrap());
    assert!(row.contains("run_notebook"), "{row}");
    assert!(
        row.contains("running"),
        "waterfall row not labelled running: {row}"
    );
    assert!(
        details.contains("running"),
        "span details not running: {details}"
    );
    let running_png = d.screenshot("e2e-running.png");

    // The Now page shows the runner (CLOSED, its worst open tool span) and the open span.
    d.goto(&ui("#/now"));
    let now = d.wait_for(
        "the runner card and the open span on the Now page",
        PAGE_WAIT,
        &format!(
            "const c = document.querySelector('.runner[data-runner-id=\"{runner}\"]'); \
             const o = document.querySelector('tr.open-span[data-span-id=\"{span_id}\"]'); \
             return c && o && c.innerText.includes('run_notebook') ? [c.innerText, o.innerText] : null"
        ),
    );
    let (card, open_row) = (now[0].as_str().unwrap(), now[1].as_str().unwrap());
    assert!(
        card.contains("CLOSED"),
        "runner card not CLOSED before the trip: {card}"
    );
    assert!(
        card.contains(&pid.to_string()),
        "runner card lacks pid {pid}: {card}"
    );
    for needle in ["run_notebook", runner, "running"] {
        assert!(
            open_row.contains(needle),
            "open-span row lacks {needle:?}: {open_row}"
        );
    }
    let now_png = d.screenshot("e2e-now.png");
    // Everything above was seen before the trip: no breaker.opened exists yet.
    let before: Vec<Value> = incidents(&server, runner);
    assert!(
        !before.iter().any(|i| i["event"] == "breaker.opened"),
        "the breaker opened before the running span was checked (raise BROWSER_SLA_MS): {before:#?}"
    );

    // 3. The Incidents page, loaded once and never reloaded, shows the trip live.
    d.goto(&ui("#/incidents"));
    d.wait_for(
        "the incidents list and the live connection",
        PAGE_WAIT,
        "return document.getElementById('live').classList.contains('on') \
           && !!document.querySelector('.timeline .incident, .timeline .empty')",
    );
    d.js("window.__stallwatch_no_reload = 4242; return true");
    let shown_at_load =
        d.js("return document.querySelectorAll('.incident[data-event=\"breaker.opened\"]').length");
    let opened_yet = incidents(&server, runner)
        .iter()
        .any(|i| i["event"] == "breaker.opened");
    assert!(
        !opened_yet && shown_at_load == json!(0),
        "the breaker opened before the Incidents page was ready, so liveness is not shown \
         (raise BROWSER_SLA_MS)"
    );
    let trip_wait = Duration::from_millis(BROWSER_SLA_MS) + Duration::from_secs(90);
    let opened = d.wait_for(
        "breaker.opened to appear live",
        trip_wait,
        "const e = document.querySelector('.incident[data-event=\"breaker.opened\"]'); \
         return e ? e.innerText : null",
    );
    let opened = opened.as_str().unwrap();
    assert!(opened.contains(&format!("runner {runner}")), "{opened}");
    assert!(opened.contains("span run_notebook"), "{opened}");
    let terminated = d.wait_for(
        "runner.terminated to appear live",
        PAGE_WAIT,
        "const e = document.querySelector('.incident[data-event=\"runner.terminated\"]'); \
         return e ? e.innerText : null",
    );
    let terminated = terminated.as_str().unwrap();
    assert!(
        terminated.contains(&format!("runner {runner}")),
        "{terminated}"
    );
    assert!(
        terminated.contains("SIGTERM at"),
        "no SIGTERM step shown: {terminated}"
    );
    assert_eq!(
        d.js("return window.__stallwatch_no_reload"),
        json!(4242),
        "the page reloaded"
    );
    // The page's incidents are the server's (same ids).
    let api_opened = incidents(&server, runner)
        .into_iter()
        .find(|i| i["event"] == "breaker.opened")
        .expect("breaker.opened in the API");
    let page_id = d.js(
        "return document.querySelector('.incident[data-event=\"breaker.opened\"]').dataset.incidentId",
    );
    let api_id = match &api_opened["id"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    assert_eq!(page_id.as_str().unwrap(), api_id, "{api_opened:#}");
    let incident_png = d.screenshot("e2e-incident.png");

    // Afterwards the trace view shows the span ended by stallwatch as an error.
    d.goto(&ui(&format!("#/span/{span_trace}/{span_id}")));
    d.wait_for(
        "the tool span ended as an error after the trip",
        PAGE_WAIT,
        &format!(
            "const r = document.querySelector('#waterfall .wf-row[data-span-id=\"{span_id}\"]'); \
             return r && r.dataset.state === 'ended' && !!r.querySelector('.wf-bar.error')"
        ),
    );

    for p in [
        &traces_png,
        &trace_png,
        &running_png,
        &now_png,
        &incident_png,
    ] {
        assert!(
            std::fs::metadata(p).unwrap().len() > 1000,
            "{}",
            p.display()
        );
    }
    drop(d);
    assert_eq!(server.stop(), Some(0));
}

/// How long one dashboard page load may take here (a loaded 2-core box loads one in well
/// under a second; a load queued behind Chromium's 6 connections per host waited ~56 s).
const PAGE_LOAD_BOUND: Duration = Duration::from_secs(15);

/// Issue 13's stalled navigation: Chromium keeps a page it leaves in its back/forward cache,
/// and with it the page's open `EventSource` and the HTTP/1.1 connection under it (one of
/// its 6 per host). Six Now pages left that way (each with `/api/v1/events?board=1` open)
/// made the seventh page load wait ~1 min for a connection. The UI closes its streams on
/// `pagehide` and reopens the live one on `pageshow` from that cache; the logs live tail
/// also ends when its view is left.
#[test]
fn dashboard_pages_left_in_the_back_forward_cache_hold_no_connection() {
    find_binary(
        "STALLWATCH_CHROMIUM",
        &["/usr/bin/chromium", "/usr/bin/chromium-browser"],
    );
    find_binary(
        "STALLWATCH_CHROMEDRIVER",
        &["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"],
    );
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let now_page = server.api("/#/");
    let profile = tempfile::tempdir().unwrap();
    let d = Driver::start(profile.path());
    let live_open = "return document.getElementById('live').textContent === 'live' \
                     && state.es !== null && state.es.readyState === 1";

    // More page loads than Chromium's 6 connections per host, each left with its stream open.
    for i in 0..9 {
        d.goto("about:blank");
        let t = std::time::Instant::now();
        d.goto(&now_page);
        d.wait_for("the Now page's live stream open", PAGE_WAIT, live_open);
        let took = t.elapsed();
        assert!(
            took < PAGE_LOAD_BOUND,
            "dashboard page load {i} took {took:?} (pages left earlier still hold connections?)"
        );
    }

    // The premise: the page left for about:blank comes back from the back/forward cache
    // (same window object), and its live stream is reopened. Chromium may decline to keep a
    // page (a fetch still in flight when it was left, memory pressure on a loaded box): up to
    // four tries, each from a settled page; the test fails when none is restored, with
    // Chromium's reasons (`notRestoredReasons`).
    let mut reasons = Vec::new();
    let restored = (0..4).any(|attempt| {
        d.wait_for("the Now page's live stream open", PAGE_WAIT, live_open);
        std::thread::sleep(Duration::from_millis(300 * (attempt + 1)));
        d.js("window.__kept = true; return 1");
        d.goto("about:blank");
        d.js("history.back(); return 1");
        d.wait_for(
            "the Now page back",
            PAGE_WAIT,
            "return location.hash === '#/' && document.readyState === 'complete'",
        );
        let kept = d.js("return window.__kept === true") == json!(true);
        if !kept {
            reasons.push(d.js(
                "const n = performance.getEntriesByType('navigation')[0]; \
                 return n && n.notRestoredReasons ? JSON.stringify(n.notRestoredReasons) : 'none given'",
            ));
        }
        kept
    });
    assert!(
        restored,
        "the page was never restored from Chromium's back/forward cache in 4 tries: this test \
         no longer tests it; Chromium's reasons: {reasons:?}"
    );
    d.wait_for(
        "the live stream reopened after pageshow",
        PAGE_WAIT,
        live_open,
    );

    // The logs live tail ends when its view is left.
    d.js(
        "const Real = window.EventSource; window.__streams = []; \
         window.EventSource = function (url) { const es = new Real(url); window.__streams.push(es); return es; }; \
         location.hash = '#/logs'; return 1",
    );
    d.wait_for(
        "the logs view",
        PAGE_WAIT,
        "return !!document.getElementById('logs-live')",
    );
    d.js("document.getElementById('logs-live').click(); return 1");
    d.wait_for(
        "the logs live tail open",
        PAGE_WAIT,
        "return window.__streams.length === 1 && window.__streams[0].readyState === 1",
    );
    d.js("location.hash = '#/traces'; return 1");
    d.wait_for(
        "the logs live tail closed with its view",
        Duration::from_secs(10),
        "return window.__streams[0].readyState === 2",
    );
    drop(d);
    assert_eq!(server.stop(), Some(0));
}
