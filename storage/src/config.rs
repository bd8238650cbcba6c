//! Validated storage configuration. Raw TOML/CLI input is converted into this by `src/`.

use std::path::PathBuf;
use std::time::Duration;

/// Default bound of the telemetry write queue, in export requests.
pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;
/// Default retention by age: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default database size cap: 2 GiB.
pub const DEFAULT_MAX_DB_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Telemetry ingest stops this many bytes before `max_db_bytes`, so control records
/// always fit (docs/design.md, Durability levels): 16 MiB.
pub const CONTROL_RESERVE_BYTES: u64 = 16 * 1024 * 1024;
/// Default SQLite `busy_timeout`: 5 s.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Default interval of the background retention pass: 60 s.
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(60);

/// SQLite `PRAGMA synchronous` level for telemetry commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// `OFF`: fastest; a crash of the OS can lose or corrupt recent commits.
    Off,
    /// `NORMAL` (default): in WAL mode survives a crash of stallwatch, not a power loss.
    #[default]
    Normal,
    /// `FULL`: survives a power loss.
    Full,
}

impl Synchronous {
    /// The pragma value.
    pub fn pragma(&self) -> &'static str {
        match self {
            Synchronous::Off => "OFF",
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// Storage configuration (`[storage]` in the TOML file).
#[derive(Clone, Debug)]
pub struct StorageConfig {
    /// The database file (`<data_dir>/stallwatch.db`).
    pub path: PathBuf,
    /// `synchronous` for telemetry commits; control records always use FULL.
    pub telemetry_synchronous: Synchronous,
    /// Bound of the write queue, in export requests.
    pub queue_capacity: usize,
    /// Retention by age.
    pub retention: Duration,
    /// Database size cap, bytes; telemetry stops [`CONTROL_RESERVE_BYTES`] before it.
    pub max_db_bytes: u64,
    /// SQLite `busy_timeout`.
    pub busy_timeout: Duration,
    /// How often the background retention pass runs.
    pub retention_interval: Duration,
}

impl StorageConfig {
    /// Defaults for a database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            telemetry_synchronous: Synchronous::Normal,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            retention: DEFAULT_RETENTION,
            max_db_bytes: DEFAULT_MAX_DB_BYTES,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            retention_interval: DEFAULT_RETENTION_INTERVAL,
        }
    }
}
