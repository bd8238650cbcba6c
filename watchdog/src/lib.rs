//! stallwatch's watchdog: decides, never acts.
//!
//! It keeps the open-span ledger (docs/design.md, "Open spans"), resolves each tool span's SLA,
//! pings every runner's heartbeat socket, fuses those signals into a verdict (docs/design.md,
//! "Fusion and breakers"), and drives one circuit breaker per runner. A trip is published
//! as an incident and then sent to the reaper as a [`stallwatch_storage::control::Trip`];
//! the watchdog itself never sends a signal and never touches a workspace file. The pure
//! cores ([`ledger`], [`sla`], [`fusion`], [`breaker`], the heartbeat tracker) take `now`
//! and do no I/O, and so does each runner's `step` (`runner.rs`); [`worker`] only moves
//! messages around them.

pub mod breaker;
pub mod clock;
pub mod config;
mod effects;
pub mod error;
pub mod fusion;
pub mod glob;
mod handle;
pub mod heartbeat;
pub mod ledger;
mod runner;
mod schedule;
pub mod shapes;
pub mod sla;
pub mod stats;
pub mod worker;

pub use breaker::{Admission, Breaker, Transition};
pub use config::{RawSlaRule, RawWatchdogConfig, SlaPolicy, SlaRule, WatchdogConfig};
pub use error::WatchdogError;
pub use fusion::{fuse, Fused, SpanFacts, Verdict};
pub use heartbeat::{HeartbeatFailure, HeartbeatState};
pub use stats::WatchdogStats;
pub use worker::{Watchdog, WatchdogHandle};
