//! MCP request spans per the OpenTelemetry MCP semantic conventions (semconv, gen-ai:
//! "Semantic conventions for Model Context Protocol (MCP)"), exported as OTLP/JSON over
//! OTLP/HTTP (`POST /v1/traces`, OTLP spec, OTLP/HTTP) by one background task.
//!
//! A `tools/call` span is exported at once as a snapshot with `endTimeUnixNano = 0` (the
//! open-span shape 1 of docs/design.md, Conventions: Open spans), again on each
//! `notifications/progress` (a refresh), and once more ended at its response. Other
//! requests are exported once, ended.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::sync::mpsc;

/// Instrumentation scope name of the wrapper's spans.
pub const SCOPE_NAME: &str = "stallwatch-mcp";
/// Bound of the export queue; past it snapshots are dropped and counted (an ended span is
/// never dropped for a snapshot: the relay waits for room instead).
pub const EXPORT_QUEUE: usize = 1024;
/// Most spans in one export request.
pub const MAX_BATCH: usize = 256;
/// Deadline of one export request.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(3);

/// Nanoseconds since the Unix epoch, now.
pub fn now_unix_nano() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// One attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// `stringValue`.
    Str(String),
    /// `intValue` (a decimal string in OTLP/JSON).
    Int(i64),
}

/// The resource of the server process: `service.name = mcp:<server name>`,
/// `stallwatch.runner.id`, `process.pid`.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    /// `service.name`.
    pub service_name: String,
    /// `stallwatch.runner.id`.
    pub runner_id: String,
    /// `process.pid` of the server, when running.
    pub pid: Option<u32>,
}

/// A span being traced: ids, name, start, attributes, and (once ended) end and status.
#[derive(Clone, Debug)]
pub struct McpSpan {
    /// Trace id (joined from `params._meta.traceparent` when present).
    pub trace_id: [u8; 16],
    /// Span id.
    pub span_id: [u8; 8],
    /// Parent span id from `traceparent`.
    pub parent_span_id: Option<[u8; 8]>,
    /// `{mcp.method.name} {target}`.
    pub name: String,
    /// Start, ns since the Unix epoch.
    pub start_unix_nano: u64,
    /// End, ns since the Unix epoch; 0 while open.
    pub end_unix_nano: u64,
    /// Attributes in insertion order.
    pub attributes: Vec<(String, AttrValue)>,
    /// `Some(message)` when the status is ERROR.
    pub error: Option<String>,
}

impl McpSpan {
    /// A new span for request `method` with JSON-RPC id `request_id`, joining the trace of
    /// `params._meta.traceparent` when it is a valid W3C `traceparent` (semconv MCP, Context
    /// propagation), else a new trace.
    pub fn start(method: &str, target: Option<&str>, params: Option<&Value>) -> Self {
        let parent = params
            .and_then(|p| p.get("_meta"))
            .and_then(|m| m.get("traceparent"))
            .and_then(Value::as_str)
            .and_then(parse_traceparent);
        let (trace_id, parent_span_id) = match parent {
            Some((t, s)) => (t, Some(s)),
            None => (rand::random::<[u8; 16]>(), None),
        };
        let name = match target {
            Some(t) if !t.is_empty() => format!("{method} {t}"),
            _ => method.to_string(),
        };
        Self {
            trace_id,
            span_id: rand::random::<[u8; 8]>(),
            parent_span_id,
            name,
            start_unix_nano: now_unix_nano(),
            end_unix_nano: 0,
            attributes: Vec::new(),
            error: None,
        }
    }

    /// Adds a string attribute.
    pub fn set_str(&mut self, key: &str, value: impl Into<String>) {
        self.attributes
            .push((key.to_string(), AttrValue::Str(value.into())));
    }

    /// Adds an integer attribute.
    pub fn set_int(&mut self, key: &str, value: i64) {
        self.attributes
            .push((key.to_string(), AttrValue::Int(value)));
    }

