//! The open-span ledger against its rules (docs/design.md, "Open spans").

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

fn numbered_key(i: u64) -> SpanKey {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&i.to_le_bytes());
    SpanKey {
        trace_id: TraceId(t),
        span_id: SpanId(i.to_le_bytes()),
    }
}

/// The memory of ended keys: an ended span is refused a late re-open for at least
/// `RECENTLY_ENDED_CAPACITY` later ends, and the memory stays bounded (forgotten by twice
/// that), whether or not the span was ever open.
#[test]
fn an_ended_key_is_remembered_for_at_least_the_capacity_and_then_forgotten() {
    let cfg = WatchdogConfig::default();
    let t0 = Instant::now();
    let mut l = Ledger::new();
    // the first end lands at every position of a generation in turn (0 and CAPACITY - 1 are
    // the extremes of how long it is kept)
    for warmup in [0u64, 1, RECENTLY_ENDED_CAPACITY as u64 - 1] {
        let mut l2 = Ledger::new();
        for i in 0..warmup {
            l2.close(numbered_key(1_000_000_000 + i));
        }
        let k = numbered_key(7);
        l2.close(k);
        for i in 0..RECENTLY_ENDED_CAPACITY as u64 {
            l2.close(numbered_key(2_000_000_000 + i));
        }
        assert!(
            l2.ended.contains(&k),
            "forgotten within {RECENTLY_ENDED_CAPACITY} later ends (warm-up {warmup})"
        );
        for i in 0..RECENTLY_ENDED_CAPACITY as u64 {
            l2.close(numbered_key(3_000_000_000 + i));
        }
        assert!(
            !l2.ended.contains(&k),
            "still remembered after twice the capacity (warm-up {warmup})"
        );
        assert!(l2.ended.len() <= 2 * RECENTLY_ENDED_CAPACITY);
    }
    // through `apply`: an end, many other ends, then a late open record is still refused
    let mut rec = open(9, None, true);
    if let Record::Open(r) = &mut rec {
        r.key = numbered_key(9);
    }
    assert_eq!(
        l.apply(&Record::Ended(numbered_key(9)), t0, 1, &cfg, &|_| None),
        Applied::Ignored
    );
    for i in 0..(RECENTLY_ENDED_CAPACITY as u64 - 1) {
        l.close(numbered_key(4_000_000_000 + i));
    }
    assert_eq!(l.apply(&rec, t0, 2, &cfg, &|_| None), Applied::Ignored);
    assert!(l.is_empty());
    // the healthy case: a span never ended opens
    let mut fresh = open(10, None, true);
    if let Record::Open(r) = &mut fresh {
        r.key = numbered_key(10);
    }
    assert_eq!(l.apply(&fresh, t0, 3, &cfg, &|_| None), Applied::Opened);
}

/// Ends wait in a log until a lookup moves them into the sets: ends and lookups
/// interleaved, across a generation swap that leaves ends of the older generation still
/// in its log, find exactly the keys that ended.
#[test]
fn ends_logged_between_lookups_are_found_in_both_generations() {
    let mut ended = RecentlyEnded::default();
    let cap = RECENTLY_ENDED_CAPACITY as u64;
    ended.insert(numbered_key(1));
    assert!(ended.contains(&numbered_key(1)));
    assert!(!ended.contains(&numbered_key(2)), "the healthy case");
    // key 2 ends, then the generation fills and swaps before any lookup: key 2 and the
    // rest of that generation are still in the (now previous) generation's log
    ended.insert(numbered_key(2));
    for i in 0..cap - 2 {
        ended.insert(numbered_key(10_000 + i));
    }
    ended.insert(numbered_key(3));
    assert!(!ended.previous.log.is_empty(), "the swap left a log behind");
    assert!(
        ended.contains(&numbered_key(2)),
        "logged in the previous generation"
    );
    assert!(
        ended.contains(&numbered_key(3)),
        "logged in the current one"
    );
    assert!(ended.contains(&numbered_key(1)));
    assert!(!ended.contains(&numbered_key(4)), "the healthy case");
    assert!(ended.previous.log.is_empty() && ended.current.log.is_empty());
    assert!(ended.len() <= 2 * RECENTLY_ENDED_CAPACITY);
}

