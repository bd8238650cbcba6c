//! WAL checkpoints off the writer thread.
//!
//! Every connection runs with `wal_autocheckpoint=0` (see `db::open_connection`), so no
//! commit pays for copying WAL frames into the database file and syncing it. This thread,
//! with its own connection, runs `PRAGMA wal_checkpoint(PASSIVE)` once commits gathered for
//! [`CHECKPOINT_INTERVAL`] or an eighth of the WAL's bound was committed
//! ([`GATHER_WAL_SHARE`]), so the copying and the fsyncs run on the other core while the
//! writer keeps committing. A PASSIVE checkpoint never blocks the
//! writer or readers. When nothing commits the thread sleeps on a condition variable with
//! no timeout (the writer wakes it through [`Shared::note_commit`]), so an idle sidecar
//! pays no wake-ups for it. A panic in its loop is logged and the loop starts again after
//! a one-second pause (`supervise`); until then the writer bounds the WAL alone.
//!
//! Bounding the WAL (docs/design.md, Durability levels: `max_db_bytes` bounds the file plus
//! its WAL): SQLite rewinds the WAL at the start of a write transaction once every frame
//! has been checkpointed. Under continuous load a concurrent checkpoint never quite catches
//! up (the writer appends while it copies), so when the WAL holds more than its bound
//! (`[storage] max_db_bytes`' WAL share, [`crate::config::wal_budget_bytes`], in frames)
//! the checkpointer (or the writer, finding the `-wal` file past it after a commit) raises a
//! flag, the checkpointer stands aside, and the writer runs one PASSIVE checkpoint itself between
//! two groups (only the tail is left to copy; while the `-wal` file is past its bound it
//! retries until that checkpoint completes, up to 2 s, see `writer::commit`), after which
//! its next transaction rewinds the WAL; `journal_size_limit` (the same bound) then truncates the file back. While the
//! WAL is past a quarter of its bound the checkpointer copies at once after a commit
//! instead of gathering commits for [`CHECKPOINT_INTERVAL`], so the writer's share of the
//! copying stays small at full ingest.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::config::StorageConfig;
use crate::db::open_connection;
use crate::error::StorageError;

/// How long the checkpointer gathers commits before it checkpoints them (unless
/// [`GATHER_WAL_SHARE`] or a WAL past a quarter of its bound ends that sooner).
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);
/// How long the checkpoint loop pauses after a panic before it starts again: a panic that
/// recurs at once costs a log line a second, not a spinning core. Meanwhile the writer
/// bounds the WAL on its own (it checkpoints the tail itself once the `-wal` file is past
/// its bound, see the module doc).
const PANIC_PAUSE: Duration = Duration::from_secs(1);
/// The checkpointer also stops gathering commits once this share of the WAL's bound
/// (one eighth) was committed: at the smallest `max_db_bytes` (a 4 MiB WAL) full ingest
/// writes more than the bound in one interval, and the writer would copy it itself.
const GATHER_WAL_SHARE: u64 = 8;

