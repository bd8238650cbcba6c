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
    }
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
}
