//! Messages that cross crate boundaries through channels `src/` wires.
//!
//! Crates never call each other; they exchange these values:
//! - collector → watchdog: [`Observation`] (what was just committed, with its arrival time
//!   on stallwatch's monotonic clock);
//! - watchdog → reaper: [`Trip`] (a breaker opened: stop this runner);
//! - reaper → (src) → watchdog: [`RunnerChange`] (a runner was registered, restarted or is
//!   gone), the lifecycle notice named in ARCHITECTURE.md;
//! - dashboards → (src) → reaper/watchdog: [`ControlRequest`] (the control API), the one
//!   reverse edge;
//! - watchdog → dashboards: [`RunnerBoard`] through a `tokio::sync::watch` channel.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::model::{LogBatch, SpanId, TraceBatch, TraceId};

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

/// Telemetry that has just been committed, handed to the watchdog.
#[derive(Clone, Debug)]
pub struct Observation {
    /// When the request arrived (stallwatch's monotonic clock).
    pub received: Instant,
    /// What arrived.
    pub data: ObservedData,
}

/// The committed records of one export request.
#[derive(Clone, Debug)]
pub enum ObservedData {
    /// A trace export.
    Spans(Arc<TraceBatch>),
    /// A log export (the open-span heartbeat shape 2 arrives as logs).
    Logs(Arc<LogBatch>),
}

/// How a runner is started or found (DESIGN, Interfaces: Runners). Config `[[runner]]` and
/// `POST /api/v1/runners` share this shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerSpec {
    /// Runner id, `^[a-z0-9][a-z0-9._-]{0,62}$`.
    pub id: String,
    /// UNIX socket answering `PING\n` with `PONG`; for spawned runners stallwatch chooses one
    /// under `<data_dir>/run/` when absent.
    #[serde(default)]
    pub heartbeat_socket: Option<PathBuf>,
    /// Start it as a child of stallwatch.
    #[serde(default)]
    pub spawn: Option<SpawnSpec>,
    /// Watch an existing process.
    #[serde(default)]
    pub attach: Option<AttachSpec>,
}

/// A runner stallwatch starts itself.
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

/// The watchdog's request to stop a runner: its breaker went CLOSED → OPEN.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trip {
    /// The runner to stop.
    pub runner_id: String,
    /// Verdict name: `tool_overrun`, `unresponsive`, `stalled`, `suspect_timeout`, ...
    pub verdict: String,
    /// One human sentence.
    pub reason: String,
    /// The `breaker.opened` incident this trip acts on.
    pub incident_id: Option<i64>,
    /// Open tool spans of this runner whose end stallwatch must write.
    pub open_spans: Vec<(TraceId, SpanId)>,
    /// When the watchdog decided, ns since the Unix epoch.
    pub at_unix_nano: u64,
}

/// A runner lifecycle notice from the reaper, forwarded by `src/` to the watchdog.
#[derive(Clone, Debug, PartialEq)]
pub enum RunnerChange {
    /// A runner is (again) registered and should be watched.
    Registered {
        /// Runner id.
        id: String,
        /// Its current pid, when known.
        pid: Option<u32>,
        /// Its heartbeat socket, when it has one.
        heartbeat_socket: Option<PathBuf>,
        /// Spawned by stallwatch (true) or attached (false).
        spawned: bool,
        /// True when this is a restart of a runner that was already registered.
        restarted: bool,
    },
    /// The runner process is gone (exited, killed, or unregistered).
    Gone {
        /// Runner id.
        id: String,
        /// True when it was removed for good (`DELETE`), false when it may come back.
        removed: bool,
    },
    /// The reaper moved the runner to a lifecycle state only it knows: `stopping` (its
    /// termination began), `detached` (tripped but never signalled), `restarting`,
    /// `gave_up` (`docs/design.md`, Runner lifecycle).
    Lifecycle {
        /// Runner id.
        id: String,
        /// The new state.
        lifecycle: RunnerLifecycle,
    },
    /// Span ends that stallwatch wrote itself (a runner stopped, crashed, exited or found
    /// orphaned): the ledger closes them at once, whoever wrote them, so no page shows a
    /// span running after its end is stored.
    SpansEnded {
        /// Runner id the spans belonged to.
        id: String,
        /// (trace id, span id) of each span whose end is now stored.
        spans: Vec<(TraceId, SpanId)>,
    },
}

/// Where a runner is in its life, on the board and in `/api/v1/runners` as `lifecycle`
/// (`docs/design.md`, Runner lifecycle).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunnerLifecycle {
    /// Registered; its first PONG is not in yet.
    Starting,
    /// Alive and watched (first PONG seen, or it has no heartbeat socket).
    #[default]
    Running,
    /// Exiting: it said goodbye on its heartbeat socket, or stallwatch is terminating it.
    /// Never tripped for the missing heartbeat; waits up to `[watchdog] stopping_timeout_ms`.
    Stopping,
    /// Its process is gone (exited, crashed, killed, or stopped by stallwatch).
    Exited,
    /// Gone and about to be started again under the restart policy.
    Restarting,
    /// Gone, and the restart policy's intensity limit refused another restart.
    GaveUp,
    /// Tripped but never signalled (attached without a start time): still running, not
    /// under stallwatch's control; its breaker recovers through HALF_OPEN as usual.
    Detached,
}

impl RunnerLifecycle {
    /// Every state, in the order above.
    pub const ALL: [RunnerLifecycle; 7] = [
        RunnerLifecycle::Starting,
        RunnerLifecycle::Running,
        RunnerLifecycle::Stopping,
        RunnerLifecycle::Exited,
        RunnerLifecycle::Restarting,
        RunnerLifecycle::GaveUp,
        RunnerLifecycle::Detached,
    ];

