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
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::labels::HeartbeatLabel;
use crate::model::{LogBatch, SpanId, TraceBatch, TraceId};

/// Default heartbeat timeout: no PONG for 5000 ms since the last one means *lost*
/// (docs/design.md, Defaults). The watchdog's default for `[watchdog] heartbeat_timeout_ms`,
/// and what the reaper tells spawned runners (`STALLWATCH_HEARTBEAT_TIMEOUT_MS`) when it was
/// given no other.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(5000);

/// `retry_after_ms` of an admission that only a person (a breaker reset) or a new runner (a
/// registration, a restart) can change: a breaker held OPEN with no probe in sight, or a
/// runner that exited and is not restarted. 1 h, so a client that honours `Retry-After`
/// does not poll every cooldown for it.
pub const HELD_RETRY_AFTER_MS: u64 = 3_600_000;

/// `retry_after_ms` of an admission refused while a runner is stopping or restarting: a
/// moment, after which it is running again or known to be gone.
pub const LIFECYCLE_RETRY_AFTER_MS: u64 = 1_000;

/// Runner ids match `^[a-z0-9][a-z0-9._-]{0,62}$` (docs/design.md, Interfaces: Runners).
pub fn valid_runner_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b[1..].iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
}

/// How long a spawn keeps retrying, every [`TEXT_BUSY_RETRY_EVERY`], while `execve` fails
/// with `ETXTBSY` ("text file busy"): the binary is still open for writing somewhere. That
/// is brief and common right after a binary was written, built or updated: any thread of
/// the spawning process that forks while the writer's descriptor is open hands a copy of
/// it to that child until the child's `exec` closes it. Every spawn of an external binary
/// follows it: the sidecar by the Rust client, runners by the reaper and by
/// `stallwatch mcp wrap` (docs/design.md, Runners).
pub const TEXT_BUSY_RETRY: Duration = Duration::from_millis(1_000);
/// See [`TEXT_BUSY_RETRY`].
pub const TEXT_BUSY_RETRY_EVERY: Duration = Duration::from_millis(20);

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
    /// A trace export, every span whole. The collector sends [`ObservedData::Traces`];
    /// this whole-batch form is what the watchdog's tests and benches send (the watchdog
    /// reads both the same way).
    Spans(Arc<TraceBatch>),
    /// A trace export as the collector sends it: the spans the watchdog reads whole
    /// ([`crate::model::Span::watched_whole`]: open spans and Logfire pending twins, with
    /// their resources and scopes) and the (trace id, span id) of every other span, which
    /// ended; read in that order. An ended span costs 24 bytes here instead of its
    /// attributes, which bounds a large export's memory (issue 17 #14).
    Traces {
        /// Open spans and pending twins, in request order.
        open: Arc<TraceBatch>,
        /// The ended spans' ids, in request order.
        ended: Arc<Vec<(TraceId, SpanId)>>,
    },
    /// A log export (the open-span heartbeat shape 2 arrives as logs).
    Logs(Arc<LogBatch>),
}

/// How a runner is started or found (docs/design.md, Interfaces: Runners). Config `[[runner]]` and
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

    /// A runner someone else started, watched by `pid`; give `start_time_ticks` (field 22
    /// of `/proc/PID/stat`) or it is watched but never signalled.
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
        /// The process that is gone, when known: only its spans (and those of no known
        /// process) close with it, not those a new process of the same id already sent.
        pid: Option<u32>,
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
    /// under stallwatch's control; its breaker recovers through HALF_OPEN as usual when it
    /// has a heartbeat socket (without one it is held OPEN until registered again or reset).
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

/// Circuit breaker states (docs/design.md, Fusion and breakers).
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
    /// Heartbeat: `ok`, `lost`, `starting`, `not_configured`, `unknown`, `not_running`, or
    /// a named failure (`socket_missing`, `connection_refused`, `path_too_long`,
    /// `bad_answer`, `timeout`, ...): see [`HeartbeatLabel`].
    pub heartbeat: HeartbeatLabel,
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

