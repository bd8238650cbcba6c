//! Why a runner is stopped, and the idempotency keys of the incidents stallwatch records,
//! written once (issue 10: typed vocabulary where strings ruled).
//!
//! A [`StopCause`] travels from the trip, the DELETE or the shutdown to the termination
//! sequence; its wire string (`trip: stalled`, `delete`, `shutdown`, ...) is what the
//! `runners` row's state detail, the `runner.terminated` evidence (`cause`) and the
//! termination report carry, exactly as before it was a type.
//!
//! An incident's idempotency key makes a retried insert a no-op (`incidents.idempotency_key
//! UNIQUE`, docs/design.md, Incidents and events): one key per fact, so two records of the
//! same fact collapse into one row and two facts never share a key. Each constructor below
//! is the one place its key's shape is written; the shapes are the ones already stored in
//! existing databases (reaper keys are `:`-separated, watchdog keys `/`-separated).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::{EventKind, SpanId, TraceId};

/// Why a termination runs (docs/design.md, Termination). The wire string is
/// its `Display`; serde reads and writes the same string.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StopCause {
    /// The watchdog tripped the runner's breaker: `trip: <verdict>` (`trip: stalled`,
    /// `trip: tool_overrun`, `trip: probe_failed`, ...).
    Trip {
        /// The trip's verdict name (`Trip::verdict`).
        verdict: String,
    },
    /// `DELETE /api/v1/runners/{id}`: the runner is removed, its spans end as killed.
    Delete,
    /// stallwatch's ordered shutdown stops every runner within one grace period.
    Shutdown,
    /// A termination that an earlier stallwatch began and did not finish, continued from
    /// the action ledger after a restart.
    Resume,
    /// The leader exited but left members of its process group behind; they are ended
    /// while the leader is still an unreaped child.
    ExitCleanup,
}

impl StopCause {
    /// A trip with this verdict.
    pub fn trip(verdict: impl Into<String>) -> Self {
        StopCause::Trip {
            verdict: verdict.into(),
        }
    }

    /// Parses a wire string; `None` for anything [`Display`](fmt::Display) never writes.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "delete" => Some(StopCause::Delete),
            "shutdown" => Some(StopCause::Shutdown),
            "resume" => Some(StopCause::Resume),
            "exit_cleanup" => Some(StopCause::ExitCleanup),
            _ => s
                .strip_prefix("trip: ")
                .filter(|v| !v.is_empty())
                .map(StopCause::trip),
        }
    }

    /// A watchdog trip (forensics are taken only for these).
    pub fn is_trip(&self) -> bool {
        matches!(self, StopCause::Trip { .. })
    }

    /// A DELETE: the runner's row becomes `removed`, not `terminated`, and its open spans
    /// end with `error.type = killed` instead of `timeout`.
    pub fn removes_runner(&self) -> bool {
        matches!(self, StopCause::Delete)
    }
}

impl fmt::Display for StopCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopCause::Trip { verdict } => write!(f, "trip: {verdict}"),
            StopCause::Delete => f.write_str("delete"),
            StopCause::Shutdown => f.write_str("shutdown"),
            StopCause::Resume => f.write_str("resume"),
            StopCause::ExitCleanup => f.write_str("exit_cleanup"),
        }
    }
}

impl Serialize for StopCause {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for StopCause {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        StopCause::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown stop cause {s:?}")))
    }
}

/// The termination id of a trip's termination: `trip-<instance_id>-<at_unix_nano>`, so the
/// same trip of the same runner instance resumes the same ledger entries.
pub fn trip_termination_id(instance_id: &str, at_unix_nano: u64) -> String {
    format!("trip-{instance_id}-{at_unix_nano}")
}

/// `<event>:<runner_id>:<instance_id>`: one incident of this kind per runner instance
/// (`runner.exited`, `runner.crashed` when it ends on its own).
pub fn runner_instance(kind: EventKind, runner_id: &str, instance_id: &str) -> String {
    format!("{}:{runner_id}:{instance_id}", kind.as_str())
}

