//! Writing the missing end of a tool span that stallwatch stopped or found orphaned.
//!
//! docs/design.md, Open spans: when the reaper stops a runner, or the orphan sweep finds a dead one,
//! stallwatch writes the span's end itself: a copy of the span with end time = the kill
//! time, status ERROR, `error.type` = `timeout` or `orphaned`, and span events for SIGTERM,
//! SIGKILL (if sent) and rollback. The original span is read back from storage; when it is
//! not there, a minimal span is built from what the reaper knows. Every other end of a
//! runner (it exited, crashed, was killed from outside) closes its spans the same way, with
//! the exit code or signal as attributes (`ends.rs`; issue 12 #1).

use std::sync::Arc;

use stallwatch_storage::model::{
    AnyValue, Event, KeyValue, Resource, ResourceSpans, Scope, ScopeSpans, Span, SpanId, Status,
    TraceBatch, TraceId, STATUS_ERROR,
};
use stallwatch_storage::Storage;

/// Instrumentation scope name of the span ends stallwatch writes.
pub const SCOPE_NAME: &str = "stallwatch.reaper";

/// A span event to add (name, time ns since the Unix epoch).
#[derive(Clone, Debug)]
pub struct EndEvent {
    /// `SIGTERM`, `SIGKILL`, `rollback`, `orphaned`.
    pub name: String,
    /// When, ns since the Unix epoch.
    pub at_unix_nano: u64,
}

/// Builds the ended copy of `original` (or of a minimal span when it is unknown).
pub fn ended_copy(
    trace_id: TraceId,
    span_id: SpanId,
    original: Option<Span>,
    error_type: &str,
    reason: &str,
    end_unix_nano: u64,
    events: &[EndEvent],
) -> Span {
    let mut span = original.unwrap_or_else(|| Span {
        trace_id,
        span_id,
        name: "unknown tool span (ended by stallwatch)".into(),
        start_time_unix_nano: end_unix_nano,
        ..Default::default()
    });
    span.end_time_unix_nano = end_unix_nano.max(span.start_time_unix_nano);
    span.status = Status {
        code: STATUS_ERROR,
        message: reason.to_string(),
    };
    span.attributes.retain(|kv| kv.key != "error.type");
    span.attributes.push(KeyValue::new(
        "error.type",
        AnyValue::String(error_type.into()),
    ));
    for e in events {
        span.events.push(Event {
            time_unix_nano: e.at_unix_nano,
            name: e.name.clone(),
            attributes: vec![KeyValue::new(
                "stallwatch.reason",
                AnyValue::String(reason.into()),
            )],
            dropped_attributes_count: 0,
        });
    }
    span
}

/// How the runner's process ended, as attributes of the span ends written for it
/// (issue 12 #1): `process.exit.code` (OpenTelemetry semantic conventions, process
/// registry) and `stallwatch.exit.signal` (the signal name, e.g. `SIGKILL`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitAttrs {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it.
    pub signal: Option<i32>,
}

/// The conventional name of signal `n` (`SIGKILL`), or `SIG<n>` for one without a name here.
pub fn signal_name(n: i32) -> String {
    let name = match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => return format!("SIG{n}"),
    };
    name.to_string()
}

/// Adds the exit attributes to `span` (and to its exit event, when it has one named
/// `runner.exit`).
pub fn mark_exit(span: &mut Span, exit: ExitAttrs) {
    let mut attrs = Vec::new();
    if let Some(c) = exit.code {
        attrs.push(KeyValue::new(
            "process.exit.code",
            AnyValue::Int(i64::from(c)),
        ));
    }
    if let Some(n) = exit.signal {
        attrs.push(KeyValue::new(
            "stallwatch.exit.signal",
            AnyValue::String(signal_name(n)),
        ));
    }
    span.attributes
        .retain(|kv| kv.key != "process.exit.code" && kv.key != "stallwatch.exit.signal");
    span.attributes.extend(attrs.iter().cloned());
    for e in span.events.iter_mut().filter(|e| e.name == "runner.exit") {
        e.attributes.extend(attrs.iter().cloned());
    }
}

