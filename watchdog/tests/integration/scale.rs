//! Issue 17 #10 at the watchdog: with a thousand runners registered, a wake costs what is
//! due (the runner an observation touched), not a pass over every runner, and a stalled
//! runner among them still trips within its SLA plus a little, while no healthy one does.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::*;

const RUNNERS: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_follows_what_is_due_and_a_stalled_runner_among_a_thousand_trips_on_time() {
    let mut rig = Rig::start(fast_config()).await;
    for i in 0..RUNNERS {
        // no heartbeat socket: judged by their spans only
        rig.register(&format!("r{i}"), None, None, false).await;
    }
    let stats = rig.handle.stats();
    wait_for(
        "every runner registered",
        Duration::from_secs(30),
        || async { (stats.runners.load(Ordering::Relaxed) == RUNNERS as u64).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = stats.evaluations.load(Ordering::Relaxed);
    let t0 = Instant::now();
    // 50 exports of one runner's long span (60 s SLA), one per 20 ms tick
    for _ in 0..50 {
        rig.observe_spans(batch(
            resource(Some("r0"), None),
            vec![tool_span(1, 1, "long_fit", Some(60_000), 0)],
        ))
        .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spent = t0.elapsed();
    let evaluations = stats.evaluations.load(Ordering::Relaxed) - before;
    // Each runner is looked at about once per second anyway (the loop's longest idle);
    // a full pass per observation would be 50 x 1000.
    let per_second_floor = RUNNERS as f64 * (spent.as_secs_f64() + 1.0);
    eprintln!("{evaluations} evaluations in {spent:?} with {RUNNERS} runners and 50 exports");
    assert!(
        (evaluations as f64) < 2.0 * per_second_floor + 200.0,
        "{evaluations} evaluations: the watchdog walks every runner per observation"
    );
    // one stalled runner among them: SLA 400 ms
    let opened = Instant::now();
    rig.observe_spans(batch(
        resource(Some("r7"), None),
        vec![tool_span(2, 2, "stuck_fit", Some(400), 0)],
    ))
    .await;
    let trip = rig
        .next_trip(Duration::from_secs(10))
        .await
        .expect("a trip");
    let waited = opened.elapsed();
    assert_eq!(trip.runner_id, "r7", "{trip:?}");
    assert_eq!(trip.verdict, "tool_overrun");
    assert!(
        waited >= Duration::from_millis(400),
        "before its SLA: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(400 + 300),
        "{waited:?}: late by more than a few ticks"
    );
    // the healthy ones (r0 within its 60 s SLA, the rest idle) are never tripped
    assert!(
        rig.next_trip(Duration::from_millis(500)).await.is_none(),
        "a healthy runner was tripped"
    );
    let board = rig.handle.board().borrow().clone();
    assert_eq!(board.len(), RUNNERS);
    assert_eq!(board["r0"].verdict, "healthy");
    assert_eq!(
        board["r0"]
            .worst_span
            .as_ref()
            .map(|w| w.tool_name.as_str()),
        Some("long_fit")
    );
    rig.stop().await;
}
