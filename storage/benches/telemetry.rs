//! Telemetry storage benchmark (a bench binary, not a timed test).
//!
//! Writes realistic tool spans (the `otlp-blast` shape: 8-span agent-turn traces over four
//! services, 512 spans per request, 4 random 24-character attributes per span) through
//! `Storage::write_traces` with 1 and N concurrent callers, then measures search and
//! trace-view latency on the filled database.
//!
//! ```text
//! cargo bench -p stallwatch-storage --bench telemetry -- --spans 1000000 --concurrency 1,4
//! ```
//! Options: `--spans N` (fill size, default 1000000), `--concurrency LIST` (default 1,4),
//! `--dir PATH` (database folder, default a temp dir), `--queries N` (per query kind,
//! default 50).
//!
//! `--continued N` instead writes N exports of 64 spans whose traces continue over
//! `--over K` exports each (default 8; 8 traces per export, as a batch span processor cuts
//! long traces), and reports the write time per export over the last quarter (by then
//! ~N/256 index runs exist): the deduplication of a continued trace against what is stored.
//!
//! ```text
//! cargo bench -p stallwatch-storage --bench telemetry -- --continued 24000 --over 512
//! ```

#![allow(missing_docs, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use stallwatch_storage::model::*;
use stallwatch_storage::telemetry::TraceQuery;
use stallwatch_storage::{Storage, StorageConfig};

const SERVICES: [&str; 4] = [
    "tauri-backend",
    "mcp-runner-python",
    "mcp-runner-node",
    "llm-gateway",
];
#[allow(clippy::type_complexity)]
const SHAPE: [(usize, &str, i32, Option<usize>, &[(&str, &str)]); 8] = [
    (
        0,
        "invoke agent_turn",
        2,
        None,
        &[("tauri.command", "agent_turn"), ("session.id", "ses_7f3a")],
    ),
    (
        3,
        "chat claude-sonnet-4",
        3,
        Some(0),
        &[
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.request.model", "claude-sonnet-4"),
            ("gen_ai.system", "anthropic"),
        ],
    ),
    (
        0,
        "tools/call run_notebook",
        3,
        Some(0),
        &[
            ("mcp.method.name", "tools/call"),
            ("gen_ai.tool.name", "run_notebook"),
            ("gen_ai.operation.name", "execute_tool"),
        ],
    ),
    (
        1,
        "tools/call run_notebook",
        2,
        Some(2),
        &[
            ("mcp.method.name", "tools/call"),
            ("gen_ai.tool.name", "run_notebook"),
            ("gen_ai.operation.name", "execute_tool"),
            ("mcp.session.id", "mcp_91c2"),
        ],
    ),
    (
        1,
        "execute_cell",
        1,
        Some(3),
        &[
            ("notebook.cell.index", "3"),
            ("code.function.name", "execute_cell"),
        ],
    ),
    (
        0,
        "tools/call read_file",
        3,
        Some(0),
        &[
            ("mcp.method.name", "tools/call"),
            ("gen_ai.tool.name", "read_file"),
            ("gen_ai.operation.name", "execute_tool"),
        ],
    ),
    (
        2,
        "tools/call read_file",
        2,
        Some(5),
        &[
            ("mcp.method.name", "tools/call"),
            ("gen_ai.tool.name", "read_file"),
            ("gen_ai.operation.name", "execute_tool"),
            ("mcp.session.id", "mcp_44d0"),
        ],
    ),
    (
        0,
        "db.write session_events",
        1,
        Some(0),
        &[
            ("db.system.name", "sqlite"),
            ("db.operation.name", "INSERT"),
        ],
    ),
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn alnum(&mut self, s: &mut String) {
        const A: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        s.clear();
        let mut r = 0;
        for i in 0..24 {
            if i % 10 == 0 {
                r = self.next();
            }
            s.push(A[(r % 62) as usize] as char);
            r /= 62;
        }
    }
}

