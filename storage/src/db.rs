//! The [`Storage`] handle: opening the file, pragmas, migrations, and the two doors every
//! domain module uses: [`Storage::control`] (a `synchronous=FULL` write transaction) and
//! [`Storage::read`] (a pooled read-only connection). Telemetry has its own writer thread
//! in `telemetry/`.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use crate::config::StorageConfig;
use crate::error::StorageError;
use crate::schema;
use crate::telemetry::TelemetryWriter;

/// How long [`Storage::shutdown`] keeps retrying held control records.
pub const SHUTDOWN_HELD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Read connections kept open for the read API.
const READ_POOL: usize = 4;

/// A cheap, cloneable handle to the database. Dropping the last clone does not stop the
/// writer thread; call [`Storage::shutdown`] for an ordered flush.
#[derive(Clone)]
pub struct Storage {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: StorageConfig,
    pub(crate) control: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    pub(crate) telemetry: TelemetryWriter,
    pub(crate) held: crate::held::HeldQueue,
}

/// Opens a connection with the pragmas every stallwatch connection uses.
pub(crate) fn open_connection(
    config: &StorageConfig,
    flags: OpenFlags,
) -> Result<Connection, StorageError> {
    let conn =
        Connection::open_with_flags(&config.path, flags).map_err(|source| StorageError::Open {
            path: config.path.clone(),
            source,
        })?;
    conn.busy_timeout(config.busy_timeout)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "cache_size", -16_000i64)?; // 16 MB per connection
                                                         // Checkpoints run on the telemetry checkpoint thread, never inside a commit.
    conn.pragma_update(None, "wal_autocheckpoint", 0i64)?;
    Ok(conn)
}

impl Storage {
    /// Opens (creating if needed) the database at `config.path`, migrates it, and starts the
    /// telemetry writer thread.
    ///
    /// Errors: [`StorageError::Open`] when the file cannot be opened,
    /// [`StorageError::SchemaTooNew`] when a newer stallwatch wrote it,
    /// [`StorageError::SchemaForeign`] when something else did (`user_version` negative, or
    /// 0 with tables in the file).
    pub fn open(config: StorageConfig) -> Result<Self, StorageError> {
        let rw = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut control = open_connection(&config, rw)?;
        schema::check(&control)?;
        // auto_vacuum and page_size must be set before the first table exists; WAL is
        // persistent. 16 KiB pages: telemetry payloads are ~200 KB blobs per export request,
        // and 4 KiB pages cost 4x the WAL frames and checkpoint writes (telemetry/ bench).
        control.pragma_update(None, "page_size", 16384i64)?;
        control.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
        control.pragma_update(None, "journal_mode", "WAL")?;
        schema::migrate(&mut control)?;
        control.pragma_update(None, "synchronous", "FULL")?;
        let page_size: i64 = control.pragma_query_value(None, "page_size", |r| r.get(0))?;
        let max_pages = (config.max_db_bytes / page_size.max(512) as u64).max(64);
        control.pragma_update(None, "max_page_count", max_pages as i64)?;

        let ro = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut readers = Vec::with_capacity(READ_POOL);
        for _ in 0..READ_POOL {
            readers.push(open_connection(&config, ro)?);
        }
        let telemetry = TelemetryWriter::start(&config)?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                control: Mutex::new(control),
                readers: Mutex::new(readers),
                telemetry,
                held: Default::default(),
            }),
        })
    }

    /// The configuration this storage was opened with.
    pub fn config(&self) -> &StorageConfig {
        &self.inner.config
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.inner.config.path
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the control connection
    /// (`synchronous=FULL`) and commits when it returns `Ok`. Blocking; see
    /// [`Storage::control`] for async callers.
    pub(crate) fn control_blocking<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let mut conn = self
            .inner
            .control
            .lock()
            .map_err(|_| StorageError::Task("control connection poisoned".into()))?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        self.inner.telemetry.note_commit();
        Ok(out)
    }

    /// Async form of [`Storage::control_blocking`], run on tokio's blocking pool.
    pub(crate) async fn control<T, F>(&self, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, StorageError> + Send + 'static,
    {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.control_blocking(f))
            .await
            .map_err(|e| StorageError::Task(e.to_string()))?
    }

    /// Runs `f` on a pooled read-only connection. Blocking.
    pub(crate) fn read_blocking<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let conn = {
            let mut pool = self
                .inner
                .readers
                .lock()
                .map_err(|_| StorageError::Task("reader pool poisoned".into()))?;
            pool.pop()
        };
        let conn = match conn {
            Some(c) => c,
            None => open_connection(
                &self.inner.config,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?,
        };
        let out = f(&conn);
        if let Ok(mut pool) = self.inner.readers.lock() {
            if pool.len() < READ_POOL {
                pool.push(conn);
            }
        }
        out
    }

    /// Async form of [`Storage::read_blocking`], run on tokio's blocking pool.
    pub(crate) async fn read<T, F>(&self, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StorageError> + Send + 'static,
    {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.read_blocking(f))
            .await
            .map_err(|e| StorageError::Task(e.to_string()))?
    }

    /// Runs `PRAGMA integrity_check` and answers its rows (`["ok"]` when healthy).
    pub async fn integrity_check(&self) -> Result<Vec<String>, StorageError> {
        self.read(|c| {
            let mut st = c.prepare("PRAGMA integrity_check")?;
            let rows = st.query_map([], |r| r.get::<_, String>(0))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Ordered stop: control records held in memory are written (retried for up to
    /// `SHUTDOWN_HELD_WAIT`, then logged one by one), the telemetry writer commits what is
    /// queued, then stops. Control and read calls keep working until the last handle is
    /// dropped.
    pub async fn shutdown(&self) {
        self.flush_held_until(std::time::Instant::now() + SHUTDOWN_HELD_WAIT)
            .await;
        self.inner.telemetry.shutdown().await;
    }
}
