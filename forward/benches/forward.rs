//! Forwarding benchmark (a bench binary, not a timed test). A = a real SQLite storage
//! filled with realistic tool spans (512 per stored request) plus a [`Forwarder`]; B = a
//! real collector with its own storage (the upstream, as a second stallwatch would be).
//!
//! 1. Throughput: `FORWARD_BENCH_SPANS` (default 500000) spans stored in A, then the time
//!    until B acknowledged them all, per protocol (HTTP/protobuf, gRPC; no compression).
//! 2. Outage: A ingests `FORWARD_BENCH_RATE` spans/s (default 20000) for
//!    `FORWARD_BENCH_OUTAGE_SECS` (default 30) while B is down; prints the backlog every
//!    5 s, then brings B up and reports the drain time.
//!
//! 3. Live: A ingests at the same rate for `FORWARD_BENCH_LIVE_SECS` (default 10) with
//!    the forwarder off, then on with B healthy: the slowest and mean local write, and the
//!    forwarding lag at the end (does forwarding slow local ingest?).
//!
//! Run: `cargo bench -p stallwatch-forward --bench forward`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::resource::v1 as pr;
use opentelemetry_proto::tonic::trace::v1 as pt;
use prost::Message;
use stallwatch_collector::decode::{decode_traces, Format, Limits};
use stallwatch_collector::{Collector, CollectorConfig};
use stallwatch_forward::{ForwardConfig, Forwarder, RawForwardConfig};
use stallwatch_storage::forward::Signal;
use stallwatch_storage::model::TraceBatch;
use stallwatch_storage::{Storage, StorageConfig};
use tokio_util::sync::CancellationToken;

const SPANS_PER_REQUEST: usize = 512;