/// Reads each span, writes its ended copy. Answers how many were written; failures are
/// logged and skipped (the telemetry writer may refuse under back-pressure).
pub async fn close_spans(
    storage: &Storage,
    runner_id: &str,
    spans: &[(TraceId, SpanId)],
    error_type: &str,
    reason: &str,
    end_unix_nano: u64,
    events: &[EndEvent],
) -> usize {
    close_spans_with(
        storage,
        runner_id,
        spans,
        error_type,
        reason,
        end_unix_nano,
        events,
        None,
    )
    .await
    .0
}

/// [`close_spans`] with the process's exit attributes. Answers how many ends were written
/// and every key whose end is now stored (written here, or already ended on its own).
#[allow(clippy::too_many_arguments)]
pub async fn close_spans_with(
    storage: &Storage,
    runner_id: &str,
    spans: &[(TraceId, SpanId)],
    error_type: &str,
    reason: &str,
    end_unix_nano: u64,
    events: &[EndEvent],
    exit: Option<ExitAttrs>,
) -> (usize, Vec<(TraceId, SpanId)>) {
    let mut written = 0;
    let mut ended = Vec::new();
    for (t, s) in spans {
        let stored = storage.span(*t, *s).await.ok().flatten();
        let (resource, scope, original) = match stored {
            Some(st) => ((*st.resource).clone(), (*st.scope).clone(), Some(st.span)),
            None => (
                Resource {
                    attributes: vec![KeyValue::new(
                        "stallwatch.runner.id",
                        AnyValue::String(runner_id.into()),
                    )],
                    ..Default::default()
                },
                Scope {
                    name: SCOPE_NAME.into(),
                    ..Default::default()
                },
                None,
            ),
        };
        if original.as_ref().is_some_and(Span::is_ended) {
            ended.push((*t, *s));
            continue; // it ended on its own after all
        }
        let mut span = ended_copy(*t, *s, original, error_type, reason, end_unix_nano, events);
        if let Some(x) = exit {
            mark_exit(&mut span, x);
        }
        let batch = TraceBatch {
            resource_spans: vec![ResourceSpans {
                resource,
                scope_spans: vec![ScopeSpans {
                    scope,
                    spans: vec![span],
                }],
            }],
        };
        match storage.write_traces(Arc::new(batch)).await {
            Ok(()) => {
                written += 1;
                ended.push((*t, *s));
            }
            Err(e) => {
                tracing::warn!(runner = runner_id, trace = %t, span = %s, "span end not written: {e}")
            }
        }
    }
    (written, ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_copy_keeps_the_span_and_marks_the_error() {
        let orig = Span {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([2; 8]),
            name: "run_notebook".into(),
            start_time_unix_nano: 100,
            attributes: vec![KeyValue::new(
                "gen_ai.tool.name",
                AnyValue::String("x".into()),
            )],
            ..Default::default()
        };
        let ev = [
            EndEvent {
                name: "SIGTERM".into(),
                at_unix_nano: 200,
            },
            EndEvent {
                name: "SIGKILL".into(),
                at_unix_nano: 300,
            },
        ];
        let s = ended_copy(
            orig.trace_id,
            orig.span_id,
            Some(orig.clone()),
            "timeout",
            "over SLA",
            200,
            &ev,
        );
        assert_eq!(s.name, "run_notebook");
        assert_eq!(s.end_time_unix_nano, 200);
        assert_eq!(s.status.code, STATUS_ERROR);
        assert_eq!(
            stallwatch_storage::model::attr(&s.attributes, "error.type").and_then(AnyValue::as_str),
            Some("timeout")
        );
        assert_eq!(
            s.events.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["SIGTERM", "SIGKILL"]
        );
    }
}
