//! stallwatch reaper: the only crate that sends signals or touches a workspace.
//!
//! It spawns and attaches runners, stops them safely (identity proven before every signal,
//! SIGTERM to the group, grace period, SIGKILL, reap, escaped descendants, survivors, all in
//! an append-only action ledger), reaps zombies as a child subreaper, writes the missing
//! ends of the tool spans it stopped, commits and rolls back checkpoints with an intent
//! journal, and sweeps orphans left by a previous run (docs/design.md: Runners, Reaper,
//! Checkpoints, Orphan sweep). Raw process calls live in [`platform`] only.

pub mod checkpoint;
mod checkpoint_edge;
pub mod config;
pub mod ends;
pub mod error;
pub mod failpoint;
pub mod forensics;
pub mod plan;
pub mod platform;
pub mod runner;
mod service;
mod shutdown;
pub mod spans;
pub mod stats;
pub mod sweep;
pub mod terminate;

pub use config::{RawReaperConfig, ReaperConfig, ReaperConfigInput, RestartPolicy};
pub use error::ReaperError;
pub use service::{allow_restart, Reaper, ReaperHandle};
pub use stats::ReaperStats;
pub use terminate::TerminationReport;
