//! The three wire shapes of a running span (docs/design.md, "Open spans"), read out of committed
//! telemetry into [`Record`]s keyed by (trace id, span id):
//!
//! 1. a span exported with `end_time_unix_nano = 0` (a running snapshot);
//! 2. an OTLP log record with `span.state` = `heartbeat` | `ended` and `log.body.type` =
//!    `json/v1`, whose string body is the span as OTLP/JSON `TracesData` (parsed minimally:
//!    ids, name, attributes, times; ids as hex, base64 accepted too);
//! 3. a Logfire twin span with `logfire.span_type = "pending_span"` whose parent is the
//!    real, still running span;
//! 4. an OTLP log record with `partial.event` = `heartbeat` | `stop` and
//!    `partial.body.type` = `json/v1`, body as in shape 2 (PyPI `partial-span-processor`
//!    0.0.9, the only published partial-span package; issue 12 #7).
//!
//! Any other span with an end time is an [`Record::Ended`]: it closes its ledger entry.
//! This module only reads; the ledger decides what the records mean.

use base64::Engine;
use serde_json::Value;
use stallwatch_storage::model::{
    attr, AnyValue, KeyValue, LogBatch, Resource, SpanId, TraceBatch, TraceId,
};

/// Key of an open-span ledger entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanKey {
    /// Trace id.
    pub trace_id: TraceId,
    /// Span id.
    pub span_id: SpanId,
}

/// Which wire shape a record came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Shape 1: a span with `end_time_unix_nano = 0`.
    Snapshot,
    /// Shape 2: a `span.state = heartbeat` log record.
    LogHeartbeat,
    /// Shape 3: a Logfire `pending_span` twin.
    PendingTwin,
    /// Shape 4: a `partial.event = heartbeat` log record (`partial-span-processor`).
    PartialEvent,
}

/// What the ledger needs to know about a running span.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenRecord {
    /// (trace id, span id) of the running span (for shape 3: the twin's parent).
    pub key: SpanKey,
    /// Its parent, when known.
    pub parent: Option<SpanId>,
    /// Span name.
    pub name: String,
    /// `gen_ai.tool.name`, when present.
    pub tool_attr: Option<String>,
    /// True when `gen_ai.operation.name = "execute_tool"` or `mcp.method.name =
    /// "tools/call"` (docs/design.md, Tool spans).
    pub semconv_tool: bool,
    /// The span's `stallwatch.sla_ms` attribute, when present.
    pub sla_override_ms: Option<i64>,
    /// Resource `stallwatch.runner.id`, when present.
    pub runner_attr: Option<String>,
    /// Resource `process.pid`, when present.
    pub pid: Option<u32>,
    /// Resource `service.name`.
    pub service: String,
    /// The span's own `start_time_unix_nano` (0 when unknown): the ledger counts its age
    /// from it when plausible (`[watchdog] max_backdate_ms`).
    pub start_unix_nano: u64,
    /// The wire shape.
    pub shape: Shape,
}

/// Why a log record that looked like an open-span record was skipped, counted in
/// `/metrics` as `stallwatch_ledger_records_skipped_total{reason}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// `span.state` present but `log.body.type` is not `json/v1`.
    BodyType,
    /// The body is not a string, or not JSON.
    BodyNotJson,
    /// The JSON body has no `resourceSpans` array.
    NoSpans,
    /// A span in the body has a trace or span id that is neither hex (up to the full
    /// length, left-padded) nor base64 of the right length.
    BadId,
    /// A span in the body has an all-zero trace or span id.
    ZeroId,
    /// An unknown `span.state` value.
    UnknownState,
}

impl SkipReason {
    /// Every reason, for counters.
    pub const ALL: [SkipReason; 6] = [
        SkipReason::BodyType,
        SkipReason::BodyNotJson,
        SkipReason::NoSpans,
        SkipReason::BadId,
        SkipReason::ZeroId,
        SkipReason::UnknownState,
    ];

