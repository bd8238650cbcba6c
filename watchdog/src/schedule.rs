//! When the watchdog task next wakes, as a pure value (issue 10: every scheduling decision
//! of the worker goes through pure, property-tested functions). A wake evaluates the
//! runners that are due; a *full pass* (every runner, after an observation or a change)
//! runs at most once per `tick`, and never later than one tick after it was asked for. The
//! worker adds the runners' own deadlines and the board interval; nothing here reads a
//! clock.

use std::time::{Duration, Instant};

/// The wake-up schedule of the watchdog loop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Schedule {
    /// When the loop next wakes to evaluate.
    pub(crate) next_wake: Instant,
    /// Evaluate every runner (not only those due) at the next wake.
    full_pending: bool,
    /// When the last full pass ran.
    last_full: Instant,
    /// Least time between two full passes.
    tick: Duration,
}

impl Schedule {
    /// A schedule whose first wake, at `now`, is a full pass.
    pub(crate) fn new(now: Instant, tick: Duration) -> Self {
        Self {
            next_wake: now,
            full_pending: true,
            last_full: now,
            tick,
        }
    }

    /// Asks for a full pass: at the next wake, and no later than one tick after the last.
    pub(crate) fn want_full(&mut self) {
        if !self.full_pending {
            self.full_pending = true;
            self.wake_by(self.last_full + self.tick);
        }
    }

    /// Asks for a full pass without moving the wake (the task was starved: it is awake).
    pub(crate) fn force_full(&mut self) {
        self.full_pending = true;
    }

    /// Wakes no later than `t`.
    pub(crate) fn wake_by(&mut self, t: Instant) {
        self.next_wake = self.next_wake.min(t);
    }

    /// A wake at `now` begins: answers whether it is a full pass.
    pub(crate) fn begin(&mut self, now: Instant) -> bool {
        let full = self.full_pending && now >= self.last_full + self.tick;
        if full {
            self.full_pending = false;
            self.last_full = now;
        }
        full
    }

    /// The wake's pass ended: the next wake is `due` (the earliest runner deadline, at most
    /// the longest idle), or the board's next republication, or one tick after the last
    /// full pass when another is pending, whichever comes first.
    pub(crate) fn end(&mut self, due: Instant, board_due: Instant) {
        let mut next = due.min(board_due);
        if self.full_pending {
            next = next.min(self.last_full + self.tick);
        }
        self.next_wake = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against the rule itself: full passes are at least a tick apart; one asked for is
        /// run within a tick of the previous one (or of the ask, when later); the loop never
        /// sleeps past a runner deadline or the board interval.
        #[test]
        fn full_passes_are_bounded_and_never_late(
            tick_ms in 1u64..100,
            events in proptest::collection::vec((any::<bool>(), 1u64..200, 1u64..300), 1..80),
        ) {
            let tick = Duration::from_millis(tick_ms);
            let t0 = Instant::now();
            let mut s = Schedule::new(t0, tick);
            let mut now = t0;
            // the schedule counts from its creation as from a full pass
            let mut last_full: Option<Instant> = Some(t0);
            let mut asked: Option<Instant> = Some(t0);
            for (ask, due_ms, board_ms) in events {
                if ask {
                    s.want_full();
                    asked.get_or_insert(now);
                }
                // the loop wakes at next_wake (or later, when it was busy)
                now = now.max(s.next_wake);
                if let (Some(a), Some(l)) = (asked, last_full) {
                    prop_assert!(s.next_wake <= (l + tick).max(a), "a full pass was asked for and is late");
                }
                let full = s.begin(now);
                if full {
                    if let Some(l) = last_full {
                        prop_assert!(now >= l + tick, "two full passes within a tick");
                    }
                    last_full = Some(now);
                    asked = None;
                }
                let due = now + Duration::from_millis(due_ms);
                let board = now + Duration::from_millis(board_ms);
                s.end(due, board);
                prop_assert!(s.next_wake <= due && s.next_wake <= board);
                if asked.is_some() {
                    prop_assert!(s.next_wake <= last_full.map_or(now, |l| l + tick).max(now));
                }
            }
        }
    }
}
