//! Test harness: a real SQLite file in a temp dir, the dashboard served on a real socket
//! (port 0), a board the test controls, and the control channel's receiving end.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use stallwatch_dashboards::{app, serve, AppState, DashboardConfig};
use stallwatch_storage::control::{
    BreakerState, ControlRequest, RunnerBoard, RunnerLifecycle, RunnerStatus, WorstSpan,
};
use stallwatch_storage::ledger::{LedgerRow, LedgerWrite};
use stallwatch_storage::model::*;
use stallwatch_storage::{EventBus, MetricsSource, Storage, StorageConfig};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// The control token every harness uses.
pub const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Fixed ids of the seeded data.
pub const TRACE_A: &str = "0af7651916cd43dd8448eb211c80319c";
pub const TRACE_B: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
pub const ROOT: &str = "b7ad6b7169203331";
pub const TOOL: &str = "00f067aa0ba902b7";
pub const OPEN: &str = "53995c3f42cd8ad8";
pub const ORPHAN: &str = "c0ffee0000000001";
pub const MISSING_PARENT: &str = "dead00000000beef";

/// Base time of the seeded spans: 2026-01-01T00:00:00Z in ns.
pub const T0: u64 = 1_767_225_600_000_000_000;
const MS: u64 = 1_000_000;

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub storage: Storage,
    pub events: EventBus,
    pub board: watch::Sender<RunnerBoard>,
    pub ready: watch::Sender<bool>,
    pub control: mpsc::Receiver<ControlRequest>,
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
    pub client: reqwest::Client,
    pub server: tokio::task::JoinHandle<std::io::Result<()>>,
}

struct FixedMetrics;
impl MetricsSource for FixedMetrics {
    fn render_prometheus(&self, out: &mut String) {
        out.push_str("# TYPE stallwatch_test_spans_total counter\nstallwatch_test_spans_total 7\n");
    }
}

pub fn db_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("stallwatch.db")
}

impl Harness {
    pub async fn start(config: DashboardConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, config).await
    }

    pub async fn start_in(dir: tempfile::TempDir, mut config: DashboardConfig) -> Self {
        let storage = Storage::open(StorageConfig::new(db_path(&dir))).unwrap();
        let events = EventBus::new(storage.clone());
        let (board, board_rx) = watch::channel::<RunnerBoard>(Arc::new(BTreeMap::new()));
        let (ready, ready_rx) = watch::channel(true);
        let (control_tx, control) = mpsc::channel(8);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        config.listen = addr;
        let state = AppState {
            storage: storage.clone(),
            events: events.clone(),
            board: board_rx,
            control: control_tx,
            token: TOKEN.into(),
            metrics: vec![Arc::new(FixedMetrics)],
            ready: ready_rx,
            config: Arc::new(config),
        };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app(state), shutdown.clone()));
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        Self {
            dir,
            storage,
            events,
            board,
            ready,
            control,
            addr,
            shutdown,
            client,
            server,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.unwrap()
    }

    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        let r = self.get(path).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
        (status, v)
    }

    pub async fn stop(self) -> tempfile::TempDir {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.server).await;
        self.storage.shutdown().await;
        self.dir
    }
}

fn kv(k: &str, v: AnyValue) -> KeyValue {
    KeyValue::new(k, v)
}
fn s(v: &str) -> AnyValue {
    AnyValue::String(v.into())
}
pub fn tid(h: &str) -> TraceId {
    TraceId::from_hex(h).unwrap()
}
pub fn sid(h: &str) -> SpanId {
    SpanId::from_hex(h).unwrap()
}

