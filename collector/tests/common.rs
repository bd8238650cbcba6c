//! Test harness: start a collector with a temp database, send requests, read back.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use stallwatch_collector::{Collector, CollectorConfig, IngestStats};
use stallwatch_storage::control::Observation;
use stallwatch_storage::model::TraceId;
use stallwatch_storage::telemetry::TraceQuery;
use stallwatch_storage::{Storage, StorageConfig};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A running collector.
pub struct Harness {
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub storage: Storage,
    pub stats: Arc<IngestStats>,
    pub observations: mpsc::Receiver<Observation>,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), stallwatch_collector::CollectorError>>,
    pub client: reqwest::Client,
    _dir: tempfile::TempDir,
}

pub async fn start() -> Harness {
    start_with(|_| {}).await
}

pub async fn start_with(f: impl FnOnce(&mut CollectorConfig)) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(StorageConfig::new(dir.path().join("stallwatch.db"))).unwrap();
    let mut config = CollectorConfig {
        grpc_listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        ..CollectorConfig::default()
    };
    f(&mut config);
    let (tx, rx) = mpsc::channel(1024);
    let collector = Collector::bind(config, storage.clone(), tx).await.unwrap();
    let shutdown = CancellationToken::new();
    let (http, grpc, stats) = (
        collector.http_addr(),
        collector.grpc_addr(),
        collector.stats(),
    );
    let task = tokio::spawn(collector.run(shutdown.clone()));
    Harness {
        http,
        grpc,
        storage,
        stats,
        observations: rx,
        shutdown,
        task,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        _dir: dir,
    }
}

impl Harness {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// POSTs `body` with the given content type and optional content encoding.
    pub async fn post(
        &self,
        path: &str,
        ct: &str,
        ce: Option<&str>,
        body: Vec<u8>,
    ) -> reqwest::Response {
        let mut rb = self
            .client
            .post(self.url(path))
            .header("content-type", ct)
            .body(body);
        if let Some(ce) = ce {
            rb = rb.header("content-encoding", ce);
        }
        rb.send().await.unwrap()
    }

    /// Spans stored in the whole (fresh) database, by the read API's search.
    pub async fn stored_span_total(&self) -> u64 {
        let page = self
            .storage
            .search_traces(TraceQuery {
                limit: 1000,
                ..TraceQuery::default()
            })
            .await
            .unwrap();
        page.items.iter().map(|t| t.span_count).sum()
    }

    /// Spans stored for one trace.
    pub async fn stored_spans(&self, trace_id: &str) -> usize {
        let id = TraceId::from_hex(trace_id).unwrap();
        self.storage
            .trace(id)
            .await
            .unwrap()
            .map_or(0, |t| t.spans.len())
    }

    /// Waits (generously) for the next observation.
    pub async fn next_observation(&mut self) -> Observation {
        tokio::time::timeout(Duration::from_secs(30), self.observations.recv())
            .await
            .expect("no observation within 30 s")
            .expect("observation channel closed")
    }
}

/// The project's own copy of the case payloads.
pub fn payload_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/cases/payloads")
}

pub fn case_bytes(rel: &str) -> Vec<u8> {
    std::fs::read(payload_dir().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

pub fn manifest() -> Vec<Value> {
    serde_json::from_slice(&case_bytes("MANIFEST.json")).unwrap()
}

/// The manifest entry for `file`.
pub fn entry(file: &str) -> Value {
    manifest()
        .into_iter()
        .find(|e| e["file"] == file)
        .unwrap_or_else(|| panic!("{file} not in MANIFEST.json"))
}

pub fn gunzip(data: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(data)
        .read_to_end(&mut out)
        .unwrap();
    out
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A length-prefixed gRPC message.
pub fn grpc_frame(compressed: bool, message: &[u8]) -> Vec<u8> {
    let mut f = vec![u8::from(compressed)];
    f.extend_from_slice(&(message.len() as u32).to_be_bytes());
    f.extend_from_slice(message);
    f
}

/// What a gRPC call answered.
#[derive(Debug)]
pub struct GrpcReply {
    pub http_status: u16,
    pub grpc_status: Option<i32>,
    pub grpc_message: String,
    pub details: Option<Vec<u8>>,
    /// The response message (without its 5-byte prefix), when one was sent.
    pub message: Option<Vec<u8>>,
}

/// One unary gRPC call over a raw HTTP/2 connection; `body` is sent as is.
pub async fn grpc_call(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> GrpcReply {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await.unwrap();
    let mut rb = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let (resp, mut send) = client.send_request(rb.body(()).unwrap(), false).unwrap();
    send.send_data(Bytes::from(body), true).unwrap();
    let resp = resp.await.unwrap();
    let (parts, mut body) = resp.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap();
    let meta = trailers.as_ref().unwrap_or(&parts.headers);
    let get = |k: &str| {
        meta.get(k)
            .or_else(|| parts.headers.get(k))
            .map(|v| v.to_str().unwrap().to_string())
    };
    let details = get("grpc-status-details-bin").map(|b| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(b.trim_end_matches('='))
            .unwrap()
    });
    GrpcReply {
        http_status: parts.status.as_u16(),
        grpc_status: get("grpc-status").map(|s| s.parse().unwrap()),
        grpc_message: get("grpc-message")
            .map(|m| percent_decode(&m))
            .unwrap_or_default(),
        details,
        message: (data.len() >= 5).then(|| data[5..].to_vec()),
    }
}

/// `grpc-message` as sent (percent-encoded), decoded.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The trace ids a JSON request file carries, lowercased.
pub fn json_trace_ids(body: &[u8]) -> Vec<String> {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(_) => return vec![],
    };
    let mut out = Vec::new();
    // Only span ids: links carry trace ids too.
    fn walk(v: &Value, in_spans: bool, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if in_spans {
                    let id = m.get("traceId").or_else(|| m.get("trace_id"));
                    if let Some(s) = id.and_then(Value::as_str) {
                        let s = s.to_ascii_lowercase();
                        if s.len() == 32 && !out.contains(&s) {
                            out.push(s);
                        }
                    }
                }
                for (k, v) in m {
                    walk(v, k == "spans", out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, in_spans, out)),
            _ => {}
        }
    }
    walk(&v, false, &mut out);
    out
}
