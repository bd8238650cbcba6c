//! The read API's JSON shapes, rendered by hand from storage records.
//!
//! DESIGN, Read API JSON: snake_case keys, lowercase hex ids, `*_unix_nano` as decimal
//! strings, attributes as OTLP `KeyValue` lists (`{"key","value":{"stringValue"|...}}`,
//! `intValue` as a string, `bytesValue` as base64, NaN and the infinities as the strings
//! `"NaN"`, `"Infinity"`, `"-Infinity"`), `state: "open" | "ended" | "inferred"`. Serde's
//! derives on the storage types would print ids as byte arrays, so nothing here derives.

use base64::Engine;
use serde_json::{json, Map, Value};
use stallwatch_storage::control::{BreakerState, RunnerStatus};
use stallwatch_storage::ledger::OpenSpanRow;
use stallwatch_storage::model::{
    AnyValue, Event, Incident, KeyValue, Link, Resource, Scope, Span, SpanId, SpanState, TraceId,
};
use stallwatch_storage::outbox::{Delivery, DeliveryAttempt};
use stallwatch_storage::telemetry::{StoredLog, StoredSpan, TraceSummary, TraceView};

/// Decimal string of a 64-bit nanosecond time (OTLP/JSON carries 64-bit ints as strings).
pub fn nanos(v: u64) -> Value {
    Value::String(v.to_string())
}

fn opt_hex_trace(t: Option<TraceId>) -> Value {
    t.map(|t| Value::String(t.to_hex())).unwrap_or(Value::Null)
}

fn opt_hex_span(s: Option<SpanId>) -> Value {
    s.map(|s| Value::String(s.to_hex())).unwrap_or(Value::Null)
}

/// OTLP/JSON `AnyValue`.
pub fn any_value(v: &AnyValue) -> Value {
    match v {
        AnyValue::Empty => json!({}),
        AnyValue::String(s) => json!({ "stringValue": s }),
        AnyValue::Bool(b) => json!({ "boolValue": b }),
        AnyValue::Int(i) => json!({ "intValue": i.to_string() }),
        AnyValue::Double(d) => {
            let v = if d.is_nan() {
                Value::String("NaN".into())
            } else if d.is_infinite() {
                Value::String(if *d > 0.0 { "Infinity" } else { "-Infinity" }.into())
            } else {
                json!(d)
            };
            json!({ "doubleValue": v })
        }
        AnyValue::Bytes(b) => {
            json!({ "bytesValue": base64::engine::general_purpose::STANDARD.encode(b) })
        }
        AnyValue::Array(items) => {
            json!({ "arrayValue": { "values": items.iter().map(any_value).collect::<Vec<_>>() } })
        }
        AnyValue::KvList(kvs) => json!({ "kvlistValue": { "values": attributes(kvs) } }),
    }
}

/// OTLP/JSON `KeyValue` list.
pub fn attributes(kvs: &[KeyValue]) -> Value {
    Value::Array(
        kvs.iter()
            .map(|kv| json!({ "key": kv.key, "value": any_value(&kv.value) }))
            .collect(),
    )
}

/// A resource: `{"attributes","dropped_attributes_count","schema_url"}`.
pub fn resource(r: &Resource) -> Value {
    json!({
        "attributes": attributes(&r.attributes),
        "dropped_attributes_count": r.dropped_attributes_count,
        "schema_url": r.schema_url,
    })
}

/// A scope: `{"name","version","attributes","dropped_attributes_count","schema_url"}`.
pub fn scope(s: &Scope) -> Value {
    json!({
        "name": s.name,
        "version": s.version,
        "attributes": attributes(&s.attributes),
        "dropped_attributes_count": s.dropped_attributes_count,
        "schema_url": s.schema_url,
    })
}

fn event(e: &Event) -> Value {
    json!({
        "time_unix_nano": nanos(e.time_unix_nano),
        "name": e.name,
        "attributes": attributes(&e.attributes),
        "dropped_attributes_count": e.dropped_attributes_count,
    })
}

