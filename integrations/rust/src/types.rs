//! The JSON shapes the client sends and reads, as small serde types.
//!
//! The request types ([`RunnerSpec`], [`SpawnSpec`], [`AttachSpec`]) mirror
//! `stallwatch_storage::control` field for field and serialize to the same JSON (a test
//! checks it), so a Tauri app gets them without pulling storage's SQLite dependency. The
//! answer types follow DESIGN, Read API JSON and the dashboard's renderers; they ignore
//! unknown fields so a newer binary can add some.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

/// Runner ids match `^[a-z0-9][a-z0-9._-]{0,62}$` (DESIGN, Interfaces: Runners).
pub fn valid_runner_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b[1..].iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
}

/// Body of `POST /api/v1/runners`: `id`, optional `heartbeat_socket`, and exactly one of
/// `spawn` and `attach` (DESIGN, Interfaces: Runners).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerSpec {
    /// Runner id, `^[a-z0-9][a-z0-9._-]{0,62}$`.
    pub id: String,
    /// UNIX socket answering `PING\n` with `PONG`; for spawned runners stallwatch chooses one
    /// under `<data_dir>/run/` when absent and passes it as `STALLWATCH_HEARTBEAT_SOCKET`.
    #[serde(default)]
    pub heartbeat_socket: Option<PathBuf>,
    /// Start it as a child of stallwatch.
    #[serde(default)]
    pub spawn: Option<SpawnSpec>,
    /// Watch an existing process.
    #[serde(default)]
    pub attach: Option<AttachSpec>,
}

impl RunnerSpec {
    /// A runner stallwatch starts with `argv` (no cwd, env or workspace).
    pub fn spawned(id: impl Into<String>, argv: Vec<String>) -> Self {
        Self {
            id: id.into(),
            heartbeat_socket: None,
            spawn: Some(SpawnSpec {
                argv,
                cwd: None,
                env: BTreeMap::new(),
                workspace: None,
            }),
            attach: None,
        }
    }

    /// A runner someone else started, watched by `pid`; give `start_time_ticks` (see
    /// [`crate::process_start_time_ticks`]) or it is watched but never signalled.
    pub fn attached(id: impl Into<String>, pid: u32, start_time_ticks: Option<u64>) -> Self {
        Self {
            id: id.into(),
            heartbeat_socket: None,
            spawn: None,
            attach: Some(AttachSpec {
                pid,
                start_time_ticks,
            }),
        }
    }
}

/// A runner stallwatch starts itself (its child, in its own process group).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnSpec {
    /// Program and arguments; `argv[0]` is looked up in `PATH`.
    pub argv: Vec<String>,
    /// Working directory (default: stallwatch's).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Extra environment; wins over the injected variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Workspace root for checkpoints (enables `STALLWATCH_CHECKPOINT_DIR`).
    #[serde(default)]
    pub workspace: Option<PathBuf>,
}

/// A runner started by someone else, watched by pid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachSpec {
    /// Its pid.
    pub pid: u32,
    /// Field 22 of `/proc/PID/stat` (clock ticks since boot). Without it the runner is
    /// watched but never signalled.
    #[serde(default)]
    pub start_time_ticks: Option<u64>,
}

/// Circuit breaker states (DESIGN, Fusion and breakers), on the wire `CLOSED`, `OPEN`,
/// `HALF_OPEN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BreakerState {
    /// Healthy: requests admitted.
    #[serde(rename = "CLOSED")]
    Closed,
    /// Tripped: requests refused until the cooldown ends.
    #[serde(rename = "OPEN")]
    Open,
    /// Cooldown over; one probe ping decides.
    #[serde(rename = "HALF_OPEN")]
    HalfOpen,
}

/// The answer of `GET /api/v1/runners/{id}/admit`: `{"state","admit","reason",
/// "retry_after_ms"}` (200 in CLOSED, 503 in OPEN and HALF_OPEN; DESIGN, Control endpoints).
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
}

impl Admission {
    /// [`Admission::retry_after_ms`] as a `Duration`, when refused.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ms.map(Duration::from_millis)
    }
}

/// The answer of `POST /api/v1/checkpoints`: `{"id","path"}`. The tool writes into `path`
/// (`<workspace>/.workbench/checkpoints/<id>/`), never into the workspace directly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Checkpoint (transaction) id.
    pub id: String,
    /// The staging folder.
    pub path: PathBuf,
}

