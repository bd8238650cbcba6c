//! The JSON shapes the client sends and reads, as small serde types.
//!
//! The request types ([`RunnerSpec`], [`SpawnSpec`], [`AttachSpec`]), [`BreakerState`] and
//! [`valid_runner_id`] are the server's own, from `stallwatch-vocabulary` (no SQLite in
//! the app); tests pin their JSON shape. The answer types follow docs/design.md, Read API JSON and the dashboard's renderers; they ignore
//! unknown fields so a newer binary can add some.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

pub use stallwatch_vocabulary::control::{
    valid_runner_id, AttachSpec, BreakerState, RunnerLifecycle, RunnerSpec, SpawnSpec,
};

/// The answer of `GET /api/v1/runners/{id}/admit`: `{"state","admit","reason",
/// "retry_after_ms","lifecycle"}` (200 in CLOSED; 503 in OPEN and HALF_OPEN, and in CLOSED
/// while the runner is stopping, restarting, exited or given up on; docs/design.md, Control
/// endpoints).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    /// The runner's breaker state.
    pub state: BreakerState,
    /// True when the MCP request may be dispatched now.
    pub admit: bool,
    /// Why the breaker is in its state (empty when CLOSED and healthy).
    #[serde(default)]
    pub reason: String,
    /// When refused: ms until admission could succeed (the `Retry-After` header carries the
    /// same in whole seconds, ≥ 1).
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// The runner's lifecycle (`None` from a stallwatch that did not send it).
    #[serde(default)]
    pub lifecycle: Option<RunnerLifecycle>,
}

impl Admission {
    /// [`Admission::retry_after_ms`] as a `Duration`, when refused.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ms.map(Duration::from_millis)
    }
}

/// The answer of `POST /api/v1/checkpoints`: `{"id","path"}` (the server's own type).
pub type Checkpoint = stallwatch_vocabulary::control::CheckpointCreated;

pub use stallwatch_vocabulary::control::CheckpointOutcome;

/// One recent heartbeat round trip.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRtt {
    /// When, ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// Round trip, µs.
    pub rtt_us: u64,
}

/// The worst open tool span of a runner (highest elapsed / SLA).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorstSpan {
    /// Trace id, lowercase hex.
    pub trace_id: String,
    /// Span id, lowercase hex.
    pub span_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Elapsed since first seen, ms (stallwatch's monotonic clock).
    pub elapsed_ms: u64,
    /// Effective SLA, ms.
    pub sla_ms: u64,
    /// True when refreshes stopped for longer than the staleness limit.
    #[serde(default)]
    pub stale: bool,
}

/// One runner as the watchdog sees it (`GET /api/v1/runners` items).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Runner {
    /// Runner id.
    pub id: String,
    /// Current pid, when known.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Spawned by stallwatch (true) or attached.
    #[serde(default)]
    pub spawned: bool,
    /// Breaker state.
    pub breaker: BreakerState,
    /// Verdict: `healthy`, `suspect`, `tool_overrun`, `unresponsive`, `stalled`, ...
    #[serde(default)]
    pub verdict: String,
    /// Why the breaker is in its state.
    #[serde(default)]
    pub reason: String,
    /// In OPEN/HALF_OPEN: ms until admission could succeed.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// Heartbeat: `ok`, `lost`, `starting`, `not_configured`, or a named failure.
    #[serde(default)]
    pub heartbeat: String,
    /// Recent heartbeat round trips, oldest first.
    #[serde(default)]
    pub heartbeat_rtt_us: Vec<HeartbeatRtt>,
    /// The worst open tool span, if any.
    #[serde(default)]
    pub worst_span: Option<WorstSpan>,
}

/// One incident (`GET /api/v1/incidents` items, and the `data` of an SSE event). The
/// `event` is one of the design's vocabulary: `verdict.suspect`, `breaker.opened`,
/// `breaker.half_open`, `breaker.closed`, `runner.started`, `runner.exited`,
/// `runner.crashed`, `runner.terminated`, `runner.restarted`, `runner.orphaned`,
/// `checkpoint.committed`, `checkpoint.rolled_back`, `storage.full`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    /// Incident id (the SSE `id:`; 0 while held in memory on a full disk).
    pub id: i64,
    /// Event name, e.g. `runner.terminated`.
    pub event: String,
    /// The runner concerned, if any.
    #[serde(default)]
    pub runner_id: Option<String>,
    /// The tool concerned, if any.
    #[serde(default)]
    pub tool_name: Option<String>,
    /// Trace id, lowercase hex, if any.
    #[serde(default)]
    pub trace_id: Option<String>,
    /// Span id, lowercase hex, if any.
    #[serde(default)]
    pub span_id: Option<String>,
    /// One human sentence.
    #[serde(default)]
    pub reason: String,
    /// Structured evidence (shape depends on the event).
    #[serde(default)]
    pub evidence: serde_json::Value,
    /// Idempotency key (also sent to webhooks).
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// When, ns since the Unix epoch (a decimal string on the wire).
    #[serde(deserialize_with = "u64_from_string_or_number")]
    pub at_unix_nano: u64,
}

/// A page of a list answer, `{"items": [...], "next_cursor": ...}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Pass as the next query's cursor (`before_id` for incidents); `None` at the end.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// Filter of [`crate::Client::incidents`]: `GET /api/v1/incidents[?runner_id=&event=&
/// before_id=&limit=]`, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IncidentQuery {
    /// Only this runner's incidents.
    pub runner_id: Option<String>,
    /// Only this event name, e.g. `runner.terminated`.
    pub event: Option<String>,
    /// Only incidents with a smaller id (paging: the previous page's `next_cursor`).
    pub before_id: Option<i64>,
    /// Page size (server default 100, at most 1000).
    pub limit: Option<u64>,
}