/// State shared by the writer and the checkpointer.
#[derive(Default)]
pub(crate) struct Shared {
    /// Commits made by the writer (bumped after each COMMIT).
    pub(crate) commits: AtomicU64,
    /// Set when the WAL outgrew `bound_frames`; the writer checkpoints and clears it.
    pub(crate) writer_should_checkpoint: AtomicBool,
    /// WAL frames (pages) above which the writer checkpoints the tail itself: the WAL
    /// budget over the page size.
    pub(crate) bound_frames: AtomicI64,
    /// Checkpoints this thread ran (each one copies and syncs: two `fsync`s at
    /// `synchronous=NORMAL`).
    pub(crate) checkpoints: AtomicU64,
    /// Bytes committed (as the writer counts them: payloads and indexes) since this thread
    /// last started a checkpoint.
    pub(crate) bytes_since: AtomicU64,
    /// Gatherings ended by [`GATHER_WAL_SHARE`] before the interval was over.
    pub(crate) ended_by_bytes: AtomicU64,
    /// Bytes committed that end a gathering: an eighth of the WAL's bound
    /// ([`GATHER_WAL_SHARE`]), bytes.
    gather_bytes: AtomicU64,
    /// True while the checkpointer waits for the first commit after a checkpoint (set and
    /// cleared under `stop`'s mutex).
    idle: AtomicBool,
    /// Times [`Shared::note_commit`] woke the checkpointer.
    pub(crate) wakes: AtomicU64,
    /// Panics the checkpoint loop survived (each one logged, the loop started again after
    /// [`PANIC_PAUSE`]).
    pub(crate) panics: AtomicU64,
    /// Tests: the next checkpoint panics instead of running.
    #[cfg(test)]
    panic_next: AtomicBool,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl Shared {
    /// Counts one commit of `bytes` and wakes the checkpointer when that commit matters to
    /// it: it is waiting for the first commit after a checkpoint, or this commit made the
    /// gathered bytes reach an eighth of the WAL's bound. Other commits only count: the
    /// gathering ends at its interval's timeout anyway, and waking the thread at every
    /// commit cost a futex wake-up and a context switch per commit (issue 16: about a
    /// thousand a second at one exporter; on two cores the one the request needed next).
    ///
    /// No wake-up is lost: the counters are bumped before `idle` is read, and the
    /// checkpointer sets `idle` before it compares the commit counter, both sequentially
    /// consistent, so one of the two sees the other; the notification itself is sent with
    /// the mutex held, which the checkpointer holds from that comparison until it waits.
    pub(crate) fn note_commit(&self, bytes: u64) {
        let before = self.bytes_since.fetch_add(bytes, Ordering::SeqCst);
        self.commits.fetch_add(1, Ordering::SeqCst);
        let gather = self.gather_bytes.load(Ordering::Relaxed);
        let reached = before < gather && before.saturating_add(bytes) >= gather;
        if reached || self.idle.load(Ordering::SeqCst) {
            if let Ok(_guard) = self.stop.lock() {
                self.wakes.fetch_add(1, Ordering::Relaxed);
                self.wake.notify_all();
            }
        }
    }
}

/// The checkpoint thread's handle; dropping it stops the thread.
pub(crate) struct Checkpointer {
    pub(crate) shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// `(busy, wal frames, checkpointed frames)` of `PRAGMA wal_checkpoint(PASSIVE)`.
pub(crate) fn passive(conn: &Connection) -> Result<(i64, i64, i64), rusqlite::Error> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
}

impl Checkpointer {
    /// Opens the checkpointer's connection and starts the thread.
    ///
    /// Errors: [`StorageError::Open`] / [`StorageError::Sqlite`] when the connection cannot
    /// be opened.
    pub(crate) fn start(config: &StorageConfig) -> Result<Self, StorageError> {
        let conn = open_connection(
            config,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.pragma_update(None, "cache_size", 16i64)?;
        let page_size: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
        let page_size = page_size.max(512) as u64;
        let shared = Arc::new(Shared::default());
        shared.bound_frames.store(
            (crate::config::wal_budget_bytes(config.max_db_bytes) / page_size).max(16) as i64,
            Ordering::Relaxed,
        );
        shared
            .gather_bytes
            .store(gather_bytes(&shared, page_size), Ordering::Relaxed);
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("stallwatch-wal-checkpoint".into())
            .spawn(move || supervise(&conn, &s, page_size))
            .map_err(|e| StorageError::Task(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it (at most one checkpoint).
    pub(crate) fn stop(&mut self) {
        if let Ok(mut s) = self.shared.stop.lock() {
            *s = true;
        }
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shared.stop.lock() {
            *s = true;
        }
        self.shared.wake.notify_all();
    }
}

/// Bytes committed that end a gathering ([`GATHER_WAL_SHARE`] of the WAL's bound), at
/// least 1.
fn gather_bytes(shared: &Shared, page_size: u64) -> u64 {
    let bound = shared.bound_frames.load(Ordering::Relaxed);
    (bound.max(0) as u64 * page_size / GATHER_WAL_SHARE).max(1)
}

/// Runs the checkpoint loop until it is stopped, starting it again after a panic (a bug in
/// it or in SQLite's bindings): the thread that copies the WAL must not end quietly and
/// leave every copy to the writer for the rest of the run.
fn supervise(conn: &Connection, shared: &Arc<Shared>, page_size: u64) {
    loop {
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(conn, shared, page_size)
        }));
        let Err(payload) = ran else {
            return;
        };
        shared.panics.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            panic = %crate::group::panic_message(payload.as_ref()),
            "the WAL checkpoint thread panicked; starting it again in {PANIC_PAUSE:?}"
        );
        let Ok(stop) = shared.stop.lock() else {
            return;
        };
        let Ok((stop, _)) = shared.wake.wait_timeout_while(stop, PANIC_PAUSE, |s| !*s) else {
            return;
        };
        if *stop {
            return;
        }
    }
}

fn run(conn: &Connection, shared: &Arc<Shared>, page_size: u64) {
    let mut seen = shared.commits.load(Ordering::Acquire);
    let bound = shared.bound_frames.load(Ordering::Relaxed);
    let gather_bytes = gather_bytes(shared, page_size);
    let mut last_log: i64 = 0;
    loop {
        {
            // Sleep until a commit happens (no timeout: an idle sidecar never wakes here).
            let Ok(mut stop) = shared.stop.lock() else {
                return;
            };
            shared.idle.store(true, Ordering::SeqCst);
            while !*stop && shared.commits.load(Ordering::SeqCst) == seen {
                let Ok(s) = shared.wake.wait(stop) else {
                    return;
                };
                stop = s;
            }
            shared.idle.store(false, Ordering::SeqCst);
            if *stop {
                return;
            }
            // Then let commits gather for one interval, or until an eighth of the WAL's
            // bound was committed, so a busy writer gets one checkpoint per interval
            // rather than one per commit; not while the WAL is already past a quarter of
            // its bound. The writer notifies only the commit that reaches the eighth, so
            // the wait goes on until one of those: waking at the next commit had made it a
            // checkpoint (and two fsyncs) every second or third commit under load (issue
            // 16: `strace -c`, 1,166 fsyncs for 2,000 commits).
            if last_log <= bound / 4 {
                let until = std::time::Instant::now() + CHECKPOINT_INTERVAL;
                loop {
                    let left = until.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    if shared.bytes_since.load(Ordering::Relaxed) >= gather_bytes {
                        shared.ended_by_bytes.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    let Ok((s, _)) = shared.wake.wait_timeout(stop, left) else {
                        return;
                    };
                    stop = s;
                    if *stop {
                        return;
                    }
                }
            }
        }
        seen = shared.commits.load(Ordering::Acquire);
        if shared.writer_should_checkpoint.load(Ordering::Acquire) {
            // The writer copies the tail itself between two groups; a checkpoint here
            // would hold the lock it needs.
            last_log = 0;
            continue;
        }
        shared.bytes_since.store(0, Ordering::Relaxed);
        #[cfg(test)]
        if shared.panic_next.swap(false, Ordering::SeqCst) {
            panic!("test: the checkpoint panics");
        }
        let done = passive(conn);
        shared.checkpoints.fetch_add(1, Ordering::Relaxed);
        match done {
            Ok((_, log, _)) => {
                last_log = log;
                if log > bound {
                    shared
                        .writer_should_checkpoint
                        .store(true, Ordering::Release);
                }
            }
            Err(e) => tracing::debug!(error = %e, "WAL checkpoint failed; will retry"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer connection to a new WAL database at `config.path` with one table `t`.
    fn open_writer(config: &StorageConfig) -> Connection {
        let writer = open_connection(
            config,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        )
        .unwrap();
        writer.pragma_update(None, "journal_mode", "WAL").unwrap();
        writer
            .execute_batch("CREATE TABLE t (x BLOB NOT NULL)")
            .unwrap();
        writer
    }

    /// Opens a WAL database at `config.path` with one table, starts a checkpointer, makes
    /// `commits` commits of `bytes` each (noted as the writer notes them), `gap` apart,
    /// lets the last gathering end and stops the checkpointer. Answers its counters and
    /// how many whole intervals the commits took.
    fn commit_noted(
        config: &StorageConfig,
        commits: u64,
        bytes: u64,
        gap: Duration,
    ) -> (Arc<Shared>, u64) {
        let writer = open_writer(config);
        let mut cp = Checkpointer::start(config).unwrap();
        let started = std::time::Instant::now();
        for _ in 0..commits {
            writer
                .execute("INSERT INTO t (x) VALUES (zeroblob(?1))", [bytes as i64])
                .unwrap();
            cp.shared.note_commit(bytes);
            std::thread::sleep(gap);
        }
        let intervals = (started.elapsed().as_millis() / CHECKPOINT_INTERVAL.as_millis()) as u64;
        std::thread::sleep(CHECKPOINT_INTERVAL * 2);
        cp.stop();
        (cp.shared.clone(), intervals)
    }

    /// 200 commits of 4 KiB every 2 ms, each one noted: the checkpointer gathers
    /// them for its interval instead of checkpointing after every other commit (an eighth
    /// of the default WAL bound is far more than these commits write).
    #[test]
    fn commits_are_gathered_for_an_interval_between_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let config = StorageConfig::new(dir.path().join("db"));
        let commits = 200u64;
        let (shared, intervals) = commit_noted(&config, commits, 4096, Duration::from_millis(2));
        let ran = shared.checkpoints.load(Ordering::Relaxed);
        // One per interval (plus the last gathering and rounding), never one per commit
        // or two (which was 100 here).
        assert!(
            ran >= 1 && ran <= intervals + 3 && ran * 4 <= commits,
            "{ran} checkpoints for {commits} commits over {intervals} intervals"
        );
        // Only the first commit of each gathering wakes the thread (every commit did, 200).
        let wakes = shared.wakes.load(Ordering::Relaxed);
        assert!(
            wakes >= 1 && wakes <= ran + 2,
            "{wakes} wake-ups for {ran} checkpoints and {commits} commits"
        );
    }

    /// A panic in the checkpoint loop is logged and the loop starts again: later commits
    /// are still checkpointed by this thread. Without the guard the thread ended and
    /// `checkpoints` stayed where it was.
    #[test]
    fn a_panic_in_the_checkpoint_loop_is_survived() {
        let dir = tempfile::tempdir().unwrap();
        let config = StorageConfig::new(dir.path().join("db"));
        let writer = open_writer(&config);
        let mut cp = Checkpointer::start(&config).unwrap();
        let commit = || {
            writer
                .execute("INSERT INTO t (x) VALUES (zeroblob(4096))", [])
                .unwrap();
            cp.shared.note_commit(4096);
        };
        let wait_for = |what: &str, f: &dyn Fn() -> bool| {
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while !f() {
                assert!(std::time::Instant::now() < until, "{what}");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        cp.shared.panic_next.store(true, Ordering::SeqCst);
        // Commits until the loop takes one: a commit noted before the thread first waits
        // is not a wake-up (1 run in 3 waited the whole 10 s for a wake that never came).
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while cp.shared.panics.load(Ordering::Relaxed) == 0 {
            assert!(std::time::Instant::now() < until, "the panic");
            commit();
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(cp.shared.panics.load(Ordering::Relaxed), 1);
        assert_eq!(cp.shared.checkpoints.load(Ordering::Relaxed), 0);
        // after the pause the loop runs again and checkpoints the next commit
        std::thread::sleep(PANIC_PAUSE + Duration::from_millis(100));
        commit();
        wait_for("a checkpoint after the panic", &|| {
            cp.shared.checkpoints.load(Ordering::Relaxed) >= 1
        });
        assert_eq!(cp.shared.panics.load(Ordering::Relaxed), 1);
        // and it still stops at once when asked
        let started = std::time::Instant::now();
        cp.stop();
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// With the smallest WAL bound (4 MiB, at `max_db_bytes` = 64 MiB) and 320 KiB
    /// committed every 10 ms (3.2 MiB an interval), gatherings end once an eighth of the
    /// bound (512 KiB) was committed, every second commit or so, not when the interval is
    /// over (when the WAL outgrew a quarter of its bound meanwhile, the checkpointer copies
    /// at once and does not gather at all).
    #[test]
    fn gathering_ends_once_an_eighth_of_the_bound_was_committed() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = StorageConfig::new(dir.path().join("db"));
        config.max_db_bytes = 64 * 1024 * 1024;
        assert_eq!(
            crate::config::wal_budget_bytes(config.max_db_bytes),
            4 * 1024 * 1024
        );
        let (shared, _) = commit_noted(&config, 40, 327_680, Duration::from_millis(10));
        let early = shared.ended_by_bytes.load(Ordering::Relaxed);
        let ran = shared.checkpoints.load(Ordering::Relaxed);
        assert!(
            early >= 2,
            "{early} of {ran} gatherings ended by the committed bytes"
        );
    }
}
