//! Storage configuration, `[storage]` in the TOML file: the raw shape
//! [`RawStorageConfig`] (serde, unknown keys refused by name) and the validated
//! [`StorageConfig`] it converts into with `TryFrom`. Each default is a named constant.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::StorageError;

/// Default bound of the telemetry write queue, in export requests.
pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;
/// Default retention by age: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default database size cap: 2 GiB.
pub const DEFAULT_MAX_DB_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Telemetry ingest stops this many bytes before `max_db_bytes`, so control records
/// always fit (docs/design.md, Durability levels): 16 MiB.
pub const CONTROL_RESERVE_BYTES: u64 = 16 * 1024 * 1024;
/// Smallest share of `max_db_bytes` kept for the write-ahead log (`-wal`): 4 MiB.
pub const MIN_WAL_BUDGET_BYTES: u64 = 4 * 1024 * 1024;
/// Largest share of `max_db_bytes` kept for the write-ahead log: 64 MiB.
pub const MAX_WAL_BUDGET_BYTES: u64 = 64 * 1024 * 1024;

/// The bytes of `max_db_bytes` kept for the write-ahead log: a sixteenth of the cap, at
/// least [`MIN_WAL_BUDGET_BYTES`] and at most [`MAX_WAL_BUDGET_BYTES`] (4 MiB at the
/// smallest cap, 64 MiB at the 2 GiB default). The cap bounds the database file plus its
/// `-wal` and `-shm` (docs/design.md, Durability levels): the file is limited to
/// `max_db_bytes` minus this, and the WAL is checkpointed and rewound before it passes
/// this (`journal_size_limit` truncates it back to it).
pub fn wal_budget_bytes(max_db_bytes: u64) -> u64 {
    (max_db_bytes / 16).clamp(MIN_WAL_BUDGET_BYTES, MAX_WAL_BUDGET_BYTES)
}

/// Bytes of the database file telemetry may fill: `max_db_bytes` minus the WAL's share
/// ([`wal_budget_bytes`]) and [`CONTROL_RESERVE_BYTES`]. Size retention deletes the oldest
/// telemetry from 85% of it down to 75% (`telemetry/retention.rs`).
pub fn telemetry_budget_bytes(max_db_bytes: u64) -> u64 {
    max_db_bytes
        .saturating_sub(wal_budget_bytes(max_db_bytes))
        .saturating_sub(CONTROL_RESERVE_BYTES)
}

/// Default SQLite `busy_timeout`: 5 s.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Default interval of the background retention pass: 60 s.
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(60);
/// Smallest `max_db_bytes` accepted: 64 MiB (room for the control reserve and a working set).
pub const MIN_MAX_DB_BYTES: u64 = 64 * 1024 * 1024;
/// Smallest `retention_interval_ms` accepted: 100 ms.
pub const MIN_RETENTION_INTERVAL_MS: u64 = 100;

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
    /// Size cap of the database file plus its `-wal` and `-shm`, bytes; telemetry gets
    /// [`telemetry_budget_bytes`] of it, the oldest going first.
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

/// Raw `[storage]` section as written in TOML; every field absent means its default.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStorageConfig {
    /// `off`, `normal` (default) or `full`: `synchronous` for telemetry commits.
    pub synchronous: Option<String>,
    /// Write queue bound, export requests; default [`DEFAULT_QUEUE_CAPACITY`].
    pub queue_capacity: Option<usize>,
    /// Retention by age, hours; default [`DEFAULT_RETENTION`] (168 h).
    pub retention_hours: Option<u64>,
    /// Database size cap, bytes, at least [`MIN_MAX_DB_BYTES`]; default
    /// [`DEFAULT_MAX_DB_BYTES`].
    pub max_db_bytes: Option<u64>,
    /// SQLite busy timeout, ms; default [`DEFAULT_BUSY_TIMEOUT`].
    pub busy_timeout_ms: Option<u64>,
    /// Interval of the retention pass, ms, at least [`MIN_RETENTION_INTERVAL_MS`]; default
    /// [`DEFAULT_RETENTION_INTERVAL`].
    pub retention_interval_ms: Option<u64>,
}

impl TryFrom<(RawStorageConfig, PathBuf)> for StorageConfig {
    type Error = StorageError;

    /// The validated config for a database at the given path.
    ///
    /// Errors: [`StorageError::Config`] naming the key: an unknown `synchronous` level, a
    /// zero `queue_capacity` or `retention_hours`, `max_db_bytes` below
    /// [`MIN_MAX_DB_BYTES`], `retention_interval_ms` below [`MIN_RETENTION_INTERVAL_MS`].
    fn try_from((raw, path): (RawStorageConfig, PathBuf)) -> Result<Self, Self::Error> {
        let bad = |m: String| Err(StorageError::Config(m));
        let mut c = StorageConfig::new(path);
        if let Some(s) = &raw.synchronous {
            c.telemetry_synchronous = match s.to_ascii_lowercase().as_str() {
                "off" => Synchronous::Off,
                "normal" => Synchronous::Normal,
                "full" => Synchronous::Full,
                other => {
                    return bad(format!(
                        "synchronous = {other:?}: expected \"off\", \"normal\" or \"full\""
                    ))
                }
            };
        }
        if let Some(q) = raw.queue_capacity {
            if q == 0 {
                return bad("queue_capacity must be at least 1".into());
            }
            c.queue_capacity = q;
        }
        if let Some(h) = raw.retention_hours {
            if h == 0 {
                return bad("retention_hours must be at least 1".into());
            }
            c.retention = Duration::from_secs(h.saturating_mul(3600));
        }
        if let Some(b) = raw.max_db_bytes {
            if b < MIN_MAX_DB_BYTES {
                return bad(format!(
                    "max_db_bytes must be at least {MIN_MAX_DB_BYTES} (64 MiB)"
                ));
            }
            c.max_db_bytes = b;
        }
        if let Some(ms) = raw.busy_timeout_ms {
            c.busy_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = raw.retention_interval_ms {
            if ms < MIN_RETENTION_INTERVAL_MS {
                return bad(format!(
                    "retention_interval_ms must be at least {MIN_RETENTION_INTERVAL_MS}"
                ));
            }
            c.retention_interval = Duration::from_millis(ms);
        }
        Ok(c)
    }
}
