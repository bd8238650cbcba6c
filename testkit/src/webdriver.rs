//! The WebDriver harness: a chromedriver child and one headless Chromium session (Debian's
//! `chromium` + `chromium-driver`), driven over the W3C WebDriver protocol with a few JSON
//! calls (blocking reqwest): navigate, run a script, wait for a script to answer truthy,
//! take a screenshot. Missing Chromium or chromedriver is a failure with the install hint.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Deadline of each wait on the page (Chromium on a loaded CI box is slow).
pub const PAGE_WAIT: Duration = Duration::from_secs(60);

/// A tool's path: the variable `env` when set (it must exist), else the first existing
/// of `candidates`. None found: a failure with the install hint, never a skip.
pub fn find_binary(env: &str, candidates: &[&str]) -> PathBuf {
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
pub struct Driver {
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
    /// Starts chromedriver on a free port and a headless Chromium session whose profile is
    /// `profile` (a temp folder).
    pub fn start(profile: &Path) -> Driver {
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
        crate::wait_until!(Duration::from_secs(60), "chromedriver to be ready", ready());
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

    /// Navigates to `url`.
    pub fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page; answers its return value.
    pub fn js(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Polls `script` until it returns a truthy value; panics with `what` and the page's
    /// text after `timeout`.
    pub fn wait_for(&self, what: &str, timeout: Duration, script: &str) -> Value {
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
    pub fn screenshot(&self, name: &str) -> PathBuf {
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None);
        let png = base64_decode(v.as_str().unwrap());
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n"),
            "screenshot is not a PNG"
        );
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/artifacts")
            .join(name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&path, png).unwrap();
        path
    }

    /// Runs `script` with `args` (its `arguments`); answers what it returns.
    pub fn js_with(&self, script: &str, args: Value) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
    }

    /// Types `text` into the element `css` (for an `<input type=file>`: the path of a
    /// file to choose, as a user picking it would).
    pub fn send_keys(&self, css: &str, text: &str) {
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

    /// Runs the Chrome DevTools command `cmd` with `params` through chromedriver's
    /// `goog/cdp/execute` (e.g. `Emulation.setEmulatedMedia` for a dark colour scheme).
    pub fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/goog/cdp/execute",
            Some(json!({ "cmd": cmd, "params": params })),
        )
    }
}