/// A repeated end counts again while it waits in the log (a retried export of ended
/// spans): the key is still remembered for the capacity's worth of later ends, repeats
/// merge once looked up, and the memory stays within two generations whatever repeats.
#[test]
fn repeated_ends_count_again_and_the_memory_stays_bounded() {
    let cap = RECENTLY_ENDED_CAPACITY as u64;
    // every end sent twice with no lookup between: still at least `cap` later ends
    let mut ended = RecentlyEnded::default();
    ended.insert(numbered_key(1));
    ended.insert(numbered_key(1));
    for i in 0..cap / 2 {
        ended.insert(numbered_key(20_000 + i));
        ended.insert(numbered_key(20_000 + i));
    }
    assert!(ended.contains(&numbered_key(1)), "within {cap} later ends");
    for i in 0..cap {
        ended.insert(numbered_key(500_000 + i));
    }
    assert!(
        !ended.contains(&numbered_key(1)),
        "forgotten after 2 × {cap} ends"
    );
    assert!(ended.len() <= 2 * RECENTLY_ENDED_CAPACITY);
    // looked up between repeats: a repeat merges into the set and uses no room
    let mut looked = RecentlyEnded::default();
    for _ in 0..1_000 {
        looked.insert(numbered_key(7));
        assert!(looked.contains(&numbered_key(7)));
    }
    assert_eq!(looked.len(), 1);
    // ends only, many generations: never more than two generations held
    let mut flood = RecentlyEnded::default();
    for i in 0..5 * cap {
        flood.insert(numbered_key(i % (cap / 3)));
        assert!(flood.len() <= 2 * RECENTLY_ENDED_CAPACITY);
    }
}

/// A span loaded from the previous run is not judged until a record of it arrives: its end
/// may have been sent, and lost, while stallwatch was down. After a crash and a restart,
/// spans that had ended meanwhile were judged over their SLA (downtime included) and tripped
/// healthy runners. A refresh confirms it: it is then judged from its first arrival,
/// downtime included (a span stuck across the restart); never confirmed, it is swept like
/// an inferred entry.
#[test]
fn a_restored_span_is_judged_only_once_a_record_confirms_it() {
    let cfg = WatchdogConfig::default();
    let none = |_| None;
    let clock = MonoClock::with_boot_id("boot-a".into());
    let t0 = Instant::now();
    let mut before = Ledger::new();
    before.apply(&open(2, None, true), t0, 1, &cfg, &none);
    before.apply(&open(3, None, true), t0, 1, &cfg, &none);
    let rows: Vec<LedgerRow> = before
        .take_writes(&clock)
        .into_iter()
        .filter_map(|w| match w {
            LedgerWrite::Upsert(r) => Some(*r),
            LedgerWrite::Remove(..) => None,
        })
        .collect();
    assert_eq!(rows.len(), 2);
    // the restart: a new ledger on the same boot, 90 s later (past the 60 s SLA)
    let restart = t0 + Duration::from_secs(90);
    let mut after = Ledger::new();
    after.load(rows, &clock, restart);
    assert!(after.get(&key(2)).unwrap().restored);
    assert_eq!(after.worst_for("r1", restart, cfg.staleness), None);
    assert_eq!(after.next_crossing("r1", restart, cfg.staleness), None);
    // span 2 ended while stallwatch was down: its late end closes it
    assert_eq!(
        after.apply(&Record::Ended(key(2)), restart, 2, &cfg, &none),
        Applied::Closed
    );
    // span 3 still runs: its refresh confirms it, judged from its first arrival
    let refreshed = restart + Duration::from_secs(1);
    after.apply(&open(3, None, true), refreshed, 3, &cfg, &none);
    assert!(!after.get(&key(3)).unwrap().restored);
    let w = after.worst_for("r1", refreshed, cfg.staleness).unwrap();
    assert_eq!((w.key, w.elapsed), (key(3), Duration::from_secs(91)));
    // a restored span never confirmed is swept after the max age, like an inferred one
    let rows = vec![to_row(after.get(&key(3)).unwrap(), &clock)];
    let mut again = Ledger::new();
    again.load(rows, &clock, refreshed);
    again.sweep_inferred(refreshed + Duration::from_secs(10), Duration::from_secs(60));
    assert!(again.get(&key(3)).is_some());
    again.sweep_inferred(refreshed + Duration::from_secs(61), Duration::from_secs(60));
    assert!(again.get(&key(3)).is_none());
}

