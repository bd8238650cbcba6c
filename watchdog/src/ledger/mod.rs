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
//!
//! **The bound** (`[watchdog] max_open_spans`): the ledger never holds more entries than
//! that, and each entry's texts are clipped to [`MAX_ENTRY_TEXT_BYTES`], so a flood of
//! never-ending spans costs bounded memory (in the durable copy too, which mirrors it). A
//! record that would open an entry beyond the bound is not tracked ([`Applied::Untracked`],
//! counted by [`UntrackedSource`]); entries already tracked are never pushed out, and their
//! refreshes and ends always apply. Spans of registered runners ([`Ledger::runner_registered`])
//! may use the whole bound, any other span only the first three quarters
//! ([`Ledger::has_room`]), so a flood from unregistered sources leaves room for the runners
//! stallwatch watches. An end of an untracked span finds nothing and changes nothing.
//!
//! Not tracking a span can hide a stall (a missed detection), but must never cause a trip:
//! a runner whose tool span was not tracked has a *partial view*
//! ([`Ledger::partial_view`]) until `max_sla_ms` after the last such span, and the runner's
//! step then holds every trip that a missing span could have prevented
//! ([`crate::fusion::hold_for_partial_view`]). After `max_sla_ms` any such span still open
//! is past every SLA, so the whole view would trip the runner anyway.

mod views;

use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashSet};

use stallwatch_storage::ledger::{LedgerRow, LedgerWrite};
use stallwatch_storage::model::{SpanId, SpanState};

use crate::clock::MonoClock;
use crate::config::WatchdogConfig;
use crate::shapes::{OpenRecord, Record, SpanKey};

/// A refresh that changes nothing but `last_seen` is written to storage at most this often
/// per span (1 s): the durable copy's staleness is then at most this much behind.
pub const REFRESH_PERSIST_INTERVAL: Duration = Duration::from_secs(1);

/// How many recently ended keys are remembered, at least, to refuse late re-opens: a key
/// is forgotten no sooner than this many later ends, a repeated end counting again (and
/// once every end of two generations was distinct, no later than twice this many).
pub const RECENTLY_ENDED_CAPACITY: usize = 65_536;

/// Longest text an entry keeps (span name, tool name, `service.name`, runner id), bytes:
/// longer ones are cut at the last character boundary within it. Display only: a span's
/// SLA is resolved from its whole tool name first, and a runner id longer than this is not
/// a valid one (at most 63 bytes), so it never names a registered runner. Without it an
/// entry's size would follow what an exporter sends (up to the 20 MiB request cap).
pub const MAX_ENTRY_TEXT_BYTES: usize = 128;

/// The part of the bound kept for registered runners' spans: `max_open_spans / 4`
/// ([`Ledger::has_room`]).
pub const REGISTERED_RESERVE_DIVISOR: usize = 4;

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
    /// True for an entry loaded from the previous run ([`Ledger::load`]) that no record
    /// has confirmed since: its end may have been sent, and lost, while stallwatch was
    /// down (the exporter gave up its retries), so it is shown but never judged, like an
    /// inferred one, until a record of it arrives (a kit refreshes a running tool span
    /// every few seconds; an end closes it). Judging it had tripped healthy runners whose
    /// span ended during the downtime (docs/design.md, Orphan sweep).
    pub restored: bool,
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
    /// A new span was not tracked: the ledger is at its bound (`max_open_spans`, or the
    /// share of it open to spans of no registered runner). Counted by [`UntrackedSource`].
    Untracked,
}

/// Whose span the ledger did not track at its bound (the `source` label of
/// `stallwatch_watchdog_ledger_untracked_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UntrackedSource {
    /// A span bound to a registered runner (its view becomes partial).
    RegisteredRunner,
    /// Any other span: no runner, or a runner id or pid no registered runner has.
    Other,
}

impl UntrackedSource {
    /// Every source, in [`UntrackedSource::index`] order.
    pub const ALL: [UntrackedSource; 2] =
        [UntrackedSource::RegisteredRunner, UntrackedSource::Other];