fn template(worker: usize, rng: &mut Rng) -> TraceBatch {
    let mut per: Vec<Vec<Span>> = vec![vec![]; 4];
    for i in 0..512 {
        let (svc, name, kind, _, attrs) = SHAPE[i % 8];
        let mut attributes: Vec<KeyValue> = attrs
            .iter()
            .map(|(k, v)| KeyValue::new(*k, AnyValue::String(v.to_string())))
            .collect();
        for j in 0..4 {
            let mut s = String::new();
            rng.alnum(&mut s);
            attributes.push(KeyValue::new(
                format!("workbench.attr.{j}"),
                AnyValue::String(s),
            ));
        }
        per[svc].push(Span {
            name: name.into(),
            kind,
            flags: 0x100,
            attributes,
            ..Default::default()
        });
    }
    TraceBatch {
        resource_spans: per
            .into_iter()
            .enumerate()
            .map(|(si, spans)| ResourceSpans {
                resource: Resource {
                    attributes: vec![
                        KeyValue::new("service.name", AnyValue::String(SERVICES[si].into())),
                        KeyValue::new(
                            "process.pid",
                            AnyValue::Int(10_000 + worker as i64 * 10 + si as i64),
                        ),
                        KeyValue::new("service.version", AnyValue::String("0.4.2".into())),
                        KeyValue::new("telemetry.sdk.language", AnyValue::String("rust".into())),
                    ],
                    dropped_attributes_count: 0,
                    schema_url: "https://opentelemetry.io/schemas/1.37.0".into(),
                },
                scope_spans: vec![ScopeSpans {
                    scope: Scope {
                        name: "workbench.tracing".into(),
                        version: "0.4.2".into(),
                        ..Default::default()
                    },
                    spans,
                }],
            })
            .collect(),
    }
}

/// Same layout as `template`: global span index of each span per resource.
fn layout() -> Vec<Vec<usize>> {
    let mut l = vec![vec![]; 4];
    for i in 0..512 {
        l[SHAPE[i % 8].0].push(i);
    }
    l
}

fn refresh(b: &mut TraceBatch, lay: &[Vec<usize>], rng: &mut Rng) {
    let traces: Vec<[u8; 16]> = (0..64)
        .map(|_| {
            let mut t = [0u8; 16];
            t[..8].copy_from_slice(&rng.next().to_le_bytes());
            t[8..].copy_from_slice(&rng.next().to_le_bytes());
            t
        })
        .collect();
    let spans: Vec<[u8; 8]> = (0..512).map(|_| (rng.next() | 1).to_le_bytes()).collect();
    let now = now_unix_nano();
    for (rs, idxs) in b.resource_spans.iter_mut().zip(lay) {
        for (sp, &gi) in rs.scope_spans[0].spans.iter_mut().zip(idxs) {
            let (t, pos) = (gi / 8, gi % 8);
            sp.trace_id = TraceId(traces[t]);
            sp.span_id = SpanId(spans[gi]);
            sp.parent_span_id = SHAPE[pos].3.map(|p| SpanId(spans[t * 8 + p]));
            let start = now - 2_000_000_000 + pos as u64 * 3_000_000 + rng.next() % 1_000_000;
            sp.start_time_unix_nano = start;
            sp.end_time_unix_nano = start + 200_000 + rng.next() % 250_000_000;
            if rng.next().is_multiple_of(50) {
                sp.status = Status {
                    code: STATUS_ERROR,
                    message: "tool returned non-zero exit".into(),
                };
            } else {
                sp.status = Status::default();
            }
            let n = sp.attributes.len();
            for kv in &mut sp.attributes[n - 4..] {
                if let AnyValue::String(s) = &mut kv.value {
                    rng.alnum(s);
                }
            }
        }
    }
}

fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ut: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let st: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    (ut + st) / 100.0
}

fn peak_rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

