//! The web UI in a real headless Chromium, driven over the W3C WebDriver protocol
//! (Debian's `chromium` + `chromium-driver`; a few JSON calls with reqwest, no extra crate).
//!
//! Against a running dashboard seeded with spans (one of them open): the trace list shows
//! both traces, the waterfall shows the spans with the open one drawn as running, and an
//! incident published after page load appears without a reload. Screenshots land in
//! `dashboards/tests/artifacts/` (gitignored).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use stallwatch_dashboards::DashboardConfig;
use stallwatch_storage::model::EventKind;

use crate::common::*;

fn find_binary(env: &str, candidates: &[&str]) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("none of {candidates:?} exists; install Debian's chromium and chromium-driver (or set {env})"))
}

struct Driver {
    child: Child,
    base: String,
    session: String,
    http: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    async fn start(profile: &std::path::Path) -> Self {
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let mut driver = Driver {
            child,
            base,
            session: String::new(),
            http,
        };
        let up = eventually(Duration::from_secs(30), || async {
            let r = driver
                .http
                .get(format!("{}/status", driver.base))
                .send()
                .await
                .ok()?;
            let v: Value = r.json().await.ok()?;
            v["value"]["ready"].as_bool().filter(|r| *r)
        })
        .await;
        assert!(up.is_some(), "chromedriver did not become ready");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    "--disable-dev-shm-usage", "--window-size=1280,800",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }
        }}});
        let v: Value = driver
            .http
            .post(format!("{}/session", driver.base))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        driver.session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {v}"))
            .to_string();
        driver
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{}", self.base, self.session, path);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        if v["value"].get("error").is_some() {
            panic!("WebDriver {path}: {v}");
        }
        v["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    async fn js(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Polls `script` until it returns a truthy value; panics with `what` after 20 s.
    async fn wait_for(&self, what: &str, script: &str) -> Value {
        let got = eventually(Duration::from_secs(20), || async {
            let v = self.js(script).await;
            let truthy = !(v.is_null() || v == json!(false) || v == json!(0) || v == json!(""));
            truthy.then_some(v)
        })
        .await;
        match got {
            Some(v) => v,
            None => {
                let html = self
                    .js("return document.getElementById('view').innerText")
                    .await;
                panic!("timed out waiting for {what}; page shows: {html}")
            }
        }
    }

    async fn screenshot(&self, name: &str) {
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/artifacts");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), png).unwrap();
    }

    async fn quit(&self) {
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = self.http.delete(url).send().await;
    }
}