    /// `registered_runner` or `other`.
    pub fn as_str(&self) -> &'static str {
        match self {
            UntrackedSource::RegisteredRunner => "registered_runner",
            UntrackedSource::Other => "other",
        }
    }

    /// Index into [`UntrackedSource::ALL`].
    pub fn index(&self) -> usize {
        match self {
            UntrackedSource::RegisteredRunner => 0,
            UntrackedSource::Other => 1,
        }
    }
}

/// `s` cut to at most [`MAX_ENTRY_TEXT_BYTES`], at a character boundary.
pub fn clipped(s: &str) -> &str {
    if s.len() <= MAX_ENTRY_TEXT_BYTES {
        return s;
    }
    let mut cut = MAX_ENTRY_TEXT_BYTES;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

fn clip(s: &str) -> String {
    clipped(s).to_string()
}

/// The keys of recently ended spans, in two generations: a key stays in `current` until
/// an end finds it full ([`RECENTLY_ENDED_CAPACITY`] ends), then in `previous` until that
/// happens again, so it is remembered for at least that many later ends.
///
/// Every span of every trace export ends here, so this is on the ingest path: aging a
/// whole generation at once (a swap and a clear that keeps the allocation) replaced a
/// queue and one hash-set removal per end, which with SipHash was ~11% of a dist
/// stallwatch's ingest CPU (issue 16; `perf record -e cpu-clock` under otlp-blast).
///
/// A key is remembered as its 64-bit fingerprint (foldhash, seeded per process, so an
/// exporter cannot aim at a collision). Two keys share a fingerprint with probability
/// about 2^-64 per pair: then a late open record of one of them is ignored as if it had
/// ended (the watchdog misses that snapshot; it never trips for it).
///
/// Ends are many and lookups few (only an open record asks, for itself and the parent it
/// names), so an end is only appended to its generation's log, a sequential write, and a
/// lookup first moves what the logs gathered into their sets ([`Generation::catch_up`]).
/// The inserts are put off, not saved: while no open record arrives (otlp-blast's exports,
/// all ended) none is paid, and the insert per end, a cache miss into the sets, was ~4% of
/// ingest CPU there (`Ledger::close` 3.6% → 0.2% of samples, issue 16, `perf record` at
/// HTTP/protobuf c=4); with open records arriving each end is inserted once, as before,
/// plus the append, and the first lookup after a long run of ends pays for up to two
/// generations at once (up to 131,072 inserts; not measured as time). A repeated end is appended again, so a retried export
/// of ended spans uses a generation twice as fast (the capacity counts ends). Memory: a
/// full set ~1.1 MiB (65,536 keys in 131,072 buckets of 9 bytes), a full log 0.5 MiB, both
/// kept through a clear: at most ~3.3 MiB for the two generations.
#[derive(Debug, Default)]
struct RecentlyEnded {
    seed: foldhash::fast::RandomState,
    current: Generation,
    previous: Generation,
}

/// One generation of [`RecentlyEnded`]: fingerprints not yet looked up in arrival order
/// (`log`), the others as a set.
#[derive(Debug, Default)]
struct Generation {
    log: Vec<u64>,
    set: HashSet<u64>,
}

impl Generation {
    /// Ends recorded (an end repeated counts again while it waits in the log).
    fn len(&self) -> usize {
        self.set.len() + self.log.len()
    }

    /// Moves the log into the set.
    fn catch_up(&mut self) {
        if !self.log.is_empty() {
            self.set.extend(self.log.drain(..));
        }
    }

    fn clear(&mut self) {
        self.log.clear();
        self.set.clear();
    }
}

impl RecentlyEnded {
    fn fingerprint(&self, key: &SpanKey) -> u64 {
        self.seed.hash_one(key)
    }

    fn insert(&mut self, key: SpanKey) {
        let f = self.fingerprint(&key);
        if self.current.len() >= RECENTLY_ENDED_CAPACITY {
            std::mem::swap(&mut self.current, &mut self.previous);
            self.current.clear();
        }
        self.current.log.push(f);
    }

    fn contains(&mut self, key: &SpanKey) -> bool {
        let f = self.fingerprint(key);
        self.current.catch_up();
        self.previous.catch_up();
        self.current.set.contains(&f) || self.previous.set.contains(&f)
    }

    /// Ends remembered, in both generations.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

/// The in-memory open-span ledger.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: HashMap<SpanKey, Entry>,
    by_runner: HashMap<String, HashSet<SpanKey>>,
    ended: RecentlyEnded,
    dirty: HashSet<SpanKey>,
    /// Ids of the registered runners (the worker keeps it current): their spans may use
    /// the whole bound.
    registered: HashSet<String>,
    /// Registered runners whose tool span was not tracked, and when the last one arrived
    /// (at most one key per registered runner).
    partial: HashMap<String, Instant>,
    /// When the last tool span that named a runner no registered runner had (by
    /// `stallwatch.runner.id` or `process.pid`) was not tracked: a runner registered later
    /// may be that one ([`Ledger::runner_registered`]).
    refused_unbound_at: Option<Instant>,
    /// Spans not tracked at the bound, by [`UntrackedSource::index`] (monotonic).
    untracked: [u64; 2],
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

    /// Whether a new entry may be opened under the bound `max` (`max_open_spans`): one for
    /// a span of a registered runner while fewer than `max` entries are held; any other
    /// while fewer than `max - max / REGISTERED_RESERVE_DIVISOR` are (the last quarter is
    /// kept for the runners stallwatch watches).
    pub fn has_room(&self, for_registered: bool, max: usize) -> bool {
        let limit = if for_registered {
            max
        } else {
            max - max / REGISTERED_RESERVE_DIVISOR
        };
        self.entries.len() < limit
    }

    /// Spans not tracked at the bound so far, from `source` (monotonic).
    pub fn untracked(&self, source: UntrackedSource) -> u64 {
        self.untracked[source.index()]
    }

    /// `id` is registered (again): its spans may use the whole bound from now on. When a
    /// tool span naming a runner that was not registered then was not tracked within the
    /// last `max_sla`, it may have been this one's (sent before its registration): its view
    /// is partial from then ([`Ledger::partial_view`]).
    pub fn runner_registered(&mut self, id: &str, now: Instant, max_sla: Duration) {
        if !self.registered.contains(id) {
            self.registered.insert(id.to_string());
        }
        if let Some(t) = self.refused_unbound_at {
            if now.saturating_duration_since(t) <= max_sla {
                let p = self.partial.entry(id.to_string()).or_insert(t);
                *p = (*p).max(t);
            }
        }
    }

    /// `id` is no longer registered (removed): its spans count as anyone's again.
    pub fn runner_removed(&mut self, id: &str) {
        self.registered.remove(id);
        self.partial.remove(id);
    }

    /// Forgets the partial views older than `max_sla` (see [`Ledger::partial_view`]).
    pub fn forget_partial_views(&mut self, now: Instant, max_sla: Duration) {
        let fresh = |t: &Instant| now.saturating_duration_since(*t) <= max_sla;
        self.partial.retain(|_, t| fresh(t));
        if !self.refused_unbound_at.as_ref().is_some_and(fresh) {
            self.refused_unbound_at = None;
        }
    }

    /// A new span was not tracked: counts it and, for a tool span, marks whose view is
    /// partial now.
    fn refuse(
        &mut self,
        rec: &OpenRecord,
        runner: Option<&str>,
        registered: bool,
        tool: bool,
        now: Instant,
    ) {
        let source = if registered {
            UntrackedSource::RegisteredRunner
        } else {
            UntrackedSource::Other
        };
        self.untracked[source.index()] += 1;
        if !tool {
            return;
        }
        match runner {
            Some(r) if registered => match self.partial.get_mut(r) {
                Some(t) => *t = (*t).max(now),
                None => {
                    self.partial.insert(r.to_string(), now);
                }
            },
            // a span that names a runner may become a registered runner's (a registration
            // by that id or pid); one that names none never can
            _ if rec.runner_attr.is_some() || rec.pid.is_some() => {
                self.refused_unbound_at = Some(self.refused_unbound_at.map_or(now, |t| t.max(now)));
            }
            _ => {}
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
        self.ended.insert(key);
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
            .as_deref()
            .map(clip)
            .or_else(|| rec.pid.and_then(pid_runner));
        let is_tool = rec.semconv_tool || config.name_is_tool(&rec.name);
        let tool_name = is_tool.then(|| rec.tool_attr.as_deref().unwrap_or(&rec.name));
        // the SLA is resolved from the whole tool name, the entry keeps it clipped
        let sla = tool_name.map(|t| config.sla.resolve(t, rec.sla_override_ms).0);
        let tool = tool_name.map(clip);
        let name = clipped(&rec.name);
        let service = clipped(&rec.service);
        let mut persist = false;
        let applied = match self.entries.get_mut(&rec.key) {
            Some(e) => {
                let was_inferred = e.inferred;
                if !was_inferred {
                    e.refreshes = e.refreshes.saturating_add(1);
                }
                // a plain refresh is persisted at most once per REFRESH_PERSIST_INTERVAL
                let material = was_inferred
                    || e.name != name
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
                e.restored = false;
                e.last_seen = e.last_seen.max(now);
                e.last_seen_unix_nano = e.last_seen_unix_nano.max(now_unix_nano);
                if e.name != name {
                    e.name = name.to_string();
                }
                e.tool = tool;
                e.sla = sla;
                e.sla_override_ms = rec.sla_override_ms;
                e.parent = rec.parent.or(e.parent);
                if e.service != service {
                    e.service = service.to_string();
                }
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
                let registered = runner
                    .as_deref()
                    .is_some_and(|r| self.registered.contains(r));
                if !self.has_room(registered, config.max_open_spans) {
                    // not tracked, nor its parent inferred: counted, and its runner's view
                    // marked partial when it is a tool span
                    self.refuse(rec, runner.as_deref(), registered, sla.is_some(), now);
                    return Applied::Untracked;
                }
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
            self.infer_parent(
                rec,
                parent,
                runner,
                now,
                now_unix_nano,
                config.max_open_spans,
            );
        }
        applied
    }

    /// Makes (or refreshes) the inferred entry of `parent`, named by the open `rec`. Under
    /// the bound as any new entry ([`Ledger::has_room`]); an inferred parent not made is not
    /// counted as untracked (it was never sent, and is never acted on).
    fn infer_parent(
        &mut self,
        rec: &OpenRecord,
        parent: SpanId,
        runner: Option<String>,
        now: Instant,
        now_unix_nano: u64,
        max: usize,
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
                let registered = runner
                    .as_deref()
                    .is_some_and(|r| self.registered.contains(r));
                if !self.has_room(registered, max) {
                    return;
                }
                self.entries.insert(
                    pkey,
                    Entry {
                        key: pkey,
                        parent: None,
                        name: String::new(),
                        tool: None,
                        runner: runner.clone(),
                        service: clip(&rec.service),
                        pid: rec.pid,
                        sla_override_ms: None,
                        sla: None,
                        inferred: true,
                        restored: false,
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

    /// Drops inferred entries not refreshed for `max_age` (a parent that never arrives),
    /// and restored ones no record confirmed for as long (an end lost while stallwatch was
    /// down).
    pub fn sweep_inferred(&mut self, now: Instant, max_age: Duration) {
        let old: Vec<SpanKey> = self
            .entries
            .values()
            .filter(|e| {
                (e.inferred || e.restored) && now.saturating_duration_since(e.last_seen) > max_age
            })
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
    /// Every loaded entry is [`Entry::restored`] until a record of it arrives. The caller
    /// gives at most the bound's rows (`Storage::ledger_load` takes it as its limit).
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
            let runner = r.runner_id.as_deref().map(clip);
            let e = Entry {
                key,
                parent: r.parent_span_id,
                name: clip(&r.name),
                tool: r.tool_name.as_deref().map(clip),
                runner: runner.clone(),
                service: clip(&r.service_name),
                pid: r.pid,
                sla_override_ms: r.sla_override_ms.map(|v| v.min(i64::MAX as u64) as i64),
                sla: r.sla_ms.map(Duration::from_millis),
                inferred: r.state == SpanState::Inferred,
                restored: true,
                first_seen: first,
                last_seen: last,
                refreshes,
                first_seen_unix_nano: r.first_seen_unix_nano,
                last_seen_unix_nano: r.last_seen_unix_nano,
                persisted_last_seen: last,
            };
            self.entries.insert(key, e);
            self.index(key, &runner);
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
        name: clip(&rec.name),
        tool,
        runner,
        service: clip(&rec.service),
        pid: rec.pid,
        sla_override_ms: rec.sla_override_ms,
        sla,
        inferred: false,
        restored: false,
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
mod tests;
