//! Telemetry tables (spans, logs, metric points) and the group-commit writer thread.

use crate::config::StorageConfig;
use crate::error::StorageError;

/// DDL for the telemetry tables (part of migration 1).
pub(crate) const SCHEMA: &str = "";

/// The telemetry writer thread's handle.
pub(crate) struct TelemetryWriter {}

impl TelemetryWriter {
    /// Starts the writer thread on its own connection.
    pub(crate) fn start(_config: &StorageConfig) -> Result<Self, StorageError> {
        Ok(Self {})
    }
    /// Commits what is queued and stops the thread.
    pub(crate) async fn shutdown(&self) {}
}