fn link(l: &Link) -> Value {
    json!({
        "trace_id": l.trace_id.to_hex(),
        "span_id": l.span_id.to_hex(),
        "trace_state": l.trace_state,
        "attributes": attributes(&l.attributes),
        "dropped_attributes_count": l.dropped_attributes_count,
        "flags": l.flags,
    })
}

/// The lowercase name of an OTLP `SpanKind` number.
pub fn kind_name(kind: i32) -> &'static str {
    match kind {
        0 => "unspecified",
        1 => "internal",
        2 => "server",
        3 => "client",
        4 => "producer",
        5 => "consumer",
        _ => "unknown",
    }
}

fn status_name(code: i32) -> &'static str {
    match code {
        0 => "unset",
        1 => "ok",
        2 => "error",
        _ => "unknown",
    }
}

/// The state name (`open`, `ended`, `inferred`).
pub fn state_name(s: SpanState) -> &'static str {
    match s {
        SpanState::Open => "open",
        SpanState::Ended => "ended",
        SpanState::Inferred => "inferred",
    }
}

fn span_fields(sp: &Span, state: SpanState) -> Map<String, Value> {
    let tool = stallwatch_storage::model::attr(&sp.attributes, "gen_ai.tool.name")
        .and_then(AnyValue::as_str)
        .map(|s| Value::String(s.to_string()))
        .unwrap_or(Value::Null);
    let (duration_ns, duration_ms) = match sp.duration_ns() {
        Some(d) => (nanos(d), json!(d as f64 / 1e6)),
        None => (Value::Null, Value::Null),
    };
    let mut m = Map::new();
    m.insert("trace_id".into(), sp.trace_id.to_hex().into());
    m.insert("span_id".into(), sp.span_id.to_hex().into());
    m.insert("parent_span_id".into(), opt_hex_span(sp.parent_span_id));
    m.insert("trace_state".into(), sp.trace_state.clone().into());
    m.insert("flags".into(), sp.flags.into());
    m.insert("name".into(), sp.name.clone().into());
    m.insert("kind".into(), sp.kind.into());
    m.insert("kind_name".into(), kind_name(sp.kind).into());
    m.insert(
        "start_time_unix_nano".into(),
        nanos(sp.start_time_unix_nano),
    );
    m.insert("end_time_unix_nano".into(), nanos(sp.end_time_unix_nano));
    m.insert("duration_ns".into(), duration_ns);
    m.insert("duration_ms".into(), duration_ms);
    m.insert("clock_skewed".into(), sp.clock_skewed().into());
    m.insert("state".into(), state_name(state).into());
    m.insert("tool_name".into(), tool);
    m.insert("attributes".into(), attributes(&sp.attributes));
    m.insert(
        "dropped_attributes_count".into(),
        sp.dropped_attributes_count.into(),
    );
    m.insert(
        "events".into(),
        Value::Array(sp.events.iter().map(event).collect()),
    );
    m.insert(
        "dropped_events_count".into(),
        sp.dropped_events_count.into(),
    );
    m.insert(
        "links".into(),
        Value::Array(sp.links.iter().map(link).collect()),
    );
    m.insert("dropped_links_count".into(), sp.dropped_links_count.into());
    m.insert(
        "status".into(),
        json!({"code": sp.status.code, "code_name": status_name(sp.status.code), "message": sp.status.message}),
    );
    m
}

/// A stored span with its resource, scope and state.
pub fn stored_span(s: &StoredSpan) -> Value {
    let mut m = span_fields(&s.span, s.state);
    m.insert(
        "service_name".into(),
        s.resource.service_name().to_string().into(),
    );
    m.insert("resource".into(), resource(&s.resource));
    m.insert("scope".into(), scope(&s.scope));
    m.insert("received_unix_nano".into(), nanos(s.received_unix_nano));
    Value::Object(m)
}