/// Spans of the seeded workbench: trace A (root, an ended ERROR tool span, an open tool
/// span) from a Python runner, trace B (one span whose parent never arrived).
pub fn seed_batch() -> TraceBatch {
    let resource = Resource {
        attributes: vec![
            kv("service.name", s("python-runner")),
            kv("process.pid", AnyValue::Int(4242)),
            kv("stallwatch.runner.id", s("nb-1")),
        ],
        dropped_attributes_count: 0,
        schema_url: "https://opentelemetry.io/schemas/1.26.0".into(),
    };
    let scope = Scope {
        name: "stallwatch.test".into(),
        version: "1.0".into(),
        ..Scope::default()
    };
    let root = Span {
        trace_id: tid(TRACE_A),
        span_id: sid(ROOT),
        name: "agent.run".into(),
        kind: 2,
        start_time_unix_nano: T0,
        end_time_unix_nano: T0 + 5_000 * MS,
        attributes: vec![kv("gen_ai.operation.name", s("invoke_agent"))],
        status: Status {
            code: 1,
            message: String::new(),
        },
        ..Span::default()
    };
    let tool = Span {
        trace_id: tid(TRACE_A),
        span_id: sid(TOOL),
        parent_span_id: Some(sid(ROOT)),
        name: "execute_tool run_notebook".into(),
        kind: 1,
        start_time_unix_nano: T0 + 100 * MS,
        end_time_unix_nano: T0 + 2_600 * MS,
        attributes: vec![
            kv("gen_ai.operation.name", s("execute_tool")),
            kv("gen_ai.tool.name", s("run_notebook")),
            kv("error.type", s("timeout")),
            kv("cells", AnyValue::Int(12)),
            kv("ratio", AnyValue::Double(f64::NAN)),
            kv("cached", AnyValue::Bool(false)),
            kv("digest", AnyValue::Bytes(vec![1, 2, 3])),
            kv(
                "shape",
                AnyValue::Array(vec![AnyValue::Int(3), AnyValue::Int(4)]),
            ),
            kv("meta", AnyValue::KvList(vec![kv("kernel", s("python3"))])),
        ],
        events: vec![Event {
            time_unix_nano: T0 + 2_500 * MS,
            name: "exception".into(),
            attributes: vec![kv("exception.type", s("TimeoutError"))],
            dropped_attributes_count: 0,
        }],
        links: vec![Link {
            trace_id: tid(TRACE_B),
            span_id: sid(ORPHAN),
            trace_state: String::new(),
            attributes: vec![kv("link.reason", s("retry of"))],
            dropped_attributes_count: 0,
            flags: 1,
        }],
        status: Status {
            code: STATUS_ERROR,
            message: "notebook cell 7 timed out".into(),
        },
        ..Span::default()
    };
    let open = Span {
        trace_id: tid(TRACE_A),
        span_id: sid(OPEN),
        parent_span_id: Some(sid(ROOT)),
        name: "execute_tool plot_results".into(),
        kind: 1,
        start_time_unix_nano: T0 + 2_700 * MS,
        end_time_unix_nano: 0,
        attributes: vec![
            kv("gen_ai.operation.name", s("execute_tool")),
            kv("gen_ai.tool.name", s("plot_results")),
        ],
        ..Span::default()
    };
    let orphan = Span {
        trace_id: tid(TRACE_B),
        span_id: sid(ORPHAN),
        parent_span_id: Some(sid(MISSING_PARENT)),
        name: "load_dataset".into(),
        kind: 3,
        start_time_unix_nano: T0 + 10_000 * MS,
        end_time_unix_nano: T0 + 10_250 * MS,
        ..Span::default()
    };
    TraceBatch {
        resource_spans: vec![ResourceSpans {
            resource,
            scope_spans: vec![ScopeSpans {
                scope,
                spans: vec![root, tool, open, orphan],
            }],
        }],
    }
}

pub fn seed_logs() -> LogBatch {
    LogBatch {
        resource_logs: vec![ResourceLogs {
            resource: Resource {
                attributes: vec![kv("service.name", s("python-runner"))],
                ..Resource::default()
            },
            scope_logs: vec![ScopeLogs {
                scope: Scope {
                    name: "nb.logger".into(),
                    ..Scope::default()
                },
                log_records: vec![LogRecord {
                    time_unix_nano: T0 + 2_400 * MS,
                    observed_time_unix_nano: T0 + 2_401 * MS,
                    severity_number: 13,
                    severity_text: "WARN".into(),
                    body: s("cell 7 still running"),
                    attributes: vec![kv("code.function", s("run_cell"))],
                    trace_id: Some(tid(TRACE_A)),
                    span_id: Some(sid(TOOL)),
                    ..LogRecord::default()
                }],
            }],
        }],
    }
}

/// The ledger row of the open span, as the watchdog would write it.
pub fn open_ledger_row(now: u64) -> LedgerRow {
    LedgerRow {
        trace_id: tid(TRACE_A),
        span_id: sid(OPEN),
        parent_span_id: Some(sid(ROOT)),
        name: "execute_tool plot_results".into(),
        tool_name: Some("plot_results".into()),
        runner_id: Some("nb-1".into()),
        service_name: "python-runner".into(),
        pid: Some(4242),
        state: SpanState::Open,
        boot_id: "test-boot".into(),
        first_seen_mono_ns: 1,
        last_seen_mono_ns: 2,
        refreshes: 1,
        first_seen_unix_nano: now,
        last_seen_unix_nano: now,
        sla_ms: Some(30_000),
        sla_override_ms: None,
    }
}