    /// `starting`, `running`, `stopping`, `exited`, `restarting`, `gave_up`, `detached`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RunnerLifecycle::Starting => "starting",
            RunnerLifecycle::Running => "running",
            RunnerLifecycle::Stopping => "stopping",
            RunnerLifecycle::Exited => "exited",
            RunnerLifecycle::Restarting => "restarting",
            RunnerLifecycle::GaveUp => "gave_up",
            RunnerLifecycle::Detached => "detached",
        }
    }

    /// True when the runner's process is (believed) alive.
    pub fn is_alive(&self) -> bool {
        matches!(
            self,
            RunnerLifecycle::Starting
                | RunnerLifecycle::Running
                | RunnerLifecycle::Stopping
                | RunnerLifecycle::Detached
        )
    }
}

/// Circuit breaker states (DESIGN, Fusion and breakers).
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

impl BreakerState {
    /// `CLOSED`, `OPEN` or `HALF_OPEN`.
    pub fn as_str(&self) -> &'static str {
        match self {
            BreakerState::Closed => "CLOSED",
            BreakerState::Open => "OPEN",
            BreakerState::HalfOpen => "HALF_OPEN",
        }
    }
}

/// One runner as the watchdog sees it, for the dashboard and admission.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunnerStatus {
    /// Runner id.
    pub id: String,
    /// Current pid, when known.
    pub pid: Option<u32>,
    /// Spawned by stallwatch or attached.
    pub spawned: bool,
    /// Where the runner is in its life (`starting`, `running`, `stopping`, `exited`,
    /// `restarting`, `gave_up`, `detached`).
    #[serde(default)]
    pub lifecycle: RunnerLifecycle,
    /// Breaker state.
    pub breaker: BreakerState,
    /// Current verdict: `healthy`, `suspect`, `tool_overrun`, `unresponsive`, `stalled`, ...
    pub verdict: String,
    /// Why the breaker is in its state (empty when CLOSED and healthy).
    pub reason: String,
    /// In OPEN/HALF_OPEN: ms until the next admission could succeed.
    pub retry_after_ms: Option<u64>,
    /// Heartbeat: `ok`, `lost`, `starting`, `not_configured`, or a named failure
    /// (`socket_missing`, `connection_refused`, `path_too_long`, `bad_answer`, `timeout`).
    pub heartbeat: String,
    /// Recent heartbeat round trips: (unix ms, µs), oldest first, bounded.
    pub heartbeat_rtt_us: Vec<(u64, u64)>,
    /// The worst open tool span (highest elapsed / SLA), if any.
    pub worst_span: Option<WorstSpan>,
}

/// The worst open tool span of a runner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorstSpan {
    /// Trace id.
    pub trace_id: TraceId,
    /// Span id.
    pub span_id: SpanId,
    /// Tool name.
    pub tool_name: String,
    /// Elapsed since first seen, ms (stallwatch's monotonic clock).
    pub elapsed_ms: u64,
    /// Effective SLA, ms.
    pub sla_ms: u64,
    /// True when refreshes stopped for longer than the staleness limit.
    pub stale: bool,
}

/// Every runner's status, by id. Published through a `watch` channel.
pub type RunnerBoard = Arc<BTreeMap<String, RunnerStatus>>;

/// An error answer of the control API: HTTP status, machine code, human message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ControlError {
    /// HTTP status to answer (400, 404, 409, 500, 503, ...).
    pub status: u16,
    /// Machine-readable code, e.g. `runner_exists`.
    pub code: String,
    /// Human message.
    pub message: String,
}

impl ControlError {
    /// Builds an error.
    pub fn new(status: u16, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
        }
    }
}

/// The answer of a control request: a JSON body for 200/201, or an error.
pub type ControlReply = Result<serde_json::Value, ControlError>;

/// A control API call, routed by `src/` to the reaper or the watchdog.
#[derive(Debug)]
pub enum ControlRequest {
    /// `POST /api/v1/runners`.
    RegisterRunner {
        /// The runner.
        spec: RunnerSpec,
        /// Answer.
        reply: oneshot::Sender<ControlReply>,
    },
    /// `DELETE /api/v1/runners/{id}`: answers when termination is done.
    DeleteRunner {
        /// Runner id.
        id: String,
        /// Answer (the termination steps and survivors).
        reply: oneshot::Sender<ControlReply>,
    },
    /// `POST /api/v1/runners/{id}/breaker/reset`.
    ResetBreaker {
        /// Runner id.
        id: String,
        /// Answer.
        reply: oneshot::Sender<ControlReply>,
    },
    /// `POST /api/v1/checkpoints`.
    CreateCheckpoint {
        /// Runner the checkpoint belongs to.
        runner_id: String,
        /// Workspace root.
        workspace: PathBuf,
        /// Answer (`{"id","path"}`).
        reply: oneshot::Sender<ControlReply>,
    },
    /// `POST /api/v1/checkpoints/{id}/commit`.
    CommitCheckpoint {
        /// Checkpoint (transaction) id.
        id: String,
        /// Answer.
        reply: oneshot::Sender<ControlReply>,
    },
    /// `POST /api/v1/checkpoints/{id}/rollback`.
    RollbackCheckpoint {
        /// Checkpoint (transaction) id.
        id: String,
        /// Answer.
        reply: oneshot::Sender<ControlReply>,
    },
    /// `POST /api/v1/shutdown`: the same ordered shutdown as SIGTERM.
    Shutdown,
}