/// A parent that never arrived, shown as running (DESIGN, "in progress (inferred)"): it
/// starts with its earliest child and has no resource or scope.
pub fn inferred_span(trace_id: TraceId, span_id: SpanId, start_unix_nano: u64) -> Value {
    let sp = Span {
        trace_id,
        span_id,
        name: "(in progress, inferred)".into(),
        start_time_unix_nano: start_unix_nano,
        ..Span::default()
    };
    let mut m = span_fields(&sp, SpanState::Inferred);
    m.insert("service_name".into(), Value::Null);
    m.insert("resource".into(), Value::Null);
    m.insert("scope".into(), Value::Null);
    m.insert("received_unix_nano".into(), Value::Null);
    Value::Object(m)
}

/// A log record with its resource and scope.
pub fn stored_log(l: &StoredLog) -> Value {
    let r = &l.record;
    json!({
        "time_unix_nano": nanos(r.time_unix_nano),
        "observed_time_unix_nano": nanos(r.observed_time_unix_nano),
        "severity_number": r.severity_number,
        "severity_text": r.severity_text,
        "body": any_value(&r.body),
        "attributes": attributes(&r.attributes),
        "dropped_attributes_count": r.dropped_attributes_count,
        "flags": r.flags,
        "trace_id": opt_hex_trace(r.trace_id),
        "span_id": opt_hex_span(r.span_id),
        "event_name": r.event_name,
        "service_name": l.resource.service_name(),
        "resource": resource(&l.resource),
        "scope": scope(&l.scope),
    })
}

/// `{"trace_id","spans","logs"}`; a parent named by a span but never stored is added as an
/// `inferred` span.
pub fn trace_view(v: &TraceView) -> Value {
    let present: std::collections::HashSet<SpanId> =
        v.spans.iter().map(|s| s.span.span_id).collect();
    let mut inferred: std::collections::BTreeMap<SpanId, u64> = Default::default();
    for s in &v.spans {
        if let Some(p) = s.span.parent_span_id {
            if !present.contains(&p) {
                let e = inferred.entry(p).or_insert(u64::MAX);
                *e = (*e).min(s.span.start_time_unix_nano);
            }
        }
    }
    let mut spans: Vec<Value> = inferred
        .into_iter()
        .map(|(id, start)| inferred_span(v.trace_id, id, start))
        .collect();
    spans.extend(v.spans.iter().map(stored_span));
    json!({
        "trace_id": v.trace_id.to_hex(),
        "spans": spans,
        "logs": v.logs.iter().map(stored_log).collect::<Vec<_>>(),
    })
}

/// One trace search row.
pub fn trace_summary(t: &TraceSummary) -> Value {
    let duration_ms = if t.end_time_unix_nano >= t.start_time_unix_nano && t.end_time_unix_nano > 0
    {
        json!((t.end_time_unix_nano - t.start_time_unix_nano) as f64 / 1e6)
    } else {
        Value::Null
    };
    json!({
        "trace_id": t.trace_id.to_hex(),
        "root_service": t.root_service,
        "root_name": t.root_name,
        "start_time_unix_nano": nanos(t.start_time_unix_nano),
        "end_time_unix_nano": nanos(t.end_time_unix_nano),
        "duration_ms": duration_ms,
        "span_count": t.span_count,
        "error_count": t.error_count,
        "open_count": t.open_count,
    })
}

/// An incident: `{"id","event","runner_id","tool_name","trace_id","span_id","reason",
/// "evidence","idempotency_key","at_unix_nano"}`.
pub fn incident(i: &Incident) -> Value {
    let n = &i.incident;
    json!({
        "id": i.id,
        "event": n.kind.as_str(),
        "runner_id": n.runner_id,
        "tool_name": n.tool_name,
        "trace_id": opt_hex_trace(n.trace_id),
        "span_id": opt_hex_span(n.span_id),
        "reason": n.reason,
        "evidence": n.evidence,
        "idempotency_key": n.idempotency_key,
        "at_unix_nano": nanos(n.at_unix_nano),
    })
}