/// An open tool span numbered `i`, of `runner` (by `stallwatch.runner.id`) or of nobody.
fn numbered_open(i: u64, runner: Option<&str>) -> Record {
    Record::Open(OpenRecord {
        key: numbered_key(i),
        parent: None,
        name: format!("execute_tool flood {i}"),
        tool_attr: None,
        semconv_tool: true,
        sla_override_ms: None,
        runner_attr: runner.map(str::to_string),
        pid: None,
        service: "svc".into(),
        start_unix_nano: 0,
        shape: Shape::Snapshot,
    })
}

fn bounded(max: usize) -> WatchdogConfig {
    let mut cfg = WatchdogConfig::default();
    cfg.max_open_spans = max;
    cfg
}

/// The bound (`max_open_spans`): below it every span is tracked; at the share open to
/// anyone, new spans of no registered runner are not tracked and are counted, while a
/// registered runner's span still opens in the reserved quarter and its stall is still
/// detected; tracked spans keep their refreshes and ends, an end of an untracked span is
/// harmless, and an end makes room again.
#[test]
fn the_bound_refuses_new_spans_of_unregistered_sources_and_keeps_room_for_runners() {
    let cfg = bounded(16); // anyone: 12 entries; registered runners: up to 16
    let mut l = Ledger::new();
    l.runner_registered("r1", Instant::now(), cfg.sla.max_sla);
    let t0 = Instant::now();
    let none = |_| None;
    // healthy: below the bound every span is tracked
    for i in 0..12 {
        assert_eq!(
            l.apply(&numbered_open(i, None), t0, 1, &cfg, &none),
            Applied::Opened,
            "span {i}"
        );
    }
    assert_eq!(l.len(), 12);
    assert_eq!(l.untracked(UntrackedSource::Other), 0);
    // at the shared limit: a span of nobody, and one naming an unregistered runner, are not
    // tracked, and counted
    assert_eq!(
        l.apply(&numbered_open(100, None), t0, 2, &cfg, &none),
        Applied::Untracked
    );
    assert_eq!(
        l.apply(&numbered_open(101, Some("ghost")), t0, 2, &cfg, &none),
        Applied::Untracked
    );
    assert_eq!(l.len(), 12);
    assert_eq!(l.untracked(UntrackedSource::Other), 2);
    assert!(l.get(&numbered_key(100)).is_none());
    // a tracked span is still refreshed at the bound
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(
        l.apply(&numbered_open(3, None), t1, 3, &cfg, &none),
        Applied::Refreshed
    );
    // the end of an untracked span finds nothing and changes nothing
    assert_eq!(
        l.apply(&Record::Ended(numbered_key(100)), t1, 4, &cfg, &none),
        Applied::Ignored
    );
    assert_eq!(l.len(), 12);
    // a registered runner's stuck span opens in the reserve and trips when over its SLA
    assert_eq!(
        l.apply(&numbered_open(200, Some("r1")), t0, 5, &cfg, &none),
        Applied::Opened
    );
    assert!(!l.partial_view("r1", t1, cfg.sla.max_sla));
    let late = t0 + cfg.sla.default_sla + Duration::from_millis(1);
    let w = l.worst_for("r1", late, cfg.staleness).expect("tracked");
    assert_eq!(w.key, numbered_key(200));
    let verdict = crate::fusion::fuse(
        crate::heartbeat::HeartbeatState::Ok,
        Some(crate::fusion::SpanFacts {
            elapsed: w.elapsed,
            sla: w.sla,
            stale: w.stale,
        }),
        late,
        cfg.suspect_cap,
    );
    assert!(verdict.trip, "{verdict:?}");
    // the reserve fills too: then the registered runner's new span is not tracked either,
    // counted apart, and its view is partial; nothing tracked was pushed out
    for i in 201..204 {
        assert_eq!(
            l.apply(&numbered_open(i, Some("r1")), t0, 6, &cfg, &none),
            Applied::Opened
        );
    }
    assert_eq!(l.len(), 16);
    assert_eq!(
        l.apply(&numbered_open(204, Some("r1")), t1, 7, &cfg, &none),
        Applied::Untracked
    );
    assert_eq!(l.untracked(UntrackedSource::RegisteredRunner), 1);
    assert!(l.partial_view("r1", t1, cfg.sla.max_sla));
    assert_eq!(
        l.worst_for("r1", late, cfg.staleness).map(|w| w.key),
        Some(numbered_key(200)),
        "the stuck span is still judged"
    );
    // the partial view lasts max_sla after the last untracked tool span
    assert!(l.partial_view("r1", t1 + cfg.sla.max_sla, cfg.sla.max_sla));
    let after = t1 + cfg.sla.max_sla + Duration::from_millis(1);
    assert!(!l.partial_view("r1", after, cfg.sla.max_sla));
    l.forget_partial_views(after, cfg.sla.max_sla);
    assert!(!l.partial_view("r1", t1, cfg.sla.max_sla), "forgotten");
    // an end makes room: the next span of nobody is tracked again
    assert_eq!(
        l.apply(&Record::Ended(numbered_key(0)), t1, 8, &cfg, &none),
        Applied::Closed
    );
    assert_eq!(
        l.apply(&Record::Ended(numbered_key(1)), t1, 8, &cfg, &none),
        Applied::Closed
    );
    assert_eq!(l.len(), 14);
    for i in 201..204 {
        l.apply(&Record::Ended(numbered_key(i)), t1, 9, &cfg, &none);
    }
    assert_eq!(l.len(), 11);
    assert_eq!(
        l.apply(&numbered_open(102, None), t1, 10, &cfg, &none),
        Applied::Opened
    );
}

