//! A degraded telemetry writer waits between its probes (docs/design.md, Durability
//! levels: "The writer probes every second and recovers by itself"). Alone in its test
//! binary, so the one thread named `stallwatch-telemetry-writer` is this test's.

#![allow(missing_docs, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use stallwatch_storage::model::*;
use stallwatch_storage::{Storage, StorageConfig};

fn batch(n: u8) -> Arc<TraceBatch> {
    Arc::new(TraceBatch {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id: TraceId([n; 16]),
                    span_id: SpanId([n; 8]),
                    name: format!("span {n}"),
                    start_time_unix_nano: 1_000,
                    end_time_unix_nano: 2_000,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    })
}

/// CPU time (user + system, clock ticks) of this process's threads named `name`.
#[cfg(target_os = "linux")]
fn thread_ticks(name: &str) -> u64 {
    let mut ticks = 0;
    let mut found = false;
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = t.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if comm.is_empty() || !name.starts_with(comm) {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = after.split_whitespace().collect();
        ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        found = true;
    }
    assert!(found, "no thread named {name}");
    ticks
}

/// A degraded writer (here: its database file deleted) whose retention pass came due
/// waits between probes instead of spinning: it used to wait 0 ms and probe in a loop,
/// a whole core until the episode ended (found by an outside-style round after a second
/// disk-full episode: ~125,000 `stat` calls a second).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_degraded_writer_does_not_spin_when_a_retention_pass_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = StorageConfig::new(dir.path().join("stallwatch.db"));
    c.retention_interval = Duration::from_millis(100);
    let storage = Storage::open(c).unwrap();
    storage.write_traces(batch(1)).await.unwrap();
    std::fs::remove_file(dir.path().join("stallwatch.db")).unwrap();
    assert!(storage.write_traces(batch(2)).await.is_err());
    // Past the retention interval, then two seconds of a degraded, idle writer.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = thread_ticks("stallwatch-telemetry-writer");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = thread_ticks("stallwatch-telemetry-writer") - before;
    // A spinning writer uses ~200 ticks (2 s at 100 Hz); a waiting one a few.
    assert!(used < 40, "the degraded writer used {used} ticks in 2 s");
    storage.shutdown().await;
}
