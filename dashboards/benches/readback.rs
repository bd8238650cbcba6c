//! Logs and metrics read benchmark (a bench binary, not a timed test): p50/p95 of
//! `GET /api/v1/logs` and `GET /api/v1/metrics/{name}/points` over a real SQLite file
//! holding `STALLWATCH_BENCH_LOGS` log records and `STALLWATCH_BENCH_POINTS` metric points
//! (default 1,000,000 each), through the real HTTP server on a loopback socket. The target
//! (issue 13) is p95 < 50 ms for every query.
//!
//! The database is filled through `Storage::write_logs` / `write_metrics` (the writer thread
//! the OTLP ingest uses) in batches of 1,000, as an exporter's batch processor sends them.
//! Logs: 8 services × 4 runners, severities DEBUG..FATAL (mostly INFO), one record in 4
//! tied to a trace, 1 ms apart. Metrics: 10 instruments (sums, gauges, histograms,
//! exponential histograms) × 10 series × 10,000 points each, 10 s apart (~28 h).
//!
//! Each line also gives the process CPU time per request (`CLOCK_PROCESS_CPUTIME_ID`:
//! server and client together, all threads), which a loaded machine does not inflate as it
//! does wall time.
//!
//! Run: `cargo bench -p stallwatch-dashboards --bench readback`. `STALLWATCH_BENCH_DB`
//! keeps the database at that path (filled only when it is new); `STALLWATCH_BENCH_RUNS`
//! sets the requests per query (default 30).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stallwatch_dashboards::{app, serve, AppState, DashboardConfig};
use stallwatch_storage::control::RunnerBoard;
use stallwatch_storage::model::*;
use stallwatch_storage::{EventBus, Storage, StorageConfig};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// 2026-01-01T00:00:00Z, ns.
const T0: u64 = 1_767_225_600_000_000_000;
const BATCH: u64 = 1_000;
const SERIES: u64 = 10;
const INSTRUMENTS: [(&str, MetricKind); 10] = [
    ("tool.calls", MetricKind::Sum),
    ("tokens.used", MetricKind::Sum),
    ("queue.depth", MetricKind::Gauge),
    ("memory.rss", MetricKind::Gauge),
    ("cpu.load", MetricKind::Gauge),
    ("tool.duration", MetricKind::Histogram),
    ("http.server.request.duration", MetricKind::Histogram),
    ("llm.latency", MetricKind::Histogram),
    ("cell.duration", MetricKind::ExponentialHistogram),
    ("export.size", MetricKind::ExponentialHistogram),
];

fn s(v: &str) -> AnyValue {
    AnyValue::String(v.into())
}

fn resource(service: &str, runner: &str) -> Resource {
    Resource {
        attributes: vec![
            KeyValue::new("service.name", s(service)),
            KeyValue::new("stallwatch.runner.id", s(runner)),
        ],
        ..Resource::default()
    }
}

fn log_batch(first: u64) -> Arc<LogBatch> {
    let k = first / BATCH;
    let service = format!("svc-{}", k % 8);
    let runner = format!("runner-{}", k % 4);
    let records = (first..first + BATCH)
        .map(|i| {
            let severity = match i % 100 {
                0 => 21,
                1..=3 => 17,
                4..=10 => 13,
                11..=30 => 5,
                _ => 9,
            };
            let mut trace = [0u8; 16];
            trace[..8].copy_from_slice(&(i / 40 + 1).to_be_bytes());
            LogRecord {
                time_unix_nano: T0 + i * 1_000_000,
                observed_time_unix_nano: T0 + i * 1_000_000,
                severity_number: severity,
                severity_text: String::new(),
                body: s(&format!(
                    "cell {} finished {} after {} ms",
                    i % 500,
                    if severity >= 17 {
                        "with an error"
                    } else {
                        "ok"
                    },
                    i % 997
                )),
                attributes: vec![
                    KeyValue::new(
                        "code.function",
                        s(["fit", "plot", "load", "save"][(i % 4) as usize]),
                    ),
                    KeyValue::new("cell.index", AnyValue::Int((i % 500) as i64)),
                ],
                trace_id: (i % 4 == 0).then_some(TraceId(trace)),
                span_id: (i % 4 == 0).then_some(SpanId((i + 1).to_be_bytes())),
                ..LogRecord::default()
            }
        })
        .collect();
    Arc::new(LogBatch {
        resource_logs: vec![ResourceLogs {
            resource: resource(&service, &runner),
            scope_logs: vec![ScopeLogs {
                scope: Scope {
                    name: "bench.logs".into(),
                    ..Scope::default()
                },
                log_records: records,
            }],
        }],
    })
}

