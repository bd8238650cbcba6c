//! Whether the end of one registration of a runner is wholly recorded (its span ends, its
//! row, its incident, the watchdog told it is gone). A registration of the same id waits
//! for it, or that record lands on the new registration: its spans closed, its row marked
//! exited, the watchdog told it was gone, so it is never watched. Shared by the Linux and
//! the Windows reaper.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a registration waits for the previous registration of its id to be settled
/// before it is refused as in use (409): that takes the output readers' wait (500 ms) and a
/// few writes.
pub(crate) const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Set once a registration's exit or stop is wholly recorded ([`Settled::settle`]).
#[derive(Debug, Default)]
pub(crate) struct Settled {
    done: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Settled {
    /// Marks the exit or stop wholly recorded, waking a registration that waits for it.
    pub(crate) fn settle(&self) {
        self.done.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Waits up to `limit` for [`Settled::settle`]; true once settled.
    pub(crate) async fn wait(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Created before the check: `notify_waiters` wakes it even before it is polled.
            let notified = self.notify.notified();
            if self.done.load(Ordering::SeqCst) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.done.load(Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_is_woken_by_the_settle_and_times_out_without_one() {
        let s = std::sync::Arc::new(Settled::default());
        assert!(!s.wait(Duration::from_millis(20)).await);
        let s2 = s.clone();
        let waiter = stallwatch_vocabulary::task::spawn_boxed(async move {
            s2.wait(Duration::from_secs(30)).await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.settle();
        assert!(waiter.await.unwrap());
        assert!(s.wait(Duration::ZERO).await, "settled stays settled");
    }
}
