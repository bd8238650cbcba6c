//! Ingest benchmark (a bench binary, not a timed test): realistic tool spans, 512 per
//! request, through (1) the decode layer alone, protobuf and OTLP/JSON, and (2) a real
//! collector with a real SQLite storage over OTLP/gRPC at concurrency 1 and 4, reporting
//! accepted spans/s and p50/p99 export latency.
//!
//! Run: `cargo bench -p stallwatch-collector --bench ingest` (env `INGEST_BENCH_SECS`,
//! default 5, sets the duration of each end-to-end run; `INGEST_BENCH_DECODE_ONLY` set:
//! the decode layer alone).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::resource::v1 as pr;
use opentelemetry_proto::tonic::trace::v1 as pt;
use prost::Message;
use stallwatch_collector::decode::{
    decode_traces, decode_traces_into, DecodeError, Format, Limits, SpanSink,
};
use stallwatch_collector::{Collector, CollectorConfig};
use stallwatch_storage::model::{Resource, Scope, Span, SpanRef};
use stallwatch_storage::{Storage, StorageConfig};

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

/// One request of realistic tool spans; `seq` makes ids unique.
fn request(seq: u64) -> ExportTraceServiceRequest {
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
                kv("mcp.method.name", s("tools/call")),
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
    ExportTraceServiceRequest {
        resource_spans: vec![pt::ResourceSpans {
            resource: Some(pr::Resource {
                attributes: vec![
                    kv("service.name", s("python-runner")),
                    kv("stallwatch.runner.id", s("runner-1")),
                    kv("process.pid", pc::any_value::Value::IntValue(4242)),
                ],
                ..Default::default()
            }),
            scope_spans: vec![pt::ScopeSpans {
                scope: Some(pc::InstrumentationScope {
                    name: "mcp.server".into(),
                    version: "1.0".into(),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// The same request as OTLP/JSON (hex ids, int64 as strings).
fn request_json(req: &ExportTraceServiceRequest) -> Vec<u8> {
    use serde_json::{json, Value};
    let attr = |a: &pc::KeyValue| -> Value {
        let v = match &a.value.as_ref().unwrap().value {
            Some(pc::any_value::Value::StringValue(s)) => json!({"stringValue": s}),
            Some(pc::any_value::Value::IntValue(i)) => json!({"intValue": i.to_string()}),
            _ => json!({}),
        };
        json!({"key": a.key, "value": v})
    };
    let rs = &req.resource_spans[0];
    let spans: Vec<Value> = rs.scope_spans[0]
        .spans
        .iter()
        .map(|sp| {
            json!({
                "traceId": hex::encode(&sp.trace_id), "spanId": hex::encode(&sp.span_id),
                "parentSpanId": hex::encode(&sp.parent_span_id), "name": sp.name, "kind": sp.kind,
                "startTimeUnixNano": sp.start_time_unix_nano.to_string(),
                "endTimeUnixNano": sp.end_time_unix_nano.to_string(),
                "attributes": sp.attributes.iter().map(attr).collect::<Vec<_>>(),
                "status": {"code": 1}
            })
        })
        .collect();
    let res_attrs: Vec<Value> = rs
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(attr)
        .collect();
    json!({"resourceSpans": [{"resource": {"attributes": res_attrs},
        "scopeSpans": [{"scope": {"name": "mcp.server"}, "spans": spans}]}]})
    .to_string()
    .into_bytes()
}

fn decode_bench() {
    let limits = Limits {
        max_nesting_depth: 32,
    };
    let req = request(0);
    let pb = req.encode_to_vec();
    let js = request_json(&req);
    for (name, body, format) in [
        ("protobuf", &pb, Format::Protobuf),
        ("json", &js, Format::Json),
    ] {
        let iters = if format == Format::Json { 100 } else { 400 };
        let t = Instant::now();
        for _ in 0..iters {
            let d = decode_traces(body, format, &limits).unwrap();
            assert_eq!(d.batch.span_count(), SPANS_PER_REQUEST);
        }
        let secs = t.elapsed().as_secs_f64();
        let spans = (iters * SPANS_PER_REQUEST) as f64;
        println!(
            "decode {name:8}: {:>9.0} spans/s, {:.2} CPU s per million spans, request {} bytes",
            spans / secs,
            secs / spans * 1e6,
            body.len()
        );
    }
}

/// A sink that counts the spans the protobuf decoder hands it, borrowed, and drops them:
/// what the ingest path's own decoding costs, without the owned copy [`Collect`] makes.
#[derive(Default)]
struct Count(usize);

impl<'a> SpanSink<'a> for Count {
    fn resource(&mut self, _: Resource) {}
    fn scope(&mut self, _: Scope) {}
    fn span(&mut self, _: Span, _: usize) -> Result<(), DecodeError> {
        self.0 += 1;
        Ok(())
    }
    fn span_ref(&mut self, span: SpanRef<'a>, _: usize) -> Result<(), DecodeError> {
        drop(std::hint::black_box(span));
        self.0 += 1;
        Ok(())
    }
}

/// The protobuf decoder alone, spans borrowed and dropped (the ingest path's decoding).
fn decode_borrowed_bench() {
    let limits = Limits {
        max_nesting_depth: 32,
    };
    let pb = request(0).encode_to_vec();
    let iters = 2000;
    let t = Instant::now();
    for _ in 0..iters {
        let mut count = Count::default();
        decode_traces_into(&pb, Format::Protobuf, &limits, &mut count).unwrap();
        assert_eq!(count.0, SPANS_PER_REQUEST);
    }
    let secs = t.elapsed().as_secs_f64();
    let spans = (iters * SPANS_PER_REQUEST) as f64;
    println!(
        "decode protobuf, borrowed: {:>9.0} spans/s, {:.3} CPU s per million spans",
        spans / secs,
        secs / spans * 1e6,
    );
}

async fn grpc_export(client: &mut h2::client::SendRequest<Bytes>, addr: SocketAddr, frame: Bytes) {
    let req = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{addr}/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (resp, mut send) = client.send_request(req, false).unwrap();
    send.send_data(frame, true).unwrap();
    let resp = resp.await.unwrap();
    let mut body = resp.into_body();
    while let Some(c) = body.data().await {
        let c = c.unwrap();
        let _ = body.flow_control().release_capacity(c.len());
    }
    let trailers = body.trailers().await.unwrap().unwrap();
    assert_eq!(trailers["grpc-status"], "0");
}

fn frame(msg: &[u8]) -> Bytes {
    let mut f = vec![0u8];
    f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    f.extend_from_slice(msg);
    Bytes::from(f)
}

async fn e2e(concurrency: usize, secs: u64) {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(StorageConfig::new(dir.path().join("bench.db"))).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let config = CollectorConfig {
        grpc_listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        ..CollectorConfig::default()
    };
    let collector = Collector::bind(config, storage.clone(), tx).await.unwrap();
    let addr = collector.grpc_addr();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(collector.run(shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut workers = Vec::new();
    for w in 0..concurrency {
        workers.push(tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let (client, conn) = h2::client::handshake(tcp).await.unwrap();
            tokio::spawn(conn);
            let mut client = client.ready().await.unwrap();
            let mut lat = Vec::new();
            let mut seq = (w as u64) << 32;
            while Instant::now() < deadline {
                let body = frame(&request(seq).encode_to_vec());
                seq += 1;
                let t = Instant::now();
                grpc_export(&mut client, addr, body).await;
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let start = Instant::now();
    let mut lat: Vec<Duration> = Vec::new();
    for w in workers {
        lat.extend(w.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "grpc e2e c={concurrency}: {:>9.0} spans/s accepted (durable), p50 {:.1} ms, p99 {:.1} ms, {} requests",
        (lat.len() * SPANS_PER_REQUEST) as f64 / elapsed,
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        lat.len()
    );
    shutdown.cancel();
    let _ = server.await;
    storage.shutdown().await;
}

fn main() {
    let secs: u64 = std::env::var("INGEST_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    decode_bench();
    decode_borrowed_bench();
    if std::env::var_os("INGEST_BENCH_DECODE_ONLY").is_some() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        e2e(1, secs).await;
        e2e(4, secs).await;
    });
}