/// `runner.gave_up:<runner_id>:<instance_id>`: the restart policy gave up on this instance
/// (recorded as `runner.crashed` with `gave_up: true`; its own key so it is not folded into
/// the instance's exit).
pub fn runner_gave_up(runner_id: &str, instance_id: &str) -> String {
    format!("runner.gave_up:{runner_id}:{instance_id}")
}

/// `runner.terminated:<runner_id>:<termination_id>`: one per termination.
pub fn runner_terminated(runner_id: &str, termination_id: &str) -> String {
    format!(
        "{}:{runner_id}:{termination_id}",
        EventKind::RunnerTerminated.as_str()
    )
}

/// `<event>:<checkpoint_id>`: one commit or one rollback per checkpoint.
pub fn checkpoint(kind: EventKind, checkpoint_id: &str) -> String {
    format!("{}:{checkpoint_id}", kind.as_str())
}

/// `sidecar.degraded/<at_unix_nano>`: each episode of stallwatch's own trouble.
pub fn sidecar_degraded(at_unix_nano: u64) -> String {
    format!("{}/{at_unix_nano}", EventKind::SidecarDegraded.as_str())
}

/// `breaker.closed/<runner_id>/<at_unix_nano>`.
pub fn breaker_closed(runner_id: &str, at_unix_nano: u64) -> String {
    format!(
        "{}/{runner_id}/{at_unix_nano}",
        EventKind::BreakerClosed.as_str()
    )
}

/// `breaker.half_open/<runner_id>/<at_unix_nano>`.
pub fn breaker_half_open(runner_id: &str, at_unix_nano: u64) -> String {
    format!(
        "{}/{runner_id}/{at_unix_nano}",
        EventKind::BreakerHalfOpen.as_str()
    )
}

/// `breaker.opened/<runner_id>/probe/<at_unix_nano>`: the HALF_OPEN probe failed.
pub fn breaker_reopened(runner_id: &str, at_unix_nano: u64) -> String {
    format!(
        "{}/{runner_id}/probe/{at_unix_nano}",
        EventKind::BreakerOpened.as_str()
    )
}

/// `breaker.opened/<runner_id>/<verdict>/<trace_id>/<span_id>` (ids in lowercase hex): a
/// trip blamed on one open span, so the same span never opens the breaker twice.
pub fn breaker_opened_span(runner_id: &str, verdict: &str, trace: TraceId, span: SpanId) -> String {
    format!(
        "{}/{runner_id}/{verdict}/{trace}/{span}",
        EventKind::BreakerOpened.as_str()
    )
}

/// `breaker.opened/<runner_id>/<verdict>/<at_unix_nano>`: a trip with no span to blame
/// (a lost heartbeat with nothing open).
pub fn breaker_opened_at(runner_id: &str, verdict: &str, at_unix_nano: u64) -> String {
    format!(
        "{}/{runner_id}/{verdict}/{at_unix_nano}",
        EventKind::BreakerOpened.as_str()
    )
}

/// `verdict.suspect/<runner_id>/<cause>/<trace_id>/<span_id>`: one suspicion per cause and
/// span.
pub fn verdict_suspect(runner_id: &str, cause: &str, trace: TraceId, span: SpanId) -> String {
    format!(
        "{}/{runner_id}/{cause}/{trace}/{span}",
        EventKind::VerdictSuspect.as_str()
    )
}

/// `storage.full:start:<at_unix_nano>`: the disk was full when stallwatch started.
pub fn storage_full_at_start(at_unix_nano: u64) -> String {
    format!("{}:start:{at_unix_nano}", EventKind::StorageFull.as_str())
}