async fn fill(storage: &Storage, spans: usize, concurrency: usize, seed: u64) -> Vec<TraceId> {
    let requests = spans.div_ceil(512);
    let per = requests.div_ceil(concurrency);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let storage = storage.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (w as u64 + 1) | 1);
            let lay = layout();
            let mut b = template(w, &mut rng);
            let mut gen = Duration::ZERO;
            let mut lat = Vec::with_capacity(per);
            let mut sample = Vec::new();
            for i in 0..per {
                let g = Instant::now();
                refresh(&mut b, &lay, &mut rng);
                gen += g.elapsed();
                if i.is_multiple_of(97) {
                    sample.push(b.resource_spans[0].scope_spans[0].spans[0].trace_id);
                }
                let a = Arc::new(b);
                let s = Instant::now();
                loop {
                    match storage.write_traces(a.clone()).await {
                        Ok(()) => break,
                        Err(stallwatch_storage::WriteError::QueueFull { .. }) => {
                            tokio::time::sleep(Duration::from_millis(1)).await
                        }
                        Err(e) => panic!("write failed: {e}"),
                    }
                }
                lat.push(s.elapsed());
                b = Arc::try_unwrap(a).unwrap();
            }
            (gen, lat, sample)
        }));
    }
    let mut gen = Duration::ZERO;
    let mut lat = Vec::new();
    let mut sample = Vec::new();
    for t in tasks {
        let (g, l, s) = t.await.unwrap();
        gen += g;
        lat.extend(l);
        sample.extend(s);
    }
    let el = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let n = (per * concurrency * 512) as f64;
    println!(
        "{{\"bench\":\"write\",\"concurrency\":{concurrency},\"spans\":{n},\"elapsed_s\":{el:.2},\"spans_per_s\":{:.0},\"p50_ms\":{:.2},\"p99_ms\":{:.2},\"cpu_s_per_million\":{:.2},\"generator_cpu_s_per_million\":{:.2},\"peak_rss_mib\":{:.1}}}",
        n / el,
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        cpu / n * 1e6,
        gen.as_secs_f64() / n * 1e6,
        peak_rss_mib()
    );
    sample
}

async fn big_trace(storage: &Storage, spans: usize) -> TraceId {
    let mut rng = Rng(77);
    let trace = TraceId([7; 16]);
    let now = now_unix_nano();
    let mut i = 0;
    while i < spans {
        let mut b = template(9, &mut rng);
        for rs in &mut b.resource_spans {
            for sp in &mut rs.scope_spans[0].spans {
                sp.trace_id = trace;
                sp.span_id = SpanId((i as u64 + 1).to_be_bytes());
                sp.parent_span_id = (i > 0).then(|| SpanId(1u64.to_be_bytes()));
                sp.start_time_unix_nano = now + i as u64;
                sp.end_time_unix_nano = now + i as u64 + 1000;
                i += 1;
            }
        }
        storage.write_traces(Arc::new(b)).await.unwrap();
    }
    trace
}

