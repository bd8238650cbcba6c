//! Memory per tracked open span: the open-span ledger filled to its default bound
//! (`DEFAULT_MAX_OPEN_SPANS`) under a counting allocator, with ordinary texts and with every
//! text longer than an entry keeps. The figures behind the default
//! (`watchdog/src/config.rs`) and the README: run with `--nocapture` to print them.
//! Its own test binary, for its global allocator.
#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use stallwatch_storage::model::{SpanId, TraceId};
use stallwatch_watchdog::clock::MonoClock;
use stallwatch_watchdog::config::DEFAULT_MAX_OPEN_SPANS;
use stallwatch_watchdog::ledger::{Applied, Ledger};
use stallwatch_watchdog::shapes::{OpenRecord, Record, Shape, SpanKey};
use stallwatch_watchdog::WatchdogConfig;

/// Bytes live on the heap, by this binary's allocator.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter moves.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Ordinary texts: the spans of the report's flood, bound to a runner. Measured 427 B
/// (debug build, glibc malloc sizes as asked, not as rounded).
const ORDINARY_MAX_BYTES_PER_SPAN: f64 = 520.0;
/// Every text past the clip (`MAX_ENTRY_TEXT_BYTES`): name, tool, service, runner id.
/// Measured 1,019 B; without the clip the same spans cost ~8 KiB each.
const LONG_MAX_BYTES_PER_SPAN: f64 = 1200.0;

fn record(i: u64, long: bool) -> Record {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&(i / 8 + 1).to_be_bytes());
    let text = |s: &str| {
        if long {
            format!("{s}{}", "x".repeat(2000))
        } else {
            s.to_string()
        }
    };
    Record::Open(OpenRecord {
        key: SpanKey {
            trace_id: TraceId(t),
            span_id: SpanId((i + 1).to_be_bytes()),
        },
        parent: None,
        name: text(&format!("execute_tool read_file {}", i % 97)),
        tool_attr: Some(text("read_file")),
        semconv_tool: true,
        sla_override_ms: None,
        // a registered runner's id is at most 63 bytes; a longer one is nobody's
        runner_attr: Some(text("py-tools")),
        pid: Some(4242),
        service: text("flood"),
        start_unix_nano: 0,
        shape: Shape::Snapshot,
    })
}

/// Heap bytes per entry of a ledger filled with `n` spans (after its writes were taken, as
/// the worker does: the changed-key set keeps its capacity).
fn bytes_per_span(n: usize, long: bool) -> f64 {
    let mut cfg = WatchdogConfig::default();
    cfg.max_open_spans = n;
    let clock = MonoClock::with_boot_id("boot".into());
    let records: Vec<Record> = (0..n as u64).map(|i| record(i, long)).collect();
    let now = Instant::now();
    let before = LIVE.load(Ordering::Relaxed);
    let mut l = Ledger::new();
    // a registered runner's spans may fill the whole bound
    l.runner_registered("py-tools", now, cfg.sla.max_sla);
    for r in &records {
        let a = l.apply(r, now, 1, &cfg, &|_| None);
        assert!(matches!(a, Applied::Opened | Applied::Untracked), "{a:?}");
    }
    drop(l.take_writes(&clock));
    let after = LIVE.load(Ordering::Relaxed);
    // the registered runner's spans fill the bound; nobody's its first three quarters
    let tracked = if long { n - n / 4 } else { n };
    assert_eq!(l.len(), tracked);
    (after - before) as f64 / tracked as f64
}

#[test]
fn a_tracked_open_span_costs_a_bounded_few_hundred_bytes() {
    let n = DEFAULT_MAX_OPEN_SPANS;
    let ordinary = bytes_per_span(n, false);
    let long = bytes_per_span(n, true);
    let mib = |b: f64| b * n as f64 / (1024.0 * 1024.0);
    println!(
        "per tracked open span: {ordinary:.0} B ordinary, {long:.0} B with every text clipped; \
         at max_open_spans = {n}: {:.1} MiB, {:.1} MiB",
        mib(ordinary),
        mib(long)
    );
    assert!(ordinary <= ORDINARY_MAX_BYTES_PER_SPAN, "{ordinary:.0} B");
    assert!(long <= LONG_MAX_BYTES_PER_SPAN, "{long:.0} B");
}
