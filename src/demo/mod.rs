//! `stallwatch demo`: one command that shows the whole chain on real stalled runners.
//!
//! It starts `stallwatch serve` as a child (this same binary) with a throw-away data folder,
//! port 0 everywhere and scaled-down timings, creates a throw-away workspace and hashes every
//! file in it, then registers six real Python runners built on the runner kit
//! (`integrations/python`): one healthy, and four that hang inside a tool span in the ways
//! real MCP runners do (two threads deadlocked, a read with no timeout, a GUI event loop, a
//! half-written CSV in the checkpoint folder). It follows the incident stream
//! (`GET /api/v1/events`) and prints a timeline as it happens, waits until the four are
//! stopped and the checkpoint rolled back, checks the healthy runner was never tripped and
//! that the workspace is byte-for-byte as before, and prints a summary. Exit 0 when all of
//! that happened, 1 otherwise (docs/design.md: Fusion and breakers, Reaper, Checkpoints).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
#[cfg(unix)]
use std::os::unix::process::CommandExt;
#[cfg(windows)]
use std::os::windows::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::cli::DemoArgs;

mod files;
mod report;

use files::{differing, hash_tree, make_workspace, python_has, read_ready, read_sse, tail};

/// The misbehaving runner script (built on the Python kit), written into the temp folder.
const RUNNER_SCRIPT: &str = include_str!("../../tests/python/runners/stalled.py");

/// Heartbeat interval of the demo sidecar, ms.
const HEARTBEAT_INTERVAL_MS: u64 = 250;
/// Heartbeat timeout of the demo sidecar, ms. Generous: the stalled runners are caught by
/// their tool SLA (their heartbeat thread keeps answering), and on a loaded machine a
/// 1500 ms timeout tripped the healthy runner.
const HEARTBEAT_TIMEOUT_MS: u64 = 3000;
/// Grace between SIGTERM and SIGKILL, ms.
const GRACE_MS: u64 = 1500;
/// Staleness limit of refreshed open spans, ms.
const STALENESS_MS: u64 = 4000;
/// Breaker cooldown, ms: long, so the breakers stay OPEN for the whole demo.
const BREAKER_COOLDOWN_MS: u64 = 3_600_000;
/// How long `serve` may take to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Base bound on waiting for the four stalled runners to be handled (plus 3 SLAs).
const OUTCOME_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the timeline keeps following after the expected outcome.
const SETTLE: Duration = Duration::from_secs(1);
/// How long the sidecar may take to shut down after `POST /api/v1/shutdown`.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Id of the healthy runner.
const HEALTHY: &str = "py-ok";
/// Id of the runner that writes half a CSV into its checkpoint.
const CSV: &str = "py-csv";
/// Id of the runner that ignores SIGTERM, so the SIGKILL after the grace is visible.
const NO_TERM: &str = "py-noterm";
/// The six runners: (id, mode of stalled.py, what it does).
const RUNNERS: [(&str, &str, &str); 6] = [
    (
        HEALTHY,
        "healthy",
        "short tool spans, each well within the SLA",
    ),
    (
        "py-deadlock",
        "deadlock",
        "two threads deadlock inside a tool span",
    ),
    (
        "py-read",
        "read_block",
        "a read with no timeout on a pipe nobody writes",
    ),
    (
        "py-gui",
        "gui",
        "plt.show() with an interactive backend forced",
    ),
    (
        CSV,
        "half_csv",
        "half a CSV written into its checkpoint, then hangs",
    ),
    (
        NO_TERM,
        "ignore_term",
        "ignores SIGTERM: its handler never runs while a C call holds the main thread",
    ),
];

