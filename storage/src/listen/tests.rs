//! Tests of the connection loop's pure parts: its config validation and which deadlines close
//! a connection.

#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn defaults_and_zero_values_name_the_key() {
    let l = ListenLimits::try_from(&RawListenLimits::default()).unwrap();
    assert_eq!(l, ListenLimits::default());
    assert_eq!(l.header_read_timeout, Duration::from_secs(10));
    assert_eq!(l.max_connections, 512);
    let e = ListenLimits::try_from(&RawListenLimits {
        max_connections: Some(0),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.contains("max_connections"), "{e}");
    let e = ListenLimits::try_from(&RawListenLimits {
        idle_timeout_ms: Some(0),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.contains("idle_timeout_ms"), "{e}");
}

fn activity(age: Duration, seen: bool, in_flight: u64, last_done: Duration) -> Activity {
    let born = Instant::now().checked_sub(age).unwrap();
    Activity {
        born,
        in_flight: AtomicU64::new(in_flight),
        seen_request: AtomicBool::new(seen),
        last_done_ms: AtomicU64::new(last_done.as_millis() as u64),
        bodies_waiting: AtomicU64::new(0),
        last_body_ms: AtomicU64::new(0),
    }
}

#[test]
fn only_bodies_that_all_stopped_arriving_count_as_stalled() {
    let s = Duration::from_secs;
    let stall = STOPPING_BODY_STALL;
    let a = activity(s(10), true, 2, s(0));
    // both requests wait for body bytes, the last frame came 9 s ago
    a.bodies_waiting.store(2, Ordering::Relaxed);
    a.last_body_ms.store(1_000, Ordering::Relaxed);
    assert!(a.bodies_stalled(stall));
    // one request is being handled (its body not waited for): not stalled
    a.bodies_waiting.store(1, Ordering::Relaxed);
    assert!(!a.bodies_stalled(stall));
    // both wait, but a frame arrived just now: a slow client still sending
    a.bodies_waiting.store(2, Ordering::Relaxed);
    a.last_body_ms.store(a.since_born_ms(), Ordering::Relaxed);
    assert!(!a.bodies_stalled(stall));
    // no request in flight at all: that is the idle rule's case, not this one
    let idle = activity(s(10), true, 0, s(0));
    assert!(!idle.bodies_stalled(stall));
}

#[test]
fn deadlines_close_only_what_is_due() {
    let l = ListenLimits::default();
    let s = Duration::from_secs;
    // A fresh connection and one with a request in flight are left alone.
    assert_eq!(due(&activity(s(1), false, 0, s(0)), &l), None);
    assert_eq!(due(&activity(s(600), true, 1, s(0)), &l), None);
    // Recently busy: not idle yet.
    assert_eq!(due(&activity(s(100), true, 0, s(90)), &l), None);
    assert_eq!(
        due(&activity(s(11), false, 0, s(0)), &l),
        Some(CloseReason::HeaderTimeout)
    );
    assert_eq!(
        due(&activity(s(100), true, 0, s(30)), &l),
        Some(CloseReason::Idle)
    );
    assert_eq!(
        due(&activity(s(3601), true, 1, s(0)), &l),
        Some(CloseReason::MaxAge)
    );
    // A request waiting for body bytes: left alone while they come, closed once none came
    // for body_read_timeout (the request's own handler may wait for ever).
    let waiting = activity(s(600), true, 1, s(0));
    waiting.bodies_waiting.store(1, Ordering::Relaxed);
    waiting.last_body_ms.store(
        waiting.since_born_ms() - l.body_read_timeout.as_millis() as u64 + 1_000,
        Ordering::Relaxed,
    );
    assert_eq!(due(&waiting, &l), None);
    waiting.last_body_ms.store(
        waiting.since_born_ms() - l.body_read_timeout.as_millis() as u64,
        Ordering::Relaxed,
    );
    assert_eq!(due(&waiting, &l), Some(CloseReason::BodyTimeout));
}
