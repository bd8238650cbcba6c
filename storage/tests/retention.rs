//! Size retention at the cap on a real SQLite file (issue 16, "Retention keeps up with
//! ingest"; docs/design.md, Durability levels): sustained writes at the cap are accepted
//! while the oldest batches go, the database file plus its `-wal` and `-shm` stay within
//! the cap, and below the high watermark nothing is deleted.

#![allow(missing_docs, clippy::unwrap_used)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stallwatch_storage::config::telemetry_budget_bytes;
use stallwatch_storage::model::*;
use stallwatch_storage::telemetry::{RefusedReason, TraceQuery};
use stallwatch_storage::{Storage, StorageConfig, WriteError};

const MIB: u64 = 1024 * 1024;

fn config(dir: &tempfile::TempDir, cap: u64) -> StorageConfig {
    let mut c = StorageConfig::new(dir.path().join("stallwatch.db"));
    c.retention_interval = Duration::from_secs(3600);
    c.max_db_bytes = cap;
    c
}

/// Request `seq` of writer `w` shaped like an otlp-blast request: 512 spans in 8-span
/// traces over two services, each span with a tool name and four 24-character attributes.
fn request(w: u8, seq: u32) -> Arc<TraceBatch> {
    let mut x = u64::from(seq) << 8 | u64::from(w);
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 16
    };
    let trace = |i: usize| {
        let mut t = [0u8; 16];
        t[0] = w;
        t[1..5].copy_from_slice(&seq.to_le_bytes());
        t[5..9].copy_from_slice(&(i as u32 / 8).to_le_bytes());
        t[15] = 1;
        TraceId(t)
    };
    let resource_spans = ["tauri-backend", "mcp-runner-python"]
        .iter()
        .enumerate()
        .map(|(r, service)| ResourceSpans {
            resource: Resource {
                attributes: vec![
                    KeyValue::new("service.name", AnyValue::String((*service).into())),
                    KeyValue::new("process.pid", AnyValue::Int(4000 + r as i64)),
                ],
                ..Default::default()
            },
            scope_spans: vec![ScopeSpans {
                scope: Scope {
                    name: "blast".into(),
                    ..Default::default()
                },
                spans: (r * 256..(r + 1) * 256)
                    .map(|i| {
                        let mut sid = [0u8; 8];
                        sid[..4].copy_from_slice(&(i as u32).to_le_bytes());
                        sid[4..].copy_from_slice(&seq.to_le_bytes());
                        let mut attributes = vec![KeyValue::new(
                            "gen_ai.tool.name",
                            AnyValue::String(
                                if i % 2 == 0 {
                                    "run_notebook"
                                } else {
                                    "read_file"
                                }
                                .into(),
                            ),
                        )];
                        for k in 0..4 {
                            let v: String = (0..24)
                                .map(|_| (b'a' + (next() % 26) as u8) as char)
                                .collect();
                            attributes.push(KeyValue::new(
                                format!("workbench.attr.{k}"),
                                AnyValue::String(v),
                            ));
                        }
                        Span {
                            trace_id: trace(i),
                            span_id: SpanId(sid),
                            name: "tools/call".into(),
                            start_time_unix_nano: 1_000_000 + u64::from(seq) * 1000 + i as u64,
                            end_time_unix_nano: 2_000_000 + u64::from(seq) * 1000 + i as u64,
                            attributes,
                            ..Default::default()
                        }
                    })
                    .collect(),
            }],
        })
        .collect();
    Arc::new(TraceBatch { resource_spans })
}

/// Bytes of the database file, its `-wal` and its `-shm`.
fn file_set_bytes(db: &Path) -> u64 {
    ["", "-wal", "-shm"]
        .iter()
        .map(|s| {
            let mut p = db.as_os_str().to_owned();
            p.push(s);
            std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
        })
        .sum()
}

