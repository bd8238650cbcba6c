//! Read-API benchmark (a bench binary, not a timed test): trace view of one 10,000-span
//! trace and trace search p50/p95 over a database of `STALLWATCH_BENCH_TRACES` traces
//! (default 2,000 × 5 spans), through the real HTTP server on a loopback socket.
//!
//! Run: `cargo bench -p stallwatch-dashboards --bench api`. For the 10-million-span figure,
//! point `STALLWATCH_BENCH_DB` at a database filled by the storage fill tool (the 10,000-span
//! trace is then added to it).

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

fn span(t: [u8; 16], s: u64, parent: Option<u64>, start: u64, name: &str, tool: &str) -> Span {
    Span {
        trace_id: TraceId(t),
        span_id: SpanId(s.to_be_bytes()),
        parent_span_id: parent.map(|p| SpanId(p.to_be_bytes())),
        name: name.into(),
        kind: 1,
        start_time_unix_nano: start,
        end_time_unix_nano: start + 1_000_000 + (s % 97) * 1_000_000,
        attributes: vec![
            KeyValue::new(
                "gen_ai.operation.name",
                AnyValue::String("execute_tool".into()),
            ),
            KeyValue::new("gen_ai.tool.name", AnyValue::String(tool.into())),
        ],
        status: Status {
            code: if s.is_multiple_of(50) { 2 } else { 1 },
            message: String::new(),
        },
        ..Span::default()
    }
}

fn batch(spans: Vec<Span>, service: &str) -> Arc<TraceBatch> {
    Arc::new(TraceBatch {
        resource_spans: vec![ResourceSpans {
            resource: Resource {
                attributes: vec![KeyValue::new(
                    "service.name",
                    AnyValue::String(service.into()),
                )],
                ..Resource::default()
            },
            scope_spans: vec![ScopeSpans {
                scope: Scope::default(),
                spans,
            }],
        }],
    })
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let path = std::env::var("STALLWATCH_BENCH_DB")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| dir.path().join("bench.db"));
    let traces: u64 = std::env::var("STALLWATCH_BENCH_TRACES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let storage = Storage::open(StorageConfig::new(&path)).unwrap();
    let t0 = 1_767_225_600_000_000_000u64;
    let tools = ["run_notebook", "plot_results", "fit_model", "load_dataset"];
    let fill = Instant::now();
    for chunk in 0..traces.div_ceil(100) {
        let mut spans = Vec::new();
        for i in chunk * 100..((chunk + 1) * 100).min(traces) {
            let mut t = [0u8; 16];
            t[..8].copy_from_slice(&(i + 1).to_be_bytes());
            t[8] = 0xaa;
            let root = (i + 1) << 8;
            spans.push(span(
                t,
                root,
                None,
                t0 + i * 10_000_000,
                "agent.run",
                "agent",
            ));
            for k in 1..5u64 {
                spans.push(span(
                    t,
                    root + k,
                    Some(root),
                    t0 + i * 10_000_000 + k,
                    "execute_tool",
                    tools[(k as usize) % 4],
                ));
            }
        }
        storage
            .write_traces(batch(spans, "python-runner"))
            .await
            .unwrap();
    }
    let big = [0xbbu8; 16];
    for chunk in 0..10u64 {
        let spans = (0..1000u64)
            .map(|j| {
                let s = chunk * 1000 + j + 2;
                span(
                    big,
                    s,
                    Some(1),
                    t0 + s * 1000,
                    "execute_tool cell",
                    tools[(s as usize) % 4],
                )
            })
            .chain((chunk == 0).then(|| span(big, 1, None, t0, "notebook.run", "agent")))
            .collect();
        storage
            .write_traces(batch(spans, "big-runner"))
            .await
            .unwrap();
    }
    eprintln!(
        "filled {} spans in {:?}",
        traces * 5 + 10_001,
        fill.elapsed()
    );

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

    let mut direct = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let v = storage.trace(TraceId(big)).await.unwrap().unwrap();
        direct.push(t.elapsed());
        assert_eq!(v.spans.len(), 10_001);
    }
    println!(
        "storage.trace alone, 10,001 spans: p50 {:?}",
        pct(direct, 0.5)
    );

    let mut view = Vec::new();
    let mut bytes = 0;
    for _ in 0..20 {
        let t = Instant::now();
        let body = client
            .get(format!("http://{addr}/api/v1/traces/{}", hex::encode(big)))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        view.push(t.elapsed());
        bytes = body.len();
    }
    println!(
        "trace view, 10,001 spans ({} KiB): p50 {:?}  p95 {:?}",
        bytes / 1024,
        pct(view.clone(), 0.5),
        pct(view, 0.95)
    );

    let queries = [
        "limit=50",
        "service=python-runner&limit=50",
        "tool_name=fit_model&limit=50",
        "status=error&limit=50",
        "min_duration_ms=50&limit=50",
        "span_name=execute_tool&limit=20",
        "attr=gen_ai.tool.name=plot_results&limit=50",
    ];
    let mut all = Vec::new();
    for q in queries {
        let mut v = Vec::new();
        for _ in 0..30 {
            let t = Instant::now();
            let r = client
                .get(format!("http://{addr}/api/v1/traces?{q}"))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{q}: {}", r.status());
            r.bytes().await.unwrap();
            v.push(t.elapsed());
        }
        println!(
            "search {q:<45} p50 {:?}  p95 {:?}",
            pct(v.clone(), 0.5),
            pct(v.clone(), 0.95)
        );
        all.extend(v);
    }
    println!(
        "search, all queries: p50 {:?}  p95 {:?}",
        pct(all.clone(), 0.5),
        pct(all, 0.95)
    );
    stop.cancel();
    storage.shutdown().await;
}
