//! The web UI of a running `stallwatch serve` in a real headless Chromium (Debian's
//! `chromium` + `chromium-driver`), driven over the W3C WebDriver protocol with a few JSON
//! calls (reqwest; the approach of the dashboards crate's browser test, copied here because
//! the root test target cannot import another crate's tests).
//!
//! One whole-system run: a real Python OpenTelemetry SDK exporter feeds the server → the
//! Traces page lists its trace and the waterfall shows both spans; a real Python runner
//! (project kit) deadlocks inside a tool span → before its SLA passes the trace view draws
//! that span as running and the Now page shows the runner and the open span; with the
//! Incidents page loaded and never reloaded, the trip (`breaker.opened`, then
//! `runner.terminated`) appears live over Server-Sent Events. Screenshots land in
//! `tests/artifacts/e2e-*.png` (gitignored).
//!
//! Missing Chromium or chromedriver is a failure with the install hint, never a skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::chain::{chain_config, incidents, python_runner, SLA_MS};
use crate::support::*;

/// The tool SLA of this test, ms: long enough that a loaded 2-core box can load the trace
/// view and the Now page while the span is still within it (the chain tests use 2000 ms).
const BROWSER_SLA_MS: u64 = 20_000;
/// Deadline of each wait on the page (Chromium on a loaded CI box is slow).
pub(crate) const PAGE_WAIT: Duration = Duration::from_secs(60);

pub(crate) fn find_binary(env: &str, candidates: &[&str]) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        assert!(p.exists(), "{env}={} does not exist", p.display());
        return p;
    }
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "none of {candidates:?} exists: this test needs a real headless Chromium. \
                 Install Debian's chromium and chromium-driver (`apt-get install chromium \
                 chromium-driver`, done by scripts/setup-test-env) or set {env}"
            )
        })
}

/// Decodes standard base64 (the WebDriver screenshot encoding).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: byte {c}"),
        }
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'=')
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= val(*c) << (18 - 6 * i);
        }
        let n = chunk.len() * 6 / 8;
        for i in 0..n {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// A chromedriver child and one browser session. Dropping it (also on panic) ends the
/// session (closing Chromium) and kills chromedriver.
pub(crate) struct Driver {
    child: Child,
    base: String,
    session: String,
    http: reqwest::blocking::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let url = format!("{}/session/{}", self.base, self.session);
            let _ = self
                .http
                .delete(url)
                .timeout(Duration::from_secs(20))
                .send();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    pub(crate) fn start(profile: &Path) -> Driver {
        let chromedriver = find_binary(
            "STALLWATCH_CHROMEDRIVER",
            &["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"],
        );
        let chromium = find_binary(
            "STALLWATCH_CHROMIUM",
            &["/usr/bin/chromium", "/usr/bin/chromium-browser"],
        );
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let child = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
        let http = reqwest::blocking::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let mut driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            http,
        };
        let ready = || -> bool {
            let Ok(r) = driver.http.get(format!("{}/status", driver.base)).send() else {
                return false;
            };
            let v: Value = r.json().unwrap_or(Value::Null);
            v["value"]["ready"] == true
        };
        wait_until!(Duration::from_secs(60), "chromedriver to be ready", ready());
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    "--disable-dev-shm-usage", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }
        }}});
        let v: Value = driver
            .http
            .post(format!("{}/session", driver.base))
            .json(&caps)
            .send()
            .unwrap_or_else(|e| panic!("WebDriver new session: {e}"))
            .json()
            .unwrap();
        driver.session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session (Chromium did not start?): {v}"))
            .to_string();
        driver
    }

    fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{}", self.base, self.session, path);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req
            .send()
            .unwrap_or_else(|e| panic!("WebDriver {path}: {e}"))
            .json()
            .unwrap();
        if v["value"].get("error").is_some() {
            panic!("WebDriver {path}: {v}");
        }
        v["value"].clone()
    }

    pub(crate) fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({ "url": url })));
    }

    pub(crate) fn js(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Runs `script` with `args` (its `arguments`); answers what it returns.
    pub(crate) fn js_with(&self, script: &str, args: Value) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
    }

    /// Types `text` into the element `css` (for an `<input type=file>`: the path of a
    /// file to choose, as a user picking it would).
    pub(crate) fn send_keys(&self, css: &str, text: &str) {
        let el = self.cmd(
            reqwest::Method::POST,
            "/element",
            Some(json!({ "using": "css selector", "value": css })),
        );
        let id = el
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {el}"))
            .to_string();
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        );
    }

    /// Polls `script` until it returns a truthy value; panics with `what` and the page's
    /// text after `timeout`.
    pub(crate) fn wait_for(&self, what: &str, timeout: Duration, script: &str) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.js(script);
            if !(v.is_null() || v == json!(false) || v == json!(0) || v == json!("")) {
                return v;
            }
            if Instant::now() > deadline {
                let page = self.js("return document.body.innerText");
                panic!("timed out after {timeout:?} waiting for {what}; page shows:\n{page}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Saves a PNG of the viewport to `tests/artifacts/{name}` (`name` may hold a folder);
    /// answers its path.
    pub(crate) fn screenshot(&self, name: &str) -> PathBuf {
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None);
        let png = base64_decode(v.as_str().unwrap());
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n"),
            "screenshot is not a PNG"
        );
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/artifacts")
            .join(name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&path, png).unwrap();
        path
    }
}

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