/// The peak of [`file_set_bytes`] sampled on a thread every `every`, until [`PeakSampler::stop`].
struct PeakSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl PeakSampler {
    fn start(db: &Path, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, peak, db) = (stop.clone(), peak.clone(), db.to_path_buf());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(file_set_bytes(&db), Ordering::Relaxed);
                    std::thread::sleep(every);
                }
            })
        };
        Self { stop, peak, thread }
    }

    /// Stops sampling; answers the peak, bytes.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        self.peak.load(Ordering::Relaxed)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_writes_at_the_cap_are_accepted_oldest_first_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 32 * MIB;
    let cfg = config(&dir, cap);
    let db = cfg.path.clone();
    let storage = Storage::open(cfg).unwrap();
    let budget = telemetry_budget_bytes(cap);

    // sample the file set while two writers keep the writer busy
    let sampler = PeakSampler::start(&db, Duration::from_millis(2));
    // enough to fill the cap several times over with payloads stored compressed (~2.5x)
    const PER_WRITER: u32 = 250;
    let writers: Vec<_> = (0..2u8)
        .map(|w| {
            let storage = storage.clone();
            tokio::spawn(async move {
                let mut refused = Vec::new();
                for seq in 0..PER_WRITER {
                    if let Err(e) = storage.write_traces(request(w, seq)).await {
                        refused.push((seq, e.to_string()));
                    }
                }
                refused
            })
        })
        .collect();
    let mut refused = Vec::new();
    for w in writers {
        refused.extend(w.await.unwrap());
    }
    let peak = sampler.stop();

    let stats = storage.telemetry_stats();
    assert!(
        refused.is_empty(),
        "{} of {} writes refused at the cap, first: {:?}",
        refused.len(),
        2 * PER_WRITER,
        refused.first()
    );
    assert_eq!(stats.refused(RefusedReason::StorageFull), 0);
    assert_eq!(stats.spans_committed(), 2 * u64::from(PER_WRITER) * 512);
    // The cap was reached several times over: retention deleted most of what was written.
    let deleted = stats_batches_deleted(&storage);
    assert!(
        deleted > u64::from(PER_WRITER),
        "only {deleted} batches deleted: the cap was never really reached"
    );
    assert!(
        stats.db_used_bytes() <= budget,
        "{} bytes in use over the telemetry budget {budget}",
        stats.db_used_bytes()
    );
    eprintln!(
        "cap {cap}: file set peak {peak} bytes, {deleted} batches deleted, {} bytes in use of {budget}",
        stats.db_used_bytes()
    );
    assert!(
        peak <= cap + cap / 10,
        "database + WAL + shm peaked at {peak} bytes against the {cap}-byte cap"
    );

    // Oldest first: both writers' first requests are gone, their last ones are whole.
    for w in 0..2u8 {
        let first = request(w, 0).resource_spans[0].scope_spans[0].spans[0].trace_id;
        assert!(
            storage.trace(first).await.unwrap().is_none(),
            "writer {w}'s first trace is still stored"
        );
        let last = request(w, PER_WRITER - 1);
        for rs in &last.resource_spans {
            for s in rs.scope_spans[0].spans.iter().step_by(8) {
                let view = storage.trace(s.trace_id).await.unwrap();
                assert_eq!(
                    view.map(|v| v.spans.len()),
                    Some(8),
                    "writer {w}'s newest trace {:?} is not whole",
                    s.trace_id
                );
            }
        }
    }
    // The read API still works over what is left: the newest page is of the newest requests.
    let page = storage
        .search_traces(TraceQuery {
            limit: 20,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 20);
    assert_eq!(
        storage.integrity_check().await.unwrap(),
        vec!["ok".to_string()]
    );
    storage.shutdown().await;
}

