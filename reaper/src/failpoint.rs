//! Deterministic test-only failpoints, compiled in and cheap when unset.
//!
//! `STALLWATCH_FAILPOINTS=checkpoint.after_rename:3` aborts the process (like `kill -9`:
//! no destructors, no flush) on the 3rd time the `checkpoint.after_rename` point is hit.
//! Several points are separated by commas. Read once per process; when the variable is
//! unset each [`hit`] is one `OnceLock` load and an empty-map check. Used by the tests that
//! prove a half-done commit is rolled forward on restart (issue 4, Tests).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable holding `name:count[,name:count...]`.
pub const FAILPOINTS_ENV: &str = "STALLWATCH_FAILPOINTS";

static POINTS: OnceLock<HashMap<String, (u64, AtomicU64)>> = OnceLock::new();

fn parse(spec: &str) -> HashMap<String, (u64, AtomicU64)> {
    spec.split(',')
        .filter_map(|p| {
            let (name, n) = p.trim().rsplit_once(':')?;
            Some((name.to_string(), (n.parse().ok()?, AtomicU64::new(0))))
        })
        .collect()
}

/// Counts a pass through failpoint `name`; aborts the process on the configured pass.
pub fn hit(name: &str) {
    let points = POINTS.get_or_init(|| parse(&std::env::var(FAILPOINTS_ENV).unwrap_or_default()));
    if points.is_empty() {
        return;
    }
    if let Some((at, count)) = points.get(name) {
        if count.fetch_add(1, Ordering::SeqCst) + 1 == *at {
            eprintln!("failpoint {name}:{at} reached: aborting");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_names_and_counts() {
        let p = super::parse("checkpoint.after_rename:3, other:1,bad");
        assert_eq!(p.len(), 2);
        assert_eq!(p["checkpoint.after_rename"].0, 3);
    }
}