fn kv(k: &str, v: pc::any_value::Value) -> pc::KeyValue {
    pc::KeyValue {
        key: k.into(),
        value: Some(pc::AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

fn s(v: &str) -> pc::any_value::Value {
    pc::any_value::Value::StringValue(v.into())
}

/// One stored request of realistic tool spans; `seq` makes ids unique.
fn batch(seq: u64) -> Arc<TraceBatch> {
    let mut spans = Vec::with_capacity(SPANS_PER_REQUEST);
    for i in 0..SPANS_PER_REQUEST as u64 {
        let n = seq * SPANS_PER_REQUEST as u64 + i;
        let mut trace_id = [0u8; 16];
        trace_id[..8].copy_from_slice(&(n / 8 + 1).to_be_bytes());
        trace_id[8..].copy_from_slice(&0x5eed_u64.wrapping_mul(n / 8 + 7).to_be_bytes());
        let start = 1_700_000_000_000_000_000 + n * 1_000_000;
        spans.push(pt::Span {
            trace_id: trace_id.to_vec(),
            span_id: (n + 1).to_be_bytes().to_vec(),
            parent_span_id: if i.is_multiple_of(8) {
                vec![]
            } else {
                (n - i % 8 + 1).to_be_bytes().to_vec()
            },
            name: "execute_tool run_notebook".into(),
            kind: 1,
            start_time_unix_nano: start,
            end_time_unix_nano: start + 250_000_000,
            attributes: vec![
                kv("gen_ai.operation.name", s("execute_tool")),
                kv("gen_ai.tool.name", s("run_notebook")),
                kv("gen_ai.tool.call.id", s(&format!("call_{n:016x}"))),
                kv("code.function.name", s("execute")),
                kv("tool.input.bytes", pc::any_value::Value::IntValue(4096)),
            ],
            status: Some(pt::Status {
                code: 1,
                message: String::new(),
            }),
            ..Default::default()
        });
    }
    let req = ExportTraceServiceRequest {
        resource_spans: vec![pt::ResourceSpans {
            resource: Some(pr::Resource {
                attributes: vec![
                    kv("service.name", s("python-runner")),
                    kv("stallwatch.runner.id", s("runner-1")),
                ],
                ..Default::default()
            }),
            scope_spans: vec![pt::ScopeSpans {
                scope: Some(pc::InstrumentationScope {
                    name: "mcp.server".into(),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    let limits = Limits {
        max_nesting_depth: 32,
    };
    Arc::new(
        decode_traces(&req.encode_to_vec(), Format::Protobuf, &limits)
            .unwrap()
            .batch,
    )
}

/// The upstream: a collector on fixed addresses with its own storage.
struct Upstream {
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    storage: Storage,
    stats: Arc<stallwatch_collector::IngestStats>,
}

async fn upstream(dir: &std::path::Path, grpc: SocketAddr, http: SocketAddr) -> Upstream {
    let storage = Storage::open(StorageConfig::new(dir.join("b.db"))).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let config = CollectorConfig {
        grpc_listen: grpc,
        http_listen: http,
        ..CollectorConfig::default()
    };
    let collector = Collector::bind(config, storage.clone(), tx).await.unwrap();
    let stats = collector.stats();
    let token = CancellationToken::new();
    let t = token.clone();
    let task = tokio::spawn(async move {
        let _ = collector.run(t).await;
    });
    Upstream {
        token,
        task,
        storage,
        stats,
    }
}

impl Upstream {
    async fn stop(self) {
        self.token.cancel();
        let _ = self.task.await;
        self.storage.shutdown().await;
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn forward_config(endpoint: SocketAddr, protocol: &str) -> ForwardConfig {
    ForwardConfig::try_from(RawForwardConfig {
        endpoint: Some(format!("http://{endpoint}")),
        protocol: Some(protocol.into()),
        retry_initial_ms: Some(200),
        retry_max_ms: Some(1000),
        ..Default::default()
    })
    .unwrap()
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn throughput(protocol: &str, spans: u64) {
    let dir = tempfile::tempdir().unwrap();
    let a = Storage::open(StorageConfig::new(dir.path().join("a.db"))).unwrap();
    let requests = spans.div_ceil(SPANS_PER_REQUEST as u64);
    for seq in 0..requests {
        a.write_traces(batch(seq)).await.unwrap();
    }
    let total = requests * SPANS_PER_REQUEST as u64;
    let (grpc, http) = (free_addr(), free_addr());
    let b = upstream(dir.path(), grpc, http).await;
    let target = if protocol == "grpc" { grpc } else { http };
    let t = Instant::now();
    let fwd = Forwarder::start(forward_config(target, protocol), a.clone()).unwrap();
    let stats = fwd.stats();
    while stats.sent_items(Signal::Traces) < total {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "forward {protocol:>13}: {total} spans in {secs:.2} s = {:.0} spans/s (upstream received {}, retries {})",
        total as f64 / secs,
        b.stats.spans_received(),
        stats.retries()
    );
    fwd.stop(Duration::from_secs(10)).await;
    b.stop().await;
    a.shutdown().await;
}

async fn outage(rate: u64, secs: u64) {
    let dir = tempfile::tempdir().unwrap();
    let a = Storage::open(StorageConfig::new(dir.path().join("a.db"))).unwrap();
    let (grpc, http) = (free_addr(), free_addr());
    let fwd = Forwarder::start(forward_config(http, "http/protobuf"), a.clone()).unwrap();
    let stats = fwd.stats();
    let per_tick = (rate / 10).div_ceil(SPANS_PER_REQUEST as u64); // requests per 100 ms
    let t = Instant::now();
    let mut seq = 0u64;
    let mut worst_write = Duration::ZERO;
    let mut next_report = 5;
    while t.elapsed() < Duration::from_secs(secs) {
        let tick = Instant::now();
        for _ in 0..per_tick {
            let w = Instant::now();
            a.write_traces(batch(seq)).await.unwrap();
            worst_write = worst_write.max(w.elapsed());
            seq += 1;
        }
        if t.elapsed().as_secs() >= next_report {
            let backlog = a.forward_backlog(Signal::Traces, 0).await.unwrap();
            println!(
                "outage t={:>2}s: backlog {} spans, {:.1} MiB stored payload; retries {}",
                next_report,
                backlog.items,
                backlog.bytes as f64 / 1048576.0,
                stats.retries()
            );
            next_report += 5;
        }
        tokio::time::sleep(Duration::from_millis(100).saturating_sub(tick.elapsed())).await;
    }
    let total = seq * SPANS_PER_REQUEST as u64;
    println!(
        "outage: {total} spans accepted locally in {:.1} s while the upstream was down (slowest local write {:.1} ms); forwarded so far {}",
        t.elapsed().as_secs_f64(),
        worst_write.as_secs_f64() * 1e3,
        stats.sent_items(Signal::Traces)
    );
    let b = upstream(dir.path(), grpc, http).await;
    let up = Instant::now();
    while stats.sent_items(Signal::Traces) < total {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain = up.elapsed().as_secs_f64();
    println!(
        "outage: upstream back; backlog of {total} spans drained in {drain:.2} s ({:.0} spans/s, includes waiting out the back-off ≤ 1 s)",
        total as f64 / drain
    );
    fwd.stop(Duration::from_secs(10)).await;
    b.stop().await;
    a.shutdown().await;
}

/// Ingests `rate` spans/s for `secs` into `a`; answers (slowest, mean) write latency.
async fn ingest(a: &Storage, rate: u64, secs: u64, seq: &mut u64) -> (Duration, Duration) {
    let per_tick = (rate / 10).div_ceil(SPANS_PER_REQUEST as u64);
    let t = Instant::now();
    let (mut worst, mut total, mut n) = (Duration::ZERO, Duration::ZERO, 0u32);
    while t.elapsed() < Duration::from_secs(secs) {
        let tick = Instant::now();
        for _ in 0..per_tick {
            let w = Instant::now();
            a.write_traces(batch(*seq)).await.unwrap();
            let e = w.elapsed();
            worst = worst.max(e);
            total += e;
            n += 1;
            *seq += 1;
        }
        tokio::time::sleep(Duration::from_millis(100).saturating_sub(tick.elapsed())).await;
    }
    (worst, total / n.max(1))
}

async fn live(rate: u64, secs: u64) {
    let dir = tempfile::tempdir().unwrap();
    let a = Storage::open(StorageConfig::new(dir.path().join("a.db"))).unwrap();
    let mut seq = 0u64;
    let (worst, mean) = ingest(&a, rate, secs, &mut seq).await;
    println!(
        "live: forwarder off: {rate} spans/s for {secs} s, local write slowest {:.1} ms, mean {:.2} ms",
        worst.as_secs_f64() * 1e3,
        mean.as_secs_f64() * 1e3
    );
    let (grpc, http) = (free_addr(), free_addr());
    let b = upstream(dir.path(), grpc, http).await;
    let fwd = Forwarder::start(forward_config(http, "http/protobuf"), a.clone()).unwrap();
    let stats = fwd.stats();
    let before = seq * SPANS_PER_REQUEST as u64;
    while stats.sent_items(Signal::Traces) < before {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (worst, mean) = ingest(&a, rate, secs, &mut seq).await;
    let total = seq * SPANS_PER_REQUEST as u64;
    let lag = total - stats.sent_items(Signal::Traces);
    println!(
        "live: forwarder on:  {rate} spans/s for {secs} s, local write slowest {:.1} ms, mean {:.2} ms; forwarding lag at the end {lag} spans",
        worst.as_secs_f64() * 1e3,
        mean.as_secs_f64() * 1e3
    );
    fwd.stop(Duration::from_secs(10)).await;
    b.stop().await;
    a.shutdown().await;
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let spans = env("FORWARD_BENCH_SPANS", 500_000);
    rt.block_on(throughput("http/protobuf", spans));
    rt.block_on(throughput("grpc", spans));
    rt.block_on(outage(
        env("FORWARD_BENCH_RATE", 20_000),
        env("FORWARD_BENCH_OUTAGE_SECS", 30),
    ));
    rt.block_on(live(
        env("FORWARD_BENCH_RATE", 20_000),
        env("FORWARD_BENCH_LIVE_SECS", 10),
    ));
}
