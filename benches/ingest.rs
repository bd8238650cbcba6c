//! Ingest benchmark: starts the real `stallwatch serve` (bench profile) on a fresh data
//! folder and loads it with realistic tool spans over OTLP/gRPC and OTLP/HTTP protobuf,
//! 512 spans per request, at concurrency 1, 4 and 16.
//!
//! Reports per run: accepted spans/s, p50/p99 export latency, stallwatch's own CPU seconds
//! (user + system, from `/proc/PID/stat`) per million spans, and peak RSS (`VmHWM`); idle
//! RSS is read 10 s after start on an empty database. Each configuration gets a fresh
//! server and database. With `--prefill N` it also loads N spans into a fresh server and
//! then measures gRPC and HTTP/protobuf at concurrency 1 against that database.
//!
//! ```sh
//! cargo bench --bench ingest -- --requests 2000 --prefill 1000000
//! ```
//!
//! Every acknowledged span is durable (an export is answered only after its commit), so
//! these are durable-ingest figures. Spans are 8-span agent-turn traces (the same shape
//! `otlp-blast` sends); each request gets fresh trace and span ids by rewriting the id bytes
//! of a few pre-encoded bodies, so the generator costs little CPU next to the target.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{
    any_value::Value, AnyValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;

// ------------------------------------------------------------------ request templates

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        for chunk in out.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        out
    }
    fn word(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| (b'a' + (self.next() % 26) as u8) as char)
            .collect()
    }
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

/// (service, span name, kind, parent index, fixed attributes): the agent-turn trace
/// otlp-blast sends (same attributes, so both tools load the server equally).
type Shape = (
    &'static str,
    &'static str,
    i32,
    Option<usize>,
    &'static [(&'static str, &'static str)],
);
const TRACE_SHAPE: [Shape; 8] = [
    (
        "tauri-backend",
        "invoke agent_turn",
        2,
        None,
        &[("tauri.command", "agent_turn"), ("session.id", "ses_7f3a")],
    ),
    (
        "llm-gateway",
        "chat claude-sonnet-4",
        3,
        Some(0),
        &[
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.request.model", "claude-sonnet-4"),
            ("gen_ai.system", "anthropic"),
        ],
    ),
    (
        "tauri-backend",
        "tools/call run_notebook",
        3,
        Some(0),
        &[
            ("mcp.method.name", "tools/call"),
            ("gen_ai.tool.name", "run_notebook"),
            ("gen_ai.operation.name", "execute_tool"),
        ],
    ),
    (
        "mcp-runner-python",
        "tools/call run_notebook",
        2,
        Some(2),
        &[
            ("mcp.method.name", "tools/call"),
            ("gen_ai.tool.name", "run_notebook"),
            ("gen_ai.operation.name", "execute_tool"),
            ("mcp.session.id", "mcp_91c2"),
        ],
    ),
    (
        "mcp-runner-python",
        "execute_cell",
        1,
        Some(3),
        &[
            ("notebook.cell.index", "3"),
            ("code.function.name", "execute_cell"),
        ],
    ),
    (
        "tauri-backend",
        "tools/call read_file",
        3,
        Some(0),
        &[
            ("mcp.method.name", "tools/call"),
            ("gen_ai.tool.name", "read_file"),
            ("gen_ai.operation.name", "execute_tool"),
        ],
    ),
    (
        "mcp-runner-node",
        "tools/call read_file",
        2,
        Some(5),
        &[
            ("mcp.method.name", "tools/call"),
            ("gen_ai.tool.name", "read_file"),
            ("gen_ai.operation.name", "execute_tool"),
            ("mcp.session.id", "mcp_44d0"),
        ],
    ),
    (
        "tauri-backend",
        "db.write session_events",
        1,
        Some(0),
        &[
            ("db.system.name", "sqlite"),
            ("db.operation.name", "INSERT"),
        ],
    ),
];

/// A pre-encoded request and where its ids sit, so each send can use fresh ids.
struct Template {
    body: Vec<u8>,
    trace_slots: Vec<Vec<usize>>,
    span_slots: Vec<Vec<usize>>,
}

fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    hay.windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

fn template(spans_per_request: usize, attrs: usize, rng: &mut Rng) -> Template {
    let traces = spans_per_request.div_ceil(8);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        - 2_000_000_000;
    let mut by_service: HashMap<&str, Vec<Span>> = HashMap::new();
    let mut trace_ids = Vec::new();
    let mut span_ids = Vec::new();
    let mut emitted = 0;
    for _ in 0..traces {
        let tid: [u8; 16] = rng.bytes();
        trace_ids.push(tid);
        let ids: Vec<[u8; 8]> = (0..8).map(|_| rng.bytes()).collect();
        for (i, (service, name, kind, parent, fixed)) in TRACE_SHAPE.iter().enumerate() {
            if emitted == spans_per_request {
                break;
            }
            emitted += 1;
            span_ids.push(ids[i]);
            let mut attributes: Vec<KeyValue> = fixed.iter().map(|(k, v)| kv(k, v)).collect();
            for a in 0..attrs {
                attributes.push(kv(&format!("workbench.attr.{a}"), &rng.word(24)));
            }
            let start = now + (i as u64) * 3_000_000 + rng.next() % 1_000_000;
            // 2% errors with a message, as otlp-blast.
            let error = rng.next().is_multiple_of(50);
            by_service.entry(service).or_default().push(Span {
                trace_id: tid.to_vec(),
                span_id: ids[i].to_vec(),
                parent_span_id: parent.map(|p| ids[p].to_vec()).unwrap_or_default(),
                flags: 0x100,
                name: (*name).into(),
                kind: *kind,
                start_time_unix_nano: start,
                end_time_unix_nano: start + 200_000 + rng.next() % 250_000_000,
                attributes,
                status: Some(Status {
                    code: if error { 2 } else { 0 },
                    message: if error {
                        "tool returned non-zero exit".into()
                    } else {
                        String::new()
                    },
                }),
                ..Default::default()
            });
        }
    }
    let mut resource_spans = vec![];
    let mut services: Vec<_> = by_service.into_iter().collect();
    services.sort_by_key(|(s, _)| *s);
    for (pid, (service, spans)) in services.into_iter().enumerate() {
        resource_spans.push(ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", service),
                    KeyValue {
                        key: "process.pid".into(),
                        value: Some(AnyValue {
                            value: Some(Value::IntValue(10_000 + pid as i64)),
                        }),
                        ..Default::default()
                    },
                    kv("service.version", "0.4.2"),
                    kv(
                        "telemetry.sdk.language",
                        match service {
                            "mcp-runner-python" => "python",
                            "mcp-runner-node" => "nodejs",
                            _ => "rust",
                        },
                    ),
                ],
                dropped_attributes_count: 0,
                entity_refs: vec![],
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "workbench.tracing".into(),
                    version: "0.4.2".into(),
                    attributes: vec![],
                    dropped_attributes_count: 0,
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: "https://opentelemetry.io/schemas/1.37.0".into(),
        });
    }
    let body = ExportTraceServiceRequest { resource_spans }.encode_to_vec();
    let trace_slots = trace_ids.iter().map(|t| find_all(&body, t)).collect();
    let span_slots = span_ids.iter().map(|s| find_all(&body, s)).collect();
    Template {
        body,
        trace_slots,
        span_slots,
    }
}

