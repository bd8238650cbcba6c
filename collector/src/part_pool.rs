//! The threads that decode the parts of a trace export after the first (issue 16).
//!
//! A job queue behind one mutex, and threads that wait on a condition variable when it is
//! empty: an idle thread sleeps in the kernel at once. The pool it replaces (rayon's) had
//! each thread look for more work after every job, yielding its core some 32 times before
//! it slept. At one export in flight that came after every export: `perf` at HTTP/protobuf
//! c=1 put 2.7% of the process's CPU in those `sched_yield` calls and their scheduling,
//! for no gain, since a part waiting in the queue is claimed by the calling thread first
//! ([`crate::chunks`], `Claims`) and never waits for a pool thread to wake.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// A job: run once on one of the pool's threads.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed set of named threads running [`PartPool::spawn`]ed jobs in the order given.
///
/// The threads stay for the pool's life, so their allocator heaps stay warm (a new thread
/// per part had cost ~0.25 ms of CPU per 200 KB export). Dropping the pool lets each thread
/// finish the jobs queued, then end; it does not wait for them.
#[derive(Debug)]
pub(crate) struct PartPool {
    shared: Arc<Shared>,
    threads: usize,
}

#[derive(Debug, Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Notified when a job is queued or the pool is dropped.
    ready: Condvar,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Set when the pool is dropped: threads end once `jobs` is empty.
    closed: bool,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("jobs", &self.jobs.len())
            .field("closed", &self.closed)
            .finish()
    }
}

impl PartPool {
    /// Starts `threads` threads (at least one), named `{name}-{i}`.
    ///
    /// Errors: the OS refused a thread (the ones started end again).
    pub(crate) fn new(threads: usize, name: &str) -> std::io::Result<Self> {
        let pool = Self {
            shared: Arc::new(Shared::default()),
            threads: threads.max(1),
        };
        for i in 0..pool.threads {
            let shared = Arc::clone(&pool.shared);
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || shared.serve())?;
        }
        Ok(pool)
    }

    /// How many threads run the jobs.
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// Queues `job` for the first thread free. A job that panics ends alone (the panic is
    /// caught on its thread, which goes on with the next job).
    pub(crate) fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        let mut q = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        q.jobs.push_back(Box::new(job));
        drop(q);
        self.shared.ready.notify_one();
    }
}

impl Drop for PartPool {
    fn drop(&mut self) {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed = true;
        self.shared.ready.notify_all();
    }
}

impl Shared {
    /// One thread's loop: the next job, or a wait for one, until the pool is dropped.
    fn serve(&self) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(job) = q.jobs.pop_front() {
                drop(q);
                // Jobs catch their own panics (`Claims`); this keeps the thread if one
                // does not.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            } else if q.closed {
                return;
            } else {
                q = self.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn jobs_run_on_the_named_threads_side_by_side() {
        let pool = PartPool::new(2, "part-test").unwrap();
        assert_eq!(pool.threads(), 2);
        let (tx, rx) = mpsc::channel();
        let release = Arc::new(std::sync::Barrier::new(2));
        for _ in 0..2 {
            let (tx, release) = (tx.clone(), Arc::clone(&release));
            pool.spawn(move || {
                // Both jobs must be running at once to pass the barrier.
                release.wait();
                let name = std::thread::current().name().map(str::to_owned);
                tx.send(name).unwrap();
            });
        }
        let mut names: Vec<_> = (0..2)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["part-test-0", "part-test-1"]);
    }

    #[test]
    fn a_panicking_job_leaves_the_thread_serving() {
        let pool = PartPool::new(1, "part-panic").unwrap();
        pool.spawn(|| panic!("a part's bug"));
        let (tx, rx) = mpsc::channel();
        pool.spawn(move || tx.send(7).unwrap());
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(7));
    }

    #[test]
    fn dropping_the_pool_still_runs_what_was_queued() {
        let pool = PartPool::new(1, "part-drop").unwrap();
        let (tx, rx) = mpsc::channel();
        let (go, gate) = mpsc::channel::<()>();
        let t = tx.clone();
        pool.spawn(move || {
            let _ = gate.recv();
            t.send(1).unwrap();
        });
        pool.spawn(move || tx.send(2).unwrap());
        drop(pool);
        go.send(()).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(1));
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(2));
        // Every sender went with its job: nothing queued was left behind.
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
    }
}
