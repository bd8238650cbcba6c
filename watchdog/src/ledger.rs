//! The open-span ledger's in-memory index (docs/design.md, "Open spans"): every span seen running
//! and not yet seen end, keyed by (trace id, span id), with the parents its open children
//! name (*inferred*). A pure core: every method takes `now` (stallwatch's monotonic clock
//! at arrival, never an exporter clock) and does no I/O.
//!
//! The first record opens an entry, later ones refresh `last_seen`, an ended record closes
//! it; a bounded memory of recently ended keys keeps a late heartbeat from reopening a
//! span that already ended ("the ended one wins"). Changed keys are collected and handed to
//! storage in batches ([`Ledger::take_writes`]) so the durable copy costs one transaction
//! per batch, not one per span.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use stallwatch_storage::ledger::{LedgerRow, LedgerWrite};
use stallwatch_storage::model::{SpanId, SpanState};

use crate::clock::MonoClock;
use crate::config::WatchdogConfig;
use crate::shapes::{OpenRecord, Record, SpanKey};

/// A refresh that changes nothing but `last_seen` is written to storage at most this often
/// per span (1 s): the durable copy's staleness is then at most this much behind.
pub const REFRESH_PERSIST_INTERVAL: Duration = Duration::from_secs(1);

/// How many recently ended keys are remembered to refuse late re-opens.
pub const RECENTLY_ENDED_CAPACITY: usize = 65_536;

/// One ledger entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Its key.
    pub key: SpanKey,
    /// Parent span, when known.
    pub parent: Option<SpanId>,
    /// Span name (empty for an inferred parent).
    pub name: String,
    /// Tool name when the span is a tool span (docs/design.md, Tool spans).
    pub tool: Option<String>,
    /// Runner bound by `stallwatch.runner.id`, else by `process.pid`.
    pub runner: Option<String>,
    /// `service.name`.
    pub service: String,
    /// `process.pid`.
    pub pid: Option<u32>,
    /// The span's `stallwatch.sla_ms`, as sent.
    pub sla_override_ms: Option<i64>,
    /// Effective SLA (tool spans only).
    pub sla: Option<Duration>,
    /// True for a parent only named by an open child: shown, never acted on.
    pub inferred: bool,
    /// First arrival.
    pub first_seen: Instant,
    /// Latest arrival.
    pub last_seen: Instant,
    /// Records after the first (staleness applies only when ≥ 1).
    pub refreshes: u32,
    /// First arrival, ns since the Unix epoch (display).
    pub first_seen_unix_nano: u64,
    /// Latest arrival, ns since the Unix epoch (display).
    pub last_seen_unix_nano: u64,
    /// `last_seen` as of the latest write to storage (refreshes are persisted at most once
    /// per [`REFRESH_PERSIST_INTERVAL`]).
    pub persisted_last_seen: Instant,
}

impl Entry {
    /// True when the span was refreshed at least once and nothing arrived for longer than
    /// `staleness` (docs/design.md, SLA and staleness).
    pub fn is_stale(&self, now: Instant, staleness: Duration) -> bool {
        self.refreshes > 0 && now.saturating_duration_since(self.last_seen) > staleness
    }
}

/// A runner's worst open tool span at some instant (highest elapsed / SLA).
#[derive(Clone, Debug, PartialEq)]
pub struct WorstView {
    /// Its key.
    pub key: SpanKey,
    /// Tool name.
    pub tool: String,
    /// Time since first arrival.
    pub elapsed: Duration,
    /// Effective SLA.
    pub sla: Duration,
    /// Stale (refreshed once, then silent past the staleness limit).
    pub stale: bool,
    /// Time since the latest arrival.
    pub since_last_seen: Duration,
}

/// What applying one record did (for counters and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A new entry was opened.
    Opened,
    /// An existing entry was refreshed (or an inferred one became open).
    Refreshed,
    /// An entry was closed.
    Closed,
    /// Nothing changed (an end for an unknown span, or a late open after its end).
    Ignored,
}

