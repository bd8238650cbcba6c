//! stallwatch storage: the only crate that knows SQL.
//!
//! The record model and the cross-stage messages live in `stallwatch-vocabulary`; they are
//! re-exported here as [`model`], [`control`] and [`MetricsSource`] so older paths keep
//! working.
//!
//! One SQLite file (WAL). Telemetry (spans, logs, metric points) goes through one writer
//! thread that group-commits many export requests per transaction with
//! `synchronous=NORMAL`; an export is acknowledged only after its commit. Control records
//! (incidents, runners, the action ledger, the checkpoint journal, the webhook outbox, the
//! open-span ledger) go through `Storage::control` on their own connection with
//! `synchronous=FULL`. Reads use a small pool of read-only connections.
//!
//! Each domain keeps its tables and queries in its own module (`incidents.rs`,
//! `ledger.rs`, `runners.rs`, `checkpoints.rs`, `outbox.rs`, `telemetry/`); `schema.rs`
//! assembles their DDL into numbered migrations (`PRAGMA user_version`).

pub mod checkpoints;
pub mod config;
mod db;
pub mod error;
pub mod events;
pub mod failpoint;
pub mod forward;
mod group;
mod held;
pub mod hosts;
pub mod incidents;
pub mod ledger;
pub mod listen;
pub mod outbox;
pub mod runners;
mod schema;
pub mod telemetry;
mod vfs;

pub use stallwatch_vocabulary::{control, keys, labels, model, prometheus, MetricsSource};

pub use config::{RawStorageConfig, StorageConfig, Synchronous};
pub use db::Storage;
pub use error::{StorageError, Transient, WriteError};
pub use events::EventBus;
pub use held::{Held, MAX_HELD_RECORDS};
pub use incidents::IncidentQuery;
pub use schema::SCHEMA_VERSION;
