//! Deterministic test-only failpoints, compiled in and cheap when unset.
//!
//! `STALLWATCH_FAILPOINTS=checkpoint.after_rename:3` aborts the process (like `kill -9`:
//! no destructors, no flush) on the 3rd time the `checkpoint.after_rename` point is hit;
//! `watchdog.observe:1:panic` panics there instead (a bug in that thread or task);
//! `reaper.exit_record:1:delay1500` makes the 1st pass wait 1.5 s ([`delay`]: a slow step,
//! to open a race window deterministically).
//! Several points are separated by commas. Read once per process; when the variable is
//! unset each [`hit`] is one `OnceLock` load and an empty-map check. Used by the tests that
//! prove a half-done commit is rolled forward on restart (issue 4, Tests) and that a stage
//! that dies of a panic stops stallwatch instead of leaving it running without it.
//!
//! Points: `checkpoint.after_rename` (reaper, after each move of a checkpoint commit),
//! `watchdog.observe` (each batch of committed telemetry the watchdog reads),
//! `reaper.exit_record` (a [`delay`] point: the Windows reaper, before it records a
//! runner's own exit).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable holding `name:count[,name:count...]`.
pub const FAILPOINTS_ENV: &str = "STALLWATCH_FAILPOINTS";

/// A configured point: on which pass, what it does, and the passes so far.
struct Point {
    at: u64,
    panics: bool,
    /// A [`delay`] point: how long its pass waits.
    delay: Option<std::time::Duration>,
    passes: AtomicU64,
}

static POINTS: OnceLock<HashMap<String, Point>> = OnceLock::new();

fn parse(spec: &str) -> HashMap<String, Point> {
    spec.split(',')
        .filter_map(|p| {
            let p = p.trim();
            let (p, panics) = match p.strip_suffix(":panic") {
                Some(rest) => (rest, true),
                None => (p, false),
            };
            let (p, delay) = match p.rsplit_once(":delay") {
                Some((rest, ms)) => (
                    rest,
                    Some(std::time::Duration::from_millis(ms.parse().ok()?)),
                ),
                None => (p, None),
            };
            let (name, n) = p.rsplit_once(':')?;
            let point = Point {
                at: n.parse().ok()?,
                panics,
                delay,
                passes: AtomicU64::new(0),
            };
            Some((name.to_string(), point))
        })
        .collect()
}

/// Counts a pass through failpoint `name`; on the configured pass, aborts the process or
/// panics (`:panic`).
pub fn hit(name: &str) {
    let points = POINTS.get_or_init(|| parse(&std::env::var(FAILPOINTS_ENV).unwrap_or_default()));
    if points.is_empty() {
        return;
    }
    if let Some(p) = points.get(name).filter(|p| p.delay.is_none()) {
        if p.passes.fetch_add(1, Ordering::SeqCst) + 1 == p.at {
            if p.panics {
                panic!("failpoint {name}:{} reached", p.at);
            }
            eprintln!("failpoint {name}:{} reached: aborting", p.at);
            std::process::abort();
        }
    }
}

/// Counts a pass through delay point `name` (`name:count:delay<ms>`); on the configured pass,
/// answers how long the caller waits there (the caller sleeps, so an async task does not
/// block its thread). `None` on every other pass and when the point is not set.
pub fn delay(name: &str) -> Option<std::time::Duration> {
    let points = POINTS.get_or_init(|| parse(&std::env::var(FAILPOINTS_ENV).unwrap_or_default()));
    let p = points.get(name)?;
    let d = p.delay?;
    (p.passes.fetch_add(1, Ordering::SeqCst) + 1 == p.at).then_some(d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_names_and_counts() {
        let p = super::parse(
            "checkpoint.after_rename:3, other:1:panic,bad,worse:x:panic,slow:2:delay1500,no:1:delayx",
        );
        assert_eq!(p.len(), 3);
        assert_eq!(p["slow"].at, 2);
        assert_eq!(
            p["slow"].delay,
            Some(std::time::Duration::from_millis(1500))
        );
        assert_eq!(p["other"].delay, None);
        assert_eq!(p["checkpoint.after_rename"].at, 3);
        assert!(!p["checkpoint.after_rename"].panics);
        assert_eq!(p["other"].at, 1);
        assert!(p["other"].panics);
    }
}