impl IncidentQuery {
    pub(crate) fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if let Some(r) = &self.runner_id {
            q.push(("runner_id", r.clone()));
        }
        if let Some(e) = &self.event {
            q.push(("event", e.clone()));
        }
        if let Some(b) = self.before_id {
            q.push(("before_id", b.to_string()));
        }
        if let Some(l) = self.limit {
            q.push(("limit", l.to_string()));
        }
        q
    }
}

fn u64_from_string_or_number<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum N {
        S(String),
        N(u64),
    }
    match N::deserialize(d)? {
        N::N(n) => Ok(n),
        N::S(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pairs() -> Vec<(RunnerSpec, serde_json::Value)> {
        let env: BTreeMap<String, String> = [("A".to_string(), "1".to_string())].into();
        vec![
            (
                RunnerSpec::attached("r1", 4242, Some(123456)),
                serde_json::json!({"id": "r1", "heartbeat_socket": null, "spawn": null,
                    "attach": {"pid": 4242, "start_time_ticks": 123456}}),
            ),
            (
                RunnerSpec::attached("r2", 7, None),
                serde_json::json!({"id": "r2", "heartbeat_socket": null, "spawn": null,
                    "attach": {"pid": 7, "start_time_ticks": null}}),
            ),
            (
                RunnerSpec {
                    id: "py.runner-1".into(),
                    heartbeat_socket: Some("/run/x.sock".into()),
                    spawn: Some(SpawnSpec {
                        argv: vec!["python3".into(), "-m".into(), "tool".into()],
                        cwd: Some("/w".into()),
                        env,
                        workspace: Some("/w/ws".into()),
                    }),
                    attach: None,
                },
                serde_json::json!({"id": "py.runner-1", "heartbeat_socket": "/run/x.sock",
                    "spawn": {"argv": ["python3", "-m", "tool"], "cwd": "/w",
                        "env": {"A": "1"}, "workspace": "/w/ws"},
                    "attach": null}),
            ),
        ]
    }

    #[test]
    fn runner_specs_serialize_to_the_documented_json() {
        for (spec, json) in pairs() {
            assert_eq!(serde_json::to_value(&spec).unwrap(), json);
            let back: RunnerSpec = serde_json::from_value(json).unwrap();
            assert_eq!(back, spec);
        }
        // Absent optional fields read as `None`, like the server accepts them.
        let short: RunnerSpec = serde_json::from_str(r#"{"id":"r","attach":{"pid":5}}"#).unwrap();
        assert_eq!(short, RunnerSpec::attached("r", 5, None));
    }

    #[test]
    fn runner_spec_refuses_unknown_fields_like_the_server() {
        let j = r#"{"id":"r","attach":{"pid":5},"pidd":1}"#;
        assert!(serde_json::from_str::<RunnerSpec>(j).is_err());
    }

    #[test]
    fn breaker_state_uses_the_wire_names() {
        for (state, wire) in [
            (BreakerState::Closed, "CLOSED"),
            (BreakerState::Open, "OPEN"),
            (BreakerState::HalfOpen, "HALF_OPEN"),
        ] {
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                serde_json::json!(wire)
            );
        }
    }

    #[test]
    fn runner_ids_follow_the_design_pattern() {
        for ok in ["a", "0", "py.runner_1-x", &"a".repeat(63)] {
            assert!(valid_runner_id(ok), "{ok}");
        }
        for bad in ["", "A", "-a", ".a", "a/b", "a b", &"a".repeat(64)] {
            assert!(!valid_runner_id(bad), "{bad}");
        }
    }

    #[test]
    fn incident_reads_the_dashboard_shape() {
        let j = r#"{"id":12,"event":"runner.terminated","runner_id":"r1","tool_name":null,
            "trace_id":null,"span_id":null,"reason":"stopped","evidence":{"steps":[]},
            "idempotency_key":"k","at_unix_nano":"1700000000000000000"}"#;
        let i: Incident = serde_json::from_str(j).unwrap();
        assert_eq!(i.id, 12);
        assert_eq!(i.event, "runner.terminated");
        assert_eq!(i.runner_id.as_deref(), Some("r1"));
        assert_eq!(i.at_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(i.evidence["steps"], serde_json::json!([]));
    }

    #[test]
    fn admission_reads_both_answers() {
        let a: Admission = serde_json::from_str(
            r#"{"state":"CLOSED","admit":true,"reason":"","retry_after_ms":null}"#,
        )
        .unwrap();
        assert!(a.admit);
        assert_eq!(a.retry_after(), None);
        let a: Admission = serde_json::from_str(
            r#"{"state":"HALF_OPEN","admit":false,"reason":"probe pending","retry_after_ms":2500}"#,
        )
        .unwrap();
        assert_eq!(a.state, BreakerState::HalfOpen);
        assert_eq!(a.retry_after(), Some(Duration::from_millis(2500)));
        assert_eq!(a.lifecycle, None, "an answer without it");
        let a: Admission = serde_json::from_str(
            r#"{"state":"CLOSED","admit":false,"reason":"runner r has exited and the restart policy gave up on it; register it again","retry_after_ms":3600000,"lifecycle":"gave_up"}"#,
        )
        .unwrap();
        assert!(!a.admit);
        assert_eq!(a.lifecycle, Some(RunnerLifecycle::GaveUp));
    }

    #[test]
    fn incident_query_builds_only_given_pairs() {
        assert!(IncidentQuery::default().pairs().is_empty());
        let q = IncidentQuery {
            runner_id: Some("r".into()),
            before_id: Some(9),
            ..Default::default()
        };
        assert_eq!(
            q.pairs(),
            vec![
                ("runner_id", "r".to_string()),
                ("before_id", "9".to_string())
            ]
        );
    }
}
