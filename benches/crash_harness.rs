//! Crash harness: the real `stallwatch serve` under full OTLP/HTTP protobuf ingest load is
//! `kill -9`ed at random moments, many times, on one persistent data folder, and restarted
//! each time (docs/design.md, Durability and limits; Orphan sweep).
//!
//! Per cycle: start on port 0 with a `[[runner]]` that spawns `sleep 600` (so every crash
//! leaves an active runner for the next start's orphan sweep to judge), drive 2–4 raw
//! OTLP/HTTP clients that log every trace acknowledged with 200, SIGKILL stallwatch
//! 50–1500 ms after the load started, then `PRAGMA integrity_check` on the database
//! (read-only, while stallwatch is down). At the end one more start verifies every
//! acknowledged trace through `GET /api/v1/traces/{id}` with all its spans, collects the
//! `runner.orphaned` incidents, stops gracefully, checks integrity once more, and looks for
//! `sleep 600` runners of killed generations that are still alive (those are reported, then
//! SIGKILLed by pid + start time so the harness leaves nothing behind).
//!
//! A killed generation's runner that the next sweep re-adopts (same pid, start time and boot
//! id: docs/design.md, Orphan sweep) is legitimately alive; any other one still alive is
//! *untracked*: nothing watches it any more.
//!
//! Prints one JSON summary on stdout (progress on stderr); exits 1 when a span was lost, an
//! integrity check was not `ok`, stallwatch failed to start, or a killed generation's
//! runner was left alive untracked.
//!
//! ```sh
//! cargo bench --profile dev --bench crash_harness -- --cycles 100
//! ```
//!
//! Options: `--cycles N` (100), `--clients N` (3, 1..=8), `--kill-min-ms` (50),
//! `--kill-max-ms` (1500), `--traces-per-request` (4), `--spans-per-trace` (8),
//! `--data-dir DIR` (a fresh temporary folder), `--seed N` (random).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{
    any_value::Value, AnyValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value as Json};

const RUNNER_CONFIG: &str =
    "[[runner]]\nid = \"sleeper\"\nspawn = { argv = [\"sleep\", \"600\"] }\n";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const SWEEP_TIMEOUT: Duration = Duration::from_secs(30);

// ------------------------------------------------------------------ options

struct Opts {
    cycles: u32,
    clients: u32,
    kill_min_ms: u64,
    kill_max_ms: u64,
    traces_per_request: usize,
    spans_per_trace: usize,
    data_dir: Option<PathBuf>,
    seed: Option<u64>,
}

fn parse_opts() -> Opts {
    let mut o = Opts {
        cycles: 100,
        clients: 3,
        kill_min_ms: 50,
        kill_max_ms: 1500,
        traces_per_request: 4,
        spans_per_trace: 8,
        data_dir: None,
        seed: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match a.as_str() {
            "--cycles" => o.cycles = val("--cycles").parse().expect("--cycles N"),
            "--clients" => o.clients = val("--clients").parse().expect("--clients N"),
            "--kill-min-ms" => o.kill_min_ms = val("--kill-min-ms").parse().expect("ms"),
            "--kill-max-ms" => o.kill_max_ms = val("--kill-max-ms").parse().expect("ms"),
            "--traces-per-request" => {
                o.traces_per_request = val("--traces-per-request").parse().expect("N")
            }
            "--spans-per-trace" => o.spans_per_trace = val("--spans-per-trace").parse().expect("N"),
            "--data-dir" => o.data_dir = Some(PathBuf::from(val("--data-dir"))),
            "--seed" => o.seed = Some(val("--seed").parse().expect("--seed N")),
            // `cargo bench` passes `--bench`; a filter string may follow.
            "--bench" => {}
            other if other.starts_with("--") => panic!("unknown option {other}"),
            _ => {}
        }
    }
    assert!((1..=8).contains(&o.clients), "--clients must be 1..=8");
    assert!(
        o.kill_min_ms <= o.kill_max_ms,
        "--kill-min-ms above --kill-max-ms"
    );
    assert!(o.spans_per_trace >= 1 && o.traces_per_request >= 1);
    o
}

// ------------------------------------------------------------------ the server

