//! stallwatch reaper: the only crate that sends signals or touches a workspace.
//!
//! It spawns and attaches runners, stops them safely (identity proven before every signal,
//! SIGTERM to the group, grace period, SIGKILL, reap, escaped descendants, survivors, all in
//! an append-only action ledger), reaps zombies as a child subreaper, writes the missing
//! ends of the tool spans it stopped, commits and rolls back checkpoints with an intent
//! journal, and sweeps orphans left by a previous run (docs/design.md: Runners, Reaper,
//! Checkpoints, Orphan sweep). Raw process calls live in [`platform`] only.

//!
//! Process control is Linux code (`cfg(unix)`); the Windows build has its own [`Reaper`] in
//! `windows/` (spawned runners in Job Objects). Checkpoints are shared: the orchestration,
//! content rules and journal are the same, and only their filesystem seam has a Linux and a
//! Windows arm (`checkpoint/mod.rs`; docs/platforms.md, Windows).

pub mod checkpoint;
mod checkpoint_edge;
pub mod config;
#[cfg(unix)]
pub mod ends;
pub mod env;
pub mod error;
pub use stallwatch_storage::failpoint;
#[cfg(unix)]
pub mod forensics;
pub mod plan;
#[cfg(unix)]
pub mod platform;
#[cfg(unix)]
pub mod runner;
#[cfg(unix)]
mod service;
mod settle;
#[cfg(unix)]
mod shutdown;
pub mod spans;
pub mod stats;
#[cfg(unix)]
pub mod sweep;
#[cfg(unix)]
pub mod terminate;
#[cfg(windows)]
mod windows;

pub use config::{RawReaperConfig, ReaperConfig, ReaperConfigInput, RestartPolicy};
pub use error::ReaperError;
#[cfg(unix)]
pub use service::{allow_restart, Reaper, ReaperHandle};
pub use stats::ReaperStats;
#[cfg(unix)]
pub use terminate::TerminationReport;
#[cfg(windows)]
pub use windows::{platform, Reaper, ReaperHandle, UNSUPPORTED};