    /// `body_type`, `body_not_json`, `no_spans`, `bad_id`, `zero_id`, `unknown_state`.
    pub fn as_str(&self) -> &'static str {
        match self {
            SkipReason::BodyType => "body_type",
            SkipReason::BodyNotJson => "body_not_json",
            SkipReason::NoSpans => "no_spans",
            SkipReason::BadId => "bad_id",
            SkipReason::ZeroId => "zero_id",
            SkipReason::UnknownState => "unknown_state",
        }
    }

    /// Index into [`SkipReason::ALL`].
    pub fn index(&self) -> usize {
        SkipReason::ALL.iter().position(|r| r == self).unwrap_or(0)
    }
}

/// One ledger-relevant fact read from an export.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// The span is (still) running.
    Open(OpenRecord),
    /// The span has ended (an ended span, or a `span.state = ended` log record).
    Ended(SpanKey),
}

fn is_tool_semconv(attrs: &[KeyValue]) -> bool {
    attr(attrs, "gen_ai.operation.name").and_then(AnyValue::as_str) == Some("execute_tool")
        || attr(attrs, "mcp.method.name").and_then(AnyValue::as_str) == Some("tools/call")
}

fn resource_binding(res: &Resource) -> (Option<String>, Option<u32>, String) {
    let runner = attr(&res.attributes, "stallwatch.runner.id")
        .and_then(AnyValue::as_str)
        .map(str::to_string);
    let pid = attr(&res.attributes, "process.pid")
        .and_then(AnyValue::as_i64)
        .and_then(|p| u32::try_from(p).ok());
    (runner, pid, res.service_name().to_string())
}

/// Appends the records of a trace export to `out` (shapes 1 and 3, and ended spans).
pub fn from_traces(batch: &TraceBatch, out: &mut Vec<Record>) {
    for rs in &batch.resource_spans {
        let mut binding: Option<(Option<String>, Option<u32>, String)> = None;
        for ss in &rs.scope_spans {
            for span in &ss.spans {
                let pending = span.is_pending_twin();
                if !pending && span.end_time_unix_nano != 0 {
                    out.push(Record::Ended(SpanKey {
                        trace_id: span.trace_id,
                        span_id: span.span_id,
                    }));
                    continue;
                }
                let (key, parent, shape) = if pending {
                    let Some(real) = span.parent_span_id else {
                        continue; // a twin without a parent names no running span
                    };
                    let real_parent = attr(&span.attributes, "logfire.pending_parent_id")
                        .and_then(AnyValue::as_str)
                        .and_then(SpanId::from_hex)
                        .filter(|s| !s.is_zero());
                    (
                        SpanKey {
                            trace_id: span.trace_id,
                            span_id: real,
                        },
                        real_parent,
                        Shape::PendingTwin,
                    )
                } else {
                    (
                        SpanKey {
                            trace_id: span.trace_id,
                            span_id: span.span_id,
                        },
                        span.parent_span_id,
                        Shape::Snapshot,
                    )
                };
                let (runner_attr, pid, service) = binding
                    .get_or_insert_with(|| resource_binding(&rs.resource))
                    .clone();
                out.push(Record::Open(OpenRecord {
                    key,
                    parent,
                    name: span.name.clone(),
                    tool_attr: attr(&span.attributes, "gen_ai.tool.name")
                        .and_then(AnyValue::as_str)
                        .map(str::to_string),
                    semconv_tool: is_tool_semconv(&span.attributes),
                    sla_override_ms: attr(&span.attributes, "stallwatch.sla_ms")
                        .and_then(AnyValue::as_i64),
                    runner_attr,
                    pid,
                    service,
                    // a twin starts with its real span (Logfire copies the start time)
                    start_unix_nano: span.start_time_unix_nano,
                    shape,
                }));
            }
        }
    }
}

