//! Storage errors, split by what an operator or a caller should conclude.

use std::path::PathBuf;

/// Errors of opening the database, control records and reads.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database file could not be opened or configured.
    #[error("cannot open database {path}: {source}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// The file was written by a newer stallwatch; refusing to touch it.
    #[error("database schema version {found} is newer than this binary supports ({supported}); upgrade stallwatch")]
    SchemaTooNew {
        /// `PRAGMA user_version` found in the file.
        found: i64,
        /// The newest version this binary knows.
        supported: i64,
    },
    /// The disk (or `max_db_bytes`) is full.
    #[error("storage full: {0}")]
    Full(String),
    /// Any other SQLite failure.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A stored payload could not be decoded (corruption or a bug).
    #[error("corrupt stored record: {0}")]
    Corrupt(String),
    /// The storage has been shut down.
    #[error("storage is shut down")]
    Closed,
    /// A blocking task panicked or was cancelled.
    #[error("storage task failed: {0}")]
    Task(String),
}

impl StorageError {
    /// True when the failure is SQLITE_FULL (disk or `max_page_count` reached).
    pub fn is_full(&self) -> bool {
        match self {
            StorageError::Full(_) => true,
            StorageError::Sqlite(e) => is_full_error(e),
            _ => false,
        }
    }
}

/// True when a rusqlite error is SQLITE_FULL.
pub(crate) fn is_full_error(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull
    )
}

/// Why a telemetry write was not committed. Each variant maps to one OTLP answer.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The write queue is full: retryable (gRPC `UNAVAILABLE` + RetryInfo, HTTP 503 +
    /// `Retry-After`).
    #[error("write queue full ({capacity} requests waiting)")]
    QueueFull {
        /// Queue capacity in requests.
        capacity: usize,
    },
    /// The disk is full, or telemetry reached its share of `max_db_bytes`: retryable.
    #[error("storage full: {0}")]
    Full(String),
    /// Storage is shutting down: retryable against the next instance.
    #[error("storage is shutting down")]
    Closed,
    /// The commit failed for another reason (logged with detail; not retryable).
    #[error("commit failed: {0}")]
    Failed(String),
}
