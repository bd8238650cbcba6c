//! What the watchdog reads from the open-span ledger for one runner: its open tool spans,
//! the worst of them (highest elapsed / SLA) and the next instant one crosses a threshold
//! (docs/design.md, "Open spans" and "SLA and staleness"). Pure: `now` is given.

use super::*;

impl Ledger {
    /// Open (not inferred) tool spans bound to `runner`.
    pub fn runner_tool_spans(&self, runner: &str) -> Vec<SpanKey> {
        let mut v: Vec<SpanKey> = self
            .by_runner
            .get(runner)
            .into_iter()
            .flatten()
            .filter(|k| {
                self.entries
                    .get(k)
                    .is_some_and(|e| !e.inferred && e.tool.is_some())
            })
            .copied()
            .collect();
        v.sort();
        v
    }

    /// Every entry bound to `runner` whose first arrival is at or before `before`.
    pub fn runner_spans_before(&self, runner: &str, before: Instant) -> Vec<SpanKey> {
        self.runner_spans_before_where(runner, before, |_| true)
    }

    /// [`Ledger::runner_spans_before`] among the entries whose `process.pid` passes `pid`
    /// (`None`: no known process): one process of a runner id ends, and the spans a new
    /// process of the same id already sent stay open.
    pub fn runner_spans_before_where(
        &self,
        runner: &str,
        before: Instant,
        pid: impl Fn(Option<u32>) -> bool,
    ) -> Vec<SpanKey> {
        self.by_runner
            .get(runner)
            .into_iter()
            .flatten()
            .filter(|k| {
                self.entries
                    .get(k)
                    .is_some_and(|e| e.first_seen <= before && pid(e.pid))
            })
            .copied()
            .collect()
    }

    /// Whether `runner`'s view is partial at `now`: one of its tool spans was not tracked
    /// at the bound ([`Applied::Untracked`]) no longer than `max_sla` (`max_sla_ms`, the
    /// ceiling of every SLA) ago. Until then what the ledger shows of it may lack a span
    /// that would change its verdict (a fresh one explaining a lost heartbeat, one more
    /// overdue than a stale one), so only a tracked span over its SLA may trip it
    /// ([`crate::fusion::hold_for_partial_view`]). After that, such a span, if still open,
    /// is past its SLA and the whole view would trip the runner too.
    pub fn partial_view(&self, runner: &str, now: Instant, max_sla: Duration) -> bool {
        self.partial
            .get(runner)
            .is_some_and(|t| now.saturating_duration_since(*t) <= max_sla)
    }

    /// The worst open tool span of `runner` at `now`: highest elapsed / SLA; inferred
    /// entries and restored ones not confirmed since ([`super::Entry::restored`]) never
    /// count (docs/design.md, SLA and staleness; Orphan sweep).
    pub fn worst_for(&self, runner: &str, now: Instant, staleness: Duration) -> Option<WorstView> {
        self.worst_where(runner, now, staleness, |_| true)
    }

    /// [`Ledger::worst_for`] among the spans first seen after `after` only: what a HALF_OPEN
    /// probe is judged against, since the spans from before the trip belong to the tripped
    /// process and close with the breaker (docs/design.md, Fusion and breakers).
    pub fn worst_first_seen_after(
        &self,
        runner: &str,
        after: Instant,
        now: Instant,
        staleness: Duration,
    ) -> Option<WorstView> {
        self.worst_where(runner, now, staleness, |e| e.first_seen > after)
    }

    fn worst_where(
        &self,
        runner: &str,
        now: Instant,
        staleness: Duration,
        keep: impl Fn(&Entry) -> bool,
    ) -> Option<WorstView> {
        let mut best: Option<(f64, &Entry, Duration)> = None;
        for k in self.by_runner.get(runner)? {
            let Some(e) = self.entries.get(k).filter(|e| keep(e)) else {
                continue;
            };
            let (Some(sla), false) = (e.sla, e.inferred || e.restored) else {
                continue;
            };
            let elapsed = now.saturating_duration_since(e.first_seen);
            let ratio = elapsed.as_secs_f64() / sla.as_secs_f64().max(1e-9);
            if best
                .as_ref()
                .is_none_or(|(r, b, _)| ratio > *r || (ratio == *r && e.key < b.key))
            {
                best = Some((ratio, e, sla));
            }
        }
        best.map(|(_, e, sla)| WorstView {
            key: e.key,
            tool: e.tool.clone().unwrap_or_default(),
            elapsed: now.saturating_duration_since(e.first_seen),
            sla,
            stale: e.is_stale(now, staleness),
            since_last_seen: now.saturating_duration_since(e.last_seen),
        })
    }

    /// The next instant at which one of `runner`'s tool spans crosses a threshold: its SLA
    /// (first arrival + SLA) or, once refreshed, its staleness limit (last arrival +
    /// staleness). `None` when no crossing lies ahead. The watchdog wakes for it, so
    /// detection does not wait for a periodic tick.
    pub fn next_crossing(
        &self,
        runner: &str,
        now: Instant,
        staleness: Duration,
    ) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for k in self.by_runner.get(runner)? {
            let Some(e) = self.entries.get(k) else {
                continue;
            };
            let (Some(sla), false) = (e.sla, e.inferred || e.restored) else {
                continue;
            };
            let mut cands = [Some(e.first_seen + sla), None];
            if e.refreshes > 0 {
                cands[1] = Some(e.last_seen + staleness);
            }
            for c in cands.into_iter().flatten() {
                if c >= now && next.is_none_or(|n| c < n) {
                    next = Some(c);
                }
            }
        }
        next
    }
}