/// One point of instrument `m`, series `series`, at step `n` (cumulative sums and
/// histograms since T0).
fn point(m: usize, series: u64, n: u64) -> MetricPoint {
    let (name, kind) = INSTRUMENTS[m];
    let time = T0 + n * 10_000_000_000;
    let count = (n + 1) * 10;
    let (value, detail) = match kind {
        MetricKind::Sum => (
            Some(count as f64),
            r#"{"aggregation_temporality":"AGGREGATION_TEMPORALITY_CUMULATIVE","is_monotonic":true}"#.to_string(),
        ),
        MetricKind::Gauge => (Some(((n * 7 + series) % 100) as f64), "{}".to_string()),
        MetricKind::Histogram => {
            let b = [count / 10, count / 5, count / 2, count / 10, count / 10];
            (
                None,
                format!(
                    r#"{{"aggregation_temporality":"AGGREGATION_TEMPORALITY_CUMULATIVE","explicit_bounds":[5,10,25,50],"bucket_counts":["{}","{}","{}","{}","{}"],"min":0.5,"max":80}}"#,
                    b[0], b[1], b[2], b[3], b[4]
                ),
            )
        }
        _ => {
            let b: Vec<String> = (0..8).map(|j| (count / 8 + j).to_string()).collect();
            (
                None,
                format!(
                    r#"{{"aggregation_temporality":"AGGREGATION_TEMPORALITY_CUMULATIVE","scale":3,"zero_count":"0","positive":{{"offset":10,"bucket_counts":["{}"]}},"min":2,"max":40}}"#,
                    b.join("\",\"")
                ),
            )
        }
    };
    MetricPoint {
        name: name.into(),
        description: String::new(),
        unit: "1".into(),
        kind,
        start_time_unix_nano: T0,
        time_unix_nano: time,
        value,
        count: (kind == MetricKind::Histogram || kind == MetricKind::ExponentialHistogram)
            .then_some(count),
        sum: (kind == MetricKind::Histogram || kind == MetricKind::ExponentialHistogram)
            .then_some(count as f64 * 12.5),
        attributes: vec![
            KeyValue::new("tool", s(&format!("tool-{series}"))),
            KeyValue::new("ok", AnyValue::Bool(!series.is_multiple_of(3))),
        ],
        detail,
    }
}

