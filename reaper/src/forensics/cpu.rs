//! CPU history of each runner: a bounded ring of (time, utime + stime per thread) samples
//! taken on a timer (default every 2000 ms, the heartbeat interval of `docs/design.md`,
//! Defaults), so that at trip time stallwatch can say how much CPU the runner used over the
//! last seconds and since its tool span started, and how long each thread has not run.
//!
//! Pure data: the timer lives in the forensics task; `now` is always given.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Samples kept per runner (at the default interval: the last 2 minutes).
pub const MAX_SAMPLES: usize = 64;

/// One sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// When it was taken (monotonic).
    pub at: Instant,
    /// When it was taken, ns since the Unix epoch (to compare with span start times).
    pub at_unix_nano: u64,
    /// utime + stime of the whole process, clock ticks.
    pub total_ticks: u64,
    /// Run + run-queue time of the whole process, ns (`None` without schedstat).
    pub demand_ns: Option<u64>,
    /// utime + stime per thread id, clock ticks.
    pub per_thread: Vec<(u32, u64)>,
    /// Run + run-queue time per thread id, ns.
    pub per_thread_demand: Vec<(u32, u64)>,
}

/// The history of one process (a pid with its start time: a recycled pid starts afresh).
#[derive(Clone, Debug, Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

/// CPU use over a window, as a share of one core.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CpuUse {
    /// Percent of one core (100 = one core busy the whole window; can pass 100).
    pub pct: u32,
    /// Length of the window, ms.
    pub window_ms: u64,
    /// Percent of one core its busiest thread *wanted* (on a CPU or waiting on a run
    /// queue); `None` without schedstat. On a loaded machine a busy loop gets less than it
    /// wants.
    pub demand_pct: Option<u32>,
}

impl CpuUse {
    /// The share that says "busy": the demand when known, else the CPU used.
    pub fn busy_pct(&self) -> u32 {
        self.demand_pct.unwrap_or(self.pct).max(self.pct)
    }
}

