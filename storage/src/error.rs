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
    /// `PRAGMA user_version` is a value no stallwatch ever wrote (negative, or the file is
    /// another program's database): refusing to touch it.
    #[error("database {path} has a schema from another version or program (user_version {found}; this binary knows 0..={supported}); move the file away or point --data-dir elsewhere")]
    SchemaForeign {
        /// The database file.
        path: PathBuf,
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
    /// A `[storage]` value is out of range; the message names the key.
    #[error("[storage] {0}")]
    Config(String),
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

    /// The transient condition behind this error, if it is one that may pass by itself
    /// (a lock held by another process, a full disk, an I/O error, the file moved away):
    /// callers answer retryable and hold control records in memory (docs/design.md,
    /// Durability levels).
    pub fn transient(&self) -> Option<Transient> {
        match self {
            StorageError::Full(_) => Some(Transient::Full),
            StorageError::Sqlite(e) | StorageError::Open { source: e, .. } => transient_kind(e),
            _ => None,
        }
    }
}

/// A storage condition that may pass by itself, each one label value of
/// `stallwatch_storage_writes_refused_total{reason}` and of `/readyz`'s `degraded`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transient {
    /// `SQLITE_BUSY`: another connection (a DB browser, a backup, `sqlite3`) holds the
    /// write lock past the busy timeout.
    Busy,
    /// `SQLITE_LOCKED`: a conflicting lock inside a shared-cache or the same connection.
    Locked,
    /// `SQLITE_IOERR` (and `SQLITE_CANTOPEN` mid-run): an I/O error that may pass.
    Io,
    /// `SQLITE_FULL`: the disk or `max_page_count` is full.
    Full,
    /// `SQLITE_READONLY_DBMOVED` (or the data folder's inode changed): the database file was
    /// deleted or replaced under us; writing on would acknowledge into an unlinked file.
    Gone,
}

impl Transient {
    /// The label value (`busy`, `locked`, `io`, `full`, `gone`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Transient::Busy => "busy",
            Transient::Locked => "locked",
            Transient::Io => "io",
            Transient::Full => "full",
            Transient::Gone => "gone",
        }
    }
}

impl std::fmt::Display for Transient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `SQLITE_READONLY_DBMOVED` (SQLite result codes, "extended result codes").
const SQLITE_READONLY_DBMOVED: std::os::raw::c_int = 1032;

/// Classifies a rusqlite error as a transient condition (SQLite result codes page), or
/// `None` when it is not one (a constraint, a bug, corruption).
pub(crate) fn transient_kind(e: &rusqlite::Error) -> Option<Transient> {
    use rusqlite::ErrorCode as C;
    match e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            C::DatabaseBusy => Some(Transient::Busy),
            C::DatabaseLocked => Some(Transient::Locked),
            C::SystemIoFailure | C::CannotOpen => Some(Transient::Io),
            C::DiskFull => Some(Transient::Full),
            C::ReadOnly if f.extended_code == SQLITE_READONLY_DBMOVED => Some(Transient::Gone),
            _ => None,
        },
        _ => None,
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
    /// The commit needed more pages than telemetry's share of `max_db_bytes` had free at
    /// that moment, and retention has already deleted the oldest to make room: retryable
    /// at once (gRPC `UNAVAILABLE` + RetryInfo 1 s, HTTP 503 + `Retry-After: 1`), unlike
    /// [`WriteError::Full`], which lasts until retention or the disk catches up.
    #[error("storage at its size cap for a moment: {0}")]
    AtCap(String),
    /// Storage is shutting down: retryable against the next instance.
    #[error("storage is shutting down")]
    Closed,
    /// A transient condition other than a full disk (another process holds the lock, an
    /// I/O error, the file was deleted): retryable, like [`WriteError::Full`].
    #[error("storage unavailable ({kind}): {detail}")]
    Unavailable {
        /// Which condition.
        kind: Transient,
        /// The SQLite message.
        detail: String,
    },
    /// The commit failed for another reason (logged with detail; not retryable).
    #[error("commit failed: {0}")]
    Failed(String),
}