/// `--continued N --over K`: exports of 64 spans, 8 traces each continued over `over`
/// exports; prints the mean write time per export over the last quarter.
async fn continued(exports: u64, over: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let storage = Storage::open(StorageConfig::new(tmp.path().join("continued.db"))).unwrap();
    let resource = Resource {
        attributes: vec![KeyValue::new(
            "service.name",
            AnyValue::String("mcp-runner-python".into()),
        )],
        ..Default::default()
    };
    let mut n: u64 = 0;
    let mut timed = Duration::ZERO;
    let from = exports - exports / 4;
    let now = now_unix_nano();
    for e in 0..exports {
        let mut spans = Vec::with_capacity(64);
        for k in 0..64u64 {
            n += 1;
            let mut t = [3u8; 16];
            t[..8].copy_from_slice(&((e / over) * 8 + k % 8).to_le_bytes());
            spans.push(Span {
                trace_id: TraceId(t),
                span_id: SpanId(n.to_le_bytes()),
                name: "execute_cell".into(),
                start_time_unix_nano: now + n,
                end_time_unix_nano: now + n + 1_000,
                ..Default::default()
            });
        }
        let b = Arc::new(TraceBatch {
            resource_spans: vec![ResourceSpans {
                resource: resource.clone(),
                scope_spans: vec![ScopeSpans {
                    scope: Scope::default(),
                    spans,
                }],
            }],
        });
        let t0 = Instant::now();
        storage.write_traces(b).await.unwrap();
        if e >= from {
            timed += t0.elapsed();
        }
    }
    println!(
        "{{\"bench\":\"continued\",\"exports\":{exports},\"over\":{over},\"us_per_export\":{:.1}}}",
        timed.as_secs_f64() * 1e6 / (exports - from) as f64
    );
    storage.shutdown().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(n) = arg("--continued").and_then(|v| v.parse().ok()) {
        let over = arg("--over")
            .and_then(|v| v.parse().ok())
            .unwrap_or(8)
            .max(1);
        continued(n, over).await;
        return;
    }
    let spans: usize = arg("--spans")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let queries: usize = arg("--queries").and_then(|v| v.parse().ok()).unwrap_or(50);
    let conc: Vec<usize> = arg("--concurrency")
        .unwrap_or_else(|| "1,4".into())
        .split(',')
        .filter_map(|v| v.parse().ok())
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let dir = arg("--dir")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    for (k, c) in conc.iter().enumerate() {
        let path = dir.join(format!("bench-{c}.db"));
        let _ = std::fs::remove_file(&path);
        let mut cfg = StorageConfig::new(&path);
        cfg.max_db_bytes = 64 * 1024 * 1024 * 1024;
        let storage = Storage::open(cfg).unwrap();
        let sample = fill(&storage, spans, *c, 1000 + k as u64).await;
        if k + 1 < conc.len() {
            storage.shutdown().await;
            drop(storage);
            let _ = std::fs::remove_file(&path);
        } else {
            // read latencies on the last filled database
            let big = big_trace(&storage, 10_000).await;
            let db_mib = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) as f64 / 1048576.0;
            println!("{{\"bench\":\"db\",\"spans\":{spans},\"file_mib\":{db_mib:.1}}}");
            let now = now_unix_nano();
            let kinds: Vec<(&str, TraceQuery)> = vec![
                (
                    "search_recent",
                    TraceQuery {
                        limit: 20,
                        ..Default::default()
                    },
                ),
                (
                    "search_service",
                    TraceQuery {
                        service: Some("mcp-runner-python".into()),
                        limit: 20,
                        ..Default::default()
                    },
                ),
                (
                    "search_tool",
                    TraceQuery {
                        tool_name: Some("read_file".into()),
                        limit: 20,
                        ..Default::default()
                    },
                ),
                (
                    "search_error",
                    TraceQuery {
                        status: Some(stallwatch_storage::telemetry::StatusFilter::Error),
                        limit: 20,
                        ..Default::default()
                    },
                ),
                (
                    "search_span_name_service",
                    TraceQuery {
                        service: Some("mcp-runner-node".into()),
                        span_name: Some("tools/call read_file".into()),
                        limit: 20,
                        ..Default::default()
                    },
                ),
                (
                    "search_pid",
                    TraceQuery {
                        attribute: Some(("process.pid".into(), "10001".into())),
                        limit: 20,
                        ..Default::default()
                    },
                ),
                (
                    "search_min_duration",
                    TraceQuery {
                        min_duration_ns: Some(249_000_000),
                        limit: 20,
                        ..Default::default()
                    },
                ),
                (
                    "search_page_100",
                    TraceQuery {
                        limit: 100,
                        ..Default::default()
                    },
                ),
                (
                    "search_scan_attr_1min",
                    TraceQuery {
                        attribute: Some(("gen_ai.system".into(), "anthropic".into())),
                        start_min_unix_nano: Some(now - 60_000_000_000),
                        start_max_unix_nano: Some(now),
                        limit: 20,
                        ..Default::default()
                    },
                ),
                (
                    "search_absent_tool",
                    TraceQuery {
                        tool_name: Some("no_such_tool".into()),
                        limit: 20,
                        ..Default::default()
                    },
                ),
            ];
            for (name, q) in kinds {
                let mut lat = Vec::new();
                let mut n = 0;
                for _ in 0..queries {
                    let s = Instant::now();
                    let p = storage.search_traces(q.clone()).await.unwrap();
                    lat.push(s.elapsed());
                    n = p.items.len();
                }
                println!(
                    "{{\"bench\":\"{name}\",\"items\":{n},\"p50_ms\":{:.2},\"p95_ms\":{:.2}}}",
                    pct(&mut lat, 0.5),
                    pct(&mut lat, 0.95)
                );
            }
            let mut lat = Vec::new();
            for i in 0..queries {
                let t = sample[(i * 7919) % sample.len()];
                let s = Instant::now();
                let v = storage.trace(t).await.unwrap().unwrap();
                lat.push(s.elapsed());
                assert_eq!(v.spans.len(), 8);
            }
            println!(
                "{{\"bench\":\"trace_view_8\",\"p50_ms\":{:.2},\"p95_ms\":{:.2}}}",
                pct(&mut lat, 0.5),
                pct(&mut lat, 0.95)
            );
            let mut lat = Vec::new();
            for _ in 0..queries.min(20) {
                let s = Instant::now();
                let v = storage.trace(big).await.unwrap().unwrap();
                lat.push(s.elapsed());
                assert!(v.spans.len() >= 10_000);
            }
            println!(
                "{{\"bench\":\"trace_view_10000\",\"p50_ms\":{:.2},\"p95_ms\":{:.2}}}",
                pct(&mut lat, 0.5),
                pct(&mut lat, 0.95)
            );
            storage.shutdown().await;
        }
    }
}
