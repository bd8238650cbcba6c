//! The watchdog's benchmark (a bench binary, `harness = false`):
//!
//! - detection latency p50/p99 (trip received minus the threshold crossed) for SLA
//!   overruns and for heartbeat loss, with the default tick (50 ms) and a real SQLite file
//!   (the `breaker.opened` incident is recorded before the trip is sent, so it is included);
//! - CPU used watching 1000 runners with default heartbeat timings, every socket served by
//!   one Python asyncio helper process (`tests/data/many_sockets.py`);
//! - open-span ledger throughput with 512-span observations (open snapshots, then ended
//!   spans as in ordinary ingest), including the batched writes to SQLite.
//!
//! Run: `cargo bench -p stallwatch-watchdog --bench watchdog_bench`; pick sections with
//! `WATCHDOG_BENCH=sla,heartbeat,cpu,ledger` (default: all).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stallwatch_storage::control::{Observation, ObservedData, RunnerChange, Trip};
use stallwatch_storage::model::*;
use stallwatch_storage::{EventBus, Storage, StorageConfig};
use stallwatch_watchdog::{Watchdog, WatchdogConfig, WatchdogHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

struct Rig {
    _dir: tempfile::TempDir,
    handle: WatchdogHandle,
    obs: mpsc::Sender<Observation>,
    changes: mpsc::Sender<RunnerChange>,
    trips: mpsc::Receiver<Trip>,
    shutdown: CancellationToken,
    join: tokio::task::JoinHandle<()>,
    storage: Storage,
}

fn start(cfg: WatchdogConfig) -> Rig {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage =
        Storage::open(StorageConfig::new(dir.path().join("stallwatch.db"))).expect("storage");
    let events = EventBus::new(storage.clone());
    let (obs, obs_rx) = mpsc::channel(256);
    let (changes, ch_rx) = mpsc::channel(4096);
    let (trip_tx, trips) = mpsc::channel(4096);
    let shutdown = CancellationToken::new();
    let (handle, join) = Watchdog::start(
        cfg,
        storage.clone(),
        events,
        obs_rx,
        ch_rx,
        trip_tx,
        shutdown.clone(),
    );
    Rig {
        _dir: dir,
        handle,
        obs,
        changes,
        trips,
        shutdown,
        join,
        storage,
    }
}

async fn stop(rig: Rig) {
    rig.shutdown.cancel();
    let _ = rig.join.await;
    rig.storage.shutdown().await;
}

fn register(id: &str, socket: Option<PathBuf>) -> RunnerChange {
    RunnerChange::Registered {
        id: id.into(),
        pid: None,
        heartbeat_socket: socket,
        spawned: true,
        restarted: false,
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn report(name: &str, v: &mut [f64]) {
    println!(
        "{name}: n={} p50={:.1} ms p99={:.1} ms max={:.1} ms",
        v.len(),
        percentile(v, 0.5),
        percentile(v, 0.99),
        percentile(v, 1.0)
    );
}

fn span(trace: u64, span: u64, end: u64, sla_ms: Option<i64>) -> Span {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&trace.to_be_bytes());
    t[15] = 1;
    let mut s = [0u8; 8];
    s.copy_from_slice(&span.to_be_bytes());
    s[0] |= 0x80;
    let mut attributes = vec![
        KeyValue::new(
            "gen_ai.operation.name",
            AnyValue::String("execute_tool".into()),
        ),
        KeyValue::new("gen_ai.tool.name", AnyValue::String("bench_tool".into())),
    ];
    if let Some(v) = sla_ms {
        attributes.push(KeyValue::new("stallwatch.sla_ms", AnyValue::Int(v)));
    }
    Span {
        trace_id: TraceId(t),
        span_id: SpanId(s),
        parent_span_id: None,
        name: "execute_tool bench_tool".into(),
        kind: 1,
        start_time_unix_nano: 1,
        end_time_unix_nano: end,
        attributes,
        ..Default::default()
    }
}

fn batch(runner: Option<&str>, spans: Vec<Span>) -> Arc<TraceBatch> {
    let mut attributes = vec![KeyValue::new(
        "service.name",
        AnyValue::String("bench".into()),
    )];
    if let Some(r) = runner {
        attributes.push(KeyValue::new(
            "stallwatch.runner.id",
            AnyValue::String(r.into()),
        ));
    }
    Arc::new(TraceBatch {
        resource_spans: vec![ResourceSpans {
            resource: Resource {
                attributes,
                ..Default::default()
            },
            scope_spans: vec![ScopeSpans {
                scope: Scope::default(),
                spans,
            }],
        }],
    })
}

/// SLA overruns on runners without heartbeat sockets, one tool span each. `spacing_ms`
/// apart, SLAs of `sla_base_ms` + a spread: with a wide spacing every trip is alone (the
/// latency of one decision plus one `synchronous=FULL` incident insert); with a narrow one
/// trips come in a burst and queue behind each other's incident fsync.
async fn sla_latency(label: &str, n: u64, spacing_ms: u64, spread_ms: i64) {
    let mut cfg = WatchdogConfig::default();
    cfg.sla.min_sla = Duration::from_millis(100);
    let mut rig = start(cfg);
    for i in 0..n {
        let id = format!("sla-{i}");
        let _ = rig.changes.send(register(&id, None)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // send from another task so trips are received (and timed) while spans still go out
    let obs = rig.obs.clone();
    let sender = tokio::spawn(async move {
        let mut thresholds = std::collections::HashMap::new();
        for i in 0..n {
            let id = format!("sla-{i}");
            let sla = 300
                + if spread_ms > 0 {
                    (i as i64 * 97) % spread_ms
                } else {
                    0
                };
            let received = Instant::now();
            thresholds.insert(id.clone(), received + Duration::from_millis(sla as u64));
            let _ = obs
                .send(Observation {
                    received,
                    data: ObservedData::Spans(batch(Some(&id), vec![span(i, 1, 0, Some(sla))])),
                })
                .await;
            tokio::time::sleep(Duration::from_millis(spacing_ms)).await;
        }
        thresholds
    });
    let mut got = Vec::new();
    while got.len() < n as usize {
        let Ok(Some(t)) = tokio::time::timeout(Duration::from_secs(15), rig.trips.recv()).await
        else {
            break;
        };
        got.push((t.runner_id, Instant::now()));
    }
    let thresholds = sender.await.unwrap_or_default();
    let mut lat: Vec<f64> = got
        .iter()
        .filter_map(|(id, at)| {
            thresholds
                .get(id)
                .map(|th| at.saturating_duration_since(*th).as_secs_f64() * 1e3)
        })
        .collect();
    report(label, &mut lat);
    stop(rig).await;
}

/// A heartbeat server inside this process (its own runtime thread) that answers PONG until
/// told to stop, and remembers when it sent its last PONG.
struct InProcServer {
    last_pong: Arc<std::sync::Mutex<Option<Instant>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

fn serve(path: &Path, rt: &tokio::runtime::Handle) -> InProcServer {
    let _ = std::fs::remove_file(path);
    let listener = {
        let _g = rt.enter();
        tokio::net::UnixListener::bind(path).expect("bind")
    };
    let last_pong = Arc::new(std::sync::Mutex::new(None));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (lp, st) = (last_pong.clone(), stop.clone());
    rt.spawn(async move {
        loop {
            let Ok((mut c, _)) = listener.accept().await else {
                return;
            };
            let (lp, st) = (lp.clone(), st.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 16];
                let _ = c.read(&mut buf).await;
                if st.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    return;
                }
                if c.write_all(b"PONG\n").await.is_ok() {
                    if let Ok(mut g) = lp.lock() {
                        *g = Some(Instant::now());
                    }
                }
            });
        }
    });
    InProcServer { last_pong, stop }
}

/// Heartbeat loss: 40 runners with default timings (2000 / 5000 ms) whose servers stop
/// answering at different moments; threshold = last PONG sent + 5000 ms.
async fn heartbeat_latency() {
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rig = start(WatchdogConfig::default());
    let n = 40;
    let mut servers = Vec::new();
    for i in 0..n {
        let p = dir.path().join(format!("h{i}.sock"));
        servers.push(serve(&p, server_rt.handle()));
        let _ = rig
            .changes
            .send(register(&format!("hb-{i}"), Some(p)))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for s in &servers {
        s.stop.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(53)).await;
    }
    let mut lat = Vec::new();
    while lat.len() < n {
        let Ok(Some(t)) = tokio::time::timeout(Duration::from_secs(15), rig.trips.recv()).await
        else {
            break;
        };
        let now = Instant::now();
        let i: usize = t.runner_id.trim_start_matches("hb-").parse().unwrap_or(0);
        let last = servers[i].last_pong.lock().ok().and_then(|g| *g);
        if let Some(last) = last {
            let th = last + Duration::from_millis(5000);
            lat.push(now.saturating_duration_since(th).as_secs_f64() * 1e3);
        }
    }
    report(
        "detection latency, heartbeat loss (2000/5000 ms, tick 50 ms)",
        &mut lat,
    );
    stop(rig).await;
    server_rt.shutdown_background();
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (fields 14 and 15 of /proc/self/stat)
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

/// CPU of watching 1000 runners (default timings), sockets served by one Python process.
async fn cpu_1000() {
    let n = 1000;
    let dir = tempfile::Builder::new()
        .prefix("swb")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/many_sockets.py");
    let py = std::env::var("STALLWATCH_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut helper = Command::new(py)
        .arg(script)
        .arg(dir.path())
        .arg(n.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python helper");
    let mut line = String::new();
    if let Some(out) = helper.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    assert_eq!(line.trim(), "ready");
    let rig = start(WatchdogConfig::default());
    for i in 0..n {
        let _ = rig
            .changes
            .send(register(
                &format!("cpu-{i}"),
                Some(dir.path().join(format!("r{i}.sock"))),
            ))
            .await;
        // registrations spread over one interval, as runners come up over time
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let stats = rig.handle.stats();
    let sent0 = stats.heartbeats_sent.load(Ordering::Relaxed);
    let (c0, w0) = (cpu_seconds(), Instant::now());
    tokio::time::sleep(Duration::from_secs(20)).await;
    let (c1, w1) = (cpu_seconds(), Instant::now());
    let sent = stats.heartbeats_sent.load(Ordering::Relaxed) - sent0;
    let failed: u64 = stats
        .heartbeats_failed
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum();
    let board = rig.handle.board().borrow().clone();
    let ok = board.values().filter(|s| s.heartbeat == "ok").count();
    let pct = 100.0 * (c1 - c0) / (w1 - w0).as_secs_f64();
    println!(
        "watching {n} runners (2000/5000 ms): {pct:.2}% of one core over {:.0} s; {sent} pings ({:.0}/s), {failed} failed, {ok}/{n} ok, {} trips",
        (w1 - w0).as_secs_f64(),
        sent as f64 / (w1 - w0).as_secs_f64(),
        stats.trips.load(Ordering::Relaxed)
    );
    stop(rig).await;
    let _ = helper.kill();
    let _ = helper.wait();
}

/// Ledger throughput with 512-span observations.
async fn ledger_throughput() {
    let rig = start(WatchdogConfig::default());
    let _ = rig.changes.send(register("ledger", None)).await;
    let stats = rig.handle.stats();
    let obs_n = 200u64;
    let per = 512u64;
    let batches: Vec<Arc<TraceBatch>> = (0..obs_n)
        .map(|o| {
            batch(
                Some("ledger"),
                (0..per).map(|s| span(o, s + 1, 0, None)).collect(),
            )
        })
        .collect();
    let t0 = Instant::now();
    for b in &batches {
        let _ = rig
            .obs
            .send(Observation {
                received: Instant::now(),
                data: ObservedData::Spans(b.clone()),
            })
            .await;
    }
    let total = obs_n * per;
    let deadline = Instant::now() + Duration::from_secs(120);
    while stats.ledger_records.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let applied = t0.elapsed();
    while stats.ledger_rows_written.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let persisted = t0.elapsed();
    println!(
        "ledger, {total} open snapshots in {obs_n} observations of {per}: applied {:.0} spans/s, persisted to SQLite {:.0} spans/s",
        total as f64 / applied.as_secs_f64(),
        total as f64 / persisted.as_secs_f64()
    );
    // ordinary ingest: every span arrives ended; half of them close ledger entries
    let ended: Vec<Arc<TraceBatch>> = (0..obs_n)
        .map(|o| {
            batch(
                Some("ledger"),
                (0..per)
                    .map(|s| span(o + (s % 2) * 10_000, s + 1, 2, None))
                    .collect(),
            )
        })
        .collect();
    let o0 = stats.observations.load(Ordering::Relaxed);
    let t0 = Instant::now();
    for b in &ended {
        let _ = rig
            .obs
            .send(Observation {
                received: Instant::now(),
                data: ObservedData::Spans(b.clone()),
            })
            .await;
    }
    while stats.observations.load(Ordering::Relaxed) < o0 + obs_n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = t0.elapsed();
    let w0 = stats.ledger_rows_written.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(60);
    while stats.ledger_open_spans.load(Ordering::Relaxed) > total / 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "ledger, {total} ended spans (half closing entries): {:.0} spans/s through the watchdog; ledger now {} entries, {} rows written so far",
        total as f64 / took.as_secs_f64(),
        stats.ledger_open_spans.load(Ordering::Relaxed),
        w0
    );
    stop(rig).await;
}

fn main() {
    let which =
        std::env::var("WATCHDOG_BENCH").unwrap_or_else(|_| "sla,heartbeat,cpu,ledger".into());
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for a list; nothing to list
    }
    // WATCHDOG_BENCH_THREADS=1 runs on a current-thread runtime (default: 2 workers)
    let threads: usize = std::env::var("WATCHDOG_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .expect("runtime")
    };
    rt.block_on(async {
        for section in which.split(',') {
            match section.trim() {
                "sla" => {
                    sla_latency(
                        "detection latency, SLA overrun, isolated trips (150 ms apart)",
                        40,
                        150,
                        0,
                    )
                    .await;
                    sla_latency(
                        "detection latency, SLA overrun, burst (60 trips within ~1 s)",
                        60,
                        7,
                        600,
                    )
                    .await;
                }
                "heartbeat" => heartbeat_latency().await,
                "cpu" => cpu_1000().await,
                "ledger" => ledger_throughput().await,
                other => eprintln!("unknown section {other}"),
            }
        }
    });
}