/// A tool span naming a runner that is not registered yet (its id or pid) and not tracked
/// at the bound may be that runner's: once it registers, its view is partial. A span that
/// names no runner can never become one's and marks nobody.
#[test]
fn an_untracked_span_of_a_runner_registered_later_makes_its_view_partial() {
    let cfg = bounded(16);
    let t0 = Instant::now();
    let none = |_| None;
    let full = |l: &mut Ledger| {
        for i in 0..12 {
            l.apply(&numbered_open(i, None), t0, 1, &cfg, &none);
        }
    };
    // healthy: only spans of nobody were refused
    let mut l = Ledger::new();
    full(&mut l);
    assert_eq!(
        l.apply(&numbered_open(50, None), t0, 2, &cfg, &none),
        Applied::Untracked
    );
    l.runner_registered("late", t0, cfg.sla.max_sla);
    assert!(!l.partial_view("late", t0, cfg.sla.max_sla));
    // a span naming the runner before it registered
    let mut l = Ledger::new();
    full(&mut l);
    assert_eq!(
        l.apply(&numbered_open(51, Some("late")), t0, 2, &cfg, &none),
        Applied::Untracked
    );
    l.runner_registered("late", t0 + Duration::from_secs(1), cfg.sla.max_sla);
    assert!(l.partial_view("late", t0 + Duration::from_secs(1), cfg.sla.max_sla));
    // by pid alike; registered past max_sla after the refusal, it is whole again
    let mut l = Ledger::new();
    full(&mut l);
    let Record::Open(mut r) = numbered_open(52, None) else {
        unreachable!()
    };
    r.pid = Some(4242);
    assert_eq!(
        l.apply(&Record::Open(r), t0, 2, &cfg, &none),
        Applied::Untracked
    );
    let much_later = t0 + cfg.sla.max_sla + Duration::from_secs(1);
    l.runner_registered("by-pid", much_later, cfg.sla.max_sla);
    assert!(!l.partial_view("by-pid", much_later, cfg.sla.max_sla));
    // a removed runner's spans count as anyone's again
    l.runner_registered("gone", t0, cfg.sla.max_sla);
    l.runner_removed("gone");
    assert_eq!(
        l.apply(&numbered_open(53, Some("gone")), t0, 3, &cfg, &none),
        Applied::Untracked
    );
    assert_eq!(l.untracked(UntrackedSource::RegisteredRunner), 0);
}

