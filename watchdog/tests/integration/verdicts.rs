//! Fused verdicts and breakers against real runner processes (docs/design.md, Fusion and breakers).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stallwatch_storage::control::BreakerState;
use stallwatch_storage::model::EventKind;

use crate::common::*;

const LONG: Duration = Duration::from_secs(20);

/// (a) The heartbeat thread answers while the main thread blocks inside a tool span: the
/// span's SLA passes and the runner is tripped as tool_overrun, with the breaker.opened
/// incident recorded before the trip arrives.
#[tokio::test]
async fn answering_runner_stuck_in_a_tool_span_is_tool_overrun() {
    let mut rig = Rig::start(fast_config()).await;
    let sock = rig.sock("a");
    let mut py = PyRunner::start(&sock, "pong");
    rig.register("runner-a", Some(py.pid()), Some(&sock), false)
        .await;
    py.send("block");
    // the span is bound by process.pid only
    let opened = Instant::now();
    rig.observe_spans(batch(
        resource(None, Some(py.pid())),
        vec![tool_span(1, 1, "run_notebook", Some(1200), 0)],
    ))
    .await;
    let trip = rig.next_trip(LONG).await.expect("a trip");
    let waited = opened.elapsed();
    assert_eq!(trip.runner_id, "runner-a");
    assert_eq!(trip.verdict, "tool_overrun");
    assert_eq!(trip.open_spans, vec![(tid(1), sid(1))]);
    assert!(
        waited >= Duration::from_millis(1200),
        "tripped before the SLA: {waited:?}"
    );
    let id = trip.incident_id.expect("incident recorded before the trip");
    let inc = rig.storage.incident(id).await.unwrap().expect("stored");
    assert_eq!(inc.incident.kind, EventKind::BreakerOpened);
    assert_eq!(
        inc.incident.evidence["heartbeat"], "ok",
        "the ping thread was alive"
    );
    assert_eq!(inc.incident.evidence["span"]["sla_ms"], 1200);
    assert!(inc.incident.evidence["rtt_us"].as_u64().is_some());
    let adm = rig.handle.admit("runner-a").unwrap();
    assert!(!adm.admit);
    assert_eq!(adm.state, BreakerState::Open);
    assert!(adm.retry_after_ms.unwrap() <= 800);
    assert!(rig.handle.admit("nobody").is_none());
    // the same span re-sent does not trip or record again
    rig.observe_spans(batch(
        resource(None, Some(py.pid())),
        vec![tool_span(1, 1, "run_notebook", Some(1200), 0)],
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let opened = rig
        .incidents("runner-a")
        .await
        .into_iter()
        .filter(|i| i.incident.kind == EventKind::BreakerOpened)
        .count();
    assert_eq!(opened, 1);
    rig.stop().await;
}

/// (b) A runner that stops answering pings is tripped as unresponsive after the timeout.
#[tokio::test]
async fn runner_that_stops_answering_is_unresponsive() {
    let mut rig = Rig::start(fast_config()).await;
    let sock = rig.sock("b");
    let mut py = PyRunner::start(&sock, "pong");
    rig.register("runner-b", Some(py.pid()), Some(&sock), false)
        .await;
    let mut board = rig.handle.board();
    wait_for("heartbeat ok", LONG, || {
        let b = board.borrow_and_update().clone();
        async move { (b.get("runner-b")?.heartbeat == "ok").then_some(()) }
    })
    .await;
    assert!(
        rig.next_trip(Duration::from_millis(1000)).await.is_none(),
        "healthy runner tripped"
    );
    py.send("silent");
    let silent_at = Instant::now();
    let trip = rig.next_trip(LONG).await.expect("a trip");
    assert_eq!(trip.verdict, "unresponsive");
    // lost = no PONG for the 600 ms timeout since the last PONG
    assert!(
        silent_at.elapsed() >= Duration::from_millis(500),
        "{:?}",
        silent_at.elapsed()
    );
    let inc = rig
        .storage
        .incident(trip.incident_id.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(inc.incident.evidence["last_pong_age_ms"].as_u64().unwrap() >= 600);
    assert_eq!(inc.incident.evidence["heartbeat"], "lost");
    rig.stop().await;
}

/// (c) A runner that works slowly but within its SLA, answering pings, is never tripped,
/// even with two other processes burning both cores.
#[tokio::test]
async fn slow_within_sla_under_cpu_load_is_never_tripped() {
    let mut cfg = fast_config();
    cfg.heartbeat_timeout = Duration::from_millis(2500); // generous: a loaded 2-core box
    let mut rig = Rig::start(cfg).await;
    let sock = rig.sock("c");
    let py = PyRunner::start(&sock, "pong");
    rig.register("runner-c", Some(py.pid()), Some(&sock), false)
        .await;
    let mut burners: Vec<_> = (0..2)
        .map(|_| {
            Command::new(python())
                .args(["-c", "while True: pass"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let res = resource(Some("runner-c"), None);
    for n in 0..4u8 {
        // each tool call takes ~700 ms of its 4000 ms SLA, refreshed while it runs
        rig.observe_spans(batch(
            res.clone(),
            vec![tool_span(3, n + 1, "fit", Some(4000), 0)],
        ))
        .await;
        tokio::time::sleep(Duration::from_millis(350)).await;
        rig.observe_spans(batch(
            res.clone(),
            vec![tool_span(3, n + 1, "fit", Some(4000), 0)],
        ))
        .await;
        tokio::time::sleep(Duration::from_millis(350)).await;
        rig.observe_spans(batch(
            res.clone(),
            vec![tool_span(3, n + 1, "fit", Some(4000), 1)],
        ))
        .await;
    }
    let tripped = rig.next_trip(Duration::from_millis(1500)).await;
    for b in &mut burners {
        let _ = b.kill();
        let _ = b.wait();
    }
    assert!(tripped.is_none(), "tripped: {tripped:?}");
    let st = rig
        .handle
        .board()
        .borrow()
        .get("runner-c")
        .cloned()
        .unwrap();
    assert_eq!(st.breaker, BreakerState::Closed);
    assert_eq!(st.verdict, "healthy");
    assert!(st.worst_span.is_none(), "every span ended");
    assert!(!st.heartbeat_rtt_us.is_empty(), "round trips sampled");
    assert!(rig.handle.admit("runner-c").unwrap().admit);
    rig.stop().await;
}

/// (d) HALF_OPEN: a restarted runner that answers closes the breaker; a dead one sends it
/// back to OPEN with a fresh cooldown.
#[tokio::test]
async fn half_open_probe_closes_for_a_restarted_runner_and_reopens_for_a_dead_one() {
    // A cooldown long enough that both silent runners trip within it, also on a loaded
    // machine: with 800 ms, the first one's HALF_OPEN probe could fail (`probe_failed`)
    // before the second had tripped.
    let mut config = fast_config();
    config.breaker_cooldown = Duration::from_millis(3000);
    let mut rig = Rig::start(config).await;
    let sock_ok = rig.sock("d1");
    let sock_dead = rig.sock("d2");
    let mut a = PyRunner::start(&sock_ok, "pong");
    let mut b = PyRunner::start(&sock_dead, "pong");
    rig.register("restarts", Some(a.pid()), Some(&sock_ok), false)
        .await;
    rig.register("dies", Some(b.pid()), Some(&sock_dead), false)
        .await;
    a.send("silent");
    b.send("silent");
    let mut tripped = Vec::new();
    while tripped.len() < 2 {
        let t = rig.next_trip(LONG).await.expect("both runners trip");
        if t.verdict == "probe_failed" && tripped.contains(&t.runner_id) {
            // its cooldown ended before the other tripped, and the still silent runner
            // failed its probe, as it should
            continue;
        }
        assert_eq!(t.verdict, "unresponsive");
        tripped.push(t.runner_id);
    }
    // what the reaper would do: stop both; restart one under the same id and socket
    a.kill();
    b.kill();
    let a2 = PyRunner::start(&sock_ok, "pong");
    rig.register("restarts", Some(a2.pid()), Some(&sock_ok), true)
        .await;

    let mut board = rig.handle.board();
    wait_for("restarted runner CLOSED", LONG, || {
        let v = board.borrow_and_update().clone();
        async move { (v.get("restarts")?.breaker == BreakerState::Closed).then_some(()) }
    })
    .await;
    // the incident follows the board (recorded by the effects task)
    let kinds: Vec<EventKind> = wait_for("breaker.closed recorded", LONG, || async {
        let k: Vec<EventKind> = rig
            .incidents("restarts")
            .await
            .iter()
            .rev()
            .map(|i| i.incident.kind)
            .collect();
        (k.last() == Some(&EventKind::BreakerClosed)).then_some(k)
    })
    .await;
    // opened first, then (after any probe that failed before the restart) half open and
    // closed
    assert_eq!(kinds.first(), Some(&EventKind::BreakerOpened), "{kinds:?}");
    assert!(
        kinds.ends_with(&[
            EventKind::BreakerOpened,
            EventKind::BreakerHalfOpen,
            EventKind::BreakerClosed
        ]),
        "{kinds:?}"
    );
    assert!(rig.handle.admit("restarts").unwrap().admit);

    // the dead one: HALF_OPEN, the probe fails, OPEN again (and a new trip for the reaper)
    let again = loop {
        let t = rig
            .next_trip(LONG)
            .await
            .expect("re-opened after the failed probe");
        // (a probe of the restarting runner that failed before its restart)
        if t.runner_id == "restarts" && t.verdict == "probe_failed" {
            continue;
        }
        break t;
    };
    assert_eq!(again.runner_id, "dies");
    assert_eq!(again.verdict, "probe_failed");
    let kinds: Vec<EventKind> = rig
        .incidents("dies")
        .await
        .iter()
        .rev()
        .map(|i| i.incident.kind)
        .collect();
    assert_eq!(
        &kinds[..3],
        &[
            EventKind::BreakerOpened,
            EventKind::BreakerHalfOpen,
            EventKind::BreakerOpened
        ]
    );
    let reopened = rig
        .incidents("dies")
        .await
        .into_iter()
        .find(|i| i.incident.reason.contains("probe failed"))
        .expect("the re-open names the probe failure");
    assert!(
        reopened.incident.reason.contains("stale socket")
            || reopened.incident.reason.contains("no socket"),
        "{}",
        reopened.incident.reason
    );
    let adm = rig.handle.admit("dies").unwrap();
    assert!(!adm.admit && adm.retry_after_ms.is_some());

    // a person resets it
    rig.handle.reset_breaker("dies").await.unwrap();
    assert!(rig.handle.admit("dies").unwrap().admit);
    assert!(rig.handle.reset_breaker("nobody").await.is_err());
    rig.stop().await;
}

/// stallwatch itself could not run (its runtime blocked here, as by SIGSTOP or a huge
/// batch) past a tool span's SLA, and the span's end arrives just after it runs again:
/// the runner is not tripped, because after its own stall the watchdog judges nothing for
/// a heartbeat timeout while what arrived meanwhile is read. The stalled case beside it:
/// a span that stays open on another runner trips once that time has passed.
#[tokio::test]
async fn a_span_ended_during_the_watchdogs_own_stall_is_not_tripped() {
    let mut config = fast_config();
    config.heartbeat_timeout = Duration::from_millis(2000);
    let mut rig = Rig::start(config).await;
    let (sa, sb) = (rig.sock("a"), rig.sock("b"));
    let pa = PyRunner::start(&sa, "pong");
    let pb = PyRunner::start(&sb, "pong");
    rig.register("runner-a", Some(pa.pid()), Some(&sa), false)
        .await;
    rig.register("runner-b", Some(pb.pid()), Some(&sb), false)
        .await;
    // both answer pings before the spans open
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (t, pid) in [(1, pa.pid()), (2, pb.pid())] {
        rig.observe_spans(batch(
            resource(None, Some(pid)),
            vec![tool_span(t, 1, "run_notebook", Some(800), 0)],
        ))
        .await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // the watchdog's only runtime thread is blocked past the SLA
    std::thread::sleep(Duration::from_millis(1500));
    let resumed = Instant::now();
    // it runs again (and judges), then runner-a's end arrives
    tokio::time::sleep(Duration::from_millis(100)).await;
    rig.observe_spans(batch(
        resource(None, Some(pa.pid())),
        vec![tool_span(
            1,
            1,
            "run_notebook",
            Some(800),
            1_700_000_000_500_000_000,
        )],
    ))
    .await;
    let trip = rig
        .next_trip(LONG)
        .await
        .expect("runner-b's open span trips");
    assert_eq!(trip.runner_id, "runner-b", "{trip:?}");
    assert_eq!(trip.verdict, "tool_overrun");
    assert_eq!(trip.open_spans, vec![(tid(2), sid(1))]);
    assert!(
        resumed.elapsed() >= Duration::from_millis(1900),
        "tripped {:?} after the stall, before the catch-up time",
        resumed.elapsed()
    );
    // (runner-b trips again when its breaker's HALF_OPEN probe fails: not asserted here)
    let until = Instant::now() + Duration::from_millis(1500);
    while let Some(t) = rig
        .next_trip(until.saturating_duration_since(Instant::now()))
        .await
    {
        assert_ne!(
            t.runner_id, "runner-a",
            "tripped for a span that ended during stallwatch's own stall: {t:?}"
        );
    }
    drop((pa, pb));
}
