//! The open-span ledger fed by the three wire shapes, persisted in a real SQLite file.

use std::time::Duration;

use stallwatch_storage::ledger::{OpenSpanQuery, OpenSpanRow, MAX_OPEN_SPANS_PAGE};
use stallwatch_storage::model::{EventKind, SpanId, SpanState};
use stallwatch_storage::{Storage, StorageConfig};

use crate::common::*;

const LONG: Duration = Duration::from_secs(20);

async fn rows_until(
    storage: &Storage,
    what: &str,
    pred: impl Fn(&[OpenSpanRow]) -> bool,
) -> Vec<OpenSpanRow> {
    wait_for(what, LONG, || {
        let st = storage.clone();
        let ok = &pred;
        async move {
            let rows = all_open_spans(&st).await.ok()?;
            ok(&rows).then_some(rows)
        }
    })
    .await
}

/// Every open span (these tests hold a few), oldest first: one page of the most.
async fn all_open_spans(
    storage: &Storage,
) -> Result<Vec<OpenSpanRow>, stallwatch_storage::telemetry::QueryError> {
    let page = storage
        .open_spans(OpenSpanQuery {
            limit: MAX_OPEN_SPANS_PAGE,
            ..Default::default()
        })
        .await?;
    assert!(page.next_cursor.is_none(), "more open spans than one page");
    Ok(page.items)
}

fn find(rows: &[OpenSpanRow], sp: SpanId) -> Option<&OpenSpanRow> {
    rows.iter().find(|r| r.span_id == sp)
}

/// (e) Each wire shape opens, refreshes and closes a ledger entry.
#[tokio::test]
async fn each_wire_shape_opens_refreshes_and_closes() {
    let mut rig = Rig::start(fast_config()).await;
    rig.register("shapes", None, None, false).await;
    let res = resource(Some("shapes"), Some(4242));

    // shape 1: a running snapshot (end_time_unix_nano = 0); its parent is inferred
    rig.observe_spans(batch(
        res.clone(),
        vec![tool_span(1, 1, "snap_tool", None, 0)],
    ))
    .await;
    let rows = rows_until(&rig.storage, "shape 1 open", |r| find(r, sid(1)).is_some()).await;
    let r1 = find(&rows, sid(1)).unwrap().clone();
    assert_eq!(r1.state, SpanState::Open);
    assert_eq!(r1.tool_name.as_deref(), Some("snap_tool"));
    assert_eq!(r1.runner_id.as_deref(), Some("shapes"));
    assert_eq!(r1.sla_ms, Some(60_000));
    assert_eq!(
        find(&rows, sid(200)).map(|r| r.state),
        Some(SpanState::Inferred)
    );
    // plain refreshes are persisted at most once per second (REFRESH_PERSIST_INTERVAL)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    rig.observe_spans(batch(
        res.clone(),
        vec![tool_span(1, 1, "snap_tool", None, 0)],
    ))
    .await;
    let rows = rows_until(&rig.storage, "shape 1 refreshed", |r| {
        find(r, sid(1)).is_some_and(|x| x.last_seen_unix_nano > r1.last_seen_unix_nano)
    })
    .await;
    assert_eq!(
        find(&rows, sid(1)).unwrap().first_seen_unix_nano,
        r1.first_seen_unix_nano
    );
    rig.observe_spans(batch(
        res.clone(),
        vec![tool_span(
            1,
            1,
            "snap_tool",
            None,
            1_700_000_001_000_000_000,
        )],
    ))
    .await;
    rows_until(&rig.storage, "shape 1 closed", |r| {
        find(r, sid(1)).is_none()
    })
    .await;
    // a late snapshot of the ended span does not reopen it (the ended one wins)
    rig.observe_spans(batch(
        res.clone(),
        vec![tool_span(1, 1, "snap_tool", None, 0)],
    ))
    .await;

    // shape 2: PartialSpanProcessor log records (heartbeat, heartbeat, ended)
    rig.observe_logs(partial_span_log(res.clone(), "heartbeat", 2, 2, "log_tool"))
        .await;
    let rows = rows_until(&rig.storage, "shape 2 open", |r| find(r, sid(2)).is_some()).await;
    let r2 = find(&rows, sid(2)).unwrap().clone();
    assert_eq!(r2.tool_name.as_deref(), Some("log_tool"));
    assert_eq!(
        r2.runner_id.as_deref(),
        Some("shapes"),
        "bound through the log's resource"
    );
    // plain refreshes are persisted at most once per second (REFRESH_PERSIST_INTERVAL)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    rig.observe_logs(partial_span_log(res.clone(), "heartbeat", 2, 2, "log_tool"))
        .await;
    rows_until(&rig.storage, "shape 2 refreshed", |r| {
        find(r, sid(2)).is_some_and(|x| x.last_seen_unix_nano > r2.last_seen_unix_nano)
    })
    .await;
    rig.observe_logs(partial_span_log(res.clone(), "ended", 2, 2, "log_tool"))
        .await;
    rows_until(&rig.storage, "shape 2 closed", |r| {
        find(r, sid(2)).is_none()
    })
    .await;

    // shape 3: Logfire pending_span twins open and refresh the real (parent) span
    rig.observe_spans(batch(
        res.clone(),
        vec![pending_twin(3, 31, 3, "twin_tool")],
    ))
    .await;
    let rows = rows_until(&rig.storage, "shape 3 open", |r| find(r, sid(3)).is_some()).await;
    let r3 = find(&rows, sid(3)).unwrap().clone();
    assert!(
        find(&rows, sid(31)).is_none(),
        "the twin itself is not an open span"
    );
    assert_eq!(r3.tool_name.as_deref(), Some("twin_tool"));
    // plain refreshes are persisted at most once per second (REFRESH_PERSIST_INTERVAL)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    rig.observe_spans(batch(
        res.clone(),
        vec![pending_twin(3, 32, 3, "twin_tool")],
    ))
    .await;
    rows_until(&rig.storage, "shape 3 refreshed", |r| {
        find(r, sid(3)).is_some_and(|x| x.last_seen_unix_nano > r3.last_seen_unix_nano)
    })
    .await;
    let mut real = tool_span(3, 3, "twin_tool", None, 1_700_000_002_000_000_000);
    real.parent_span_id = None;
    rig.observe_spans(batch(res.clone(), vec![real])).await;
    rows_until(&rig.storage, "shape 3 closed", |r| {
        find(r, sid(3)).is_none()
    })
    .await;

    // nothing is left open except the inferred parent of shape 1 and the board agrees
    let rows = all_open_spans(&rig.storage).await.unwrap();
    assert!(
        rows.iter().all(|r| r.state == SpanState::Inferred),
        "{rows:?}"
    );
    let st = rig.handle.board().borrow().get("shapes").cloned().unwrap();
    assert!(st.worst_span.is_none());
    rig.stop().await;
}