#[tokio::test]
async fn ui_shows_traces_open_spans_and_live_incidents() {
    let h = Harness::start(DashboardConfig::default()).await;
    seed(&h).await;
    let profile = tempfile::tempdir().unwrap();
    let d = Driver::start(profile.path()).await;

    // Trace list.
    d.goto(&h.url("/#/traces")).await;
    let rows = d
        .wait_for("two trace rows", "const r = document.querySelectorAll('tr.trace-row'); return r.length === 2 ? Array.from(r).map(e => e.dataset.traceId) : null")
        .await;
    let mut ids: Vec<String> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, vec![TRACE_A.to_string(), TRACE_B.to_string()]);
    d.screenshot("traces.png").await;

    // Waterfall, reached by clicking the row of trace A.
    d.js(&format!(
        "document.querySelector('tr.trace-row[data-trace-id=\"{TRACE_A}\"]').click(); return true"
    ))
    .await;
    let spans = d
        .wait_for("three waterfall rows", "const r = document.querySelectorAll('#waterfall .wf-row'); return r.length === 3 ? Array.from(r).map(e => [e.dataset.spanId, e.dataset.state, e.innerText]) : null")
        .await;
    let spans = spans.as_array().unwrap();
    let find = |id: &str| {
        spans
            .iter()
            .find(|s| s[0] == id)
            .unwrap_or_else(|| panic!("span {id} not in waterfall: {spans:?}"))
    };
    assert_eq!(find(ROOT)[1], "ended");
    assert_eq!(find(TOOL)[1], "ended");
    assert!(find(TOOL)[2]
        .as_str()
        .unwrap()
        .contains("execute_tool run_notebook"));
    assert_eq!(find(OPEN)[1], "open");
    assert!(
        find(OPEN)[2].as_str().unwrap().contains("running"),
        "open span not drawn as running: {:?}",
        find(OPEN)
    );
    let open_bar_running = d
        .js(&format!(
            "return !!document.querySelector('.wf-row[data-span-id=\"{OPEN}\"] .wf-bar.open')"
        ))
        .await;
    assert_eq!(open_bar_running, json!(true));
    // Span details and the trace's logs beside the waterfall.
    d.js(&format!(
        "document.querySelector('.wf-row[data-span-id=\"{TOOL}\"]').click(); return true"
    ))
    .await;
    let details = d.wait_for("span details", "const e = document.getElementById('span-details'); return e && e.dataset.spanId === '00f067aa0ba902b7' ? e.innerText : null").await;
    let details = details.as_str().unwrap();
    for needle in [
        "gen_ai.tool.name",
        "run_notebook",
        "exception",
        "TimeoutError",
        "service.name",
        "python-runner",
        "notebook cell 7 timed out",
    ] {
        assert!(
            details.contains(needle),
            "span details lack {needle:?}: {details}"
        );
    }
    let logs = d
        .js("return document.getElementById('trace-logs').innerText")
        .await;
    assert!(
        logs.as_str().unwrap().contains("cell 7 still running"),
        "{logs}"
    );
    assert!(
        d.js("return location.hash")
            .await
            .as_str()
            .unwrap()
            .ends_with(TOOL),
        "deep link not updated"
    );
    d.screenshot("trace.png").await;

    // Deep link straight to the open span.
    d.goto(&h.url(&format!("/#/span/{TRACE_A}/{OPEN}"))).await;
    let sel = d.wait_for("open span selected", "const e = document.getElementById('span-details'); return e && e.dataset.spanId === '53995c3f42cd8ad8' ? e.innerText : null").await;
    assert!(sel.as_str().unwrap().contains("running"), "{sel}");

    // Incidents: a new one appears live, without a reload.
    d.goto(&h.url("/#/incidents")).await;
    d.wait_for(
        "seeded incidents",
        "return document.querySelectorAll('.timeline .incident').length === 2",
    )
    .await;
    d.wait_for(
        "live connection",
        "return document.getElementById('live').classList.contains('on')",
    )
    .await;
    let timeline = d
        .js("return document.querySelector('.timeline').innerText")
        .await;
    for needle in [
        "SIGTERM at",
        "exited at",
        "SIGKILL at",
        "rolled back",
        "runner nb-1",
        "span run_notebook",
    ] {
        assert!(
            timeline.as_str().unwrap().contains(needle),
            "timeline lacks {needle:?}: {timeline}"
        );
    }
    d.js("window.__stallwatch_no_reload = 42; return true")
        .await;
    let mut inc = incident(EventKind::RunnerTerminated, "live-1");
    inc.reason = "runner nb-1 terminated after tool span run_notebook overran".into();
    let recorded = h.events.publish(inc).await.unwrap().unwrap();
    let shown = d
        .wait_for("live incident", &format!("const e = document.querySelector('.incident[data-incident-id=\"{}\"]'); return e ? e.innerText : null", recorded.id))
        .await;
    assert!(
        shown
            .as_str()
            .unwrap()
            .contains("terminated after tool span"),
        "{shown}"
    );
    assert_eq!(
        d.js("return window.__stallwatch_no_reload").await,
        json!(42),
        "the page reloaded"
    );

    // Now page: runner cards with breaker state and the open span with its progress.
    d.goto(&h.url("/#/now")).await;
    let now = d.wait_for("runner cards", "return document.querySelectorAll('.runner').length === 2 ? document.getElementById('view').innerText : null").await;
    let now = now.as_str().unwrap();
    for needle in ["nb-1", "CLOSED", "py-2", "OPEN", "plot_results", "running"] {
        assert!(now.contains(needle), "Now page lacks {needle:?}: {now}");
    }
    d.screenshot("now.png").await;

    // Dark theme through prefers-color-scheme (Chrome DevTools emulation via chromedriver).
    d.cmd(
        reqwest::Method::POST,
        "/goog/cdp/execute",
        Some(json!({"cmd": "Emulation.setEmulatedMedia", "params": {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}})),
    )
    .await;
    let bg = d
        .wait_for("dark background", "const c = getComputedStyle(document.body).backgroundColor; return c === 'rgb(15, 18, 23)' ? c : null")
        .await;
    assert_eq!(bg, json!("rgb(15, 18, 23)"));
    d.screenshot("now-dark.png").await;
    d.quit().await;
    drop(d);
    h.stop().await;
}
