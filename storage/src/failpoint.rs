//! Deterministic test-only failpoints, compiled in and cheap when unset.
//!
//! `STALLWATCH_FAILPOINTS=checkpoint.after_rename:3` aborts the process (like `kill -9`:
//! no destructors, no flush) on the 3rd time the `checkpoint.after_rename` point is hit;
//! `watchdog.observe:1:panic` panics there instead (a bug in that thread or task).
//! Several points are separated by commas. Read once per process; when the variable is
//! unset each [`hit`] is one `OnceLock` load and an empty-map check. Used by the tests that
//! prove a half-done commit is rolled forward on restart (issue 4, Tests) and that a stage
//! that dies of a panic stops stallwatch instead of leaving it running without it.
//!
//! Points: `checkpoint.after_rename` (reaper, after each move of a checkpoint commit),
//! `watchdog.observe` (each batch of committed telemetry the watchdog reads).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable holding `name:count[,name:count...]`.
pub const FAILPOINTS_ENV: &str = "STALLWATCH_FAILPOINTS";

/// A configured point: on which pass, what it does, and the passes so far.
struct Point {
    at: u64,
    panics: bool,
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
            let (name, n) = p.rsplit_once(':')?;
            let point = Point {
                at: n.parse().ok()?,
                panics,
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
    if let Some(p) = points.get(name) {
        if p.passes.fetch_add(1, Ordering::SeqCst) + 1 == p.at {
            if p.panics {
                panic!("failpoint {name}:{} reached", p.at);
            }
            eprintln!("failpoint {name}:{} reached: aborting", p.at);
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_names_and_counts() {
        let p = super::parse("checkpoint.after_rename:3, other:1:panic,bad,worse:x:panic");
        assert_eq!(p.len(), 2);
        assert_eq!(p["checkpoint.after_rename"].at, 3);
        assert!(!p["checkpoint.after_rename"].panics);
        assert_eq!(p["other"].at, 1);
        assert!(p["other"].panics);
    }
}
