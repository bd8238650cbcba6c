//! Shared helpers of the watchdog's integration tests: a real SQLite file, real Python
//! runner processes serving real UNIX sockets, and Observations built from the model
//! types exactly as the collector hands them over.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stallwatch_storage::control::{Observation, ObservedData, RunnerChange, Trip};
use stallwatch_storage::model::*;
use stallwatch_storage::{EventBus, Storage, StorageConfig};
use stallwatch_watchdog::{Watchdog, WatchdogConfig, WatchdogHandle};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub fn python() -> String {
    if let Ok(p) = std::env::var("STALLWATCH_TEST_PYTHON") {
        return p;
    }
    let venv = "/work/main/.venv/bin/python";
    if Path::new(venv).exists() {
        return venv.into();
    }
    "python3".into()
}

pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// A real runner process (tests/data/runner.py) serving a heartbeat socket.
pub struct PyRunner {
    pub child: Child,
    stdin: ChildStdin,
    pub socket: PathBuf,
}

impl PyRunner {
    pub fn start(socket: &Path, mode: &str) -> Self {
        let mut child = Command::new(python())
            .arg(data("runner.py"))
            .arg(socket)
            .arg(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python runner");
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "runner did not start");
        // keep reading stdout in the background so the pipe never fills
        std::thread::spawn(move || {
            let mut l = String::new();
            while out.read_line(&mut l).map(|n| n > 0).unwrap_or(false) {
                l.clear();
            }
        });
        Self {
            child,
            stdin,
            socket: socket.to_path_buf(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PyRunner {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A watchdog wired to a real storage file, with the test holding the other channel ends.
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub storage: Storage,
    pub events: EventBus,
    pub handle: WatchdogHandle,
    pub obs: mpsc::Sender<Observation>,
    pub changes: mpsc::Sender<RunnerChange>,
    pub trips: mpsc::Receiver<Trip>,
    pub shutdown: CancellationToken,
    pub join: Option<tokio::task::JoinHandle<()>>,
}

/// Fast timings for tests: ping every 100 ms, lost after 600 ms, grace 3 s, tick 20 ms.
pub fn fast_config() -> WatchdogConfig {
    let mut c = WatchdogConfig::default();
    c.heartbeat_interval = Duration::from_millis(100);
    c.heartbeat_timeout = Duration::from_millis(600);
    c.startup_grace = Duration::from_millis(3000);
    c.staleness = Duration::from_millis(1500);
    c.breaker_cooldown = Duration::from_millis(800);
    c.tick = Duration::from_millis(20);
    c.board_interval = Duration::from_millis(100);
    c.sla.min_sla = Duration::from_millis(100);
    c
}

impl Rig {
    pub async fn start(config: WatchdogConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, config).await
    }

    pub async fn start_in(dir: tempfile::TempDir, config: WatchdogConfig) -> Self {
        let storage = Storage::open(StorageConfig::new(dir.path().join("stallwatch.db"))).unwrap();
        let events = EventBus::new(storage.clone());
        let (obs, obs_rx) = mpsc::channel(64);
        let (changes, ch_rx) = mpsc::channel(64);
        let (trip_tx, trips) = mpsc::channel(64);
        let shutdown = CancellationToken::new();
        let (handle, join) = Watchdog::start(
            config,
            storage.clone(),
            events.clone(),
            obs_rx,
            ch_rx,
            trip_tx,
            shutdown.clone(),
        );
        Self {
            dir,
            storage,
            events,
            handle,
            obs,
            changes,
            trips,
            shutdown,
            join: Some(join),
        }
    }

    pub fn sock(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.sock"))
    }

    pub async fn register(
        &self,
        id: &str,
        pid: Option<u32>,
        socket: Option<&Path>,
        restarted: bool,
    ) {
        self.changes
            .send(RunnerChange::Registered {
                id: id.into(),
                pid,
                heartbeat_socket: socket.map(Path::to_path_buf),
                spawned: true,
                restarted,
            })
            .await
            .unwrap();
    }

    pub async fn observe_spans(&self, batch: TraceBatch) {
        self.obs
            .send(Observation {
                received: Instant::now(),
                data: ObservedData::Spans(Arc::new(batch)),
            })
            .await
            .unwrap();
    }

    pub async fn observe_logs(&self, batch: LogBatch) {
        self.obs
            .send(Observation {
                received: Instant::now(),
                data: ObservedData::Logs(Arc::new(batch)),
            })
            .await
            .unwrap();
    }

    /// Stops the watchdog (it flushes the ledger) and waits for it.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(j) = self.join.take() {
            j.await.unwrap();
        }
    }

    /// Waits for the next trip, up to `deadline`.
    pub async fn next_trip(&mut self, deadline: Duration) -> Option<Trip> {
        tokio::time::timeout(deadline, self.trips.recv())
            .await
            .ok()
            .flatten()
    }

    pub async fn incidents(&self, runner: &str) -> Vec<Incident> {
        self.storage
            .incidents(stallwatch_storage::IncidentQuery {
                runner_id: Some(runner.into()),
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
    }
}

/// Polls `f` every 20 ms until it answers `Some`, or panics after `deadline` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > end {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn tid(n: u8) -> TraceId {
    TraceId([n; 16])
}
pub fn sid(n: u8) -> SpanId {
    SpanId([n; 8])
}

pub fn s(v: &str) -> AnyValue {
    AnyValue::String(v.into())
}

/// A resource bound to `runner` by `stallwatch.runner.id` (or by `process.pid`).
pub fn resource(runner: Option<&str>, pid: Option<u32>) -> Resource {
    let mut attributes = vec![KeyValue::new("service.name", s("tool-runner"))];
    if let Some(r) = runner {
        attributes.push(KeyValue::new("stallwatch.runner.id", s(r)));
    }
    if let Some(p) = pid {
        attributes.push(KeyValue::new("process.pid", AnyValue::Int(i64::from(p))));
    }
    Resource {
        attributes,
        ..Default::default()
    }
}

/// An `execute_tool` span; `end == 0` makes it a running snapshot (shape 1).
pub fn tool_span(t: u8, sp: u8, tool: &str, sla_ms: Option<i64>, end: u64) -> Span {
    let mut attributes = vec![
        KeyValue::new("gen_ai.operation.name", s("execute_tool")),
        KeyValue::new("gen_ai.tool.name", s(tool)),
    ];
    if let Some(v) = sla_ms {
        attributes.push(KeyValue::new("stallwatch.sla_ms", AnyValue::Int(v)));
    }
    Span {
        trace_id: tid(t),
        span_id: sid(sp),
        parent_span_id: Some(sid(200)),
        name: format!("execute_tool {tool}"),
        kind: 1,
        start_time_unix_nano: 1_700_000_000_000_000_000,
        end_time_unix_nano: end,
        attributes,
        ..Default::default()
    }
}

pub fn batch(res: Resource, spans: Vec<Span>) -> TraceBatch {
    TraceBatch {
        resource_spans: vec![ResourceSpans {
            resource: res,
            scope_spans: vec![ScopeSpans {
                scope: Scope::default(),
                spans,
            }],
        }],
    }
}

/// A `PartialSpanProcessor`-shaped log record (shape 2) for span (t, sp).
pub fn partial_span_log(res: Resource, state: &str, t: u8, sp: u8, tool: &str) -> LogBatch {
    let body = serde_json::json!({
        "resourceSpans": [{
            "resource": {"attributes": []},
            "scopeSpans": [{"scope": {"name": "partial"}, "spans": [{
                "traceId": tid(t).to_hex(), "spanId": sid(sp).to_hex(), "name": tool,
                "kind": 1, "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "0",
                "attributes": [
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                    {"key": "gen_ai.tool.name", "value": {"stringValue": tool}}
                ]
            }]}]
        }]
    });
    LogBatch {
        resource_logs: vec![ResourceLogs {
            resource: res,
            scope_logs: vec![ScopeLogs {
                scope: Scope::default(),
                log_records: vec![LogRecord {
                    body: AnyValue::String(body.to_string()),
                    attributes: vec![
                        KeyValue::new("span.state", s(state)),
                        KeyValue::new("log.body.type", s("json/v1")),
                    ],
                    trace_id: Some(tid(t)),
                    span_id: Some(sid(sp)),
                    ..Default::default()
                }],
            }],
        }],
    }
}

/// A Logfire `pending_span` twin (shape 3) of the real span (t, real).
pub fn pending_twin(t: u8, twin: u8, real: u8, tool: &str) -> Span {
    Span {
        trace_id: tid(t),
        span_id: sid(twin),
        parent_span_id: Some(sid(real)),
        name: tool.to_string(),
        start_time_unix_nano: 1_700_000_000_000_000_000,
        end_time_unix_nano: 1_700_000_000_000_000_000,
        attributes: vec![
            KeyValue::new("logfire.span_type", s("pending_span")),
            KeyValue::new("mcp.method.name", s("tools/call")),
            KeyValue::new("gen_ai.tool.name", s(tool)),
        ],
        ..Default::default()
    }
}