impl History {
    /// Adds a sample, dropping the oldest past [`MAX_SAMPLES`].
    pub fn push(&mut self, s: Sample) {
        if self.samples.len() == MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// Number of samples kept.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// How far back the history reaches from `now`: the oldest sample's age (zero with none).
    /// A wait or a busy spell as long as this may have begun before sampling did.
    pub fn reach(&self, now: &Sample) -> Duration {
        self.samples
            .front()
            .map_or(Duration::ZERO, |s| now.at.saturating_duration_since(s.at))
    }

    /// True when no sample was taken yet.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// CPU use from the oldest sample taken at or after `since_unix_nano` (or the oldest
    /// kept) up to `now` (a last sample taken now). `None` with no earlier sample.
    pub fn use_since(&self, since_unix_nano: u64, now: &Sample, hz: u64) -> Option<CpuUse> {
        let first = self
            .samples
            .iter()
            .find(|s| s.at_unix_nano >= since_unix_nano)
            .or_else(|| self.samples.back())?;
        cpu_between(first, now, hz)
    }

    /// CPU use over about the last `window` (from the newest sample at least `window` old,
    /// else the oldest kept) up to `now`.
    pub fn use_recent(&self, window: Duration, now: &Sample, hz: u64) -> Option<CpuUse> {
        let cutoff = now.at.checked_sub(window);
        let first = self
            .samples
            .iter()
            .rev()
            .find(|s| cutoff.is_some_and(|c| s.at <= c))
            .or_else(|| self.samples.front())?;
        cpu_between(first, now, hz)
    }

    /// How long each thread has not used any CPU, up to `now`: the time since the oldest
    /// sample after which its ticks never changed (at most the history's length). A thread
    /// that ran in the last interval gets zero.
    pub fn idle_per_thread(&self, now: &Sample) -> HashMap<u32, Duration> {
        let mut out = HashMap::new();
        for (tid, ticks) in &now.per_thread {
            let mut since = now.at;
            for s in self.samples.iter().rev() {
                match s.per_thread.iter().find(|(t, _)| t == tid) {
                    Some((_, t)) if t == ticks => since = s.at,
                    _ => break,
                }
            }
            out.insert(*tid, now.at.saturating_duration_since(since));
        }
        out
    }

    /// How long the whole process has been busy: the oldest sample from which up to `now`
    /// it used (or wanted) at least `busy_pct` of a core on average.
    pub fn busy_for(&self, now: &Sample, hz: u64, busy_pct: u32) -> Duration {
        let mut since = now.at;
        for s in self.samples.iter().rev() {
            if s.at >= now.at {
                continue;
            }
            match cpu_between(s, now, hz) {
                Some(u) if u.busy_pct() >= busy_pct => since = s.at,
                _ => break,
            }
        }
        now.at.saturating_duration_since(since)
    }
}

/// What threads of `b` used since `a`, thread by thread (a thread new in `b` counts whole),
/// so that a thread that exited in between does not make the total go down.
fn per_thread_delta(a: &[(u32, u64)], b: &[(u32, u64)]) -> u64 {
    b.iter()
        .map(|(tid, v)| {
            let before = a.iter().find(|(t, _)| t == tid).map_or(0, |(_, x)| *x);
            v.saturating_sub(before)
        })
        .sum()
}

fn cpu_between(a: &Sample, b: &Sample, hz: u64) -> Option<CpuUse> {
    let wall = b.at.checked_duration_since(a.at)?;
    if wall.is_zero() {
        return None;
    }
    let ticks = if b.per_thread.is_empty() {
        b.total_ticks.saturating_sub(a.total_ticks)
    } else {
        per_thread_delta(&a.per_thread, &b.per_thread)
    };
    let cpu_ms = ticks * 1000 / hz.max(1);
    let wall_ms = wall.as_millis().max(1) as u64;
    let demand = if b.per_thread_demand.is_empty() {
        a.demand_ns
            .zip(b.demand_ns)
            .map(|(x, y)| y.saturating_sub(x))
    } else {
        // The busiest thread present in both: many threads that each wake often (a GIL
        // wait) are not a busy loop, and a new thread's whole life is not in the window.
        b.per_thread_demand
            .iter()
            .filter_map(|(tid, v)| {
                let (_, x) = a.per_thread_demand.iter().find(|(t, _)| t == tid)?;
                Some(v.saturating_sub(*x))
            })
            .max()
    };
    let demand_pct = demand.map(|d| (d / 10_000 / wall_ms) as u32);
    Some(CpuUse {
        pct: (cpu_ms * 100 / wall_ms) as u32,
        window_ms: wall_ms,
        demand_pct,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t0: Instant, secs: u64, total: u64, per: &[(u32, u64)]) -> Sample {
        Sample {
            at: t0 + Duration::from_secs(secs),
            at_unix_nano: 1_000_000_000_000 + secs * 1_000_000_000,
            total_ticks: total,
            demand_ns: None,
            per_thread: per.to_vec(),
            per_thread_demand: Vec::new(),
        }
    }

    #[test]
    fn busy_and_idle_histories() {
        let t0 = Instant::now();
        let mut busy = History::default();
        let mut idle = History::default();
        for i in 0..10u64 {
            busy.push(s(t0, i, i * 100, &[(1, i * 100)]));
            idle.push(s(t0, i, 7, &[(1, 5), (2, 2)]));
        }
        let now_b = s(t0, 10, 1000, &[(1, 1000)]);
        let now_i = s(t0, 10, 7, &[(1, 5), (2, 2)]);
        let u = busy
            .use_recent(Duration::from_secs(5), &now_b, 100)
            .unwrap();
        assert_eq!(u.pct, 100);
        assert_eq!(u.window_ms, 5000);
        assert_eq!(busy.busy_for(&now_b, 100, 80), Duration::from_secs(10));
        assert_eq!(
            idle.use_recent(Duration::from_secs(5), &now_i, 100)
                .unwrap()
                .pct,
            0
        );
        assert_eq!(idle.busy_for(&now_i, 100, 80), Duration::ZERO);
        let idle_for = idle.idle_per_thread(&now_i);
        assert_eq!(idle_for[&1], Duration::from_secs(10));
        // Idle over the whole history: exactly as far back as it reaches.
        assert_eq!(idle.reach(&now_i), Duration::from_secs(10));
        assert_eq!(History::default().reach(&now_i), Duration::ZERO);
        assert_eq!(busy.idle_per_thread(&now_b)[&1], Duration::ZERO);
        // Since a span that started at second 4.
        let since = 1_000_000_000_000 + 4 * 1_000_000_000;
        assert_eq!(busy.use_since(since, &now_b, 100).unwrap().window_ms, 6000);
        // On a loaded machine: 30% CPU got, 100% wanted.
        let mut a = s(t0, 0, 0, &[]);
        let mut b = s(t0, 1, 30, &[]);
        a.demand_ns = Some(0);
        b.demand_ns = Some(1_000_000_000);
        let u = cpu_between(&a, &b, 100).unwrap();
        assert_eq!((u.pct, u.demand_pct, u.busy_pct()), (30, Some(100), 100));
        // A thread that exited in between does not make the total go down.
        let a = s(t0, 0, 0, &[(1, 50), (2, 500)]);
        let b = s(t0, 1, 0, &[(1, 150)]);
        assert_eq!(cpu_between(&a, &b, 100).unwrap().pct, 100);
    }

    #[test]
    fn the_ring_is_bounded() {
        let t0 = Instant::now();
        let mut h = History::default();
        for i in 0..(MAX_SAMPLES as u64 + 10) {
            h.push(s(t0, i, i, &[]));
        }
        assert_eq!(h.len(), MAX_SAMPLES);
        assert!(History::default()
            .use_recent(Duration::from_secs(1), &s(t0, 1, 0, &[]), 100)
            .is_none());
    }
}
