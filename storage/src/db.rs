//! The [`Storage`] handle: opening the file, pragmas, migrations, and the two doors every
//! domain module uses: [`Storage::control`] (a `synchronous=FULL` write transaction) and
//! [`Storage::read`] (a pooled read-only connection). Telemetry has its own writer thread
//! in `telemetry/`.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, Transaction};

use crate::config::StorageConfig;
use crate::error::StorageError;
use crate::schema;
use crate::telemetry::TelemetryWriter;

/// How long [`Storage::shutdown`] keeps retrying held control records.
pub const SHUTDOWN_HELD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Read connections kept open for the read API: opened once at start, never more (a read
/// waits for a free one instead of opening its own: with thousands of runners registering,
/// extra connections each cost an open, the pragmas and a schema read).
const READ_POOL: usize = 4;

/// A read or control closure's answer with its type erased ([`Storage::read`],
/// [`Storage::control`]).
type Answer = Box<dyn std::any::Any + Send>;
/// A type-erased control closure.
type ControlFn = Box<dyn FnOnce(&Transaction<'_>) -> Result<Answer, StorageError> + Send>;
/// A type-erased read closure.
type ReadFn = Box<dyn FnOnce(&Connection) -> Result<Answer, StorageError> + Send>;

/// `f` with its answer's type erased.
fn erase_control<T, F>(f: F) -> ControlFn
where
    T: Send + 'static,
    F: FnOnce(&Transaction<'_>) -> Result<T, StorageError> + Send + 'static,
{
    Box::new(move |tx: &Transaction<'_>| f(tx).map(|t| Box::new(t) as Answer))
}

/// The answer of an erased closure, as the type its caller gave.
fn downcast<T: 'static>(a: Answer) -> Result<T, StorageError> {
    a.downcast::<T>()
        .map(|t| *t)
        .map_err(|_| StorageError::Task("a closure answered another type".into()))
}

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
    /// Signalled when a read connection goes back to `readers`.
    reader_free: Condvar,
    pub(crate) telemetry: TelemetryWriter,
    pub(crate) held: crate::held::HeldQueue,
    /// Control closures waiting for their group commit (`group.rs`).
    pub(crate) pending: crate::group::Pending,
    /// Why telemetry is refused outright (a disk found full at start), if it is.
    pub(crate) ingest_paused: Mutex<Option<String>>,
}

/// Opens a connection with the pragmas every stallwatch connection uses.
pub(crate) fn open_connection(
    config: &StorageConfig,
    flags: OpenFlags,
) -> Result<Connection, StorageError> {
    // Through the VFS that writes a commit's WAL frames in one call (`vfs.rs`); the
    // default VFS if it could not be registered (the same files, written frame by frame).
    let opened = match crate::vfs::name() {
        Ok(vfs) => Connection::open_with_flags_and_vfs(&config.path, flags, vfs),
        Err(e) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(
                || tracing::warn!(error = %e, "SQLite VFS not registered; using the default"),
            );
            Connection::open_with_flags(&config.path, flags)
        }
    };
    let conn = opened.map_err(|source| StorageError::Open {
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

/// Suffixes of the files SQLite keeps beside the database in WAL mode.
#[cfg(unix)]
const SIDE_FILES: [&str; 3] = ["", "-wal", "-shm"];

/// Mode of the database and its side files: owner only, like the token (they hold every
/// span, log and incident). Unix only: on Windows the data folder's user-only ACL covers
/// them (docs/platforms.md).
#[cfg(unix)]
pub const DB_FILE_MODE: u32 = 0o600;

/// Creates the database file with mode 0600 when it does not exist (SQLite creates it 0644
/// under the usual umask, and gives `-wal` and `-shm` the database's mode), and sets 0600
/// on the database, `-wal` and `-shm` when they exist with a wider mode. A symlink is never
/// followed or chmodded here (the data folder is 0700 and ours).
///
/// It never opens a file that exists: the mode is read with `lstat` and set with `chmod`
/// by path, and the database is created with `O_CREAT | O_EXCL`. Why: this runs again after
/// SQLite's connections are open, and on Unix closing *any* descriptor of a file drops every
/// POSIX lock the process holds on it (SQLite, "How To Corrupt An SQLite Database File",
/// 2.2). Opening and closing the files here did that: the next outside connection (a
/// user's `sqlite3`, a backup tool) believed it was alone, truncated the shared memory
/// (stallwatch died of SIGBUS) or checkpointed and deleted the WAL under the writer
/// (acknowledged exports lost after a crash).
#[cfg(unix)]
fn restrict_file_modes(db: &Path) -> Result<(), StorageError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    let open_err = |path: &Path, e: std::io::Error| StorageError::Open {
        path: path.to_path_buf(),
        source: rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!("cannot set mode 0600 on {}: {e}", path.display())),
        ),
    };
    for suffix in SIDE_FILES {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let path = std::path::PathBuf::from(name);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => {
                if meta.permissions().mode() & 0o077 != 0 {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(DB_FILE_MODE))
                        .map_err(|e| open_err(&path, e))?;
                }
            }
            // A symlink or something else: SQLite's own open reports it.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && suffix.is_empty() => {
                // Created here, so it never exists with a wider mode. An error is left to
                // SQLite's own open to report (a read-only folder), and a file that appeared
                // meanwhile (`AlreadyExists`) is chmodded at the second call.
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(DB_FILE_MODE)
                    .open(&path);
            }
            Err(_) => {}
        }
    }
    Ok(())
}

