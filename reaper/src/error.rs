//! The reaper's error type: what its start-up and operations can return.

use stallwatch_storage::StorageError;

/// Errors of the reaper.
#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    /// The `[reaper]` table or a `[[runner]]` is invalid; fix the config file.
    #[error("invalid reaper config: {0}")]
    Config(String),
    /// The kernel refused a process call (subreaper flag, pidfd, spawn).
    #[error("process call failed: {0}")]
    Os(#[from] std::io::Error),
    /// The database refused a control record.
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// A checkpoint path, file or state is not acceptable.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
}