pub fn board() -> RunnerBoard {
    let mut m = BTreeMap::new();
    m.insert(
        "nb-1".to_string(),
        RunnerStatus {
            id: "nb-1".into(),
            pid: Some(4242),
            spawned: true,
            lifecycle: RunnerLifecycle::Running,
            breaker: BreakerState::Closed,
            verdict: "healthy".into(),
            reason: String::new(),
            retry_after_ms: None,
            heartbeat: stallwatch_storage::labels::HeartbeatLabel::Ok,
            heartbeat_rtt_us: vec![(1_767_225_600_000, 180), (1_767_225_602_000, 240)],
            worst_span: Some(WorstSpan {
                trace_id: tid(TRACE_A),
                span_id: sid(OPEN),
                tool_name: "plot_results".into(),
                elapsed_ms: 12_000,
                sla_ms: 30_000,
                stale: false,
            }),
        },
    );
    m.insert(
        "py-2".to_string(),
        RunnerStatus {
            id: "py-2".into(),
            pid: Some(5151),
            spawned: false,
            lifecycle: RunnerLifecycle::Detached,
            breaker: BreakerState::Open,
            verdict: "tool_overrun".into(),
            reason: "tool span fit_model over its SLA of 60000 ms".into(),
            retry_after_ms: Some(12_500),
            heartbeat: stallwatch_storage::labels::HeartbeatLabel::Ok,
            heartbeat_rtt_us: vec![],
            worst_span: None,
        },
    );
    Arc::new(m)
}

pub fn incident(kind: EventKind, key: &str) -> NewIncident {
    NewIncident {
        kind,
        runner_id: Some("nb-1".into()),
        tool_name: Some("run_notebook".into()),
        trace_id: Some(tid(TRACE_A)),
        span_id: Some(sid(TOOL)),
        reason: format!("{} for the test", kind.as_str()),
        evidence: serde_json::json!({"sla_ms": 30000, "elapsed_ms": 31000}),
        idempotency_key: key.into(),
        at_unix_nano: now_unix_nano(),
    }
}

/// Seeds spans, logs, the open-span ledger, the board and two incidents.
pub async fn seed(h: &Harness) {
    h.storage
        .write_traces(Arc::new(seed_batch()))
        .await
        .unwrap();
    h.storage.write_logs(Arc::new(seed_logs())).await.unwrap();
    h.storage
        .ledger_apply(
            // `.into()`: works whether the writes are passed as a Vec or an Arc<Vec>.
            vec![LedgerWrite::Upsert(Box::new(open_ledger_row(
                now_unix_nano(),
            )))]
            .into(),
        )
        .await
        .unwrap();
    h.board.send_replace(board());
    h.events
        .publish(incident(EventKind::BreakerOpened, "seed-1"))
        .await
        .unwrap();
    let mut term = incident(EventKind::RunnerTerminated, "seed-2");
    // The reaper's evidence shape (reaper/src/service.rs: cause, report, rollbacks).
    term.evidence = serde_json::json!({
        "cause": "trip",
        "report": {
            "termination_id": "t-1", "runner_id": "nb-1", "cause": "trip",
            "steps": [
                {"step": "sigterm_sent", "at_ms": 0, "detail": {}},
                {"step": "exited", "at_ms": 850, "detail": {}}
            ],
            "ended_by": "sigterm", "exit": null, "escaped": [], "survivors": [],
            "sigterm_unix_nano": 1_767_225_631_000_000_000u64, "sigkill_unix_nano": null,
            "duration_ms": 850
        },
        "checkpoints_rolled_back": ["tx-1"],
        "spans_closed": 1
    });
    h.events.publish(term).await.unwrap();
}

/// Replaces values that depend on the clock with `"<t>"` (golden files ignore time).
pub fn normalize(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, val) in m.iter_mut() {
                let timey = match k.as_str() {
                    "received_unix_nano"
                    | "at_unix_nano"
                    | "first_seen_unix_nano"
                    | "last_seen_unix_nano"
                    | "elapsed_ms"
                    | "created_unix_nano"
                    | "next_attempt_unix_nano"
                    | "done_unix_nano"
                    | "progress" => !val.is_null(),
                    // attempt durations are integers; span durations are fixed floats
                    "duration_ms" => val.is_u64(),
                    _ => false,
                };
                if timey {
                    *val = Value::String("<t>".into());
                } else {
                    normalize(val);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalize),
        _ => {}
    }
}

/// Compares `actual` (normalized) with `tests/golden/<name>.json`; `UPDATE_GOLDEN=1`
/// rewrites the file instead.
pub fn assert_golden(name: &str, mut actual: Value) {
    normalize(&mut actual);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(&actual).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "missing golden file {}; run with UPDATE_GOLDEN=1",
            path.display()
        )
    });
    let expected: Value = serde_json::from_str(&expected).unwrap();
    assert_eq!(actual, expected, "golden {name} differs; actual:\n{text}");
}

/// Polls `f` until it answers `Some` or `deadline` passes.
pub async fn eventually<T, F, Fut>(deadline: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