/// (g) The ledger survives closing and reopening the storage, keeping its monotonic times
/// (boot id + CLOCK_MONOTONIC), so a span's elapsed time counts from its first arrival.
#[tokio::test]
async fn ledger_survives_reopening_the_storage() {
    let mut rig = Rig::start(fast_config()).await;
    let res = resource(Some("keeper"), None);
    rig.observe_spans(batch(
        res.clone(),
        vec![tool_span(7, 7, "long_tool", Some(600_000), 0)],
    ))
    .await;
    rows_until(&rig.storage, "span persisted", |r| {
        find(r, sid(7)).is_some()
    })
    .await;
    rig.stop().await;
    let path = rig.storage.path().to_path_buf();
    rig.storage.shutdown().await;
    let Rig {
        dir,
        storage,
        events,
        handle,
        ..
    } = rig;
    drop((storage, events, handle));
    tokio::time::sleep(Duration::from_millis(700)).await;

    // a fresh Storage on the same file sees the row
    let reopened = Storage::open(StorageConfig::new(&path)).unwrap();
    let rows = all_open_spans(&reopened).await.unwrap();
    assert_eq!(
        find(&rows, sid(7)).map(|r| r.tool_name.clone()),
        Some(Some("long_tool".into()))
    );
    reopened.shutdown().await;
    drop(reopened);

    // a fresh watchdog reloads it, but does not judge it until a record confirms it (its
    // end may have been lost while stallwatch was down) ...
    let mut rig = Rig::start_in(dir, fast_config()).await;
    rig.register("keeper", None, None, false).await;
    let mut board = rig.handle.board();
    wait_for("the runner on the board", LONG, || {
        let b = board.borrow_and_update().clone();
        async move { b.get("keeper").map(|_| ()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = board.borrow_and_update().clone();
    assert_eq!(
        b.get("keeper").and_then(|r| r.worst_span.clone()),
        None,
        "a restored span was judged before a record confirmed it"
    );
    // ... then its refresh: elapsed counts from the first arrival, not the reload
    rig.observe_spans(batch(
        res.clone(),
        vec![tool_span(7, 7, "long_tool", Some(600_000), 0)],
    ))
    .await;
    let worst = wait_for("reloaded worst span", LONG, || {
        let b = board.borrow_and_update().clone();
        async move { b.get("keeper")?.worst_span.clone() }
    })
    .await;
    assert_eq!(worst.span_id, sid(7));
    assert_eq!(worst.sla_ms, 600_000);
    assert!(
        worst.elapsed_ms >= 700,
        "elapsed restarted at reload: {} ms",
        worst.elapsed_ms
    );
    rig.stop().await;
}

/// The open-span bound (`max_open_spans`) at the watchdog: a flood of never-ending spans
/// from nobody fills only the share open to anyone (the first spans are all tracked), the
/// rest is counted and not tracked, in memory and in the durable copy; a registered
/// runner's stuck tool span still opens in the reserve and trips; when the runner's own
/// spans fill the reserve, the one not tracked raises `sidecar.degraded` naming it, and
/// the stuck span still trips it (over its SLA: a partial view holds no such trip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_is_bounded_and_a_registered_runners_stall_still_trips() {
    use stallwatch_storage::MetricsSource;
    use std::sync::atomic::Ordering;
    let mut cfg = fast_config();
    cfg.max_open_spans = 64; // anyone: 48; registered runners: the last 16 too
    let mut rig = Rig::start(cfg).await;
    rig.register("stuck", None, None, false).await;
    let stats = rig.handle.stats();
    wait_for("the runner registered", LONG, || async {
        (stats.runners.load(Ordering::Relaxed) == 1).then_some(())
    })
    .await;
    // a root tool span (no parent to infer) of nobody, or of `runner`
    let span = |t: u8, sp: u8, sla: Option<i64>| {
        let mut s = tool_span(t, sp, "flood_tool", sla, 0);
        s.parent_span_id = None;
        s
    };
    for t in 0..4u8 {
        rig.observe_spans(batch(
            resource(None, None),
            (0..50u8).map(|i| span(10 + t, i + 1, None)).collect(),
        ))
        .await;
    }
    wait_for("the flood read", LONG, || async {
        (stats.ledger_untracked[1].load(Ordering::Relaxed) == 200 - 48).then_some(())
    })
    .await;
    // healthy: the spans below the shared limit are all tracked
    assert_eq!(stats.ledger_open_spans.load(Ordering::Relaxed), 48);
    // the stuck runner: a short-SLA tool span, then more than the reserve holds
    let res = resource(Some("stuck"), None);
    rig.observe_spans(batch(res.clone(), vec![span(1, 1, Some(300))]))
        .await;
    rig.observe_spans(batch(
        res,
        (0..16u8).map(|i| span(2, i + 1, Some(600_000))).collect(),
    ))
    .await;
    let trip = rig
        .next_trip(Duration::from_secs(5))
        .await
        .expect("the stuck span trips its runner");
    assert_eq!(trip.runner_id, "stuck");
    assert_eq!(trip.verdict, "tool_overrun", "{trip:?}");
    assert_eq!(stats.ledger_open_spans.load(Ordering::Relaxed), 64);
    assert_eq!(stats.ledger_untracked[0].load(Ordering::Relaxed), 1);
    let degraded = wait_for("the degraded incident", LONG, || {
        let rig = &rig;
        async move {
            rig.incidents("stuck")
                .await
                .into_iter()
                .find(|i| i.incident.kind == EventKind::SidecarDegraded)
        }
    })
    .await;
    assert!(
        degraded.incident.reason.contains("max_open_spans = 64"),
        "{}",
        degraded.incident.reason
    );
    // the durable copy mirrors the bound
    let rows = rows_until(&rig.storage, "the ledger written", |r| r.len() == 64).await;
    assert_eq!(
        rows.iter()
            .filter(|r| r.runner_id.as_deref() == Some("stuck"))
            .count(),
        16
    );
    let mut text = String::new();
    stats.render_prometheus(&mut text);
    for line in [
        "stallwatch_watchdog_ledger_untracked_total{source=\"other\"} 152",
        "stallwatch_watchdog_ledger_untracked_total{source=\"registered_runner\"} 1",
        "stallwatch_watchdog_ledger_capacity 64",
        "stallwatch_watchdog_ledger_open_spans 64",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    rig.stop().await;
}