/// The answer of `POST /api/v1/checkpoints/{id}/commit|rollback`: `{"id","state"}` and, for
/// a commit, the number of files moved into the workspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOutcome {
    /// Checkpoint id.
    pub id: String,
    /// `committed` or `rolled_back`.
    pub state: String,
    /// Files renamed into the workspace (commit only).
    #[serde(default)]
    pub files: Option<u64>,
}

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
/// `event` is one of DESIGN's vocabulary: `verdict.suspect`, `breaker.opened`,
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
    use stallwatch_storage::control as storage;

    fn pairs() -> Vec<(RunnerSpec, storage::RunnerSpec)> {
        let env: BTreeMap<String, String> = [("A".to_string(), "1".to_string())].into();
        vec![
            (
                RunnerSpec::attached("r1", 4242, Some(123456)),
                storage::RunnerSpec {
                    id: "r1".into(),
                    heartbeat_socket: None,
                    spawn: None,
                    attach: Some(storage::AttachSpec {
                        pid: 4242,
                        start_time_ticks: Some(123456),
                    }),
                },
            ),
            (
                RunnerSpec::attached("r2", 7, None),
                storage::RunnerSpec {
                    id: "r2".into(),
                    heartbeat_socket: None,
                    spawn: None,
                    attach: Some(storage::AttachSpec {
                        pid: 7,
                        start_time_ticks: None,
                    }),
                },
            ),
            (
                RunnerSpec {
                    id: "py.runner-1".into(),
                    heartbeat_socket: Some("/run/x.sock".into()),
                    spawn: Some(SpawnSpec {
                        argv: vec!["python3".into(), "-m".into(), "tool".into()],
                        cwd: Some("/w".into()),
                        env: env.clone(),
                        workspace: Some("/w/ws".into()),
                    }),
                    attach: None,
                },
                storage::RunnerSpec {
                    id: "py.runner-1".into(),
                    heartbeat_socket: Some("/run/x.sock".into()),
                    spawn: Some(storage::SpawnSpec {
                        argv: vec!["python3".into(), "-m".into(), "tool".into()],
                        cwd: Some("/w".into()),
                        env,
                        workspace: Some("/w/ws".into()),
                    }),
                    attach: None,
                },
            ),
        ]
    }

    #[test]
    fn runner_specs_serialize_like_storage_control() {
        for (mine, theirs) in pairs() {
            let a = serde_json::to_value(&mine).unwrap();
            let b = serde_json::to_value(&theirs).unwrap();
            assert_eq!(a, b);
            // And the server's type reads what the client sends, and vice versa.
            let back: storage::RunnerSpec = serde_json::from_value(a.clone()).unwrap();
            assert_eq!(back, theirs);
            let mine_back: RunnerSpec = serde_json::from_value(b).unwrap();
            assert_eq!(mine_back, mine);
        }
    }

    #[test]
    fn runner_spec_refuses_unknown_fields_like_the_server() {
        let j = r#"{"id":"r","attach":{"pid":5},"pidd":1}"#;
        assert!(serde_json::from_str::<RunnerSpec>(j).is_err());
        assert!(serde_json::from_str::<storage::RunnerSpec>(j).is_err());
    }

    #[test]
    fn breaker_state_matches_storage() {
        for (mine, theirs) in [
            (BreakerState::Closed, storage::BreakerState::Closed),
            (BreakerState::Open, storage::BreakerState::Open),
            (BreakerState::HalfOpen, storage::BreakerState::HalfOpen),
        ] {
            assert_eq!(
                serde_json::to_value(mine).unwrap(),
                serde_json::to_value(theirs).unwrap()
            );
        }
    }

    #[test]
    fn runner_ids_follow_the_design_pattern() {
        for ok in ["a", "0", "py.runner_1-x", &"a".repeat(63)] {
            assert!(valid_runner_id(ok), "{ok}");
            assert_eq!(valid_runner_id(ok), storage::valid_runner_id(ok));
        }
        for bad in ["", "A", "-a", ".a", "a/b", "a b", &"a".repeat(64)] {
            assert!(!valid_runner_id(bad), "{bad}");
            assert_eq!(valid_runner_id(bad), storage::valid_runner_id(bad));
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