/// Runs the demo; an error (exit 1) when something did not happen as expected.
pub fn run(args: DemoArgs) -> Result<()> {
    let interrupted = watch_ctrl_c();
    let python = pick_python(args.python.as_deref());
    check_python(&python)?;
    let mut demo = Demo::start(&python, args.sla_ms)?;
    let outcome = demo.follow(&interrupted);
    if args.keep && !interrupted.load(Ordering::SeqCst) {
        println!();
        println!(
            "--keep: the sidecar is still running; browse {}  (Ctrl-C to stop and clean up)",
            demo.dashboard_url()
        );
        while !interrupted.load(Ordering::SeqCst) && demo.sidecar_alive() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    demo.shutdown();
    outcome
}

/// Python interpreter: `--python` / `$STALLWATCH_DEMO_PYTHON` (clap reads both), else
/// `./.venv/bin/python` when it exists, else `python3`. A relative path with a `/` is made
/// absolute against the current folder (the runners start in another folder); a bare name
/// is left for `PATH`.
fn pick_python(flag: Option<&Path>) -> PathBuf {
    if let Some(p) = flag {
        if p.is_relative() && p.components().count() > 1 {
            if let Ok(d) = std::env::current_dir() {
                return d.join(p);
            }
        }
        return p.to_path_buf();
    }
    let venv = Path::new(".venv/bin/python");
    if venv.exists() {
        // Absolute but not canonical: resolving the symlink would leave the venv.
        return std::env::current_dir()
            .map(|d| d.join(venv))
            .unwrap_or_else(|_| venv.to_path_buf());
    }
    PathBuf::from("python3")
}

/// Fails with setup instructions unless `python -c "import stallwatch_runner"` works.
fn check_python(python: &Path) -> Result<()> {
    let out = Command::new(python)
        .args(["-c", "import stallwatch_runner"])
        .stdin(Stdio::null())
        .output();
    let why = match out {
        Ok(o) if o.status.success() => return Ok(()),
        Ok(o) => String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("import failed")
            .to_string(),
        Err(e) => format!("cannot run it: {e}"),
    };
    bail!(
        "the demo needs a Python with the stallwatch runner kit, and `{} -c \"import stallwatch_runner\"` failed ({why}).\n\
         From the repository root run:\n    python3 -m venv .venv && .venv/bin/pip install -e integrations/python\n\
         (or scripts/setup-test-env), then `stallwatch demo` again, or pass --python PATH / set STALLWATCH_DEMO_PYTHON",
        python.display()
    )
}

/// Sets the flag on Ctrl-C (SIGINT) instead of dying, so the demo can clean up.
fn watch_ctrl_c() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    if let Ok(rt) = rt {
        // Register the handler before returning, so a Ctrl-C from now on is caught.
        #[cfg(unix)]
        let signal = rt.block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        });
        #[cfg(windows)]
        let signal = rt.block_on(async { tokio::signal::windows::ctrl_c() });
        if let Ok(mut signal) = signal {
            std::thread::spawn(move || {
                rt.block_on(signal.recv());
                set.store(true, Ordering::SeqCst);
            });
        }
    }
    flag
}

/// Nanoseconds since the Unix epoch now.
fn unix_nano() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A running demo: the temp folders, the sidecar child, the API.
struct Demo {
    /// Root of everything throw-away (data, workspace, config, script, log).
    root: PathBuf,
    workspace: PathBuf,
    sidecar: Child,
    dashboard: String,
    token: String,
    http: Api,
    /// Wall clock at the start, ns since the Unix epoch: timeline zero.
    t0_unix_nano: u64,
    before: BTreeMap<String, String>,
    sla_ms: u64,
    log: PathBuf,
    /// The staging folder of py-csv's checkpoint, from its registration.
    staging: Option<PathBuf>,
    stopped: bool,
}

/// The demo's few calls to its own sidecar, made one at a time and waited for: async
/// `reqwest` on a current-thread runtime (`reqwest::blocking` would add a client thread and
/// its code, ~60 KiB by `cargo bloat`, to the shipping binary, issue 16).
struct Api {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
}

/// A whole answer: its status, `Retry-After` (as sent) and its JSON body (`None` when the
/// body is not JSON).
struct Answer {
    status: reqwest::StatusCode,
    retry_after: Option<String>,
    body: Option<Value>,
}

impl Api {
    fn new() -> Result<Api> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the demo's HTTP runtime")?;
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Api { rt, client })
    }

    fn get(&self, url: String) -> reqwest::RequestBuilder {
        self.client.get(url)
    }

    fn post(&self, url: String) -> reqwest::RequestBuilder {
        self.client.post(url)
    }

    /// Sends `req` and reads the whole answer. Errors: the request could not be sent or the
    /// answer not read (connection, timeout).
    fn call(&self, req: reqwest::RequestBuilder) -> reqwest::Result<Answer> {
        self.rt.block_on(async {
            let resp = req.send().await?;
            let status = resp.status();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let bytes = resp.bytes().await?;
            Ok(Answer {
                status,
                retry_after,
                body: serde_json::from_slice(&bytes).ok(),
            })
        })
    }
}

/// What the incident stream told about one runner.
#[derive(Default)]
struct Seen {
    opened_reason: Option<String>,
    terminated: Option<String>,
    rolled_back: bool,
    /// Events that must never happen to the healthy runner.
    disturbances: Vec<String>,
}