/// Why the reaper refused to register a runner (`POST /api/v1/runners`, config runners).
/// The wire mapping (HTTP status, error code) is in `dashboards/src/error.rs`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RegisterError {
    /// The spec is invalid (heartbeat socket, env key, cwd, pid 1/2, stallwatch itself, a
    /// kernel thread, or no spawn/attach section); the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// A runner with this id is registered and alive; delete it first.
    #[error("runner {0} is registered and alive")]
    IdInUse(String),
    /// The process to attach is not alive (or its start time differs: pid reused).
    #[error("{0}")]
    Gone(String),
    /// The program could not be started (`execve` failed); the message names it.
    #[error("{0}")]
    SpawnFailed(String),
    /// `[reaper] max_runners` live runners are registered already (the message names the
    /// limit).
    #[error("{0}")]
    TooMany(String),
    /// The heartbeat socket folder could not be prepared under the data folder.
    #[error("{0}")]
    SocketDir(String),
    /// The runner's workspace checkpoint could not be opened.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Something inside stallwatch failed (a poisoned lock, an OS call); see its log.
    #[error("{0}")]
    Internal(String),
    /// This platform's build cannot do what was asked (runner control on Windows today;
    /// docs/platforms.md); the message names what is missing.
    #[error("{0}")]
    Unsupported(String),
}

/// Why a request about one runner failed (`DELETE /api/v1/runners/{id}`, breaker reset).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RunnerError {
    /// No runner with this id is registered (the message names it).
    #[error("{0}")]
    NotFound(String),
}

/// Why a checkpoint request failed (`POST /api/v1/checkpoints[/{id}/commit|rollback]`;
/// `docs/design.md`, Checkpoints). Messages name the path and what is wrong with it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CheckpointError {
    /// The workspace is not an absolute, existing, plain project folder (root, the data
    /// folder, a file, missing).
    #[error("{0}")]
    InvalidWorkspace(String),
    /// A path would leave the workspace (`..`, a symlink out, a symlinked staging folder).
    #[error("{0}")]
    PathEscape(String),
    /// A staged entry is not a regular file (a socket, a FIFO, a device).
    #[error("{0} is not a regular file")]
    NotAFile(PathBuf),
    /// A staged file failed its format check (empty, bad JSON/CSV, no HDF5 signature).
    #[error("{}: {why}", path.display())]
    Validation {
        /// The file, relative to the staging folder.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The workspace changed under the commit (a folder appeared at a destination, ...):
    /// the commit was undone from its journal and the checkpoint is open again.
    #[error("{0}")]
    Conflict(String),
    /// No checkpoint with this id.
    #[error("{0}")]
    NotFound(String),
    /// The checkpoint is not `open` (already committed or rolled back).
    #[error("{0}")]
    NotOpen(String),
    /// A roll-forward found the checkpoint not `committing` (nothing to finish).
    #[error("{0}")]
    NotCommitting(String),
    /// The runner the checkpoint would belong to is not registered.
    #[error("{0}")]
    RunnerNotFound(String),
    /// A file system call failed (the message names the path); transient, worth a retry.
    #[error("{0}")]
    Io(String),
    /// Something inside stallwatch failed (a journal write, a worker thread); see its log.
    #[error("{0}")]
    Internal(String),
}

/// The answer of a successful registration: a spawned or an attached runner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Registered {
    /// Started by stallwatch.
    Spawned(SpawnedRunner),
    /// Watched by pid.
    Attached(AttachedRunner),
}

/// A runner stallwatch started: `{"id","spawned":true,"pid","start_time_ticks",
/// "instance_id","heartbeat_socket","socket_fallback","checkpoint"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpawnedRunner {
    /// Runner id.
    pub id: String,
    /// Always true here.
    pub spawned: bool,
    /// Its pid (also its process group id).
    pub pid: u32,
    /// Field 22 of `/proc/PID/stat`, clock ticks since boot.
    pub start_time_ticks: u64,
    /// A fresh UUID per start (the `service.instance.id` of its output logs).
    pub instance_id: String,
    /// The heartbeat socket stallwatch pings.
    pub heartbeat_socket: PathBuf,
    /// Why the socket is not where it was asked for (path too long), if it is not.
    pub socket_fallback: Option<String>,
    /// The checkpoint opened for its workspace, when the spec names one.
    pub checkpoint: Option<CheckpointCreated>,
}