/// Appends the records of a log export to `out` (shape 2). Log records without
/// `span.state` are ordinary logs and ignored; a record with `span.state` that cannot be
/// read (wrong `log.body.type`, a body that is not JSON, bad ids) is skipped and counted by
/// reason with `skipped(reason)`, so nothing is dropped silently.
pub fn from_logs(batch: &LogBatch, out: &mut Vec<Record>, skipped: &mut dyn FnMut(SkipReason)) {
    for rl in &batch.resource_logs {
        for sl in &rl.scope_logs {
            for rec in &sl.log_records {
                let str_attr = |k| attr(&rec.attributes, k).and_then(AnyValue::as_str);
                // shape 2 (`span.state`) or shape 4 (`partial.event`)
                let (state, body_type, shape) = match str_attr("span.state") {
                    Some(s) => (s, str_attr("log.body.type"), Shape::LogHeartbeat),
                    None => match str_attr("partial.event") {
                        Some(s) => (s, str_attr("partial.body.type"), Shape::PartialEvent),
                        None => continue,
                    },
                };
                let ended = match (shape, state) {
                    (_, "heartbeat") => false,
                    (Shape::LogHeartbeat, "ended") | (Shape::PartialEvent, "stop") => true,
                    _ => {
                        skipped(SkipReason::UnknownState);
                        continue;
                    }
                };
                if body_type != Some("json/v1") {
                    skipped(SkipReason::BodyType);
                    continue;
                }
                let Some(json) = rec
                    .body
                    .as_str()
                    .and_then(|b| serde_json::from_str::<Value>(b).ok())
                else {
                    skipped(SkipReason::BodyNotJson);
                    continue;
                };
                traces_json(&json, ended, shape, &rl.resource, out, skipped);
            }
        }
    }
}

/// Decodes an OTLP/JSON id: hex of the right length, else standard base64 (protobuf's
/// JSON mapping of `bytes`). Hex shorter than the full length is left-padded with zeros:
/// python-contrib's `PartialSpanProcessor` writes ids with `hex(id)[2:]`, which drops
/// leading zeros (issue 12 #6), and an odd or short all-hex string is never valid base64
/// of the right length anyway.
fn json_id<const N: usize>(v: Option<&Value>) -> Option<[u8; N]> {
    let s = v?.as_str()?;
    let mut out = [0u8; N];
    if !s.is_empty() && s.len() < 2 * N && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        let padded = format!("{s:0>width$}", width = 2 * N);
        if let Ok(()) = decode_hex(&padded, &mut out) {
            return Some(out);
        }
    }
    if s.len() == 2 * N {
        if let Ok(()) = decode_hex(s, &mut out) {
            return Some(out);
        }
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    (bytes.len() == N).then(|| {
        out.copy_from_slice(&bytes);
        out
    })
}

fn decode_hex(s: &str, out: &mut [u8]) -> Result<(), ()> {
    let b = s.as_bytes();
    for (i, o) in out.iter_mut().enumerate() {
        let hi = (b[2 * i] as char).to_digit(16).ok_or(())?;
        let lo = (b[2 * i + 1] as char).to_digit(16).ok_or(())?;
        *o = (hi * 16 + lo) as u8;
    }
    Ok(())
}

fn json_str_attr<'a>(attrs: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    attrs?
        .as_array()?
        .iter()
        .find(|kv| kv.get("key").and_then(Value::as_str) == Some(key))?
        .get("value")
}

fn json_value_str(v: Option<&Value>) -> Option<String> {
    v?.get("stringValue")?.as_str().map(str::to_string)
}

fn json_value_int(v: Option<&Value>) -> Option<i64> {
    let v = v?;
    let i = v.get("intValue").or_else(|| v.get("stringValue"))?;
    i.as_i64().or_else(|| i.as_str()?.trim().parse().ok())
}

fn json_u64(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
        Some(v) => v.as_u64().unwrap_or(0),
        None => 0,
    }
}

