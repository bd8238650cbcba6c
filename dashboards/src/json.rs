//! The read API's JSON shapes, rendered by hand from storage records.
//!
//! docs/design.md, Read API JSON: snake_case keys, lowercase hex ids, `*_unix_nano` as decimal
//! strings, attributes as OTLP `KeyValue` lists (`{"key","value":{"stringValue"|...}}`,
//! `intValue` as a string, `bytesValue` as base64, NaN and the infinities as the strings
//! `"NaN"`, `"Infinity"`, `"-Infinity"`), `state: "open" | "ended" | "inferred"`. Serde's
//! derives on the storage types would print ids as byte arrays, so nothing here derives. The
//! big shapes (spans, logs, whole traces) are streamed by `wire.rs` instead of built here.

use serde_json::{json, Value};
use stallwatch_storage::control::{BreakerState, RunnerStatus};
use stallwatch_storage::ledger::OpenSpanRow;
use stallwatch_storage::model::{Incident, SpanId, SpanState, TraceId};
use stallwatch_storage::outbox::{Delivery, DeliveryAttempt};
use stallwatch_storage::telemetry::{StoredSpan, TraceSummary};

use crate::wire::{self, SpanJ};

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

pub(crate) fn status_name(code: i32) -> &'static str {
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

/// A stored span with its resource, scope and state (see `wire.rs`).
pub fn stored_span(s: &StoredSpan) -> Value {
    serde_json::to_value(SpanJ::stored(s)).unwrap_or(Value::Null)
}

/// A parent that never arrived, shown as running (docs/design.md, "in progress (inferred)"): it
/// starts with its earliest child and has no resource or scope.
pub fn inferred_span(trace_id: TraceId, span_id: SpanId, start_unix_nano: u64) -> Value {
    let sp = wire::inferred(trace_id, span_id, start_unix_nano);
    serde_json::to_value(SpanJ {
        span: &sp,
        state: SpanState::Inferred,
        stored: None,
        parent_state: None,
        indexed: None,
        lean: false,
    })
    .unwrap_or(Value::Null)
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
        "lifecycle": r.lifecycle.as_str(),
        "breaker": r.breaker.as_str(),
        "verdict": r.verdict,
        "reason": r.reason,
        "retry_after_ms": r.retry_after_ms,
        "heartbeat": r.heartbeat,
        "heartbeat_rtt_us": r.heartbeat_rtt_us.iter().map(|(ms, us)| json!({"at_unix_ms": ms, "rtt_us": us})).collect::<Vec<_>>(),
        "worst_span": worst,
    })
}

/// Retry-After for admission: whole seconds, at least 1 (docs/design.md, Back-pressure).
pub fn retry_after_secs(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1000).max(1)
}