/// A counter of the writer's `/metrics` exposition.
fn stat(storage: &Storage, name: &str) -> f64 {
    use stallwatch_storage::MetricsSource;
    let mut text = String::new();
    storage.telemetry_stats().render_prometheus(&mut text);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_bound_the_wal_waits_for_a_reader_then_rewinds() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 64 * MIB; // WAL bound: 4 MiB
    let cfg = config(&dir, cap);
    let mut wal = cfg.path.as_os_str().to_owned();
    wal.push("-wal");
    let wal = std::path::PathBuf::from(wal);
    let storage = Storage::open(cfg.clone()).unwrap();
    let mut seq = 0u32;
    storage.write_traces(request(0, seq)).await.unwrap();

    // Healthy: the WAL is checkpointed and rewound as it passes its bound; no wait times out.
    for _ in 0..60 {
        seq += 1;
        storage.write_traces(request(0, seq)).await.unwrap();
    }
    assert_eq!(
        stat(&storage, "stallwatch_storage_wal_waits_timed_out_total"),
        0.0
    );
    let healthy = std::fs::metadata(&wal).unwrap().len();
    assert!(
        healthy <= 8 * MIB,
        "the WAL reached {healthy} bytes with no reader (bound 4 MiB)"
    );

    // A reader holds an old snapshot: no checkpoint can pass its frames, the WAL cannot
    // rewind. The writer waits for it (2 s at most), then commits on; nothing is refused.
    let reader = rusqlite::Connection::open(&cfg.path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM span_batches", [], |r| r.get(0))
        .unwrap();
    for _ in 0..60 {
        seq += 1;
        storage.write_traces(request(0, seq)).await.unwrap();
    }
    assert!(stat(&storage, "stallwatch_storage_wal_waits_timed_out_total") >= 1.0);
    assert!(stat(&storage, "stallwatch_storage_wal_wait_seconds_total") >= 1.9);

    // The reader lets go: the next groups checkpoint the WAL, rewind it and truncate it back.
    reader.execute_batch("ROLLBACK").unwrap();
    drop(reader);
    tokio::time::sleep(Duration::from_millis(2100)).await; // past the no-wait spell
    for _ in 0..40 {
        seq += 1;
        storage.write_traces(request(0, seq)).await.unwrap();
    }
    let after = std::fs::metadata(&wal).unwrap().len();
    assert!(
        after <= 8 * MIB,
        "the WAL is {after} bytes after the reader let go (bound 4 MiB)"
    );
    assert_eq!(
        storage.telemetry_stats().spans_committed(),
        u64::from(seq + 1) * 512
    );
    storage.shutdown().await;
}

fn stats_batches_deleted(storage: &Storage) -> u64 {
    use stallwatch_storage::MetricsSource;
    let mut text = String::new();
    storage.telemetry_stats().render_prometheus(&mut text);
    text.lines()
        .find_map(|l| l.strip_prefix("stallwatch_storage_retention_batches_deleted_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn below_the_high_watermark_nothing_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 32 * MIB;
    let storage = Storage::open(config(&dir, cap)).unwrap();
    let budget = telemetry_budget_bytes(cap);
    let stats = storage.telemetry_stats();
    let mut seq = 0;
    // up to 70% of the budget (the high watermark is 85%)
    while stats.db_used_bytes() < budget / 100 * 70 {
        storage.write_traces(request(0, seq)).await.unwrap();
        seq += 1;
    }
    assert!(seq > 4, "only {seq} requests filled 70% of the budget");
    assert_eq!(stats_batches_deleted(&storage), 0);
    let report = storage.run_retention().await.unwrap();
    assert_eq!(report.batches_deleted, 0, "{report:?}");
    let first = request(0, 0).resource_spans[0].scope_spans[0].spans[0].trace_id;
    assert_eq!(
        storage.trace(first).await.unwrap().map(|v| v.spans.len()),
        Some(8),
        "the oldest trace went below the high watermark"
    );
    storage.shutdown().await;
}

/// A log export of `n` records of ~1 KiB of varied text each (the FTS index grows with it).
fn log_flood(seq: u32, n: u32) -> Arc<LogBatch> {
    let mut x = u64::from(seq).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut word = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        format!("{:x}", x % 0xFF_FFFF)
    };
    let records = (0..n)
        .map(|i| LogRecord {
            time_unix_nano: 1_700_000_000_000_000_000 + u64::from(seq) * 1000 + u64::from(i),
            severity_number: 9,
            body: AnyValue::String((0..150).map(|_| word()).collect::<Vec<_>>().join(" ")),
            ..Default::default()
        })
        .collect();
    Arc::new(LogBatch {
        resource_logs: vec![ResourceLogs {
            resource: Resource::default(),
            scope_logs: vec![ScopeLogs {
                scope: Scope::default(),
                log_records: records,
            }],
        }],
    })
}

/// A 1-span trace, id `k`.
fn trickle(k: u32) -> (TraceId, Arc<TraceBatch>) {
    let mut t = [0xAB; 16];
    t[..4].copy_from_slice(&k.to_be_bytes());
    let batch = Arc::new(TraceBatch {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id: TraceId(t),
                    span_id: SpanId([1; 8]),
                    name: "trickle".into(),
                    start_time_unix_nano: 1_000,
                    end_time_unix_nano: 2_000,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    });
    (TraceId(t), batch)
}

/// At the cap, the oldest data goes whatever its signal: a trickle of 1-span traces beside a
/// flood of logs keeps every trace received after the oldest log still kept. Size retention
/// used to take trace batches up to ~8 MiB of *their* bytes (every tiny batch, the newest
/// included) and then every log received up to the newest of them: all traces and nearly
/// all logs went, newest first (found by an outside-style round: 89 of 89 traces and all but
/// 600 of 166,000 logs deleted at a 64 MiB cap).
#[tokio::test]
async fn at_the_cap_the_oldest_data_goes_whatever_its_signal() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 32 * MIB;
    let storage = Storage::open(config(&dir, cap)).unwrap();
    let budget = telemetry_budget_bytes(cap);
    let stats = storage.telemetry_stats();
    let mut traces: Vec<(TraceId, u64)> = Vec::new();
    let mut written = 0u64;
    let mut seq = 0u32;
    let mut prev_used = 0;
    // The bytes in use each time they went down (size retention ran).
    let mut after_retention = Vec::new();
    while written < budget * 2 {
        storage.write_logs(log_flood(seq, 100)).await.unwrap();
        written += 100 * 1100;
        if seq.is_multiple_of(3) {
            let (tid, batch) = trickle(seq);
            let before = stallwatch_storage::model::now_unix_nano();
            storage.write_traces(batch).await.unwrap();
            traces.push((tid, before));
        }
        let used = stats.db_used_bytes();
        if used < prev_used {
            after_retention.push(used);
        }
        prev_used = used;
        seq += 1;
    }
    assert!(!after_retention.is_empty(), "no retention at the cap");
    // Retention deletes down to the low watermark (75% of the budget), not everything.
    let least = after_retention.iter().copied().min().unwrap_or(0);
    assert!(
        least > budget / 2,
        "size retention left {least} of {budget} bytes in use (expected ~75%)"
    );
    let db = rusqlite::Connection::open_with_flags(
        dir.path().join("stallwatch.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let (oldest_log, kept_logs): (i64, i64) = db
        .query_row(
            "SELECT min(received_unix_nano), count(*) FROM logs",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        (kept_logs as u64) < u64::from(seq) * 100,
        "no log was deleted"
    );
    assert!(kept_logs > 1000, "only {kept_logs} logs kept");
    let mut newer = 0;
    for (tid, before) in &traces {
        if *before as i64 > oldest_log {
            newer += 1;
            assert!(
                storage.trace(*tid).await.unwrap().is_some(),
                "a trace received after the oldest kept log was deleted"
            );
        }
    }
    assert!(
        newer >= 3,
        "only {newer} traces newer than the oldest kept log"
    );
    storage.shutdown().await;
}

/// A log flood at the cap keeps the database, its WAL and shm within the cap (plus 10%),
/// and the log body index drops its oldest generations whole as their rows go
/// (`log_body.rs`). Before the index came in generations, each deleted record was deleted
/// from one FTS5 index, and the merges that started rewrote most of the index inside the
/// deleting transaction: 16-28 MiB of WAL against a 4 MiB WAL share (an outside-style round
/// saw the data folder at 74 MiB against a 64 MiB cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_flood_at_the_cap_stays_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 32 * MIB;
    let cfg = config(&dir, cap);
    let db = cfg.path.clone();
    let storage = Storage::open(cfg).unwrap();
    let budget = telemetry_budget_bytes(cap);
    let sampler = PeakSampler::start(&db, Duration::from_millis(2));
    // ~1.1 KB records, 200 per export, three times the budget from two writers
    let per_writer = (3 * budget / (200 * 1100) / 2) as u32;
    let writers: Vec<_> = (0..2u32)
        .map(|w| {
            let storage = storage.clone();
            tokio::spawn(async move {
                let mut refused = Vec::new();
                for seq in 0..per_writer {
                    if let Err(e) = storage
                        .write_logs(log_flood(w * 1_000_000 + seq, 200))
                        .await
                    {
                        refused.push((seq, e.to_string()));
                    }
                }
                refused
            })
        })
        .collect();
    let mut refused = Vec::new();
    for w in writers {
        refused.extend(w.await.unwrap());
    }
    let peak = sampler.stop();
    let raw =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let (kept, oldest_id): (i64, i64) = raw
        .query_row("SELECT count(*), min(id) FROM logs", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    let gens: Vec<(i64, i64)> = raw
        .prepare("SELECT gen, first_id FROM log_body_generations ORDER BY gen")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    eprintln!(
        "log flood at a {cap}-byte cap: file set peak {peak} bytes, {kept} logs kept, generations {gens:?}, {} of {} writes refused, first: {:?}",
        refused.len(),
        2 * per_writer,
        refused.first()
    );
    assert!(
        refused.is_empty(),
        "{} of {} writes refused at the cap, first: {:?}",
        refused.len(),
        2 * per_writer,
        refused.first()
    );
    assert!(
        (kept as u64) < 2 * u64::from(per_writer) * 200,
        "no log was deleted: the cap was never reached"
    );
    assert!(
        peak <= cap + cap / 10,
        "database + WAL + shm peaked at {peak} bytes against the {cap}-byte cap"
    );
    // generations were opened as the flood went on, and the oldest ones dropped whole: only
    // the oldest one left may start before the oldest log kept
    assert!(gens[0].0 > 1, "generation 1 was never dropped: {gens:?}");
    assert!(
        gens.len() >= 2 && gens[1].1 > oldest_id,
        "a generation whose rows are all gone was kept: {gens:?}, oldest log {oldest_id}"
    );
    let tables: i64 = raw
        .query_row(
            "SELECT count(*) FROM sqlite_schema
             WHERE name GLOB 'logs_body_*' AND sql LIKE 'CREATE VIRTUAL TABLE%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, gens.len() as i64, "one FTS5 table per generation");
    assert_eq!(
        storage.integrity_check().await.unwrap(),
        vec!["ok".to_string()]
    );
    storage.shutdown().await;
}

/// Row ids only grow, even after retention emptied a table and stallwatch restarted
/// (`writer/ids.rs`): SQLite gives the largest id plus one, so the first rows after an
/// emptied table took id 1 again, behind the live tail's last id and inside the log body
/// index's older generations.
#[tokio::test]
async fn row_ids_only_grow_after_retention_emptied_the_tables_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir, 64 * MIB);
    cfg.retention = Duration::from_millis(300);
    let db = cfg.path.clone();
    let point = |t: u64| MetricPoint {
        name: "queue.depth".into(),
        description: String::new(),
        unit: "1".into(),
        kind: MetricKind::Gauge,
        start_time_unix_nano: 0,
        time_unix_nano: t,
        value: Some(1.0),
        count: None,
        sum: None,
        attributes: Vec::new(),
        detail: "{}".into(),
    };
    let metrics = |t: u64| {
        Arc::new(MetricBatch {
            resource_metrics: vec![ResourceMetrics {
                resource: Resource::default(),
                scope_metrics: vec![ScopeMetrics {
                    scope: Scope::default(),
                    points: vec![point(t), point(t + 1)],
                }],
            }],
        })
    };
    let max_ids = || {
        let c = rusqlite::Connection::open(&db).unwrap();
        let q = |t: &str| -> i64 {
            c.query_row(&format!("SELECT coalesce(max(id), 0) FROM {t}"), [], |r| {
                r.get(0)
            })
            .unwrap()
        };
        [q("span_batches"), q("logs"), q("metric_points")]
    };
    let st = Storage::open(cfg.clone()).unwrap();
    for k in 0..3 {
        st.write_traces(trickle(k).1).await.unwrap();
        st.write_logs(log_flood(k, 4)).await.unwrap();
        st.write_metrics(metrics(u64::from(k) * 10)).await.unwrap();
    }
    let before = max_ids();
    assert_eq!(before, [3, 12, 6]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let report = st.run_retention().await.unwrap();
    assert_eq!(
        (
            report.batches_deleted,
            report.logs_deleted,
            report.points_deleted
        ),
        (3, 12, 6),
        "{report:?}"
    );
    assert_eq!(max_ids(), [0, 0, 0], "every table emptied");
    // the forwarder sees the ids used, not an emptied table to restart from 0 (it would
    // count the ids before the first new row as rows lost)
    for (signal, used) in [
        (stallwatch_storage::forward::Signal::Traces, 3),
        (stallwatch_storage::forward::Signal::Logs, 12),
        (stallwatch_storage::forward::Signal::Metrics, 6),
    ] {
        assert_eq!(st.forward_max_id(signal).await.unwrap(), used);
    }
    st.shutdown().await;
    drop(st);
    let st = Storage::open(cfg).unwrap();
    st.write_traces(trickle(9).1).await.unwrap();
    st.write_logs(log_flood(9, 1)).await.unwrap();
    st.write_metrics(metrics(90)).await.unwrap();
    let after = max_ids();
    assert_eq!(after, [4, 13, 8], "ids go on from where they were");
    // the live tail after its last id sees the new record
    let (tail, _) = st
        .logs_after(Default::default(), before[1], 10)
        .await
        .unwrap();
    assert_eq!(tail.len(), 1);
    st.shutdown().await;
}

/// Age retention deleting a full store, then giving the pages back, keeps the database,
/// its WAL and shm within the cap, and leaves the WAL within its share once done (an idle
/// sidecar writes nothing that would rewind it later). `PRAGMA incremental_vacuum(N)` run
/// with one step freed one page in its own commit: an outside-style round saw the data
/// folder at 117 MiB against a 64 MiB cap (WAL 84 MiB, 1,995 commits of ~2.7 pages), and
/// it stayed so while idle; nothing checkpointed between a pass's transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_retention_of_a_full_store_stays_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 64 * MIB;
    let mut cfg = config(&dir, cap);
    cfg.retention = Duration::from_millis(500);
    let db = cfg.path.clone();
    let storage = Storage::open(cfg).unwrap();
    let stats = storage.telemetry_stats();
    let mut seq = 0;
    while stats.db_used_bytes() < 30 * MIB {
        storage.write_traces(request(0, seq)).await.unwrap();
        seq += 1;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let sampler = PeakSampler::start(&db, Duration::from_millis(1));
    let report = storage.run_retention().await.unwrap();
    let peak = sampler.stop().max(file_set_bytes(&db));
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let wal = std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0);
    let file = std::fs::metadata(&db).unwrap().len();
    eprintln!(
        "age retention of {seq} requests: {report:?}; file set peak {peak} bytes, then file {file} and WAL {wal} bytes"
    );
    assert_eq!(report.batches_deleted, u64::from(seq), "{report:?}");
    assert!(
        file < 8 * MIB,
        "the freed pages were not given back: the file is {file} bytes"
    );
    assert!(
        peak <= cap + cap / 10,
        "database + WAL + shm peaked at {peak} bytes against the {cap}-byte cap"
    );
    assert!(
        wal <= stallwatch_storage::config::wal_budget_bytes(cap),
        "the WAL was left at {wal} bytes after the pass"
    );
    storage.shutdown().await;
}

/// Gauge points of `instruments` instruments × 2 services × 4 series, `per` each, at
/// times from `t`.
fn gauges(instruments: u32, per: u32, t: u64) -> Arc<MetricBatch> {
    let point = |name: String, series: u32, time: u64| MetricPoint {
        name,
        description: String::new(),
        unit: "1".into(),
        kind: MetricKind::Gauge,
        start_time_unix_nano: 0,
        time_unix_nano: time,
        value: Some(time as f64),
        count: None,
        sum: None,
        attributes: vec![KeyValue::new(
            "series",
            AnyValue::String(format!("s{series}")),
        )],
        detail: "{}".into(),
    };
    Arc::new(MetricBatch {
        resource_metrics: (0..2)
            .map(|svc| ResourceMetrics {
                resource: Resource {
                    attributes: vec![KeyValue::new(
                        "service.name",
                        AnyValue::String(format!("svc-{svc}")),
                    )],
                    ..Default::default()
                },
                scope_metrics: vec![ScopeMetrics {
                    scope: Scope::default(),
                    points: (0..instruments)
                        .flat_map(|i| {
                            (0..4u32).flat_map(move |s| {
                                (0..per)
                                    .map(move |k| point(format!("gauge.{i}"), s, t + u64::from(k)))
                            })
                        })
                        .collect(),
                }],
            })
            .collect(),
    })
}

/// At the cap, the instrument list (`GET /api/v1/metrics`) stays exact while retention
/// deletes points: each instrument's count is what is stored, its first and last times
/// those of its oldest and newest points. It was counted again only after a whole size
/// step, and a step runs on while the groups it serves add points: an outside-style round
/// saw counts 2-11x the points stored.
#[tokio::test]
async fn at_the_cap_the_instrument_list_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 32 * MIB;
    let db = dir.path().join("stallwatch.db");
    let storage = Storage::open(config(&dir, cap)).unwrap();
    let budget = telemetry_budget_bytes(cap);
    let raw =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut written = 0u64;
    let mut t = 1_000_000_000u64;
    let mut checked = 0;
    while written < 3 * budget {
        storage.write_metrics(gauges(3, 250, t)).await.unwrap();
        t += 250;
        written += 3 * 2 * 4 * 250 * 200;
        // one snapshot: the list the API answers from (`metric_instruments`), and what is
        // stored
        raw.execute_batch("BEGIN").unwrap();
        let instruments = |sql: &str| -> Vec<(String, String, u64, u64, u64)> {
            raw.prepare(sql)
                .unwrap()
                .query_map([], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get::<_, i64>(2)? as u64,
                        r.get::<_, i64>(3)? as u64,
                        r.get::<_, i64>(4)? as u64,
                    ))
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        let listed = instruments(
            "SELECT name, service, point_count, first_time, last_time
             FROM metric_instruments ORDER BY name, service",
        );
        let stored = instruments(
            "SELECT name, service, count(*), min(time_unix_nano), max(time_unix_nano)
             FROM metric_points GROUP BY name, service ORDER BY name, service",
        );
        raw.execute_batch("COMMIT").unwrap();
        assert_eq!(
            listed, stored,
            "the instrument list against the points stored"
        );
        checked += stored.len();
    }
    // the API answers from the same table
    let api = storage.instruments(None, None, 1000).await.unwrap().items;
    assert_eq!(api.len(), 6);
    let deleted: i64 = raw
        .query_row("SELECT count(*) FROM metric_points", [], |r| r.get(0))
        .unwrap();
    assert!(
        (deleted as u64) < written / 200,
        "no point was deleted: the cap was never reached"
    );
    assert!(checked > 100, "only {checked} instruments compared");
    storage.shutdown().await;
}

/// A group that fits the budget by its estimate but needs more pages than are free (a
/// log export whose body index costs as much again) is refused as a moment at the cap
/// (`WriteError::AtCap`, retry in 1 s), the oldest are deleted to make room, no
/// `storage.full` episode starts, and the retries go through. It was refused as a full
/// disk ("retry in 10 s") and, with the bytes in use under the high watermark, nothing
/// was deleted: the same export failed on every retry.
#[tokio::test]
async fn a_group_larger_than_its_estimate_at_the_cap_is_a_moment_not_a_full_disk() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 32 * MIB;
    let storage = Storage::open(config(&dir, cap)).unwrap();
    let budget = telemetry_budget_bytes(cap);
    let stats = storage.telemetry_stats();
    // above the low watermark (75%), under the high one (85%)
    let mut seq = 0;
    while stats.db_used_bytes() < budget / 100 * 79 {
        storage.write_traces(request(0, seq)).await.unwrap();
        seq += 1;
    }
    assert!(stats.db_used_bytes() < budget / 100 * 85);
    let batch = log_flood(1, 1500);
    let mut at_cap = 0;
    let mut stored = false;
    for _ in 0..8 {
        match storage.write_logs(batch.clone()).await {
            Ok(()) => {
                stored = true;
                break;
            }
            Err(WriteError::AtCap(why)) => {
                at_cap += 1;
                assert!(why.contains("max_db_bytes"), "{why}");
                assert!(
                    storage.storage_full().borrow().is_none(),
                    "a moment at the cap started a storage.full episode"
                );
                assert!(storage.degraded().borrow().is_none());
            }
            Err(e) => panic!("refused as {e:?}"),
        }
    }
    eprintln!("{at_cap} refusals at the cap before the export was stored");
    assert!(stored, "the export was never stored");
    assert!(
        at_cap >= 1,
        "the export fit at once: the test no longer reaches the page limit"
    );
    assert_eq!(stats.refused(RefusedReason::StorageFull), at_cap);
    storage.shutdown().await;
}
