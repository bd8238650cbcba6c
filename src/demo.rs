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

/// The misbehaving runner script (built on the Python kit), written into the temp folder.
const RUNNER_SCRIPT: &str = include_str!("../tests/python/runners/stalled.py");

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
/// `./.venv/bin/python` when it exists, else `python3`.
fn pick_python(flag: Option<&Path>) -> PathBuf {
    if let Some(p) = flag {
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
    http: reqwest::blocking::Client,
    /// Wall clock at the start, ns since the Unix epoch: timeline zero.
    t0_unix_nano: u64,
    before: BTreeMap<String, String>,
    sla_ms: u64,
    log: PathBuf,
    /// The staging folder of py-csv's checkpoint, from its registration.
    staging: Option<PathBuf>,
    stopped: bool,
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
        let http = reqwest::blocking::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .context("cannot build the HTTP client")?;
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
                .post(self.api("/api/v1/runners"))
                .bearer_auth(&self.token)
                .json(&json!({ "id": id, "spawn": spawn }))
                .send()
                .with_context(|| format!("cannot register {id}"))?;
            let status = resp.status();
            let body: Value = resp.json().unwrap_or(Value::Null);
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

    fn on_incident(&self, i: &Value, seen: &mut BTreeMap<String, Seen>) {
        let event = i["event"].as_str().unwrap_or("?");
        let runner = i["runner_id"].as_str().unwrap_or("-").to_string();
        let at: u64 = i["at_unix_nano"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(unix_nano);
        let full_reason = i["reason"].as_str().unwrap_or("");
        // The verdict and reason come first; stall forensics (why it was stuck), when
        // present after "; why: ", is printed under the event's other details.
        let (reason, why) = match full_reason.split_once("; why: ") {
            Some((r, w)) => (r, Some(w.trim())),
            None => (full_reason, None),
        };
        let s = seen.entry(runner.clone()).or_default();
        if runner == HEALTHY
            && (event.starts_with("breaker.")
                || event.starts_with("runner.terminated")
                || event == "runner.crashed"
                || event == "runner.exited"
                || event == "verdict.suspect")
        {
            s.disturbances.push(format!("{event}: {reason}"));
        }
        if event != "runner.started" {
            let line = format!("{}  {runner:<12} {event:<22} {reason}", self.stamp(at));
            println!("{}", line.trim_end());
        }
        match event {
            "breaker.opened" => {
                s.opened_reason = Some(reason.to_string());
                println!(
                    "{:>9}  {:<12} {:<22} {}",
                    "",
                    "",
                    "",
                    self.admission(&runner)
                );
            }
            "checkpoint.rolled_back" => s.rolled_back = true,
            "runner.terminated" => {
                let report = &i["evidence"]["report"];
                let steps: Vec<String> = termination_steps(report)
                    .into_iter()
                    .map(|(at, what)| {
                        format!(
                            "{what} at {}",
                            self.stamp(at).trim_start_matches('+').trim_start()
                        )
                    })
                    .collect();
                if !steps.is_empty() {
                    println!("{:>9}  {:<12} {:<22} {}", "", "", "", steps.join(", "));
                }
                if let Some(why) = why.filter(|w| !w.is_empty()) {
                    println!("{:>9}  {:<12} {:<22} why: {why}", "", "", "");
                }
                let ended_by = report["ended_by"].as_str().unwrap_or("?");
                s.terminated = Some(format!(
                    "ended by {} in {} ms",
                    if ended_by == "sigterm" {
                        "SIGTERM"
                    } else if ended_by == "sigkill" {
                        "SIGKILL"
                    } else {
                        ended_by
                    },
                    report["duration_ms"].as_u64().unwrap_or(0),
                ));
            }
            _ => {}
        }
        let _ = std::io::stdout().flush();
    }

    fn report(
        &mut self,
        bad: &[&str],
        seen: &BTreeMap<String, Seen>,
        interrupted: &AtomicBool,
        stream_error: Option<String>,
    ) -> Result<()> {
        let mut problems = Vec::new();
        if let Some(e) = stream_error {
            problems.push(format!("incident stream: {e}"));
        }
        if interrupted.load(Ordering::SeqCst) {
            // Mid-run the staged CSV is still in the workspace and the runners still
            // hang: judging any of it would only mislead.
            println!();
            println!("interrupted (Ctrl-C): stopping the sidecar and its runners");
            bail!("the demo was interrupted before it finished");
        }
        // Final breaker state of each runner, as the watchdog sees it.
        println!();
        let board = self.board();
        let states: Vec<String> = RUNNERS
            .iter()
            .map(|(id, _, _)| format!("{id} {}", board.get(*id).map(String::as_str).unwrap_or("?")))
            .collect();
        println!("breakers:   {}", states.join(", "));

        let after = hash_tree(&self.workspace);
        let unchanged = match &after {
            Ok(after) => {
                let diff = differing(&self.before, after);
                if diff.is_empty() {
                    println!(
                        "workspace byte-for-byte as before: yes ({} files, SHA-256)",
                        after.len()
                    );
                    true
                } else {
                    println!(
                        "workspace byte-for-byte as before: NO, differing files: {}",
                        diff.join(", ")
                    );
                    false
                }
            }
            Err(e) => {
                println!("workspace byte-for-byte as before: NO, cannot hash it: {e:#}");
                false
            }
        };
        if !unchanged {
            problems.push("the workspace changed".to_string());
        }

        println!();
        println!("summary");
        for id in bad {
            let s = seen.get(*id);
            let opened = s.and_then(|s| s.opened_reason.as_deref());
            let ended = s.and_then(|s| s.terminated.as_deref());
            let mut line = match (opened, ended) {
                (Some(why), Some(end)) => format!("tripped ({}), {end}", verdict_of(why)),
                (Some(why), None) => format!("tripped ({}), NOT terminated", verdict_of(why)),
                (None, _) => "NOT tripped".to_string(),
            };
            if *id == CSV {
                let rolled = s.is_some_and(|s| s.rolled_back);
                let gone = self.staging.as_ref().is_some_and(|p| !p.exists());
                line.push_str(match (rolled, gone) {
                    (true, true) => ", checkpoint rolled back (staging folder deleted)",
                    (true, false) => {
                        ", checkpoint rolled back but its staging folder is still there"
                    }
                    _ => ", checkpoint NOT rolled back",
                });
                if rolled && !gone {
                    problems.push(format!("{id}: staging folder left behind"));
                }
                if !rolled {
                    problems.push(format!("{id}: its checkpoint was not rolled back"));
                }
            }
            if opened.is_none() || ended.is_none() {
                problems.push(format!("{id}: {line}"));
            }
            if board.get(*id).is_some_and(|b| b != "OPEN") {
                problems.push(format!(
                    "{id}: breaker {} at the end, expected OPEN",
                    board[*id]
                ));
            }
            println!("  {id:<12} {line}");
        }
        let healthy = seen
            .get(HEALTHY)
            .map(|s| s.disturbances.clone())
            .unwrap_or_default();
        let healthy_breaker = board.get(HEALTHY).map(String::as_str).unwrap_or("?");
        if healthy.is_empty() && healthy_breaker == "CLOSED" {
            println!(
                "  {HEALTHY:<12} never tripped, breaker CLOSED, {}",
                self.healthy_spans()
            );
        } else {
            println!(
                "  {HEALTHY:<12} DISTURBED (breaker {healthy_breaker}): {}",
                healthy.join("; ")
            );
            problems.push(format!(
                "{HEALTHY} was disturbed (breaker {healthy_breaker})"
            ));
        }
        println!(
            "  workspace    {}",
            if unchanged {
                "byte-for-byte as before"
            } else {
                "CHANGED"
            }
        );
        if problems.is_empty() {
            println!("result: everything happened as expected");
            Ok(())
        } else {
            println!(
                "result: NOT as expected; sidecar log: {}",
                self.log.display()
            );
            Err(anyhow!(
                "the demo did not go as expected: {}",
                problems.join("; ")
            ))
        }
    }

    /// What `GET /api/v1/runners/{id}/admit` answers now, as one phrase.
    fn admission(&self, id: &str) -> String {
        match self
            .http
            .get(self.api(&format!("/api/v1/runners/{id}/admit")))
            .send()
        {
            Ok(r) => {
                let status = r.status().as_u16();
                let retry = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .map(|v| format!(", Retry-After {v} s"))
                    .unwrap_or_default();
                let state = r
                    .json::<Value>()
                    .ok()
                    .and_then(|v| v["state"].as_str().map(str::to_string));
                format!(
                    "admission now: {status} ({}){retry}",
                    state.as_deref().unwrap_or("?")
                )
            }
            Err(e) => format!("admission check failed: {e}"),
        }
    }

    /// "N tool spans stored" for the healthy runner (`GET /api/v1/traces?attr=...`).
    fn healthy_spans(&self) -> String {
        let got = self
            .http
            .get(self.api(&format!(
                "/api/v1/traces?attr=stallwatch.runner.id={HEALTHY}&limit=1000"
            )))
            .send()
            .and_then(|r| r.json::<Value>());
        match got {
            Ok(v) => {
                let n = v["items"].as_array().map_or(0, Vec::len);
                let more = if v["next_cursor"].is_string() {
                    "+"
                } else {
                    ""
                };
                format!("{n}{more} tool calls traced")
            }
            Err(e) => format!("traces unavailable: {e}"),
        }
    }

    /// Breaker state per runner id from `GET /api/v1/runners`.
    fn board(&self) -> BTreeMap<String, String> {
        let got = self
            .http
            .get(self.api("/api/v1/runners"))
            .send()
            .and_then(|r| r.json::<Value>());
        let mut out = BTreeMap::new();
        if let Ok(v) = got {
            for r in v["items"].as_array().into_iter().flatten() {
                if let (Some(id), Some(b)) = (r["id"].as_str(), r["breaker"].as_str()) {
                    out.insert(id.to_string(), b.to_string());
                }
            }
        }
        out
    }

    /// `POST /api/v1/shutdown`, wait for the sidecar, delete the temp folders.
    fn shutdown(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if matches!(self.sidecar.try_wait(), Ok(None)) {
            let _ = self
                .http
                .post(self.api("/api/v1/shutdown"))
                .bearer_auth(&self.token)
                .send();
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

/// A few files a research workspace holds: a CSV, a notebook, notes.
fn make_workspace(ws: &Path) -> Result<()> {
    std::fs::create_dir_all(ws.join("notebooks"))
        .with_context(|| format!("cannot create {}", ws.display()))?;
    let notebook = json!({
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Loss curve\n"]},
            {"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [],
             "source": ["import pandas as pd\n", "df = pd.read_csv('../results.csv')\n", "df.plot(x='step', y='loss')\n"]}
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5
    });
    let files: [(&str, String); 3] = [
        (
            "results.csv",
            "step,loss,accuracy\n1,0.912,0.104\n2,0.655,0.387\n3,0.481,0.562\n".to_string(),
        ),
        ("notebooks/analysis.ipynb", format!("{notebook:#}\n")),
        (
            "notes.md",
            "# Run 14\n\nStable at step 3. Next: longer warm-up.\n".to_string(),
        ),
    ];
    for (rel, body) in files {
        std::fs::write(ws.join(rel), body).with_context(|| format!("cannot write {rel}"))?;
    }
    Ok(())
}

/// SHA-256 (hex) of every file under `root`, keyed by its relative path.
fn hash_tree(root: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?
        {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                out.insert(rel, hex::encode(Sha256::digest(&bytes)));
            }
        }
    }
    Ok(out)
}

/// Relative paths added, removed or changed between two hashed trees.
fn differing(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| match (before.contains_key(k), after.contains_key(k)) {
            (true, false) => format!("{k} (removed)"),
            (false, true) => format!("{k} (added)"),
            _ => format!("{k} (changed)"),
        })
        .collect()
}

/// The SIGTERM / exited / SIGKILL steps of a termination report, with wall-clock times.
fn termination_steps(report: &Value) -> Vec<(u64, String)> {
    let sigterm_unix: u64 = report["sigterm_unix_nano"].as_u64().unwrap_or(0);
    let steps = report["steps"].as_array().cloned().unwrap_or_default();
    // Steps carry ms since the termination began; anchor them on the SIGTERM time.
    let sigterm_at_ms = steps
        .iter()
        .find(|s| s["step"] == "sigterm_sent")
        .and_then(|s| s["at_ms"].as_u64())
        .unwrap_or(0);
    let began = sigterm_unix.saturating_sub(sigterm_at_ms * 1_000_000);
    let mut out = Vec::new();
    for s in &steps {
        let at_ms = s["at_ms"].as_u64().unwrap_or(0);
        let label = match s["step"].as_str().unwrap_or("") {
            "sigterm_sent" => "SIGTERM".to_string(),
            "exited" => "exited".to_string(),
            "sigkill_sent" => "SIGKILL".to_string(),
            "reaped" => match exit_text(&s["detail"]["exit"]) {
                Some(e) => format!("reaped ({e})"),
                None => "reaped".to_string(),
            },
            _ => continue,
        };
        out.push((began + at_ms * 1_000_000, label));
    }
    out
}

/// "killed by SIGTERM" / "exit code 0" from an exit JSON, when it says.
fn exit_text(exit: &Value) -> Option<String> {
    if let Some(sig) = exit["signal"].as_i64() {
        let name = match sig {
            15 => "SIGTERM".to_string(),
            9 => "SIGKILL".to_string(),
            n => format!("signal {n}"),
        };
        return Some(format!("killed by {name}"));
    }
    exit["code"].as_i64().map(|c| format!("exit code {c}"))
}

/// "tool_overrun" out of "tool_overrun: tool span ...".
fn verdict_of(reason: &str) -> &str {
    reason.split(':').next().unwrap_or(reason).trim()
}

/// Whether `python -c "import MODULE"` works.
fn python_has(python: &Path, module: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {module}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Reads `serve`'s JSON ready line (first stdout line) within [`READY_TIMEOUT`].
fn read_ready(child: &mut Child) -> Result<Value> {
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout from the sidecar"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    let line = rx
        .recv_timeout(READY_TIMEOUT)
        .map_err(|_| anyhow!("stallwatch serve printed no ready line within {READY_TIMEOUT:?}"))?;
    let ready: Value =
        serde_json::from_str(&line).with_context(|| format!("ready line is not JSON: {line}"))?;
    if ready["event"] != "ready" || ready["dashboard"].as_str().is_none() {
        bail!("unexpected first line from stallwatch serve: {line}");
    }
    Ok(ready)
}

/// Follows `GET /api/v1/events` and sends each incident JSON; an `Err` ends the stream.
fn read_sse(url: &str, tx: mpsc::Sender<std::result::Result<Value, String>>) {
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        .timeout(None)
        .build();
    let resp = client.and_then(|c| c.get(url).header("accept", "text/event-stream").send());
    let resp = match resp {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            let _ = tx.send(Err(format!("GET /api/v1/events answered {}", r.status())));
            return;
        }
        Err(e) => {
            let _ = tx.send(Err(format!("GET /api/v1/events failed: {e}")));
            return;
        }
    };
    let mut event = String::new();
    let mut data = String::new();
    for line in BufReader::new(resp).lines() {
        let Ok(line) = line else { break };
        if line.is_empty() {
            if event != "board" && !data.is_empty() {
                if let Ok(v) = serde_json::from_str::<Value>(&data) {
                    if tx.send(Ok(v)).is_err() {
                        return;
                    }
                }
            }
            event.clear();
            data.clear();
        } else if let Some(v) = line.strip_prefix("event:") {
            event = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