/// `storage.full:<at_unix_nano>:<episode>`: one per full-disk episode while running.
pub fn storage_full(at_unix_nano: u64, episode: u64) -> String {
    format!(
        "{}:{at_unix_nano}:{episode}",
        EventKind::StorageFull.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn causes() -> Vec<StopCause> {
        vec![
            StopCause::trip("stalled"),
            StopCause::trip("probe_failed"),
            StopCause::Delete,
            StopCause::Shutdown,
            StopCause::Resume,
            StopCause::ExitCleanup,
        ]
    }

    #[test]
    fn stop_causes_keep_their_wire_strings() {
        let wire: Vec<String> = causes().iter().map(|c| c.to_string()).collect();
        assert_eq!(
            wire,
            [
                "trip: stalled",
                "trip: probe_failed",
                "delete",
                "shutdown",
                "resume",
                "exit_cleanup"
            ]
        );
    }

    #[test]
    fn stop_causes_round_trip_through_text_and_serde() {
        for c in causes() {
            assert_eq!(StopCause::parse(&c.to_string()), Some(c.clone()));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{c}\""));
            assert_eq!(serde_json::from_str::<StopCause>(&json).unwrap(), c);
        }
        assert_eq!(StopCause::parse("trip: "), None);
        assert_eq!(StopCause::parse("trip"), None);
        assert_eq!(StopCause::parse("Delete"), None);
        assert!(serde_json::from_str::<StopCause>("\"reboot\"").is_err());
    }

    #[test]
    fn stop_cause_predicates() {
        assert!(StopCause::trip("stalled").is_trip());
        assert!(!StopCause::Delete.is_trip());
        assert!(StopCause::Delete.removes_runner());
        assert!(!StopCause::Shutdown.removes_runner());
        assert!(!StopCause::trip("stalled").removes_runner());
    }

    #[test]
    fn incident_keys_keep_the_stored_shapes() {
        let t = TraceId([0xab; 16]);
        let s = SpanId([0x01; 8]);
        let th = "ab".repeat(16);
        let sh = "01".repeat(8);
        assert_eq!(trip_termination_id("i-1", 7), "trip-i-1-7");
        assert_eq!(
            runner_instance(EventKind::RunnerExited, "r1", "i-1"),
            "runner.exited:r1:i-1"
        );
        assert_eq!(
            runner_instance(EventKind::RunnerCrashed, "r1", "i-1"),
            "runner.crashed:r1:i-1"
        );
        assert_eq!(runner_gave_up("r1", "i-1"), "runner.gave_up:r1:i-1");
        assert_eq!(runner_terminated("r1", "t9"), "runner.terminated:r1:t9");
        assert_eq!(
            checkpoint(EventKind::CheckpointRolledBack, "c1"),
            "checkpoint.rolled_back:c1"
        );
        assert_eq!(sidecar_degraded(5), "sidecar.degraded/5");
        assert_eq!(breaker_closed("r1", 5), "breaker.closed/r1/5");
        assert_eq!(breaker_half_open("r1", 5), "breaker.half_open/r1/5");
        assert_eq!(breaker_reopened("r1", 5), "breaker.opened/r1/probe/5");
        assert_eq!(
            breaker_opened_span("r1", "stalled", t, s),
            format!("breaker.opened/r1/stalled/{th}/{sh}")
        );
        assert_eq!(
            breaker_opened_at("r1", "unresponsive", 5),
            "breaker.opened/r1/unresponsive/5"
        );
        assert_eq!(
            verdict_suspect("r1", "lost_heartbeat", t, s),
            format!("verdict.suspect/r1/lost_heartbeat/{th}/{sh}")
        );
        assert_eq!(storage_full_at_start(5), "storage.full:start:5");
        assert_eq!(storage_full(5, 2), "storage.full:5:2");
    }

    #[test]
    fn distinct_facts_get_distinct_keys() {
        let keys = [
            runner_instance(EventKind::RunnerExited, "r1", "i-1"),
            runner_instance(EventKind::RunnerCrashed, "r1", "i-1"),
            runner_instance(EventKind::RunnerExited, "r1", "i-2"),
            runner_instance(EventKind::RunnerExited, "r2", "i-1"),
            runner_gave_up("r1", "i-1"),
            runner_terminated("r1", "i-1"),
            breaker_closed("r1", 5),
            breaker_half_open("r1", 5),
            breaker_reopened("r1", 5),
            breaker_opened_at("r1", "stalled", 5),
        ];
        let unique: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "{keys:?}");
    }
}