/// The in-memory open-span ledger.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: HashMap<SpanKey, Entry>,
    by_runner: HashMap<String, HashSet<SpanKey>>,
    ended: HashSet<SpanKey>,
    ended_order: VecDeque<SpanKey>,
    dirty: HashSet<SpanKey>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of entries (open and inferred).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for `key`.
    pub fn get(&self, key: &SpanKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Every entry, in no order.
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    fn remember_ended(&mut self, key: SpanKey) {
        if self.ended.insert(key) {
            self.ended_order.push_back(key);
            while self.ended_order.len() > RECENTLY_ENDED_CAPACITY {
                if let Some(old) = self.ended_order.pop_front() {
                    self.ended.remove(&old);
                }
            }
        }
    }

    fn unindex(&mut self, e: &Entry) {
        if let Some(r) = &e.runner {
            if let Some(set) = self.by_runner.get_mut(r) {
                set.remove(&e.key);
                if set.is_empty() {
                    self.by_runner.remove(r);
                }
            }
        }
    }

    fn index(&mut self, key: SpanKey, runner: &Option<String>) {
        if let Some(r) = runner {
            self.by_runner.entry(r.clone()).or_default().insert(key);
        }
    }

    /// Removes `key` (its span ended or its runner was stopped). Answers whether it was there.
    pub fn close(&mut self, key: SpanKey) -> bool {
        self.remember_ended(key);
        match self.entries.remove(&key) {
            Some(e) => {
                self.unindex(&e);
                self.dirty.insert(key);
                true
            }
            None => false,
        }
    }

    /// Applies one record that arrived at `now` (`now_unix_nano` for display). `pid_runner`
    /// maps a `process.pid` to a registered runner id.
    pub fn apply(
        &mut self,
        record: &Record,
        now: Instant,
        now_unix_nano: u64,
        config: &WatchdogConfig,
        pid_runner: &dyn Fn(u32) -> Option<String>,
    ) -> Applied {
        let rec = match record {
            Record::Ended(key) => {
                return if self.close(*key) {
                    Applied::Closed
                } else {
                    Applied::Ignored
                };
            }
            Record::Open(r) => r,
        };
        if self.ended.contains(&rec.key) {
            return Applied::Ignored;
        }
        let runner = rec
            .runner_attr
            .clone()
            .or_else(|| rec.pid.and_then(pid_runner));
        let is_tool = rec.semconv_tool || config.name_is_tool(&rec.name);
        let tool = is_tool.then(|| rec.tool_attr.clone().unwrap_or_else(|| rec.name.clone()));
        let sla = tool
            .as_deref()
            .map(|t| config.sla.resolve(t, rec.sla_override_ms).0);
        let mut persist = false;
        let applied = match self.entries.get_mut(&rec.key) {
            Some(e) => {
                let was_inferred = e.inferred;
                if !was_inferred {
                    e.refreshes = e.refreshes.saturating_add(1);
                }
                // a plain refresh is persisted at most once per REFRESH_PERSIST_INTERVAL
                let material = was_inferred
                    || e.name != rec.name
                    || e.sla_override_ms != rec.sla_override_ms
                    || now.saturating_duration_since(e.persisted_last_seen)
                        >= REFRESH_PERSIST_INTERVAL;
                if material {
                    e.persisted_last_seen = now.max(e.last_seen);
                    persist = true;
                }
                if was_inferred {
                    // first seen as a parent; its own start time is now known
                    let (t, u) = backdated_start(
                        rec.start_unix_nano,
                        now,
                        now_unix_nano,
                        config.max_backdate,
                    );
                    if t < e.first_seen {
                        e.first_seen = t;
                        e.first_seen_unix_nano = u;
                    }
                }
                e.inferred = false;
                e.last_seen = e.last_seen.max(now);
                e.last_seen_unix_nano = e.last_seen_unix_nano.max(now_unix_nano);
                e.name = rec.name.clone();
                e.tool = tool;
                e.sla = sla;
                e.sla_override_ms = rec.sla_override_ms;
                e.parent = rec.parent.or(e.parent);
                e.service = rec.service.clone();
                e.pid = rec.pid.or(e.pid);
                if runner.is_some() && e.runner != runner {
                    let old = e.clone();
                    self.unindex(&old);
                    if let Some(e) = self.entries.get_mut(&rec.key) {
                        e.runner = runner.clone();
                    }
                    self.index(rec.key, &runner);
                    persist = true;
                }
                Applied::Refreshed
            }
            None => {
                self.entries.insert(
                    rec.key,
                    new_entry(
                        rec,
                        runner.clone(),
                        tool,
                        sla,
                        now,
                        now_unix_nano,
                        config.max_backdate,
                    ),
                );
                self.index(rec.key, &runner);
                persist = true;
                Applied::Opened
            }
        };
        if persist {
            self.dirty.insert(rec.key);
        }
        if let Some(parent) = rec.parent {
            self.infer_parent(rec, parent, runner, now, now_unix_nano);
        }
        applied
    }

    fn infer_parent(
        &mut self,
        rec: &OpenRecord,
        parent: SpanId,
        runner: Option<String>,
        now: Instant,
        now_unix_nano: u64,
    ) {
        let pkey = SpanKey {
            trace_id: rec.key.trace_id,
            span_id: parent,
        };
        if self.ended.contains(&pkey) {
            return;
        }
        match self.entries.get_mut(&pkey) {
            Some(p) if p.inferred => {
                p.last_seen = p.last_seen.max(now);
                p.last_seen_unix_nano = p.last_seen_unix_nano.max(now_unix_nano);
            }
            Some(_) => return,
            None => {
                self.entries.insert(
                    pkey,
                    Entry {
                        key: pkey,
                        parent: None,
                        name: String::new(),
                        tool: None,
                        runner: runner.clone(),
                        service: rec.service.clone(),
                        pid: rec.pid,
                        sla_override_ms: None,
                        sla: None,
                        inferred: true,
                        first_seen: now,
                        last_seen: now,
                        refreshes: 0,
                        first_seen_unix_nano: now_unix_nano,
                        last_seen_unix_nano: now_unix_nano,
                        persisted_last_seen: now,
                    },
                );
                self.index(pkey, &runner);
            }
        }
        self.dirty.insert(pkey);
    }

    /// Binds entries that carry `pid` and no runner to `runner` (a runner registered after
    /// its spans arrived, matched by `process.pid`).
    pub fn bind_pid(&mut self, pid: u32, runner: &str) {
        let keys: Vec<SpanKey> = self
            .entries
            .values()
            .filter(|e| e.runner.is_none() && e.pid == Some(pid))
            .map(|e| e.key)
            .collect();
        for k in keys {
            if let Some(e) = self.entries.get_mut(&k) {
                e.runner = Some(runner.to_string());
            }
            self.index(k, &Some(runner.to_string()));
            self.dirty.insert(k);
        }
    }

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
        self.by_runner
            .get(runner)
            .into_iter()
            .flatten()
            .filter(|k| self.entries.get(k).is_some_and(|e| e.first_seen <= before))
            .copied()
            .collect()
    }

    /// The worst open tool span of `runner` at `now`: highest elapsed / SLA; inferred
    /// entries never count (docs/design.md, SLA and staleness).
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
            let (Some(sla), false) = (e.sla, e.inferred) else {
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
            let (Some(sla), false) = (e.sla, e.inferred) else {
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

    /// Drops inferred entries not refreshed for `max_age` (a parent that never arrives).
    pub fn sweep_inferred(&mut self, now: Instant, max_age: Duration) {
        let old: Vec<SpanKey> = self
            .entries
            .values()
            .filter(|e| e.inferred && now.saturating_duration_since(e.last_seen) > max_age)
            .map(|e| e.key)
            .collect();
        for k in old {
            if let Some(e) = self.entries.remove(&k) {
                self.unindex(&e);
                self.dirty.insert(k);
            }
        }
    }

    /// Number of keys changed since the last [`Ledger::take_writes`].
    pub fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    /// The storage writes for every key changed since the last call (one per key: an
    /// upsert of the current entry, or a removal).
    pub fn take_writes(&mut self, clock: &MonoClock) -> Vec<LedgerWrite> {
        let dirty = std::mem::take(&mut self.dirty);
        dirty
            .into_iter()
            .map(|k| match self.entries.get(&k) {
                Some(e) => LedgerWrite::Upsert(Box::new(to_row(e, clock))),
                None => LedgerWrite::Remove(k.trace_id, k.span_id),
            })
            .collect()
    }

    /// Rebuilds entries from the durable copy (at start). Rows from another boot get
    /// `now` as their arrival times (their monotonic offsets mean nothing after a reboot).
    pub fn load(&mut self, rows: Vec<LedgerRow>, clock: &MonoClock, now: Instant) {
        for r in rows {
            let key = SpanKey {
                trace_id: r.trace_id,
                span_id: r.span_id,
            };
            let (first, last, refreshes) = match (
                clock.to_instant(&r.boot_id, r.first_seen_mono_ns),
                clock.to_instant(&r.boot_id, r.last_seen_mono_ns),
            ) {
                (Some(f), Some(l)) => (f, l, r.refreshes),
                _ => (now, now, 0),
            };
            let e = Entry {
                key,
                parent: r.parent_span_id,
                name: r.name,
                tool: r.tool_name,
                runner: r.runner_id.clone(),
                service: r.service_name,
                pid: r.pid,
                sla_override_ms: r.sla_override_ms.map(|v| v.min(i64::MAX as u64) as i64),
                sla: r.sla_ms.map(Duration::from_millis),
                inferred: r.state == SpanState::Inferred,
                first_seen: first,
                last_seen: last,
                refreshes,
                first_seen_unix_nano: r.first_seen_unix_nano,
                last_seen_unix_nano: r.last_seen_unix_nano,
                persisted_last_seen: last,
            };
            self.entries.insert(key, e);
            self.index(key, &r.runner_id);
        }
    }
}

/// When a span that arrived at `now` (`now_unix_nano` on stallwatch's wall clock) started,
/// on the monotonic clock and the wall clock: its own `start_unix_nano` when plausible (not
/// in the future, at most `max_backdate` before its arrival), else its arrival. Exporters on
/// this machine share stallwatch's wall clock, so a first export that arrives late does not
/// delay a trip by the delay (`docs/design.md`, Fusion and breakers; issue 12 #13).
pub fn backdated_start(
    start_unix_nano: u64,
    now: Instant,
    now_unix_nano: u64,
    max_backdate: Duration,
) -> (Instant, u64) {
    if start_unix_nano == 0 || start_unix_nano > now_unix_nano {
        return (now, now_unix_nano);
    }
    let back = Duration::from_nanos(now_unix_nano - start_unix_nano);
    if back > max_backdate {
        return (now, now_unix_nano);
    }
    match now.checked_sub(back) {
        Some(t) => (t, start_unix_nano),
        None => (now, now_unix_nano),
    }
}

fn new_entry(
    rec: &OpenRecord,
    runner: Option<String>,
    tool: Option<String>,
    sla: Option<Duration>,
    now: Instant,
    now_unix_nano: u64,
    max_backdate: Duration,
) -> Entry {
    let (first_seen, first_seen_unix_nano) =
        backdated_start(rec.start_unix_nano, now, now_unix_nano, max_backdate);
    Entry {
        key: rec.key,
        parent: rec.parent,
        name: rec.name.clone(),
        tool,
        runner,
        service: rec.service.clone(),
        pid: rec.pid,
        sla_override_ms: rec.sla_override_ms,
        sla,
        inferred: false,
        first_seen,
        last_seen: now,
        refreshes: 0,
        first_seen_unix_nano,
        last_seen_unix_nano: now_unix_nano,
        persisted_last_seen: now,
    }
}

fn to_row(e: &Entry, clock: &MonoClock) -> LedgerRow {
    LedgerRow {
        trace_id: e.key.trace_id,
        span_id: e.key.span_id,
        parent_span_id: e.parent,
        name: e.name.clone(),
        tool_name: e.tool.clone(),
        runner_id: e.runner.clone(),
        service_name: e.service.clone(),
        pid: e.pid,
        state: if e.inferred {
            SpanState::Inferred
        } else {
            SpanState::Open
        },
        boot_id: clock.boot_id().to_string(),
        first_seen_mono_ns: clock.to_mono_ns(e.first_seen),
        last_seen_mono_ns: clock.to_mono_ns(e.last_seen),
        refreshes: e.refreshes,
        first_seen_unix_nano: e.first_seen_unix_nano,
        last_seen_unix_nano: e.last_seen_unix_nano,
        sla_ms: e.sla.map(|d| d.as_millis() as u64),
        sla_override_ms: e.sla_override_ms.and_then(|v| u64::try_from(v).ok()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapes::Shape;
    use stallwatch_storage::model::TraceId;

    fn key(s: u8) -> SpanKey {
        SpanKey {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([s; 8]),
        }
    }

    fn open(s: u8, parent: Option<u8>, tool: bool) -> Record {
        Record::Open(OpenRecord {
            key: key(s),
            parent: parent.map(|p| SpanId([p; 8])),
            name: format!("span{s}"),
            tool_attr: None,
            semconv_tool: tool,
            sla_override_ms: None,
            runner_attr: Some("r1".into()),
            pid: None,
            service: "svc".into(),
            start_unix_nano: 0,
            shape: Shape::Snapshot,
        })
    }

    /// Issue 12 #13: age counts from the span's own start when plausible, else arrival.
    #[test]
    fn start_time_backdates_within_the_window_only() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let arr = 1_000_000_000_000u64;
        let w = Duration::from_secs(10);
        let s3 = arr - 3_000_000_000;
        assert_eq!(
            backdated_start(s3, t0, arr, w),
            (t0 - Duration::from_secs(3), s3)
        );
        // future, too old, unknown: arrival
        assert_eq!(backdated_start(arr + 1, t0, arr, w), (t0, arr));
        assert_eq!(backdated_start(arr - 11_000_000_000, t0, arr, w), (t0, arr));
        assert_eq!(backdated_start(0, t0, arr, w), (t0, arr));
        let cfg = WatchdogConfig::default();
        let mut l = Ledger::new();
        let Record::Open(mut r) = open(2, None, true) else {
            unreachable!()
        };
        r.start_unix_nano = s3;
        l.apply(&Record::Open(r), t0, arr, &cfg, &|_| None);
        let w = l.worst_for("r1", t0, cfg.staleness).unwrap();
        assert_eq!(w.elapsed, Duration::from_secs(3));
    }

    #[test]
    fn open_refresh_close_and_no_late_reopen() {
        let cfg = WatchdogConfig::default();
        let mut l = Ledger::new();
        let t0 = Instant::now();
        let none = |_| None;
        assert_eq!(
            l.apply(&open(2, Some(1), true), t0, 1, &cfg, &none),
            Applied::Opened
        );
        // the parent is inferred, never a tool span
        assert!(l.get(&key(1)).unwrap().inferred);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(
            l.apply(&open(2, Some(1), true), later, 2, &cfg, &none),
            Applied::Refreshed
        );
        assert_eq!(l.get(&key(2)).unwrap().refreshes, 1);
        assert_eq!(l.get(&key(2)).unwrap().first_seen, t0);
        let w = l.worst_for("r1", later, cfg.staleness).unwrap();
        assert_eq!(w.key, key(2));
        assert_eq!(w.sla, Duration::from_secs(60));
        assert_eq!(
            l.apply(&Record::Ended(key(2)), later, 3, &cfg, &none),
            Applied::Closed
        );
        assert_eq!(
            l.apply(&open(2, Some(1), true), later, 4, &cfg, &none),
            Applied::Ignored
        );
        assert!(l.worst_for("r1", later, cfg.staleness).is_none());
        // the inferred parent opens for real, then ends
        assert_eq!(
            l.apply(&open(1, None, false), later, 5, &cfg, &none),
            Applied::Refreshed
        );
        assert!(!l.get(&key(1)).unwrap().inferred);
        assert_eq!(
            l.apply(&Record::Ended(key(1)), later, 6, &cfg, &none),
            Applied::Closed
        );
        assert!(l.is_empty());
    }

    #[test]
    fn staleness_needs_one_refresh() {
        let cfg = WatchdogConfig::default();
        let mut l = Ledger::new();
        let t0 = Instant::now();
        let none = |_| None;
        l.apply(&open(3, None, true), t0, 1, &cfg, &none);
        let far = t0 + Duration::from_secs(40);
        assert!(!l.worst_for("r1", far, cfg.staleness).unwrap().stale);
        l.apply(
            &open(3, None, true),
            t0 + Duration::from_secs(1),
            2,
            &cfg,
            &none,
        );
        assert!(l.worst_for("r1", far, cfg.staleness).unwrap().stale);
    }

    #[test]
    fn worst_is_highest_elapsed_over_sla() {
        let cfg = WatchdogConfig::default();
        let mut l = Ledger::new();
        let t0 = Instant::now();
        let none = |_| None;
        // span 4: default 60 s SLA, opened at t0; span 5: override 2 s, opened 1 s later
        l.apply(&open(4, None, true), t0, 1, &cfg, &none);
        let Record::Open(mut r) = open(5, None, true) else {
            unreachable!()
        };
        r.sla_override_ms = Some(2000);
        l.apply(
            &Record::Open(r),
            t0 + Duration::from_secs(1),
            2,
            &cfg,
            &none,
        );
        let w = l
            .worst_for("r1", t0 + Duration::from_secs(2), cfg.staleness)
            .unwrap();
        assert_eq!(w.key, key(5));
        assert_eq!(w.sla, Duration::from_secs(2));
    }

    #[test]
    fn pid_binding_after_registration() {
        let cfg = WatchdogConfig::default();
        let mut l = Ledger::new();
        let t0 = Instant::now();
        let Record::Open(mut r) = open(6, None, true) else {
            unreachable!()
        };
        r.runner_attr = None;
        r.pid = Some(777);
        l.apply(&Record::Open(r.clone()), t0, 1, &cfg, &|p| {
            (p == 777).then(|| "rp".to_string())
        });
        assert_eq!(l.runner_tool_spans("rp"), vec![key(6)]);
        let mut l = Ledger::new();
        l.apply(&Record::Open(r), t0, 1, &cfg, &|_| None);
        assert!(l.runner_tool_spans("rp").is_empty());
        l.bind_pid(777, "rp");
        assert_eq!(l.runner_tool_spans("rp"), vec![key(6)]);
    }
}