/// Windows: the files inherit the data folder's user-only DACL (docs/platforms.md).
#[cfg(windows)]
fn restrict_file_modes(_db: &Path) -> Result<(), StorageError> {
    Ok(())
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
        restrict_file_modes(&config.path)?;
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
        // The cap bounds the file plus its WAL: the file gets the cap minus the WAL's share.
        let file_cap = config
            .max_db_bytes
            .saturating_sub(crate::config::wal_budget_bytes(config.max_db_bytes));
        let max_pages = (file_cap / page_size.max(512) as u64).max(64);
        control.pragma_update(None, "max_page_count", max_pages as i64)?;

        let ro = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut readers = Vec::with_capacity(READ_POOL);
        for _ in 0..READ_POOL {
            readers.push(open_connection(&config, ro)?);
        }
        let telemetry = TelemetryWriter::start(&config)?;
        // The WAL and shared-memory files exist now (SQLite gives new ones the database's
        // mode; older ones may predate it).
        restrict_file_modes(&config.path)?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                control: Mutex::new(control),
                readers: Mutex::new(readers),
                reader_free: Condvar::new(),
                telemetry,
                held: Default::default(),
                pending: Default::default(),
                ingest_paused: Mutex::new(None),
            }),
        })
    }

    /// The configuration this storage was opened with.
    pub fn config(&self) -> &StorageConfig {
        &self.inner.config
    }

    /// Refuses every telemetry write with [`crate::WriteError::Full`] (`reason` given) until
    /// called with `None`: the degraded start on a full disk (docs/design.md, Durability
    /// levels), where the space stallwatch freed is kept for control records. Control
    /// records are unaffected.
    pub fn pause_ingest(&self, reason: Option<String>) {
        if let Ok(mut p) = self.inner.ingest_paused.lock() {
            *p = reason;
        }
    }

    /// Why telemetry is refused outright, if it is ([`Storage::pause_ingest`]).
    pub fn ingest_paused(&self) -> Option<String> {
        self.inner.ingest_paused.lock().ok().and_then(|p| p.clone())
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.inner.config.path
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the control connection
    /// (`synchronous=FULL`) and answers once that transaction committed. Concurrent callers
    /// share one commit (group commit, `group.rs`), each under its own savepoint: an `Err`
    /// from `f` rolls back only `f`'s writes. `wait` is how long to wait for a locked
    /// database instead of `busy_timeout`. Blocking; see [`Storage::control`] for async
    /// callers.
    pub(crate) fn control_waiting<T, F>(&self, wait: Duration, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, StorageError> + Send + 'static,
    {
        downcast(self.control_erased(wait, erase_control(f))?)
    }

    /// [`Storage::control_waiting`] for a type-erased closure: the group commit, its channel
    /// and its job type are compiled once for every caller instead of once per closure
    /// (binary size; control writes are not on the ingest path).
    #[inline(never)]
    fn control_erased(&self, wait: Duration, f: ControlFn) -> Result<Answer, StorageError> {
        let inner = &self.inner;
        inner.pending.run(
            &inner.control,
            wait,
            inner.config.busy_timeout,
            || inner.telemetry.note_commit(),
            f,
        )
    }

    /// Async form of [`Storage::control_waiting`] (waiting `busy_timeout` for a locked
    /// database), run on tokio's blocking pool.
    pub(crate) async fn control<T, F>(&self, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, StorageError> + Send + 'static,
    {
        downcast(self.control_async_erased(erase_control(f)).await?)
    }

    /// [`Storage::control`] for a type-erased closure: one blocking task type for every
    /// caller (binary size).
    #[inline(never)]
    fn control_async_erased(
        &self,
        f: ControlFn,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Answer, StorageError>> + Send>>
    {
        let this = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                this.control_erased(this.inner.config.busy_timeout, f)
            })
            .await
            .map_err(|e| StorageError::Task(e.to_string()))?
        })
    }

    /// Runs `f` on one of the [`READ_POOL`] read-only connections, waiting for one to be
    /// free. Blocking.
    pub(crate) fn read_blocking<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let mut f = Some(f);
        let mut out = None;
        self.with_reader(&mut |c| {
            if let Some(f) = f.take() {
                out = Some(f(c));
            }
        })?;
        out.unwrap_or_else(|| Err(StorageError::Task("read closure never ran".into())))
    }

    /// The pool handling of [`Storage::read_blocking`], compiled once for every caller
    /// (binary size): runs `f` on a free read connection and puts the connection back.
    #[inline(never)]
    fn with_reader(&self, f: &mut dyn FnMut(&Connection)) -> Result<(), StorageError> {
        let poisoned = || StorageError::Task("reader pool poisoned".into());
        let conn = {
            let mut pool = self.inner.readers.lock().map_err(|_| poisoned())?;
            loop {
                if let Some(c) = pool.pop() {
                    break c;
                }
                pool = self.inner.reader_free.wait(pool).map_err(|_| poisoned())?;
            }
        };
        // The connection goes back even when `f` panics, and never inside a transaction: a
        // read that panicked between BEGIN and COMMIT left one open, which failed every
        // later read on that connection ("cannot start a transaction within a
        // transaction") and pinned the WAL, so checkpoints stopped and the `-wal` file grew
        // past the size cap. One whose transaction cannot be ended is replaced.
        struct Back<'a>(&'a Inner, Option<Connection>);
        impl Drop for Back<'_> {
            fn drop(&mut self) {
                let Some(mut c) = self.1.take() else { return };
                if !c.is_autocommit() {
                    let ended = c.execute_batch("ROLLBACK").is_ok() && c.is_autocommit();
                    tracing::warn!(
                        ended,
                        "a read left its transaction open (it failed part way); rolled back"
                    );
                    if !ended {
                        let ro = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
                        match open_connection(&self.0.config, ro) {
                            Ok(fresh) => c = fresh,
                            Err(e) => {
                                tracing::error!(error = %e, "cannot replace a read connection")
                            }
                        }
                    }
                }
                if let Ok(mut pool) = self.0.readers.lock() {
                    pool.push(c);
                    self.0.reader_free.notify_one();
                }
            }
        }
        let back = Back(&self.inner, Some(conn));
        match back.1.as_ref() {
            Some(c) => {
                f(c);
                Ok(())
            }
            None => Err(poisoned()),
        }
    }

    /// Async form of [`Storage::read_blocking`], run on tokio's blocking pool.
    pub(crate) async fn read<T, F>(&self, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StorageError> + Send + 'static,
    {
        let f: ReadFn = Box::new(move |c: &Connection| f(c).map(|t| Box::new(t) as Answer));
        downcast(self.read_erased(f).await?)
    }

    /// [`Storage::read`] for a type-erased closure: one blocking task type for every caller
    /// (binary size; reads serve the dashboard, the reaper and the forwarder, not ingest).
    #[inline(never)]
    fn read_erased(
        &self,
        f: ReadFn,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Answer, StorageError>> + Send>>
    {
        let this = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || this.read_blocking(f))
                .await
                .map_err(|e| StorageError::Task(e.to_string()))?
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// Descriptors of this process open on `path`.
    fn fds_on(path: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == path))
            .count()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_share_a_fixed_pool_opened_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("stallwatch.db");
        let s = Storage::open(StorageConfig::new(db.clone())).unwrap();
        let at_start = fds_on(&db);
        let reads: Vec<_> = (0..32)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    s.read(move |c| {
                        std::thread::sleep(Duration::from_millis(20));
                        Ok(c.query_row("SELECT ?1", [i], |r| r.get::<_, i64>(0))?)
                    })
                    .await
                })
            })
            .collect();
        let mut peak = 0;
        for _ in 0..10 {
            peak = peak.max(fds_on(&db));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for (i, r) in reads.into_iter().enumerate() {
            assert_eq!(r.await.unwrap().unwrap(), i as i64);
        }
        // 32 concurrent reads ran on the connections opened at start, none opened more
        // the control connection and the read pool
        assert!(at_start > READ_POOL, "{at_start}");
        assert_eq!(peak, at_start, "a read opened its own connection");
        assert_eq!(fds_on(&db), at_start);
        s.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_that_panics_inside_its_transaction_leaves_every_connection_usable() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::open(StorageConfig::new(dir.path().join("stallwatch.db"))).unwrap();
        // Every pooled connection in turn panics between BEGIN and COMMIT (a bug in a read's
        // decoding); the pool hands out the last connection returned first, so hold them.
        for _ in 0..READ_POOL {
            let r = s
                .read(|c| -> Result<(), StorageError> {
                    c.execute_batch("BEGIN")?;
                    c.query_row("SELECT count(*) FROM span_batches", [], |r| {
                        r.get::<_, i64>(0)
                    })?;
                    panic!("a read failed part way");
                })
                .await;
            assert!(matches!(r, Err(StorageError::Task(_))), "{r:?}");
        }
        // Every connection is out of its transaction: reads that open their own work, as
        // many at once as the pool holds.
        let reads: Vec<_> = (0..READ_POOL * 2)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move {
                    s.read(|c| {
                        assert!(c.is_autocommit());
                        c.execute_batch("BEGIN")?;
                        std::thread::sleep(Duration::from_millis(10));
                        let n = c.query_row("SELECT count(*) FROM span_batches", [], |r| {
                            r.get::<_, i64>(0)
                        })?;
                        c.execute_batch("COMMIT")?;
                        Ok(n)
                    })
                    .await
                })
            })
            .collect();
        for r in reads {
            assert_eq!(r.await.unwrap().unwrap(), 0);
        }
        s.shutdown().await;
    }

    /// The bundled SQLite is built without extension loading and without the modules
    /// stallwatch never uses (`.cargo/config.toml`, `LIBSQLITE3_FLAGS`), with FTS5 kept.
    #[tokio::test]
    async fn sqlite_cannot_load_extensions_and_keeps_fts5() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::open(StorageConfig::new(dir.path().join("stallwatch.db"))).unwrap();
        let (load, fts3, rtree, fts5) = s
            .read(|c| {
                let err = |sql: &str| match c.execute_batch(sql) {
                    Ok(()) => String::new(),
                    Err(e) => e.to_string(),
                };
                Ok((
                    err("SELECT load_extension('/nonexistent/libx')"),
                    err("CREATE VIRTUAL TABLE temp.t3 USING fts3(x)"),
                    err("CREATE VIRTUAL TABLE temp.tr USING rtree(id, a, b)"),
                    err("CREATE VIRTUAL TABLE temp.t5 USING fts5(x, tokenize = 'trigram')"),
                ))
            })
            .await
            .unwrap();
        assert!(load.contains("no such function: load_extension"), "{load}");
        assert!(fts3.contains("no such module: fts3"), "{fts3}");
        assert!(rtree.contains("no such module: rtree"), "{rtree}");
        assert_eq!(fts5, "", "FTS5 (the log body index) must stay");
        s.shutdown().await;
    }

    #[tokio::test]
    async fn database_wal_and_shm_are_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("stallwatch.db");
        let s = Storage::open(StorageConfig::new(db.clone())).unwrap();
        s.control(|tx| Ok(tx.execute("CREATE TABLE mode_probe (x)", [])?))
            .await
            .unwrap();
        for suffix in SIDE_FILES {
            let p = std::path::PathBuf::from(format!("{}{suffix}", db.display()));
            assert!(p.exists(), "{} missing", p.display());
            assert_eq!(mode(&p), DB_FILE_MODE, "{}", p.display());
        }
        s.shutdown().await;
        drop(s);
        // A database left 0644 by an older version is narrowed at open.
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        let s = Storage::open(StorageConfig::new(db.clone())).unwrap();
        assert_eq!(mode(&db), DB_FILE_MODE);
        drop(s);
    }
}
