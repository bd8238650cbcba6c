//! `stallwatch serve` as a child: started on port 0 everywhere with a temp data folder, its
//! JSON ready line read (docs/design.md, Interfaces: the ready line), stopped in order
//! (SIGTERM) or crashed (SIGKILL).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The `stallwatch` binary under test: `STALLWATCH_BIN` when set, else the one Cargo built
/// beside the running test executable (`target/<profile>/stallwatch`, one folder above
/// `deps/`), which Cargo always builds for the root package's integration tests.
pub fn stallwatch_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("STALLWATCH_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("stallwatch");
    assert!(
        bin.exists(),
        "no stallwatch binary at {} (build it, or set STALLWATCH_BIN)",
        bin.display()
    );
    bin
}

/// The first line `serve` prints on stdout (its ready line), within `timeout`; `None` when
/// none came. A thread keeps draining the rest so the child never blocks on a full pipe.
pub fn read_ready_line(stdout: ChildStdout, timeout: Duration) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    rx.recv_timeout(timeout).ok()
}

/// A running `stallwatch serve`.
pub struct Server {
    /// The `serve` process.
    pub child: Child,
    /// Its data folder.
    pub data_dir: PathBuf,
    /// OTLP/gRPC address it bound.
    pub grpc: SocketAddr,
    /// OTLP/HTTP address it bound.
    pub http: SocketAddr,
    /// Dashboard address it bound.
    pub dashboard: SocketAddr,
    /// The ready line, parsed.
    pub ready: serde_json::Value,
    /// Where its stderr goes.
    pub stderr_path: PathBuf,
}

/// How to start a [`Server`].
pub struct ServerOpts {
    /// Data folder (created when missing).
    pub data_dir: PathBuf,
    /// TOML config, written beside the data folder and passed with `--config`.
    pub config: Option<String>,
    /// Extra environment variables of the child.
    pub env: Vec<(String, String)>,
}

impl ServerOpts {
    /// Defaults: no config, no extra environment.
    pub fn new(data_dir: &Path) -> Self {
        Self {
            data_dir: data_dir.to_path_buf(),
            config: None,
            env: vec![],
        }
    }
    /// With this TOML config.
    pub fn config(mut self, toml: &str) -> Self {
        self.config = Some(toml.to_string());
        self
    }
}

impl Server {
    /// Starts with defaults on `data_dir`.
    pub fn start(data_dir: &Path) -> Server {
        Self::start_with(ServerOpts::new(data_dir))
    }

    /// Starts `serve` on port 0 everywhere and waits (60 s) for its ready line.
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
        let mut cmd = Command::new(stallwatch_bin());
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
        let line = match read_ready_line(stdout, Duration::from_secs(60)) {
            Some(l) => l,
            None => {
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

    /// The control bearer token from the data folder.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("token"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// URL of a dashboard path.
    pub fn api(&self, path: &str) -> String {
        format!("http://{}{}", self.dashboard, path)
    }

    /// URL of an OTLP/HTTP path.
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

    /// The value of the first `/metrics` line that starts with `line_prefix` (a metric
    /// name and a space, or a name with its labels), or `None` when there is no such line.
    pub fn metric(&self, line_prefix: &str) -> Option<u64> {
        let text = http_client()
            .get(self.api("/metrics"))
            .send()
            .unwrap()
            .text()
            .unwrap();
        text.lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
    }

    /// What it wrote on stderr so far.
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

/// A blocking HTTP client without proxies, 30 s timeout.
pub fn http_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}