    /// Ends the span now; `error` = `Some((error.type, message))` sets status ERROR.
    pub fn end(&mut self, error: Option<(&str, String)>) {
        self.end_unix_nano = now_unix_nano().max(self.start_unix_nano);
        if let Some((ty, msg)) = error {
            self.set_str("error.type", ty);
            self.error = Some(msg);
        }
    }

    /// The span as one OTLP/JSON `Span` object (OTLP spec, JSON Protobuf Encoding: ids as
    /// lowercase hex, 64-bit integers as decimal strings).
    pub fn to_otlp_json(&self) -> Value {
        let attrs: Vec<Value> = self.attributes.iter().map(kv).collect();
        let mut span = json!({
            "traceId": hex::encode(self.trace_id),
            "spanId": hex::encode(self.span_id),
            "name": self.name,
            // SPAN_KIND_SERVER: the span covers the server's handling of the request.
            "kind": 2,
            "startTimeUnixNano": self.start_unix_nano.to_string(),
            "endTimeUnixNano": self.end_unix_nano.to_string(),
            "attributes": attrs,
        });
        if let Some(p) = self.parent_span_id {
            span["parentSpanId"] = Value::from(hex::encode(p));
        }
        if let Some(msg) = &self.error {
            span["status"] = json!({"code": 2, "message": msg});
        }
        span
    }
}

fn kv((k, v): &(String, AttrValue)) -> Value {
    match v {
        AttrValue::Str(s) => json!({"key": k, "value": {"stringValue": s}}),
        AttrValue::Int(i) => json!({"key": k, "value": {"intValue": i.to_string()}}),
    }
}

/// Reads a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`); `None` when malformed or
/// all-zero (W3C Trace Context §3.2).
pub fn parse_traceparent(s: &str) -> Option<([u8; 16], [u8; 8])> {
    let parts: Vec<&str> = s.trim().split('-').collect();
    if parts.len() < 4 || parts[0].len() != 2 || parts[0] == "ff" {
        return None;
    }
    let mut t = [0u8; 16];
    let mut p = [0u8; 8];
    hex::decode_to_slice(parts[1], &mut t).ok()?;
    hex::decode_to_slice(parts[2], &mut p).ok()?;
    (t != [0; 16] && p != [0; 8]).then_some((t, p))
}

/// One OTLP/JSON `ExportTraceServiceRequest` holding `spans`, each with its resource.
pub fn export_body(spans: &[(Resource, Value)]) -> Value {
    let rs: Vec<Value> = spans
        .iter()
        .map(|(r, s)| {
            let mut attrs = vec![
                json!({"key": "service.name", "value": {"stringValue": r.service_name}}),
                json!({"key": "stallwatch.runner.id", "value": {"stringValue": r.runner_id}}),
            ];
            if let Some(pid) = r.pid {
                attrs.push(json!({"key": "process.pid", "value": {"intValue": pid.to_string()}}));
            }
            json!({
                "resource": {"attributes": attrs},
                "scopeSpans": [{
                    "scope": {"name": SCOPE_NAME, "version": env!("CARGO_PKG_VERSION")},
                    "spans": [s],
                }],
            })
        })
        .collect();
    json!({ "resourceSpans": rs })
}

