//! When the watchdog task next wakes, as pure values (issue 10: every scheduling decision
//! of the worker goes through pure, property-tested functions). A wake evaluates the
//! runners that are due ([`DueSet`]: each runner's next deadline, ordered, so a wake costs
//! what is due and not what is registered; issue 17 #10); a *full pass* (every runner,
//! after the task itself was starved) runs at most once per `tick`, and never later than
//! one tick after it was asked for. The worker adds the board interval; nothing here reads
//! a clock.

use std::collections::{BTreeSet, HashMap};
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

/// Each runner's next deadline (when it next needs a step), ordered by instant: setting,
/// removing and taking what is due cost `O(log n)` each, so a wake that finds `k` runners
/// due costs `O(k log n)` whatever the number registered. One deadline per runner: setting
/// a new one replaces the old.
#[derive(Debug, Default)]
pub(crate) struct DueSet {
    order: BTreeSet<(Instant, String)>,
    at: HashMap<String, Instant>,
}

impl DueSet {
    /// `id` is next due at `t` (replacing its earlier deadline).
    pub(crate) fn set(&mut self, id: &str, t: Instant) {
        if let Some(old) = self.at.get(id).copied() {
            if old == t {
                return;
            }
            self.order.remove(&(old, id.to_string()));
        }
        self.at.insert(id.to_string(), t);
        self.order.insert((t, id.to_string()));
    }

    /// `id` is due no later than `t` (keeps an earlier deadline).
    pub(crate) fn set_by(&mut self, id: &str, t: Instant) {
        match self.at.get(id) {
            Some(old) if *old <= t => {}
            _ => self.set(id, t),
        }
    }

    /// Forgets `id`.
    pub(crate) fn remove(&mut self, id: &str) {
        if let Some(old) = self.at.remove(id) {
            self.order.remove(&(old, id.to_string()));
        }
    }

    /// When `id` is next due.
    #[cfg(test)]
    pub(crate) fn get(&self, id: &str) -> Option<Instant> {
        self.at.get(id).copied()
    }

    /// The earliest deadline.
    pub(crate) fn earliest(&self) -> Option<Instant> {
        self.order.first().map(|(t, _)| *t)
    }

    /// Takes every runner due at or before `now`, earliest first; they have no deadline
    /// until the caller sets a new one.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<String> {
        let mut out = Vec::new();
        while let Some((t, _)) = self.order.first() {
            if *t > now {
                break;
            }
            if let Some((_, id)) = self.order.pop_first() {
                self.at.remove(&id);
                out.push(id);
            }
        }
        out
    }

    /// Number of runners with a deadline.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum DueOp {
        Set(u8, u64),
        SetBy(u8, u64),
        Remove(u8),
        Take(u64),
    }

    fn due_op() -> impl Strategy<Value = DueOp> {
        prop_oneof![
            (0u8..16, 0u64..500).prop_map(|(i, t)| DueOp::Set(i, t)),
            (0u8..16, 0u64..500).prop_map(|(i, t)| DueOp::SetBy(i, t)),
            (0u8..16).prop_map(DueOp::Remove),
            (0u64..500).prop_map(DueOp::Take),
        ]
    }

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

    proptest! {
        /// Against a plain map scanned in full (what the worker did before): the set takes
        /// exactly the runners whose deadline has come, earliest first, never one twice,
        /// and its earliest deadline is the map's minimum, so the loop never sleeps past
        /// a runner's deadline.
        #[test]
        fn due_set_takes_exactly_what_a_full_scan_finds(
            ops in proptest::collection::vec(due_op(), 1..200),
        ) {
            let t0 = Instant::now();
            let at = |ms: u64| t0 + Duration::from_millis(ms);
            let mut set = DueSet::default();
            let mut model: HashMap<String, Instant> = HashMap::new();
            for op in ops {
                match op {
                    DueOp::Set(i, t) => {
                        set.set(&format!("r{i}"), at(t));
                        model.insert(format!("r{i}"), at(t));
                    }
                    DueOp::SetBy(i, t) => {
                        set.set_by(&format!("r{i}"), at(t));
                        let e = model.entry(format!("r{i}")).or_insert(at(t));
                        *e = (*e).min(at(t));
                    }
                    DueOp::Remove(i) => {
                        set.remove(&format!("r{i}"));
                        model.remove(&format!("r{i}"));
                    }
                    DueOp::Take(t) => {
                        let got = set.take_due(at(t));
                        let mut want: Vec<(Instant, String)> = model
                            .iter()
                            .filter(|(_, d)| **d <= at(t))
                            .map(|(id, d)| (*d, id.clone()))
                            .collect();
                        want.sort();
                        let want: Vec<String> = want.into_iter().map(|(_, id)| id).collect();
                        prop_assert_eq!(&got, &want);
                        model.retain(|_, d| *d > at(t));
                    }
                }
                prop_assert_eq!(set.len(), model.len());
                prop_assert_eq!(set.earliest(), model.values().min().copied());
                for (id, d) in &model {
                    prop_assert_eq!(set.get(id), Some(*d));
                }
            }
        }
    }
}