fn traces_json(
    json: &Value,
    ended: bool,
    shape: Shape,
    log_resource: &Resource,
    out: &mut Vec<Record>,
    skipped: &mut dyn FnMut(SkipReason),
) {
    let (log_runner, log_pid, log_service) = resource_binding(log_resource);
    let Some(rss) = json.get("resourceSpans").and_then(Value::as_array) else {
        skipped(SkipReason::NoSpans);
        return;
    };
    for rs in rss {
        let rattrs = rs.get("resource").and_then(|r| r.get("attributes"));
        let runner_attr =
            json_value_str(json_str_attr(rattrs, "stallwatch.runner.id")).or(log_runner.clone());
        let pid = json_value_int(json_str_attr(rattrs, "process.pid"))
            .and_then(|p| u32::try_from(p).ok())
            .or(log_pid);
        let service =
            json_value_str(json_str_attr(rattrs, "service.name")).unwrap_or(log_service.clone());
        let Some(sss) = rs.get("scopeSpans").and_then(Value::as_array) else {
            continue;
        };
        for ss in sss {
            let Some(spans) = ss.get("spans").and_then(Value::as_array) else {
                continue;
            };
            for sp in spans {
                let (Some(t), Some(s)) = (
                    json_id::<16>(sp.get("traceId")),
                    json_id::<8>(sp.get("spanId")),
                ) else {
                    skipped(SkipReason::BadId);
                    continue;
                };
                let key = SpanKey {
                    trace_id: TraceId(t),
                    span_id: SpanId(s),
                };
                if key.trace_id.is_zero() || key.span_id.is_zero() {
                    skipped(SkipReason::ZeroId);
                    continue;
                }
                if ended {
                    out.push(Record::Ended(key));
                    continue;
                }
                let attrs = sp.get("attributes");
                let op = json_value_str(json_str_attr(attrs, "gen_ai.operation.name"));
                let mcp = json_value_str(json_str_attr(attrs, "mcp.method.name"));
                out.push(Record::Open(OpenRecord {
                    key,
                    parent: json_id::<8>(sp.get("parentSpanId"))
                        .map(SpanId)
                        .filter(|p| !p.is_zero()),
                    name: sp
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    tool_attr: json_value_str(json_str_attr(attrs, "gen_ai.tool.name")),
                    semconv_tool: op.as_deref() == Some("execute_tool")
                        || mcp.as_deref() == Some("tools/call"),
                    sla_override_ms: json_value_int(json_str_attr(attrs, "stallwatch.sla_ms")),
                    runner_attr: runner_attr.clone(),
                    pid,
                    service: service.clone(),
                    start_unix_nano: json_u64(sp.get("startTimeUnixNano")),
                    shape,
                }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stallwatch_storage::model::{LogRecord, ResourceLogs, ScopeLogs};

    fn log_batch(state: &str, body: &str) -> LogBatch {
        LogBatch {
            resource_logs: vec![ResourceLogs {
                resource: Resource {
                    attributes: vec![KeyValue::new("process.pid", AnyValue::Int(42))],
                    ..Default::default()
                },
                scope_logs: vec![ScopeLogs {
                    scope: Default::default(),
                    log_records: vec![LogRecord {
                        body: AnyValue::String(body.into()),
                        attributes: vec![
                            KeyValue::new("span.state", AnyValue::String(state.into())),
                            KeyValue::new("log.body.type", AnyValue::String("json/v1".into())),
                        ],
                        ..Default::default()
                    }],
                }],
            }],
        }
    }

    #[test]
    fn log_body_with_hex_and_base64_ids() {
        let body = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"py"}}]},
          "scopeSpans":[{"spans":[
            {"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"1112131415161718","name":"tool",
             "attributes":[{"key":"gen_ai.operation.name","value":{"stringValue":"execute_tool"}},
                           {"key":"stallwatch.sla_ms","value":{"intValue":"2500"}}]},
            {"traceId":"AQIDBAUGBwgJCgsMDQ4PEA==","spanId":"ERITFBUWFxg=","name":"b64"}]}]}]}"#;
        let mut out = Vec::new();
        let mut skips = Vec::new();
        from_logs(&log_batch("heartbeat", body), &mut out, &mut |r| {
            skips.push(r)
        });
        assert_eq!(out.len(), 2);
        let Record::Open(a) = &out[0] else { panic!() };
        assert!(a.semconv_tool);
        assert_eq!(a.sla_override_ms, Some(2500));
        assert_eq!(a.pid, Some(42)); // falls back to the log's resource
        assert_eq!(a.service, "py");
        let Record::Open(b) = &out[1] else { panic!() };
        assert_eq!(a.key, b.key);
        let mut out = Vec::new();
        from_logs(&log_batch("ended", body), &mut out, &mut |r| skips.push(r));
        assert!(matches!(out[0], Record::Ended(_)));
        assert!(skips.is_empty());
        let mut out = Vec::new();
        from_logs(&log_batch("heartbeat", "not json"), &mut out, &mut |r| {
            skips.push(r)
        });
        assert!(out.is_empty());
        assert_eq!(skips, [SkipReason::BodyNotJson]);
    }

    /// Shape 4: `partial.event` heartbeat | stop with `partial.body.type` (the published
    /// `partial-span-processor` package).
    #[test]
    fn partial_event_shape_opens_and_stops() {
        let body = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[
            {"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"1112131415161718","name":"tool"}]}]}]}"#;
        let batch = |event: &str, ty: &str| {
            let mut b = log_batch("x", body);
            b.resource_logs[0].scope_logs[0].log_records[0].attributes = vec![
                KeyValue::new("partial.event", AnyValue::String(event.into())),
                KeyValue::new("partial.body.type", AnyValue::String(ty.into())),
            ];
            b
        };
        let mut out = Vec::new();
        let mut skips = Vec::new();
        from_logs(&batch("heartbeat", "json/v1"), &mut out, &mut |r| {
            skips.push(r)
        });
        let Record::Open(a) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(a.shape, Shape::PartialEvent);
        from_logs(&batch("stop", "json/v1"), &mut out, &mut |r| skips.push(r));
        assert!(matches!(out[1], Record::Ended(_)));
        from_logs(&batch("ended", "json/v1"), &mut out, &mut |r| skips.push(r));
        from_logs(&batch("heartbeat", "xml"), &mut out, &mut |r| skips.push(r));
        assert_eq!(out.len(), 2);
        assert_eq!(skips, [SkipReason::UnknownState, SkipReason::BodyType]);
    }

    /// python-contrib's `hex(id)[2:]` drops leading zeros: ids are left-padded, the child
    /// keeps its parent, and a non-hex id is skipped and counted (issue 12 #6).
    #[test]
    fn short_hex_ids_are_left_padded() {
        let body = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[
            {"traceId":"abc","spanId":"1f","parentSpanId":"0e0f","name":"tool","startTimeUnixNano":"1700000000000000000"},
            {"traceId":"xyz","spanId":"1f","name":"bad"},
            {"traceId":"0","spanId":"1f","name":"zero"}]}]}]}"#;
        let mut out = Vec::new();
        let mut skips = Vec::new();
        from_logs(&log_batch("heartbeat", body), &mut out, &mut |r| {
            skips.push(r)
        });
        assert_eq!(out.len(), 1);
        let Record::Open(a) = &out[0] else { panic!() };
        assert_eq!(a.key.trace_id.to_hex(), format!("{:0>32}", "abc"));
        assert_eq!(a.key.span_id.to_hex(), "000000000000001f");
        assert_eq!(
            a.parent.map(|p| p.to_hex()).as_deref(),
            Some("0000000000000e0f")
        );
        assert_eq!(a.start_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(skips, [SkipReason::BadId, SkipReason::ZeroId]);
    }
}