/// The exporter: a bounded queue drained by one task that posts batches to
/// `<endpoint>/v1/traces`, retrying a 503 / 429 after its `Retry-After` (at most 3 tries).
#[derive(Clone)]
pub struct Exporter {
    tx: Option<mpsc::Sender<(Resource, Value)>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Exporter {
    /// An exporter that drops everything (no sidecar).
    pub fn disabled() -> Self {
        Self {
            tx: None,
            dropped: Default::default(),
        }
    }

    /// Starts the export task for `endpoint` (`http://IP:PORT`).
    pub fn start(endpoint: String) -> Self {
        let (tx, rx) = mpsc::channel(EXPORT_QUEUE);
        let dropped: std::sync::Arc<std::sync::atomic::AtomicU64> = Default::default();
        stallwatch_vocabulary::task::spawn_boxed(run_exporter(endpoint, rx, dropped.clone()));
        Self {
            tx: Some(tx),
            dropped,
        }
    }

    /// Queues `span` (a snapshot when its end is 0). A snapshot is dropped and counted when
    /// the queue is full; an ended span waits for room.
    pub async fn send(&self, resource: &Resource, span: &McpSpan) {
        let Some(tx) = &self.tx else { return };
        let item = (resource.clone(), span.to_otlp_json());
        if span.end_unix_nano == 0 {
            if tx.try_send(item).is_err() {
                self.count_drop();
            }
        } else if tx.send(item).await.is_err() {
            self.count_drop();
        }
    }

    fn count_drop(&self) {
        let n = self
            .dropped
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n == 0 {
            eprintln!("stallwatch mcp: span export queue full; dropping span snapshots (counted)");
        }
    }

    /// Spans not exported (queue full or the sidecar refused them).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }
}

async fn run_exporter(
    endpoint: String,
    mut rx: mpsc::Receiver<(Resource, Value)>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let http = match reqwest::Client::builder().timeout(EXPORT_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("stallwatch mcp: cannot build the span exporter: {e}");
            return;
        }
    };
    let url = format!("{endpoint}/v1/traces");
    let mut warned = false;
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let body = export_body(&batch).to_string();
        let mut ok = false;
        for _ in 0..3 {
            let resp = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            match resp {
                Ok(r) if r.status().is_success() => {
                    ok = true;
                    break;
                }
                Ok(r) if r.status().as_u16() == 503 || r.status().as_u16() == 429 => {
                    let wait = r
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(1)
                        .clamp(1, 5);
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                }
                Ok(r) => {
                    if !warned {
                        let status = r.status();
                        let text = r.text().await.unwrap_or_default();
                        eprintln!("stallwatch mcp: span export refused ({status}): {text}");
                        warned = true;
                    }
                    break;
                }
                Err(e) => {
                    if !warned {
                        eprintln!("stallwatch mcp: span export failed: {e}");
                        warned = true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        if !ok {
            dropped.fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_a_valid_traceparent_only() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let (t, p) = parse_traceparent(tp).unwrap();
        assert_eq!(hex::encode(t), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(hex::encode(p), "b7ad6b7169203331");
        assert!(
            parse_traceparent("00-00000000000000000000000000000000-b7ad6b7169203331-01").is_none()
        );
        assert!(parse_traceparent("00-zz-b7ad6b7169203331-01").is_none());
        assert!(parse_traceparent("garbage").is_none());
        let params = json!({"_meta": {"traceparent": tp}});
        let s = McpSpan::start("tools/call", Some("add"), Some(&params));
        assert_eq!(s.name, "tools/call add");
        assert_eq!(s.trace_id, t);
        assert_eq!(s.parent_span_id, Some(p));
    }

    #[test]
    fn otlp_json_shape() {
        let mut s = McpSpan::start("tools/call", Some("t"), None);
        s.set_str("mcp.method.name", "tools/call");
        s.set_int("stallwatch.sla_ms", 1500);
        let open = s.to_otlp_json();
        assert_eq!(open["endTimeUnixNano"], "0");
        assert_eq!(open["attributes"][1]["value"]["intValue"], "1500");
        assert!(open.get("status").is_none());
        s.end(Some(("tool_error", "boom".into())));
        let ended = s.to_otlp_json();
        assert_ne!(ended["endTimeUnixNano"], "0");
        assert_eq!(ended["status"]["code"], 2);
        let r = Resource {
            service_name: "mcp:x".into(),
            runner_id: "r".into(),
            pid: Some(42),
        };
        let body = export_body(&[(r, ended)]);
        let attrs = &body["resourceSpans"][0]["resource"]["attributes"];
        assert_eq!(attrs[2]["value"]["intValue"], "42");
    }
}
