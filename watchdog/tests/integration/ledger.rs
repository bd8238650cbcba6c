//! The open-span ledger fed by the three wire shapes, persisted in a real SQLite file.

use std::time::Duration;

use stallwatch_storage::ledger::OpenSpanRow;
use stallwatch_storage::model::{SpanId, SpanState};
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
            let rows = st.open_spans().await.ok()?;
            ok(&rows).then_some(rows)
        }
    })
    .await
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
    let rows = rig.storage.open_spans().await.unwrap();
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
    let rows = reopened.open_spans().await.unwrap();
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