/// A runner as the watchdog sees it.
pub fn runner(r: &RunnerStatus) -> Value {
    let worst = r.worst_span.as_ref().map(|w| {
        json!({
            "trace_id": w.trace_id.to_hex(),
            "span_id": w.span_id.to_hex(),
            "tool_name": w.tool_name,
            "elapsed_ms": w.elapsed_ms,
            "sla_ms": w.sla_ms,
            "progress": if w.sla_ms > 0 { w.elapsed_ms as f64 / w.sla_ms as f64 } else { 0.0 },
            "stale": w.stale,
        })
    });
    json!({
        "id": r.id,
        "pid": r.pid,
        "spawned": r.spawned,
        "breaker": r.breaker.as_str(),
        "verdict": r.verdict,
        "reason": r.reason,
        "retry_after_ms": r.retry_after_ms,
        "heartbeat": r.heartbeat,
        "heartbeat_rtt_us": r.heartbeat_rtt_us.iter().map(|(ms, us)| json!({"at_unix_ms": ms, "rtt_us": us})).collect::<Vec<_>>(),
        "worst_span": worst,
    })
}

/// Retry-After for admission: whole seconds, at least 1 (DESIGN, Back-pressure).
pub fn retry_after_secs(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1000).max(1)
}

/// Admission answer `{"state","admit","reason","retry_after_ms"}`.
pub fn admission(r: &RunnerStatus) -> (bool, Value) {
    let admit = r.breaker == BreakerState::Closed;
    let retry = if admit {
        None
    } else {
        Some(r.retry_after_ms.unwrap_or(1000))
    };
    (
        admit,
        json!({
            "state": r.breaker.as_str(),
            "admit": admit,
            "reason": r.reason,
            "retry_after_ms": retry,
        }),
    )
}

/// One open-span ledger row; `elapsed_ms` is measured from its first arrival to `now`.
pub fn open_span(o: &OpenSpanRow, now_unix_nano: u64) -> Value {
    let elapsed_ms = now_unix_nano.saturating_sub(o.first_seen_unix_nano) / 1_000_000;
    json!({
        "trace_id": o.trace_id.to_hex(),
        "span_id": o.span_id.to_hex(),
        "parent_span_id": opt_hex_span(o.parent_span_id),
        "name": o.name,
        "tool_name": o.tool_name,
        "runner_id": o.runner_id,
        "service_name": o.service_name,
        "state": state_name(o.state),
        "first_seen_unix_nano": nanos(o.first_seen_unix_nano),
        "last_seen_unix_nano": nanos(o.last_seen_unix_nano),
        "elapsed_ms": elapsed_ms,
        "sla_ms": o.sla_ms,
        "progress": o.sla_ms.filter(|s| *s > 0).map(|s| elapsed_ms as f64 / s as f64),
    })
}

/// One webhook delivery with its attempts.
pub fn delivery(d: &Delivery, attempts: &[&DeliveryAttempt]) -> Value {
    json!({
        "id": d.id,
        "webhook": d.webhook,
        "incident_id": d.incident_id,
        "event": d.event,
        "idempotency_key": d.idempotency_key,
        "state": d.state.as_str(),
        "attempts": d.attempts,
        "next_attempt_unix_nano": nanos(d.next_attempt_unix_nano),
        "created_unix_nano": nanos(d.created_unix_nano),
        "done_unix_nano": d.done_unix_nano.map(nanos),
        "last_status": d.last_status,
        "last_error": d.last_error,
        "attempt_log": attempts.iter().map(|a| json!({
            "at_unix_nano": nanos(a.at_unix_nano),
            "status": a.status,
            "error": a.error,
            "duration_ms": a.duration_ms,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_doubles_and_ints_follow_otlp_json() {
        assert_eq!(
            any_value(&AnyValue::Double(f64::NAN)),
            json!({"doubleValue": "NaN"})
        );
        assert_eq!(
            any_value(&AnyValue::Double(f64::NEG_INFINITY)),
            json!({"doubleValue": "-Infinity"})
        );
        assert_eq!(
            any_value(&AnyValue::Int(i64::MAX)),
            json!({"intValue": "9223372036854775807"})
        );
        assert_eq!(
            any_value(&AnyValue::Bytes(vec![0xff, 0])),
            json!({"bytesValue": "/wA="})
        );
    }

    #[test]
    fn retry_after_is_whole_seconds_at_least_one() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1001), 2);
        assert_eq!(retry_after_secs(15000), 15);
    }
}
