//! `stallwatch-client`: the Rust client of the stallwatch sidecar, for the workbench's Tauri
//! backend.
//!
//! - [`Sidecar`] starts `stallwatch serve` on loopback port 0, reads its `ready` line
//!   ([`ReadyLine`]) and the token file, and stops it in order.
//! - [`Client`] offers typed calls: register and attach runners, ask admission before
//!   dispatching an MCP request, open, commit and roll back checkpoints, read runners,
//!   incidents and traces, and follow the live event stream ([`EventStream`]).
//!
//! Request types are the server's own, from `stallwatch-vocabulary`, which knows no SQL (no
//! SQLite in the app). See `examples/tauri_commands.rs`.

mod client;
mod config;
mod error;
mod process;
mod ready;
mod sidecar;
mod sse;
mod types;

pub use client::{read_token, Client, DEFAULT_EVENTS_RETRY, MAX_EVENTS_RETRY, TOKEN_HEX_LEN};
pub use config::{
    ClientOptions, SidecarOptions, DEFAULT_CONNECT_TIMEOUT, DEFAULT_READY_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_SHUTDOWN_DEADLINE,
};
pub use error::{error_from_answer, Error, Result};
pub use process::process_start_time_ticks;
pub use ready::ReadyLine;
pub use sidecar::{spawn_when_not_busy, Sidecar, LOOPBACK_ANY_PORT, STDERR_TAIL_LINES};
pub use sse::{Event, EventFollower, EventStream, Frame, SseParser};
pub use types::{
    valid_runner_id, Admission, AttachSpec, BreakerState, Checkpoint, CheckpointOutcome,
    HeartbeatRtt, Incident, IncidentQuery, Page, Runner, RunnerSpec, SpawnSpec, WorstSpan,
};
