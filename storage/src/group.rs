//! Group commit of control transactions.
//!
//! Control records are written with `synchronous=FULL`: every commit is an `fsync` of the
//! WAL (SQLite, "PRAGMA synchronous"). Written one transaction per record, the bookkeeping of
//! thousands of runners (a row, an incident and ledger steps each) is thousands of `fsync`s
//! in a row: registering 2,000 runners or stopping them at shutdown took minutes. Here every
//! caller queues its closure; whoever takes the control connection runs every queued closure
//! (up to [`MAX_GROUP`], in arrival order) inside one `BEGIN IMMEDIATE`
//! transaction, each under its own `SAVEPOINT` so a closure that fails is rolled back alone,
//! then commits once and hands every caller its own answer. A caller is answered only after
//! the commit that holds its writes, so durability is unchanged; only the number of `fsync`s
//! falls. The leader/follower shape is the classic group commit (the telemetry writer does
//! the same for export requests, `telemetry/`).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::error::StorageError;

/// Most closures committed in one transaction.
pub(crate) const MAX_GROUP: usize = 512;

/// One queued closure and where its answer goes.
trait Job: Send {
    /// Runs inside the group's transaction (under its savepoint); true when it succeeded.
    fn run(&mut self, tx: &Transaction<'_>) -> bool;
    /// Delivers the answer: its own result when the group committed, else the group's error.
    fn finish(self: Box<Self>, group: Result<(), &StorageError>);
}

struct Call<T, F> {
    f: Option<F>,
    out: Option<Result<T, StorageError>>,
    reply: mpsc::SyncSender<Result<T, StorageError>>,
}

impl<T, F> Job for Call<T, F>
where
    T: Send,
    F: FnOnce(&Transaction<'_>) -> Result<T, StorageError> + Send,
{
    fn run(&mut self, tx: &Transaction<'_>) -> bool {
        let out = match self.f.take() {
            // A panicking closure (a bug) fails alone, like one that returned an error: its
            // savepoint is rolled back and the connection's lock is not poisoned, so every
            // later control write still runs.
            Some(f) => match catch_unwind(AssertUnwindSafe(|| f(tx))) {
                Ok(out) => out,
                Err(payload) => Err(StorageError::Task(format!(
                    "internal error in a control write (a panic: {})",
                    panic_message(payload.as_ref())
                ))),
            },
            None => Err(StorageError::Task("control closure ran twice".into())),
        };
        let ok = out.is_ok();
        self.out = Some(out);
        ok
    }

    fn finish(self: Box<Self>, group: Result<(), &StorageError>) {
        let out = match (group, self.out) {
            (Ok(()), Some(out)) => out,
            // Its own failure stays its own, whatever the group did.
            (Err(_), Some(Err(e))) => Err(e),
            (Err(e), _) => Err(replay(e)),
            (Ok(()), None) => Err(StorageError::Task("control closure never ran".into())),
        };
        let _ = self.reply.send(out);
    }
}

/// The message of a panic's payload (`&str` or `String`, as `panic!` makes them).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

/// The same error again, for every caller of a failed group (rusqlite errors are not
/// `Clone`; the SQLite codes are what callers classify by).
fn replay(e: &StorageError) -> StorageError {
    match e {
        StorageError::Sqlite(rusqlite::Error::SqliteFailure(code, msg)) => {
            StorageError::Sqlite(rusqlite::Error::SqliteFailure(*code, msg.clone()))
        }
        StorageError::Full(s) => StorageError::Full(s.clone()),
        StorageError::Closed => StorageError::Closed,
        other => StorageError::Task(other.to_string()),
    }
}

/// Closures waiting for the control connection, each with the busy wait it asked for.
#[derive(Default)]
pub(crate) struct Pending {
    queue: Mutex<VecDeque<(Duration, Box<dyn Job>)>>,
}

impl Pending {
    /// Runs `f` in a group transaction on `conn` (taking the connection's lock, or waiting
    /// for the leader that ran it) and answers its result once that group committed.
    /// `busy_wait` is SQLite's busy timeout for the group's `BEGIN` and `COMMIT`; `restore`
    /// the connection's usual one. `committed` is called after each successful commit.
    pub(crate) fn run<T, F>(
        &self,
        conn: &Mutex<Connection>,
        busy_wait: Duration,
        restore: Duration,
        committed: impl Fn(),
        f: F,
    ) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, StorageError> + Send + 'static,
    {
        let (reply, answer) = mpsc::sync_channel(1);
        let job: Box<dyn Job> = Box::new(Call {
            f: Some(f),
            out: None,
            reply,
        });
        self.queue
            .lock()
            .map_err(|_| StorageError::Task("control queue poisoned".into()))?
            .push_back((busy_wait, job));
        loop {
            let mut c = conn
                .lock()
                .map_err(|_| StorageError::Task("control connection poisoned".into()))?;
            // A leader answers every closure it ran before it lets the connection go.
            if let Ok(out) = answer.try_recv() {
                return out;
            }
            let jobs = self.take_group();
            if !jobs.is_empty() {
                self.run_group(&mut c, restore, &committed, jobs);
            }
            drop(c);
            if let Ok(out) = answer.try_recv() {
                return out;
            }
        }
    }

    /// The oldest queued closures, at most [`MAX_GROUP`], with the busy wait each asked for.
    fn take_group(&self) -> Vec<(Duration, Box<dyn Job>)> {
        let Ok(mut q) = self.queue.lock() else {
            return Vec::new();
        };
        let n = q.len().min(MAX_GROUP);
        q.drain(..n).collect()
    }

    /// Runs one group: `BEGIN IMMEDIATE` with the shortest busy wait any member asked for
    /// (a held-record write must not wait out the full busy timeout), every closure under
    /// its savepoint, one `COMMIT`, then every answer. When `BEGIN` finds the file locked,
    /// only members that asked for no longer a wait are answered with that error; the
    /// others go back to the front of the queue and are retried with their own wait.
    fn run_group(
        &self,
        conn: &mut Connection,
        restore: Duration,
        committed: &impl Fn(),
        jobs: Vec<(Duration, Box<dyn Job>)>,
    ) {
        let wait = jobs.iter().map(|(w, _)| *w).min().unwrap_or(restore);
        if wait != restore {
            if let Err(e) = conn.busy_timeout(wait) {
                let e = StorageError::from(e);
                jobs.into_iter().for_each(|(_, j)| j.finish(Err(&e)));
                return;
            }
        }
        let outcome = run_in_transaction(conn, jobs);
        if wait != restore {
            // The usual wait back; a failure here shows on the next group's BEGIN.
            let _ = conn.busy_timeout(restore);
        }
        match outcome {
            Ok(jobs) => {
                committed();
                jobs.into_iter().for_each(|j| j.finish(Ok(())));
            }
            Err((e, Ran::No(jobs))) if is_locked(&e) => {
                let (retry, fail): (Vec<_>, Vec<_>) =
                    jobs.into_iter().partition(|(w, _)| *w > wait);
                fail.into_iter().for_each(|(_, j)| j.finish(Err(&e)));
                if let Ok(mut q) = self.queue.lock() {
                    for r in retry.into_iter().rev() {
                        q.push_front(r);
                    }
                }
            }
            Err((e, Ran::No(jobs))) => jobs.into_iter().for_each(|(_, j)| j.finish(Err(&e))),
            Err((e, Ran::Yes(jobs))) => jobs.into_iter().for_each(|j| j.finish(Err(&e))),
        }
    }
}

/// The members of a failed group: before any closure ran (`BEGIN` failed), or after.
enum Ran {
    No(Vec<(Duration, Box<dyn Job>)>),
    Yes(Vec<Box<dyn Job>>),
}

fn is_locked(e: &StorageError) -> bool {
    matches!(
        e.transient(),
        Some(crate::error::Transient::Busy) | Some(crate::error::Transient::Locked)
    )
}

fn run_in_transaction(
    conn: &mut Connection,
    jobs: Vec<(Duration, Box<dyn Job>)>,
) -> Result<Vec<Box<dyn Job>>, (StorageError, Ran)> {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return Err((e.into(), Ran::No(jobs))),
    };
    let mut jobs: Vec<Box<dyn Job>> = jobs.into_iter().map(|(_, j)| j).collect();
    let ran = (|| -> Result<(), StorageError> {
        for j in jobs.iter_mut() {
            tx.execute_batch("SAVEPOINT control_job")?;
            if j.run(&tx) {
                tx.execute_batch("RELEASE control_job")?;
            } else {
                tx.execute_batch("ROLLBACK TO control_job; RELEASE control_job")?;
            }
        }
        Ok(())
    })();
    match ran.and_then(|()| tx.commit().map_err(StorageError::from)) {
        Ok(()) => Ok(jobs),
        Err(e) => Err((e, Ran::Yes(jobs))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn conn(path: &std::path::Path) -> Connection {
        let c = Connection::open(path).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY)")
            .unwrap();
        c
    }

    #[test]
    fn concurrent_callers_share_commits_and_failures_stay_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Arc::new(Mutex::new(conn(&dir.path().join("db"))));
        let pending = Arc::new(Pending::default());
        let commits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let wait = Duration::from_secs(1);
        let threads: Vec<_> = (0..64)
            .map(|i| {
                let (conn, pending, commits) = (conn.clone(), pending.clone(), commits.clone());
                std::thread::spawn(move || {
                    pending.run(
                        &conn,
                        wait,
                        wait,
                        || {
                            commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        },
                        move |tx| {
                            tx.execute("INSERT INTO t (k) VALUES (?1)", [i])?;
                            if i % 10 == 5 {
                                // A panicking closure (a bug): rolled back alone as well.
                                panic!("closure {i} panics");
                            }
                            if i % 10 == 3 {
                                // A failing closure: its insert must be rolled back alone.
                                tx.execute("INSERT INTO t (k) VALUES (?1)", [i])?;
                            }
                            Ok(i)
                        },
                    )
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for (i, r) in results.iter().enumerate() {
            if i % 10 == 3 {
                assert!(r.is_err(), "closure {i} violated the key and must fail");
            } else if i % 10 == 5 {
                let e = r.as_ref().unwrap_err().to_string();
                assert!(e.contains(&format!("a panic: closure {i} panics")), "{e}");
            } else {
                assert_eq!(*r.as_ref().unwrap(), i as i32);
            }
        }
        assert!(
            !conn.is_poisoned(),
            "a panicking closure poisoned the connection"
        );
        let c = conn.lock().unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        let failed = (0..64).filter(|i| i % 10 == 3 || i % 10 == 5).count() as i64;
        assert_eq!(
            n,
            64 - failed,
            "every good closure committed, no failed one"
        );
        let bad: i64 = c
            .query_row("SELECT count(*) FROM t WHERE k % 10 IN (3, 5)", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(bad, 0);
        let commits = commits.load(std::sync::atomic::Ordering::Relaxed);
        assert!((1..=64).contains(&commits), "{commits} commits");
    }
}