/// A runner watched by pid: `{"id","spawned":false,"pid","start_time_ticks",
/// "signalled_on_trip","instance_id"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttachedRunner {
    /// Runner id.
    pub id: String,
    /// Always false here.
    pub spawned: bool,
    /// Its pid.
    pub pid: u32,
    /// Its start time when given (the proof of identity signals need).
    pub start_time_ticks: Option<u64>,
    /// True when a trip may signal it (a start time was given and matched).
    pub signalled_on_trip: bool,
    /// A fresh UUID, or the earlier one when the orphan sweep re-adopted it.
    pub instance_id: String,
}

/// The answer of `DELETE /api/v1/runners/{id}`: `{"id","removed":true,"termination",
/// "steps","survivors"}`. The termination report is carried as its serialized JSON (its
/// types belong to the reaper's termination module).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunnerDeleted {
    /// Runner id.
    pub id: String,
    /// Always true: the runner is unregistered.
    pub removed: bool,
    /// The termination report, when a termination ran (null for a runner already gone).
    pub termination: Option<serde_json::Value>,
    /// The report's steps (empty without a termination).
    pub steps: Vec<serde_json::Value>,
    /// Recorded processes still alive at the end (empty without a termination).
    pub survivors: Vec<serde_json::Value>,
}

/// The answer of `POST /api/v1/runners/{id}/breaker/reset`: `{"id","state":"CLOSED"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BreakerReset {
    /// Runner id.
    pub id: String,
    /// The breaker's state afterwards.
    pub state: BreakerState,
}

/// The answer of `POST /api/v1/checkpoints`: `{"id","path"}`. The tool writes into `path`
/// (`<workspace>/.workbench/checkpoints/<id>/`), never into the workspace directly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointCreated {
    /// Checkpoint (transaction) id.
    pub id: String,
    /// The staging folder.
    pub path: PathBuf,
}

/// The answer of `POST /api/v1/checkpoints/{id}/commit|rollback`: `{"id","state"}` and, for
/// a commit, `"files"` (how many files moved into the workspace).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOutcome {
    /// Checkpoint id.
    pub id: String,
    /// `committed` or `rolled_back`.
    pub state: String,
    /// Files moved into the workspace (commits only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
}

impl CheckpointOutcome {
    /// A commit that moved `files` files.
    pub fn committed(id: impl Into<String>, files: u64) -> Self {
        Self {
            id: id.into(),
            state: "committed".into(),
            files: Some(files),
        }
    }

    /// A rollback.
    pub fn rolled_back(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            state: "rolled_back".into(),
            files: None,
        }
    }
}

/// Where a control request's answer goes.
pub type Reply<T, E> = oneshot::Sender<Result<T, E>>;

/// A control API call, routed by `src/` to the reaper or the watchdog.
#[derive(Debug)]
pub enum ControlRequest {
    /// `POST /api/v1/runners`.
    RegisterRunner {
        /// The runner.
        spec: RunnerSpec,
        /// Answer.
        reply: Reply<Registered, RegisterError>,
    },
    /// `DELETE /api/v1/runners/{id}`: answers when termination is done.
    DeleteRunner {
        /// Runner id.
        id: String,
        /// Answer (the termination steps and survivors).
        reply: Reply<RunnerDeleted, RunnerError>,
    },
    /// `POST /api/v1/runners/{id}/breaker/reset`.
    ResetBreaker {
        /// Runner id.
        id: String,
        /// Answer.
        reply: Reply<BreakerReset, RunnerError>,
    },
    /// `POST /api/v1/checkpoints`.
    CreateCheckpoint {
        /// Runner the checkpoint belongs to.
        runner_id: String,
        /// Workspace root.
        workspace: PathBuf,
        /// Answer (`{"id","path"}`).
        reply: Reply<CheckpointCreated, CheckpointError>,
    },
    /// `POST /api/v1/checkpoints/{id}/commit`.
    CommitCheckpoint {
        /// Checkpoint (transaction) id.
        id: String,
        /// Answer.
        reply: Reply<CheckpointOutcome, CheckpointError>,
    },
    /// `POST /api/v1/checkpoints/{id}/rollback`.
    RollbackCheckpoint {
        /// Checkpoint (transaction) id.
        id: String,
        /// Answer.
        reply: Reply<CheckpointOutcome, CheckpointError>,
    },
    /// `POST /api/v1/shutdown`: the same ordered shutdown as SIGTERM.
    Shutdown,
}