/// Inferred parents are entries too: none is made beyond the bound (nor counted: never
/// sent), and the child that names it is tracked.
#[test]
fn no_inferred_parent_is_made_beyond_the_bound() {
    let cfg = bounded(16);
    let mut l = Ledger::new();
    l.runner_registered("r1", Instant::now(), cfg.sla.max_sla);
    let t0 = Instant::now();
    let none = |_| None;
    for i in 0..11 {
        l.apply(&numbered_open(i, None), t0, 1, &cfg, &none);
    }
    // healthy: with room, a child of nobody opens with its inferred parent (12 entries)
    assert_eq!(
        l.apply(&open(2, Some(1), true), t0, 2, &cfg, &none),
        Applied::Opened
    );
    assert!(
        l.get(&key(1)).is_some_and(|e| e.inferred),
        "parent inferred"
    );
    l.apply(&Record::Ended(key(1)), t0, 3, &cfg, &none);
    l.apply(&Record::Ended(key(2)), t0, 3, &cfg, &none);
    assert_eq!(l.len(), 11);
    // a runner's child at 15 entries: tracked, its parent not made
    for i in 11..15 {
        l.apply(&numbered_open(i, Some("r1")), t0, 4, &cfg, &none);
    }
    assert_eq!(
        l.apply(&open(4, Some(3), true), t0, 5, &cfg, &none),
        Applied::Opened
    );
    assert!(l.get(&key(3)).is_none());
    assert_eq!(l.len(), 16);
    assert_eq!(l.untracked(UntrackedSource::Other), 0);
}

/// An entry's texts are clipped to `MAX_ENTRY_TEXT_BYTES` at a character boundary, so its
/// size does not follow what an exporter sends; the SLA still comes from the whole tool
/// name, and short texts are kept whole.
#[test]
fn entry_texts_are_clipped_and_the_sla_is_resolved_from_the_whole_name() {
    let raw = crate::config::RawWatchdogConfig {
        sla_rules: vec![crate::config::RawSlaRule {
            tool: "*_tail".into(),
            sla_ms: 5000,
        }],
        ..Default::default()
    };
    let cfg = WatchdogConfig::try_from(raw).unwrap();
    let mut l = Ledger::new();
    let t0 = Instant::now();
    let Record::Open(mut r) = open(7, None, true) else {
        unreachable!()
    };
    let long = format!("{}_tail", "é".repeat(400));
    r.name = long.clone();
    r.tool_attr = Some(long.clone());
    r.service = "s".repeat(10_000);
    r.runner_attr = Some("r".repeat(1000));
    l.apply(&Record::Open(r), t0, 1, &cfg, &|_| None);
    let e = l.get(&key(7)).unwrap();
    for text in [
        &e.name,
        e.tool.as_ref().unwrap(),
        &e.service,
        e.runner.as_ref().unwrap(),
    ] {
        assert!(
            text.len() <= MAX_ENTRY_TEXT_BYTES && text.len() >= MAX_ENTRY_TEXT_BYTES - 3,
            "{}",
            text.len()
        );
    }
    assert!(long.starts_with(e.name.as_str()));
    assert_eq!(
        e.sla,
        Some(Duration::from_secs(5)),
        "resolved from the whole name"
    );
    // a refresh with the same long name is not a change of name
    let Record::Open(mut again) = open(7, None, true) else {
        unreachable!()
    };
    again.name = long.clone();
    again.tool_attr = Some(long);
    again.service = "s".repeat(10_000);
    again.runner_attr = Some("r".repeat(1000));
    l.apply(
        &Record::Open(again),
        t0 + Duration::from_millis(10),
        2,
        &cfg,
        &|_| None,
    );
    assert_eq!(l.get(&key(7)).unwrap().refreshes, 1);
    assert_eq!(l.dirty_len(), 1, "not re-persisted for a clipped name");
    // short texts are whole
    l.apply(&open(8, None, true), t0, 3, &cfg, &|_| None);
    assert_eq!(l.get(&key(8)).unwrap().name, "span8");
    assert_eq!(clipped("abc"), "abc");
}