struct Server {
    child: Child,
    http: SocketAddr,
    dashboard: SocketAddr,
    log: PathBuf,
}

/// Starts `stallwatch serve`; answers the server or why it did not become ready (the last
/// lines of its log).
fn start(data: &Path, config: &Path, log: PathBuf) -> Result<Server, String> {
    let stderr = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stallwatch"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .arg("--config")
        .arg(config)
        .args(["--otlp-grpc-listen", "127.0.0.1:0"])
        .args(["--otlp-http-listen", "127.0.0.1:0"])
        .args(["--dashboard-listen", "127.0.0.1:0"])
        .args(["--log-format", "json"])
        .env_remove("STALLWATCH_CONFIG")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()
        .expect("spawn stallwatch");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    let Ok(line) = rx.recv_timeout(READY_TIMEOUT) else {
        let _ = child.kill();
        let _ = child.wait();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(2).collect();
        return Err(tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    };
    let ready: Json = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(ready["event"], "ready", "{line}");
    let addr = |k: &str| ready[k].as_str().unwrap().parse().unwrap();
    Ok(Server {
        http: addr("otlp_http"),
        dashboard: addr("dashboard"),
        child,
        log,
    })
}

/// Start failures seen, and what the harness did about them.
#[derive(Default)]
struct StartLog {
    failures: Vec<Json>,
    /// Runners of killed generations the harness SIGKILLed so stallwatch could start.
    runners_killed_to_start: u32,
}

/// Starts, retrying: after 3 failed attempts in a row the runners of killed generations
/// still alive are SIGKILLed (what an operator would do) before the next attempts.
fn start_retrying(
    data: &Path,
    config: &Path,
    logs: &Path,
    name: &str,
    sleepers: &[(u32, Proc)],
    slog: &mut StartLog,
) -> Server {
    for attempt in 0..6 {
        let log = logs.join(format!("{name}.{attempt}.log"));
        match start(data, config, log) {
            Ok(s) => return s,
            Err(why) => {
                eprintln!("{name}: start attempt {attempt} failed: {why}");
                slog.failures
                    .push(json!({"start": name, "attempt": attempt, "error": why}));
                if attempt >= 2 {
                    slog.runners_killed_to_start += kill_alive(sleepers);
                }
            }
        }
    }
    panic!("stallwatch did not start after 6 attempts ({name})");
}

/// SIGKILLs the recorded runners that are still the same live process; answers how many.
fn kill_alive(sleepers: &[(u32, Proc)]) -> u32 {
    let mut n = 0;
    for (_, p) in sleepers {
        if alive(*p) {
            // Ours (spawned by a stallwatch this harness started), identity re-checked.
            let _ = Command::new("kill")
                .args(["-KILL", &p.pid.to_string()])
                .status();
            n += 1;
        }
    }
    n
}

impl Server {
    fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then wait up to 60 s; answers the exit code.
    fn stop(&mut self) -> Option<i32> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            if Instant::now() > deadline {
                self.kill9();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The `orphan sweep finished` log record of this run, once written.
    fn sweep_report(&self) -> Option<Json> {
        let text = std::fs::read_to_string(&self.log).ok()?;
        text.lines()
            .filter_map(|l| serde_json::from_str::<Json>(l).ok())
            .find(|v| {
                v["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("orphan sweep finished"))
            })
            .map(|v| v["fields"].clone())
    }

    fn wait_sweep(&self, timeout: Duration) -> Option<Json> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.sweep_report() {
                return Some(r);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// True when a sweep's report says it re-adopted runner `sleeper`.
fn sweep_adopted(sweep: Option<&Json>) -> bool {
    sweep
        .and_then(|s| s["report"].as_str())
        .is_some_and(|r| r.contains("adopted: [\"sleeper\""))
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

// ------------------------------------------------------------------ processes

/// A process identity that survives pid reuse: pid + start time (clock ticks since boot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Proc {
    pid: u32,
    start_ticks: u64,
}

/// (ppid, start time) of `pid` from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After "pid (comm) ": state=0, ppid=1, ..., starttime=19.
    if f.first() == Some(&"Z") {
        return None;
    }
    Some((f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?))
}

fn alive(p: Proc) -> bool {
    stat(p.pid).is_some_and(|(_, st)| st == p.start_ticks)
}

/// Children of `parent` running `sleep 600`.
fn sleepers_of(parent: u32) -> Vec<Proc> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if cmd != b"sleep\x00600\x00" {
            continue;
        }
        if let Some((ppid, start_ticks)) = stat(pid) {
            if ppid == parent {
                out.push(Proc { pid, start_ticks });
            }
        }
    }
    out
}

fn wait_sleeper(parent: u32, timeout: Duration) -> Option<Proc> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(p) = sleepers_of(parent).into_iter().next() {
            return Some(p);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ------------------------------------------------------------------ load

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn kv(k: &str, v: Value) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

fn s(v: &str) -> Value {
    Value::StringValue(v.into())
}

/// Trace id of (generation, client, sequence): never all-zero, never repeated.
fn trace_id(gen: u32, client: u32, seq: u64) -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..4].copy_from_slice(&(gen + 1).to_be_bytes());
    t[4..8].copy_from_slice(&(client + 1).to_be_bytes());
    t[8..].copy_from_slice(&seq.to_be_bytes());
    t
}

fn request(tids: &[[u8; 16]], spans_per_trace: usize) -> ExportTraceServiceRequest {
    let now = now_ns();
    let mut spans = Vec::with_capacity(tids.len() * spans_per_trace);
    for tid in tids {
        for i in 0..spans_per_trace {
            let sid = ((i as u64 + 1) << 8 | 0x5a).to_be_bytes().to_vec();
            let parent = if i == 0 {
                vec![]
            } else {
                (1u64 << 8 | 0x5a).to_be_bytes().to_vec()
            };
            spans.push(Span {
                trace_id: tid.to_vec(),
                span_id: sid,
                parent_span_id: parent,
                name: if i == 0 {
                    "invoke agent_turn".into()
                } else {
                    format!("execute_tool step_{i}")
                },
                kind: if i == 0 { 2 } else { 1 },
                start_time_unix_nano: now - 2_000_000_000 + i as u64 * 1_000_000,
                end_time_unix_nano: now - 1_000_000_000 + i as u64 * 1_000_000,
                attributes: if i == 0 {
                    vec![kv("session.id", s("crash-harness"))]
                } else {
                    vec![
                        kv("gen_ai.operation.name", s("execute_tool")),
                        kv("gen_ai.tool.name", s("run_notebook")),
                        kv("code.lineno", Value::IntValue(i as i64)),
                        kv("notebook.path", s("/home/user/project/analysis.ipynb")),
                    ]
                },
                status: Some(Status {
                    code: 1,
                    message: String::new(),
                }),
                ..Default::default()
            });
        }
    }
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", s("crash-harness")),
                    kv(
                        "process.pid",
                        Value::IntValue(i64::from(std::process::id())),
                    ),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "stallwatch.crash_harness".into(),
                    version: "1".into(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[derive(Default)]
struct Counters {
    ok: AtomicU64,
    busy: AtomicU64,
    other_status: AtomicU64,
    transport_errors: AtomicU64,
    partial: AtomicU64,
}

struct Load {
    gen: u32,
    client: u32,
    url: String,
    traces_per_request: usize,
    spans_per_trace: usize,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<[u8; 16]>>>,
    counters: Arc<Counters>,
}

/// Sends distinct traces as fast as answers come back; logs every trace of a request
/// answered 200 with no rejected spans. Stops on the flag (the server is dead by then).
fn blast(l: Load) {
    let http = client();
    let mut seq = 0u64;
    while !l.stop.load(Ordering::Relaxed) {
        let tids: Vec<[u8; 16]> = (0..l.traces_per_request)
            .map(|_| {
                seq += 1;
                trace_id(l.gen, l.client, seq)
            })
            .collect();
        let body = request(&tids, l.spans_per_trace).encode_to_vec();
        match http
            .post(&l.url)
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
        {
            Ok(r) if r.status() == 200 => {
                let bytes = r.bytes().unwrap_or_default();
                let rejected = ExportTraceServiceResponse::decode(&bytes[..])
                    .ok()
                    .and_then(|x| x.partial_success)
                    .map_or(0, |p| p.rejected_spans);
                if rejected == 0 {
                    l.counters.ok.fetch_add(1, Ordering::Relaxed);
                    l.acked.lock().unwrap().extend_from_slice(&tids);
                } else {
                    l.counters.partial.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(r) if r.status() == 503 || r.status() == 429 => {
                l.counters.busy.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(_) => {
                l.counters.other_status.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                l.counters.transport_errors.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

// ------------------------------------------------------------------ checks

/// `PRAGMA integrity_check` on a read-only connection; "ok" or the problems joined.
fn integrity(db: &Path) -> String {
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match rusqlite::Connection::open_with_flags(db, flags) {
        Ok(c) => c,
        Err(e) => return format!("open failed: {e}"),
    };
    let _ = conn.busy_timeout(Duration::from_secs(10));
    let mut stmt = match conn.prepare("PRAGMA integrity_check") {
        Ok(s) => s,
        Err(e) => return format!("prepare failed: {e}"),
    };
    let rows: Result<Vec<String>, _> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|it| it.collect());
    match rows {
        Ok(r) => r.join("; "),
        Err(e) => format!("query failed: {e}"),
    }
}

/// Checks every acknowledged trace through the read API with 4 threads; answers
/// (traces missing or short, spans lost, a few examples).
fn verify(
    dashboard: SocketAddr,
    acked: &[[u8; 16]],
    spans_per_trace: usize,
) -> (u64, u64, Vec<String>) {
    let chunks: Vec<Vec<[u8; 16]>> = acked
        .chunks(acked.len().div_ceil(4).max(1))
        .map(<[_]>::to_vec)
        .collect();
    let handles: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            std::thread::spawn(move || {
                let http = client();
                let (mut traces, mut spans, mut examples) = (0u64, 0u64, Vec::new());
                for tid in chunk {
                    let hex = hex::encode(tid);
                    let url = format!("http://{dashboard}/api/v1/traces/{hex}");
                    let found = loop {
                        match http.get(&url).send() {
                            Ok(r) if r.status() == 404 => break 0,
                            Ok(r) if r.status() == 200 => {
                                let v: Json = r.json().unwrap_or(Json::Null);
                                break v["spans"].as_array().map_or(0, Vec::len);
                            }
                            _ => std::thread::sleep(Duration::from_millis(100)),
                        }
                    };
                    if found < spans_per_trace {
                        traces += 1;
                        spans += (spans_per_trace - found) as u64;
                        if examples.len() < 5 {
                            examples.push(format!("{hex}: {found}/{spans_per_trace} spans"));
                        }
                    }
                }
                (traces, spans, examples)
            })
        })
        .collect();
    let mut out = (0, 0, Vec::new());
    for h in handles {
        let (t, s, e) = h.join().unwrap();
        out.0 += t;
        out.1 += s;
        out.2.extend(e);
    }
    out.2.truncate(5);
    out
}

/// Every `runner.orphaned` incident (paged).
fn orphan_incidents(dashboard: SocketAddr) -> Vec<Json> {
    let http = client();
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url =
            format!("http://{dashboard}/api/v1/incidents?event=runner.orphaned&limit=1000");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let v: Json = match http.get(&url).send().and_then(|r| r.json()) {
            Ok(v) => v,
            Err(e) => {
                out.push(json!({"error": e.to_string()}));
                return out;
            }
        };
        out.extend(v["items"].as_array().cloned().unwrap_or_default());
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return out,
        }
    }
}

// ------------------------------------------------------------------ main

fn main() {
    let o = parse_opts();
    let seed = o.seed.unwrap_or_else(now_ns);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Kept on failure (and on a panic) to look at; removed at the end when all is well.
    let root = match &o.data_dir {
        Some(d) => d.clone(),
        None => tempfile::Builder::new()
            .prefix("stallwatch-crash-")
            .tempdir()
            .unwrap()
            .keep(),
    };
    let data = root.join("data");
    let logs = root.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let config = root.join("stallwatch.toml");
    std::fs::write(&config, RUNNER_CONFIG).unwrap();
    let db = data.join("stallwatch.db");
    eprintln!(
        "crash harness: {} cycles, {} clients, kill after {}..={} ms, seed {seed}, folder {}",
        o.cycles,
        o.clients,
        o.kill_min_ms,
        o.kill_max_ms,
        root.display()
    );

    let acked = Arc::new(Mutex::new(Vec::<[u8; 16]>::new()));
    let counters = Arc::new(Counters::default());
    let mut sleepers: Vec<(u32, Proc)> = Vec::new();
    let mut integrity_results: BTreeMap<String, u32> = BTreeMap::new();
    let mut integrity_failures = Vec::new();
    let mut sweeps = Vec::new();
    let mut sweeps_unfinished = 0u32;
    let mut old_alive_at_kill = Vec::new();
    let mut no_sleeper = 0u32;
    let mut kill_ms = Vec::new();
    let mut slog = StartLog::default();
    let mut integrity_ms = Vec::new();
    let mut untracked_at_kill: Vec<usize> = Vec::new();
    let started = Instant::now();

    for gen in 0..o.cycles {
        let mut server = start_retrying(
            &data,
            &config,
            &logs,
            &format!("gen-{gen:03}"),
            &sleepers,
            &mut slog,
        );
        let pid = server.child.id();
        match wait_sleeper(pid, Duration::from_secs(10)) {
            Some(p) => sleepers.push((gen, p)),
            None => no_sleeper += 1,
        }
        let stop = Arc::new(AtomicBool::new(false));
        let before = acked.lock().unwrap().len();
        let workers: Vec<_> = (0..o.clients)
            .map(|c| {
                let l = Load {
                    gen,
                    client: c,
                    url: format!("http://{}/v1/traces", server.http),
                    traces_per_request: o.traces_per_request,
                    spans_per_trace: o.spans_per_trace,
                    stop: Arc::clone(&stop),
                    acked: Arc::clone(&acked),
                    counters: Arc::clone(&counters),
                };
                std::thread::spawn(move || blast(l))
            })
            .collect();
        let delay = rng.random_range(o.kill_min_ms..=o.kill_max_ms);
        kill_ms.push(delay);
        std::thread::sleep(Duration::from_millis(delay));
        // Which runners of earlier (killed) generations are still alive at this moment.
        let sweep = server.sweep_report();
        let old_alive: Vec<u32> = sleepers
            .iter()
            .filter(|(g, p)| *g < gen && alive(*p))
            .map(|(g, _)| *g)
            .collect();
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        let sweep_ref = sweep.clone();
        match sweep {
            Some(s) => sweeps.push(json!({"generation": gen, "sweep": s})),
            None => sweeps_unfinished += 1,
        }
        if gen > 0 {
            old_alive_at_kill.push(old_alive.len());
        }
        let adopted = sweep_adopted(sweep_ref.as_ref());
        untracked_at_kill.push(old_alive.len().saturating_sub(usize::from(adopted)));
        let t0 = Instant::now();
        let check = integrity(&db);
        integrity_ms.push(t0.elapsed().as_millis() as u64);
        *integrity_results.entry(check.clone()).or_default() += 1;
        if check != "ok" {
            integrity_failures.push(json!({"generation": gen, "result": check}));
        }
        let n = acked.lock().unwrap().len();
        eprintln!(
            "cycle {gen:3}: killed after {delay:4} ms, {:5} traces acked, integrity {check}, \
             killed generations' runners alive: {}",
            n - before,
            old_alive.len()
        );
    }

    // Final start: the sweep judges the last crash; then verify everything.
    let mut server = start_retrying(&data, &config, &logs, "final", &sleepers, &mut slog);
    let final_sweep = server.wait_sweep(SWEEP_TIMEOUT);
    let acked: Vec<[u8; 16]> = acked.lock().unwrap().clone();
    let t0 = Instant::now();
    let (lost_traces, lost_spans, lost_examples) =
        verify(server.dashboard, &acked, o.spans_per_trace);
    let verify_s = t0.elapsed().as_secs_f64();
    let incidents = orphan_incidents(server.dashboard);
    let incident_reasons: BTreeMap<String, usize> =
        incidents.iter().fold(BTreeMap::new(), |mut m, i| {
            let r = i["reason"]
                .as_str()
                .or_else(|| i["detail"]["reason"].as_str())
                .unwrap_or("?")
                .to_string();
            // Group by reason shape, not by pid.
            let shape: String = r
                .chars()
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .collect();
            *m.entry(shape).or_default() += 1;
            m
        });
    let exit = server.stop();
    let final_integrity = integrity(&db);
    *integrity_results
        .entry(final_integrity.clone())
        .or_default() += 1;

    // Runners of killed generations still alive after every sweep (and the final stop).
    let leftovers: Vec<Json> = sleepers
        .iter()
        .filter(|(_, p)| alive(*p))
        .map(|(g, p)| json!({"generation": g, "pid": p.pid, "start_ticks": p.start_ticks}))
        .collect();
    kill_alive(&sleepers);

    // What each finished sweep did with runner "sleeper" of the generation killed before.
    let mut verdicts: BTreeMap<&str, u32> = BTreeMap::new();
    for sw in sweeps.iter().map(|v| &v["sweep"]).chain(final_sweep.iter()) {
        let r = sw["report"].as_str().unwrap_or("");
        let v = if r.contains("adopted: [\"sleeper\"") {
            "adopted"
        } else if r.contains("orphaned: [(\"sleeper\"") {
            "orphaned"
        } else {
            "not judged"
        };
        *verdicts.entry(v).or_default() += 1;
    }
    let spans_acked = acked.len() as u64 * o.spans_per_trace as u64;
    let summary = json!({
        "cycles": o.cycles,
        "clients": o.clients,
        "seed": seed,
        "wall_s": started.elapsed().as_secs_f64(),
        "kill_after_ms": {"min": kill_ms.iter().min(), "max": kill_ms.iter().max(),
                          "mean": kill_ms.iter().sum::<u64>() as f64 / kill_ms.len().max(1) as f64},
        "requests": {
            "ok": counters.ok.load(Ordering::Relaxed),
            "busy_503": counters.busy.load(Ordering::Relaxed),
            "partial_success": counters.partial.load(Ordering::Relaxed),
            "other_status": counters.other_status.load(Ordering::Relaxed),
            "transport_errors": counters.transport_errors.load(Ordering::Relaxed),
        },
        "acked_traces": acked.len(),
        "acked_spans": spans_acked,
        "lost_traces": lost_traces,
        "lost_spans": lost_spans,
        "lost_examples": lost_examples,
        "verify_s": verify_s,
        "integrity_check": integrity_results,
        "integrity_failures": integrity_failures,
        "orphan_sweep": {
            "runners_spawned": sleepers.len(),
            "generations_without_runner": no_sleeper,
            "sweeps_finished_before_kill": sweeps.len(),
            "sweeps_unfinished_at_kill": sweeps_unfinished,
            "final_sweep": final_sweep,
            "runner_orphaned_incidents": incidents.len(),
            "incident_reasons": incident_reasons,
            "killed_generations_alive_at_kill_max": old_alive_at_kill.iter().max(),
            "untracked_alive_at_kill_max": untracked_at_kill.iter().max(),
            "cycles_with_untracked_alive": untracked_at_kill.iter().filter(|n| **n > 0).count(),
            "sweep_verdicts": verdicts,
            "sample_sweeps": sweeps.iter().take(3).collect::<Vec<_>>(),
        },
        "integrity_check_ms": {"first": integrity_ms.first(), "last": integrity_ms.last(),
                               "max": integrity_ms.iter().max()},
        "start_failures": slog.failures.len(),
        "start_failure_samples": slog.failures.iter().take(3).collect::<Vec<_>>(),
        "runners_killed_by_harness_to_start": slog.runners_killed_to_start,
        "leftover_runner_processes": leftovers,
        "final_exit_code": exit,
        "folder": root.display().to_string(),
    });
    println!("{}", serde_json::to_string_pretty(&summary).unwrap());
    let failed = lost_spans > 0
        || integrity_results.keys().any(|k| k != "ok")
        || !leftovers.is_empty()
        || !slog.failures.is_empty()
        || untracked_at_kill.iter().any(|n| *n > 0);
    if o.data_dir.is_none() && !failed {
        let _ = std::fs::remove_dir_all(&root);
    }
    std::process::exit(i32::from(failed));
}