/// Admission answer `{"state","admit","reason","retry_after_ms","lifecycle"}` and the
/// `retry_after_ms` a refusal's `Retry-After` is made of.
///
/// Admitted only while the breaker is CLOSED and the runner's process is there to answer.
/// A breaker that is not CLOSED refuses with its own reason and retry. With it CLOSED, a
/// runner that is stopping, restarting or has exited is refused for 1 s (an exit is
/// followed by a restart decision a moment later), one the restart policy gave up on for
/// [`HELD_RETRY_AFTER_MS`] (only a new registration can change that): a request sent to
/// it would hang or fail. `state` stays the breaker's; `lifecycle` is the runner's.
pub fn admission(r: &RunnerStatus) -> (bool, Option<u64>, Value) {
    use stallwatch_vocabulary::control::{
        RunnerLifecycle as L, HELD_RETRY_AFTER_MS, LIFECYCLE_RETRY_AFTER_MS,
    };
    let id = &r.id;
    let gone = match r.lifecycle {
        L::Stopping => Some((format!("runner {id} is stopping"), LIFECYCLE_RETRY_AFTER_MS)),
        L::Restarting => Some((
            format!("runner {id} is being restarted"),
            LIFECYCLE_RETRY_AFTER_MS,
        )),
        L::Exited => Some((
            format!("runner {id} has exited (register it again if it is not restarted)"),
            LIFECYCLE_RETRY_AFTER_MS,
        )),
        L::GaveUp => Some((
            format!(
                "runner {id} has exited and the restart policy gave up on it; register it again"
            ),
            HELD_RETRY_AFTER_MS,
        )),
        L::Starting | L::Running | L::Detached => None,
    };
    let (admit, reason, retry) = match gone {
        _ if r.breaker != BreakerState::Closed => {
            let retry = r.retry_after_ms.unwrap_or(1000);
            // Held OPEN with no probe in sight: say what ends it, as the watchdog does.
            let reason = if r.breaker == BreakerState::Open && retry >= HELD_RETRY_AFTER_MS {
                format!(
                    "{}; no probe until the runner is restarted or registered again, or the breaker is reset",
                    r.reason
                )
            } else {
                r.reason.clone()
            };
            (false, reason, Some(retry))
        }
        Some((why, retry)) => (false, why, Some(retry)),
        None => (true, r.reason.clone(), None),
    };
    (
        admit,
        retry,
        json!({
            "state": r.breaker.as_str(),
            "admit": admit,
            "reason": reason,
            "retry_after_ms": retry,
            "lifecycle": r.lifecycle.as_str(),
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

/// One webhook delivery with its attempts; its webhook URL without a password
/// ([`crate::config::redact_url`]).
pub fn delivery(d: &Delivery, attempts: &[&DeliveryAttempt]) -> Value {
    json!({
        "id": d.id,
        "webhook": crate::config::redact_url(&d.webhook),
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
    use stallwatch_storage::model::AnyValue;

    fn any_value_json(v: &AnyValue) -> Value {
        serde_json::to_value(crate::wire::Any(v)).unwrap()
    }

    /// A runner whose process is not there to answer is refused even with its breaker
    /// CLOSED; a running (or starting, or detached) one with a CLOSED breaker is admitted,
    /// and an OPEN breaker answers with its own reason and retry whatever the lifecycle.
    #[test]
    fn admission_follows_the_breaker_and_the_runners_lifecycle() {
        use stallwatch_vocabulary::control::{RunnerLifecycle as L, RunnerStatus};
        use stallwatch_vocabulary::labels::HeartbeatLabel;
        let status = |lifecycle, breaker| RunnerStatus {
            id: "r".into(),
            pid: Some(7),
            spawned: true,
            lifecycle,
            breaker,
            verdict: "healthy".into(),
            reason: "breaker reason".into(),
            retry_after_ms: (breaker != BreakerState::Closed).then_some(15_000),
            heartbeat: HeartbeatLabel::Ok,
            heartbeat_rtt_us: Vec::new(),
            worst_span: None,
        };
        for l in [L::Starting, L::Running, L::Detached] {
            let (admit, retry, body) = admission(&status(l, BreakerState::Closed));
            assert!(admit, "{l:?}");
            assert_eq!(retry, None);
            assert_eq!(body["lifecycle"], l.as_str());
        }
        for (l, want_retry, says) in [
            (L::Stopping, 1_000, "is stopping"),
            (L::Restarting, 1_000, "is being restarted"),
            (L::Exited, 1_000, "has exited"),
            (L::GaveUp, 3_600_000, "gave up"),
        ] {
            let (admit, retry, body) = admission(&status(l, BreakerState::Closed));
            assert!(!admit, "{l:?} admitted");
            assert_eq!(retry, Some(want_retry), "{l:?}");
            assert_eq!(body["retry_after_ms"], want_retry);
            assert_eq!(body["state"], "CLOSED");
            assert!(body["reason"].as_str().unwrap().contains(says), "{body}");
        }
        for l in L::ALL {
            let (admit, retry, body) = admission(&status(l, BreakerState::Open));
            assert!(!admit);
            assert_eq!(retry, Some(15_000), "{l:?}: the breaker's own retry");
            assert_eq!(body["reason"], "breaker reason");
        }
        // Held OPEN (no probe in sight): the reason says what ends it.
        let mut held = status(L::Detached, BreakerState::Open);
        held.retry_after_ms = Some(3_600_000);
        let (_, retry, body) = admission(&held);
        assert_eq!(retry, Some(3_600_000));
        assert!(
            body["reason"]
                .as_str()
                .unwrap()
                .starts_with("breaker reason; no probe until the runner is restarted"),
            "{body}"
        );
    }

    #[test]
    fn special_doubles_and_ints_follow_otlp_json() {
        assert_eq!(
            any_value_json(&AnyValue::Double(f64::NAN)),
            json!({"doubleValue": "NaN"})
        );
        assert_eq!(
            any_value_json(&AnyValue::Double(f64::NEG_INFINITY)),
            json!({"doubleValue": "-Infinity"})
        );
        assert_eq!(
            any_value_json(&AnyValue::Int(i64::MAX)),
            json!({"intValue": "9223372036854775807"})
        );
        assert_eq!(
            any_value_json(&AnyValue::Bytes(vec![0xff, 0])),
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