impl Template {
    /// The body with ids derived from `n` (unique per request across the run).
    fn render(&self, n: u64) -> Vec<u8> {
        // Random-looking ids (as real SDKs and otlp-blast send): sequential ids would land
        // at the end of the trace-id index and make the server look faster than it is.
        let mix = |mut z: u64| {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let mut b = self.body.clone();
        for (i, slots) in self.trace_slots.iter().enumerate() {
            let k = (n << 20) ^ i as u64;
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&mix(k).to_le_bytes());
            id[8..].copy_from_slice(&mix(!k).to_le_bytes());
            for &o in slots {
                b[o..o + 16].copy_from_slice(&id);
            }
        }
        for (i, slots) in self.span_slots.iter().enumerate() {
            let v = mix((n << 20) ^ (1 << 19) ^ i as u64) | 1;
            for &o in slots {
                b[o..o + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
        b
    }
}

// ------------------------------------------------------------------ transports

#[derive(Default, Clone)]
struct RawCodec;
struct RawEncoder;
struct RespDecoder;
impl tonic::codec::Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}
impl tonic::codec::Decoder for RespDecoder {
    type Item = ExportTraceServiceResponse;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Self::Item>, tonic::Status> {
        ExportTraceServiceResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}
impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = RawEncoder;
    type Decoder = RespDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RespDecoder {
        RespDecoder
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Protocol {
    Grpc,
    HttpProto,
}

enum Client {
    Grpc(tonic::client::Grpc<tonic::transport::Channel>),
    Http(reqwest::Client, String),
}

impl Client {
    async fn connect(p: Protocol, grpc: SocketAddr, http: SocketAddr) -> Client {
        match p {
            Protocol::Grpc => {
                let ch = tonic::transport::Channel::from_shared(format!("http://{grpc}"))
                    .unwrap()
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .unwrap();
                Client::Grpc(tonic::client::Grpc::new(ch))
            }
            Protocol::HttpProto => Client::Http(
                reqwest::Client::builder()
                    .no_proxy()
                    .tcp_nodelay(true)
                    .pool_max_idle_per_host(1)
                    .build()
                    .unwrap(),
                format!("http://{http}/v1/traces"),
            ),
        }
    }

    /// Sends one body; answers the number of spans refused (partial success), or an error.
    async fn send(&mut self, body: Vec<u8>) -> Result<i64, String> {
        match self {
            Client::Grpc(g) => {
                g.ready().await.map_err(|e| e.to_string())?;
                let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                    "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                );
                let r = g
                    .unary(tonic::Request::new(Bytes::from(body)), path, RawCodec)
                    .await
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
                Ok(r.into_inner()
                    .partial_success
                    .map(|p| p.rejected_spans)
                    .unwrap_or(0))
            }
            Client::Http(c, url) => {
                let r = c
                    .post(url.as_str())
                    .header("content-type", "application/x-protobuf")
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let st = r.status();
                let b = r.bytes().await.map_err(|e| e.to_string())?;
                if !st.is_success() {
                    return Err(format!("http {st}"));
                }
                Ok(ExportTraceServiceResponse::decode(b.as_ref())
                    .ok()
                    .and_then(|r| r.partial_success)
                    .map(|p| p.rejected_spans)
                    .unwrap_or(0))
            }
        }
    }
}

// ------------------------------------------------------------------ process probes

fn clock_ticks() -> f64 {
    rustix::param::clock_ticks_per_second() as f64
}

/// stallwatch's user+system CPU seconds so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ")": field 3 is index 0; utime is field 14 → index 11, stime 15 → 12.
    let ut: f64 = f[11].parse().unwrap();
    let st: f64 = f[12].parse().unwrap();
    (ut + st) / clock_ticks()
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

struct Target {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    _dir: tempfile::TempDir,
}

fn start_target() -> Target {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stallwatch"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args([
            "--otlp-grpc-listen",
            "127.0.0.1:0",
            "--otlp-http-listen",
            "127.0.0.1:0",
        ])
        .args(["--dashboard-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    Target {
        grpc: ready["otlp_grpc"].as_str().unwrap().parse().unwrap(),
        http: ready["otlp_http"].as_str().unwrap().parse().unwrap(),
        child,
        _dir: dir,
    }
}

// ------------------------------------------------------------------ driver

struct RunResult {
    accepted: u64,
    errors: u64,
    secs: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_s: f64,
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

async fn run(
    t: &Target,
    p: Protocol,
    concurrency: usize,
    requests: usize,
    spans: usize,
) -> RunResult {
    let pid = t.child.id();
    let mut workers = vec![];
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(concurrency + 1));
    for w in 0..concurrency {
        let quota = requests / concurrency + usize::from(w < requests % concurrency);
        let (grpc, http, barrier) = (t.grpc, t.http, barrier.clone());
        workers.push(tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (w as u64 + 1));
            let tpls: Vec<Template> = (0..4).map(|_| template(spans, 4, &mut rng)).collect();
            let mut client = Client::connect(p, grpc, http).await;
            barrier.wait().await;
            let (mut ok, mut err, mut lat) = (0u64, 0u64, Vec::with_capacity(quota));
            for i in 0..quota {
                let n = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let body = tpls[i % tpls.len()].render(n);
                let t0 = Instant::now();
                match client.send(body).await {
                    Ok(rej) => ok += spans as u64 - rej.max(0) as u64,
                    Err(e) => {
                        if err == 0 {
                            eprintln!("first error: {e}");
                        }
                        err += 1
                    }
                }
                lat.push(t0.elapsed());
            }
            (ok, err, lat)
        }));
    }
    barrier.wait().await;
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    let (mut accepted, mut errors, mut lat) = (0, 0, vec![]);
    for w in workers {
        let (a, e, l) = w.await.unwrap();
        accepted += a;
        errors += e;
        lat.extend(l);
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds(pid) - cpu0;
    lat.sort();
    let pct = |q: f64| {
        lat[((lat.len() as f64 * q).ceil() as usize).clamp(1, lat.len()) - 1].as_secs_f64() * 1000.0
    };
    RunResult {
        accepted,
        errors,
        secs,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        cpu_s,
    }
}

fn report(label: &str, p: Protocol, c: usize, r: &RunResult, pid: u32) {
    let per_m = if r.accepted > 0 {
        r.cpu_s / (r.accepted as f64 / 1e6)
    } else {
        f64::NAN
    };
    println!(
        "{}",
        serde_json::json!({
            "db": label,
            "protocol": format!("{p:?}"),
            "concurrency": c,
            "spans_accepted": r.accepted,
            "errors": r.errors,
            "spans_per_s": (r.accepted as f64 / r.secs).round(),
            "p50_ms": (r.p50_ms * 100.0).round() / 100.0,
            "p99_ms": (r.p99_ms * 100.0).round() / 100.0,
            "cpu_s_per_million_spans": (per_m * 100.0).round() / 100.0,
            "peak_rss_mib": (status_kib(pid, "VmHWM:") as f64 / 1024.0 * 10.0).round() / 10.0,
        })
    );
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn stop(mut t: Target) {
    let _ = t.child.kill();
    let _ = t.child.wait();
}

fn main() {
    // `cargo bench` passes `--bench`; cargo test passes nothing we need to honour.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let requests = arg("--requests", 2000);
    let prefill = arg("--prefill", 0);
    let spans = arg("--spans-per-request", 512);
    let idle_wait = arg("--idle-wait-s", 10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let t = start_target();
    let pid = t.child.id();
    std::thread::sleep(Duration::from_secs(idle_wait as u64));
    println!(
        "{}",
        serde_json::json!({"idle_rss_mib": (status_kib(pid, "VmRSS:") as f64 / 1024.0 * 10.0).round() / 10.0, "after_s": idle_wait})
    );
    stop(t);
    rt.block_on(async {
        // A fresh server and database per configuration: figures do not depend on the
        // runs before (database size, size-based retention at the default 2 GiB cap, peak
        // RSS of an earlier run).
        for p in [Protocol::Grpc, Protocol::HttpProto] {
            for c in [1, 4, 16] {
                let t = start_target();
                let r = run(&t, p, c, requests, spans).await;
                report("fresh", p, c, &r, t.child.id());
                stop(t);
            }
        }
        if prefill > 0 {
            for p in [Protocol::Grpc, Protocol::HttpProto] {
                let t = start_target();
                let t0 = Instant::now();
                let r = run(&t, Protocol::Grpc, 4, prefill.div_ceil(spans), spans).await;
                eprintln!(
                    "prefilled {} spans in {:.1}s",
                    r.accepted,
                    t0.elapsed().as_secs_f64()
                );
                let r = run(&t, p, 1, requests, spans).await;
                report("prefilled", p, 1, &r, t.child.id());
                stop(t);
            }
        }
    });
}