impl Demo {
    fn start(python: &Path, sla_ms: u64) -> Result<Demo> {
        let t0_unix_nano = unix_nano();
        let root = std::env::temp_dir().join(format!(
            "stallwatch-demo-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&root)
            .with_context(|| format!("cannot create {}", root.display()))?;
        let data = root.join("data");
        let workspace = root.join("workspace");
        let config = root.join("stallwatch.toml");
        let log = root.join("sidecar.log");
        let script = root.join("stalled.py");
        std::fs::write(&script, RUNNER_SCRIPT).context("cannot write the runner script")?;
        std::fs::write(&config, demo_config(sla_ms)).context("cannot write the config")?;
        make_workspace(&workspace)?;
        let before = hash_tree(&workspace)?;

        let exe = std::env::current_exe().context("cannot find the stallwatch binary")?;
        let stderr = std::fs::File::create(&log).context("cannot create the sidecar log")?;
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(&data)
            .arg("--config")
            .arg(&config)
            .args(["--otlp-grpc-listen", "127.0.0.1:0"])
            .args(["--otlp-http-listen", "127.0.0.1:0"])
            .args(["--dashboard-listen", "127.0.0.1:0"])
            .args(["--log-format", "text"])
            .arg("--exit-with-parent")
            .env_remove("STALLWATCH_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        // Its own process group: Ctrl-C reaches the demo only, which shuts it down in order.
        #[cfg(unix)]
        cmd.process_group(0);
        #[cfg(windows)]
        cmd.creation_flags(windows_sys::Win32::System::Threading::CREATE_NEW_PROCESS_GROUP);
        let mut sidecar = cmd.spawn().context("cannot start stallwatch serve")?;
        let ready = match read_ready(&mut sidecar) {
            Ok(r) => r,
            Err(e) => {
                let _ = sidecar.kill();
                let _ = sidecar.wait();
                let tail = tail(&log, 20);
                let _ = std::fs::remove_dir_all(&root);
                return Err(e.context(format!("sidecar log:\n{tail}")));
            }
        };
        let http = Api::new()?;
        let mut demo = Demo {
            root,
            workspace,
            sidecar,
            dashboard: ready["dashboard"].as_str().unwrap_or_default().to_string(),
            token: String::new(),
            http,
            t0_unix_nano,
            before,
            sla_ms,
            log,
            staging: None,
            stopped: false,
        };
        let token = std::fs::read_to_string(data.join("token"));
        match token {
            Ok(t) => demo.token = t.trim().to_string(),
            Err(e) => {
                demo.shutdown();
                bail!("cannot read the control token: {e}");
            }
        }
        println!("stallwatch demo: six Python runners on the runner kit, tool SLA {sla_ms} ms, heartbeat {HEARTBEAT_INTERVAL_MS}/{HEARTBEAT_TIMEOUT_MS} ms, grace {GRACE_MS} ms");
        println!("python:     {}", python.display());
        println!("dashboard:  {}", demo.dashboard_url());
        println!("data dir:   {}", data.display());
        println!(
            "workspace:  {} ({} files hashed with SHA-256)",
            demo.workspace.display(),
            demo.before.len()
        );
        if !python_has(python, "matplotlib") {
            println!("            (no matplotlib here: py-gui blocks in the equivalent event loop instead of plt.show())");
        }
        println!();
        if let Err(e) = demo.register_all(python, &script) {
            demo.shutdown();
            return Err(e);
        }
        Ok(demo)
    }

    fn dashboard_url(&self) -> String {
        format!("http://{}/", self.dashboard)
    }

    fn api(&self, path: &str) -> String {
        format!("http://{}{path}", self.dashboard)
    }

    fn sidecar_alive(&mut self) -> bool {
        matches!(self.sidecar.try_wait(), Ok(None))
    }

    fn register_all(&mut self, python: &Path, script: &Path) -> Result<()> {
        for (id, mode, what) in RUNNERS {
            let mut spawn = json!({
                "argv": [python.display().to_string(), script.display().to_string(), mode],
                "cwd": self.root.display().to_string(),
            });
            if id == CSV {
                spawn["workspace"] = self.workspace.display().to_string().into();
            }
            let resp = self
                .http
                .call(
                    self.http
                        .post(self.api("/api/v1/runners"))
                        .bearer_auth(&self.token)
                        .json(&json!({ "id": id, "spawn": spawn })),
                )
                .with_context(|| format!("cannot register {id}"))?;
            let status = resp.status;
            let body = resp.body.unwrap_or(Value::Null);
            if !status.is_success() {
                bail!("registering {id} answered {status}: {body}");
            }
            let pid = body["pid"].as_u64().unwrap_or(0);
            if id == CSV {
                self.staging = body["checkpoint"]["path"].as_str().map(PathBuf::from);
            }
            println!(
                "{}  {id:<12} {:<22} pid {pid}, {mode}: {what}",
                self.stamp(unix_nano()),
                "spawned"
            );
        }
        Ok(())
    }

    /// `+S.SSs` since the start.
    fn stamp(&self, at_unix_nano: u64) -> String {
        let ms = at_unix_nano.saturating_sub(self.t0_unix_nano) / 1_000_000;
        format!("+{:>3}.{:02}s", ms / 1000, (ms % 1000) / 10)
    }

    /// Follows the incident stream until everything expected happened or the deadline.
    fn follow(&mut self, interrupted: &AtomicBool) -> Result<()> {
        let bad: Vec<&str> = RUNNERS
            .iter()
            .map(|r| r.0)
            .filter(|id| *id != HEALTHY)
            .collect();
        let (tx, rx) = mpsc::channel();
        let url = self.api("/api/v1/events?last_event_id=0");
        std::thread::spawn(move || read_sse(&url, tx));
        let started = Instant::now();
        let deadline = OUTCOME_TIMEOUT + Duration::from_millis(self.sla_ms * 3);
        let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
        let mut stream_error = None;
        let mut staged_seen = false;
        loop {
            if !staged_seen {
                staged_seen = self.show_staged_csv();
            }
            let done = bad.iter().all(|id| {
                seen.get(*id)
                    .is_some_and(|s| s.opened_reason.is_some() && s.terminated.is_some())
            }) && seen.get(CSV).is_some_and(|s| s.rolled_back);
            if done || interrupted.load(Ordering::SeqCst) || started.elapsed() > deadline {
                break;
            }
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Ok(incident)) => self.on_incident(&incident, &mut seen),
                Ok(Err(e)) => {
                    stream_error = Some(e);
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    stream_error = Some("the event stream ended".to_string());
                    break;
                }
            }
        }
        // Incidents that follow at once (restart decisions, anything about the healthy
        // runner) are printed too.
        let settle = Instant::now() + SETTLE;
        while let Some(left) = settle.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(Ok(incident)) => self.on_incident(&incident, &mut seen),
                Ok(Err(_)) | Err(_) => break,
            }
        }
        self.report(&bad, &seen, interrupted, stream_error)
    }

    /// Prints a line once py-csv's half-written CSV is in its staging folder; answers
    /// whether it did.
    fn show_staged_csv(&self) -> bool {
        let Some(staging) = &self.staging else {
            return true;
        };
        let Ok(bytes) = std::fs::read(staging.join("results.csv")) else {
            return false;
        };
        let last = String::from_utf8_lossy(&bytes)
            .lines()
            .last()
            .unwrap_or("")
            .to_string();
        println!(
            "{}  {CSV:<12} {:<22} results.csv, {} bytes, last line {last:?} (uncommitted, in {})",
            self.stamp(unix_nano()),
            "staged half a CSV",
            bytes.len(),
            staging
                .strip_prefix(&self.workspace)
                .unwrap_or(staging)
                .display()
        );
        true
    }

    /// `POST /api/v1/shutdown`, wait for the sidecar, delete the temp folders.
    fn shutdown(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if matches!(self.sidecar.try_wait(), Ok(None)) {
            let _ = self.http.call(
                self.http
                    .post(self.api("/api/v1/shutdown"))
                    .bearer_auth(&self.token),
            );
            let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
            while matches!(self.sidecar.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(self.sidecar.try_wait(), Ok(None)) {
                eprintln!("stallwatch demo: the sidecar did not stop within {SHUTDOWN_TIMEOUT:?}; killing it");
                let _ = self.sidecar.kill();
            }
        }
        let _ = self.sidecar.wait();
        match std::fs::remove_dir_all(&self.root) {
            Ok(()) => println!(
                "cleaned up: sidecar stopped, {} deleted",
                self.root.display()
            ),
            Err(e) => eprintln!(
                "stallwatch demo: cannot delete {}: {e}",
                self.root.display()
            ),
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The TOML config of the demo sidecar: scaled timings, no restarts, long cooldown.
fn demo_config(sla_ms: u64) -> String {
    format!(
        "[watchdog]\nheartbeat_interval_ms = {HEARTBEAT_INTERVAL_MS}\nheartbeat_timeout_ms = {HEARTBEAT_TIMEOUT_MS}\n\
         startup_grace_ms = 15000\nstaleness_ms = {STALENESS_MS}\nbreaker_cooldown_ms = {BREAKER_COOLDOWN_MS}\n\
         default_sla_ms = {sla_ms}\ntick_ms = 25\n\
         [reaper]\ngrace_ms = {GRACE_MS}\nmax_restarts = 0\n"
    )
}