/// Points `first..first + BATCH` in time order: step n holds every instrument and series.
fn metric_batch(first: u64) -> Arc<MetricBatch> {
    let per_step = INSTRUMENTS.len() as u64 * SERIES;
    let points = (first..first + BATCH)
        .map(|i| {
            let n = i / per_step;
            let r = i % per_step;
            point((r / SERIES) as usize, r % SERIES, n)
        })
        .collect();
    Arc::new(MetricBatch {
        resource_metrics: vec![ResourceMetrics {
            resource: resource("svc-metrics", "runner-0"),
            scope_metrics: vec![ScopeMetrics {
                scope: Scope {
                    name: "bench.metrics".into(),
                    ..Scope::default()
                },
                points,
            }],
        }],
    })
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// CPU time of this process (all threads), ns.
fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let path = std::env::var("STALLWATCH_BENCH_DB")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| dir.path().join("bench.db"));
    let fresh = !path.exists();
    let logs = env_u64("STALLWATCH_BENCH_LOGS", 1_000_000).div_ceil(BATCH) * BATCH;
    let points = env_u64("STALLWATCH_BENCH_POINTS", 1_000_000).div_ceil(BATCH) * BATCH;
    let storage = Storage::open(StorageConfig::new(&path)).unwrap();
    if fresh {
        let fill = Instant::now();
        for first in (0..logs).step_by(BATCH as usize) {
            storage.write_logs(log_batch(first)).await.unwrap();
        }
        eprintln!("filled {logs} log records in {:?}", fill.elapsed());
        let fill = Instant::now();
        for first in (0..points).step_by(BATCH as usize) {
            storage.write_metrics(metric_batch(first)).await.unwrap();
        }
        eprintln!("filled {points} metric points in {:?}", fill.elapsed());
    }

    let (_board_tx, board) = watch::channel::<RunnerBoard>(Arc::new(BTreeMap::new()));
    let (_ready_tx, ready) = watch::channel(true);
    let (control, _control_rx) = mpsc::channel(1);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = AppState {
        storage: storage.clone(),
        events: EventBus::new(storage.clone()),
        board,
        control,
        token: "x".repeat(64),
        metrics: vec![],
        ready,
        config: Arc::new(DashboardConfig::default()),
        otlp_import: None,
    };
    let stop = CancellationToken::new();
    tokio::spawn(serve(listener, app(state), stop.clone()));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();

    let end = T0 + logs * 1_000_000;
    let hour = 3_600_000_000_000u64;
    let trace = {
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&(logs / 80 + 1).to_be_bytes());
        hex::encode(t)
    };
    let logs_queries = [
        "limit=50".to_string(),
        "service=svc-3&limit=50".into(),
        "min_severity=error&limit=50".into(),
        "service=svc-5&min_severity=warn&limit=50".into(),
        "runner_id=runner-2&limit=50".into(),
        format!("trace_id={trace}"),
        "body=error&limit=50".into(),
        "attr=code.function=plot&limit=50".into(),
        "body=cell%20499%20&service=svc-1&limit=50".into(),
        format!(
            "start_unix_nano={}&end_unix_nano={}&min_severity=warn&limit=100",
            end - hour / 6,
            end - hour / 12
        ),
    ];
    let metric_end = T0 + (points / (INSTRUMENTS.len() as u64 * SERIES)) * 10_000_000_000;
    let mut metric_queries = Vec::new();
    for (name, window) in [
        ("tool.calls", hour),
        ("queue.depth", hour),
        ("tool.duration", hour),
        ("cell.duration", hour),
        ("tool.calls", 24 * hour),
        ("queue.depth", 24 * hour),
        ("tool.duration", 24 * hour),
        ("cell.duration", 24 * hour),
    ] {
        metric_queries.push(format!(
            "{name}/points?service=svc-metrics&from={}&to={metric_end}",
            metric_end - window
        ));
    }
    let runs = env_u64("STALLWATCH_BENCH_RUNS", 30);
    let run = |label: &'static str, path: String| {
        let client = client.clone();
        async move {
            let mut v = Vec::new();
            let mut bytes = 0;
            let mut items = 0;
            let mut cpu = 0;
            for _ in 0..runs {
                let t = Instant::now();
                let c = cpu_ns();
                let r = client
                    .get(format!("http://{addr}{path}"))
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "{path}: {}", r.status());
                let body = r.bytes().await.unwrap();
                v.push(t.elapsed());
                cpu += cpu_ns() - c;
                bytes = body.len();
                let j: serde_json::Value = serde_json::from_slice(&body).unwrap();
                items = j["items"]
                    .as_array()
                    .or(j["series"].as_array())
                    .map_or(0, Vec::len);
            }
            println!(
                "{label} {path:<90} {items:>4} items {:>6} KiB  p50 {:>9.2?}  p95 {:>9.2?}  cpu/req {:>7.2} ms",
                bytes / 1024,
                pct(v.clone(), 0.5),
                pct(v.clone(), 0.95),
                cpu as f64 / runs as f64 / 1e6
            );
            v
        }
    };
    let mut all = Vec::new();
    for q in &logs_queries {
        all.extend(run("logs  ", format!("/api/v1/logs?{q}")).await);
    }
    println!(
        "logs, all queries ({logs} records): p50 {:?}  p95 {:?}",
        pct(all.clone(), 0.5),
        pct(all, 0.95)
    );
    let mut all = Vec::new();
    for q in &metric_queries {
        all.extend(run("points", format!("/api/v1/metrics/{q}")).await);
    }
    println!(
        "metric points, all queries ({points} points): p50 {:?}  p95 {:?}",
        pct(all.clone(), 0.5),
        pct(all, 0.95)
    );
    stop.cancel();
    storage.shutdown().await;
}
