//! Helpers: start `stallwatch serve` on port 0 with a temp data folder, read its `ready`
//! line, talk to it, stop it gracefully or with SIGKILL.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Polls `cond` every 50 ms until it is true or `timeout` passes; panics with `what`.
macro_rules! wait_until {
    ($timeout:expr, $what:expr, $cond:expr) => {{
        let deadline = std::time::Instant::now() + $timeout;
        loop {
            if $cond {
                break;
            }
            if std::time::Instant::now() > deadline {
                panic!("timed out waiting for {}", $what);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }};
}

/// The binary under test: `STALLWATCH_BIN` when set (e.g. a release build for the
/// benchmarks), else the one Cargo built for this test target.
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("STALLWATCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_stallwatch").into())
    })
}

/// The Python interpreter with the OpenTelemetry SDK: `STALLWATCH_TEST_PYTHON`, else the
/// project venv, else `python3`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("STALLWATCH_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("python3")
}

pub fn test_data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(rel)
}

/// A running `stallwatch serve`.
pub struct Server {
    pub child: Child,
    pub data_dir: PathBuf,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub dashboard: SocketAddr,
    pub ready: serde_json::Value,
    pub stderr_path: PathBuf,
}

pub struct ServerOpts {
    pub data_dir: PathBuf,
    pub config: Option<String>,
    pub env: Vec<(String, String)>,
}

impl ServerOpts {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            data_dir: data_dir.to_path_buf(),
            config: None,
            env: vec![],
        }
    }
    pub fn config(mut self, toml: &str) -> Self {
        self.config = Some(toml.to_string());
        self
    }
}

impl Server {
    pub fn start(data_dir: &Path) -> Server {
        Self::start_with(ServerOpts::new(data_dir))
    }

    pub fn start_with(opts: ServerOpts) -> Server {
        std::fs::create_dir_all(&opts.data_dir).unwrap();
        let stderr_path = opts.data_dir.with_extension(format!(
            "stderr.{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut cmd = Command::new(bin());
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(&opts.data_dir)
            .args(["--otlp-grpc-listen", "127.0.0.1:0"])
            .args(["--otlp-http-listen", "127.0.0.1:0"])
            .args(["--dashboard-listen", "127.0.0.1:0"])
            .env_remove("STALLWATCH_CONFIG")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        if let Some(toml) = &opts.config {
            let p = opts.data_dir.with_extension("toml");
            std::fs::write(&p, toml).unwrap();
            cmd.arg("--config").arg(p);
        }
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn stallwatch");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "stallwatch printed no ready line; stderr:\n{}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default()
                );
            }
        };
        let ready: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("ready line is not JSON ({e}): {line}"));
        assert_eq!(ready["event"], "ready", "{line}");
        let addr = |k: &str| -> SocketAddr {
            ready[k]
                .as_str()
                .unwrap_or_else(|| panic!("ready line lacks {k}: {line}"))
                .parse()
                .unwrap()
        };
        Server {
            grpc: addr("otlp_grpc"),
            http: addr("otlp_http"),
            dashboard: addr("dashboard"),
            data_dir: opts.data_dir,
            ready,
            child,
            stderr_path,
        }
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("token"))
            .unwrap()
            .trim()
            .to_string()
    }

    pub fn api(&self, path: &str) -> String {
        format!("http://{}{}", self.dashboard, path)
    }

    pub fn otlp_http(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// GET a JSON API path; answers (status, body).
    pub fn get_json(&self, path: &str) -> (u16, serde_json::Value) {
        let resp = http_client().get(self.api(path)).send().unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// SIGTERM and wait (up to 30 s); answers the exit code.
    pub fn stop(mut self) -> Option<i32> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "stallwatch did not stop within 30 s of SIGTERM; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL (a crash) and reap.
    pub fn crash(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    /// An ordered stop (SIGTERM), so the runners it spawned are terminated too; SIGKILL
    /// only if it does not stop within 15 s. Tests that want a crash call `crash()`.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = self.child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn http_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Looks up a span by name in a `GET /api/v1/traces/{id}` answer.
pub fn span_named<'a>(trace: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    trace["spans"]
        .as_array()
        .unwrap_or_else(|| panic!("no spans in {trace}"))
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no span named {name} in {trace:#}"))
}

/// The value of attribute `key` in an OTLP KeyValue list, as its AnyValue JSON.
pub fn attr<'a>(attrs: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    attrs
        .as_array()
        .unwrap_or_else(|| panic!("attributes are not a list: {attrs}"))
        .iter()
        .find(|kv| kv["key"] == key)
        .map(|kv| &kv["value"])
        .unwrap_or_else(|| panic!("no attribute {key} in {attrs}"))
}
