//! `[forward]`: a second stallwatch instance (B, the upstream) receives over OTLP what the
//! first (A) accepted, over HTTP/protobuf and gRPC; through an outage of B (local ingest
//! unaffected), a SIGKILL of A mid-backlog, and a queue cap that drops the oldest rows
//! visibly. B restarts on the same ports, so listen addresses are reserved up front.
//! No OpenTelemetry Collector binary is installable here from apt, PyPI or npm, so the
//! real upstream is stallwatch itself.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value::Value, AnyValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    metric::Data, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
    Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;

use crate::support::*;

const LONG: Duration = Duration::from_secs(60);

/// A free loopback port now (bound then released).
/// A free loopback address below the kernel's ephemeral port range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), for a server that is stopped and started
/// again on the same ports: a port the kernel hands out for `127.0.0.1:0` could be taken by
/// a test running beside this one between the stop and the start (seen: "Address already
/// in use" at a restart); the kernel never hands out one below the range.
fn free_addr() -> SocketAddr {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let from = low.saturating_sub(12_000).max(1024);
    assert!(
        low > from,
        "ephemeral ports start at {low}: no room below them"
    );
    // One random start per process, then consecutive ports: two tests of this process
    // never draw the same port (each draw a random port, as before, two tests running
    // side by side drew the same one now and then: "Address already in use" at a start).
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| {
        (std::process::id() as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u64)
            .wrapping_mul(0xff51_afd7_ed55_8ccd)
            >> 33
    });
    for _ in 0..1000 {
        let draw = DRAWS.fetch_add(1, Ordering::Relaxed);
        let port = from + ((start + draw) % u64::from(low - from)) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().unwrap();
        }
    }
    panic!("no free port in {from}..{low}")
}

/// Starts `stallwatch serve` with the OTLP listeners on fixed addresses (support::Server
/// always passes port 0 on the command line, and the CLI beats TOML and env).
fn start_on(data_dir: &Path, config: &str, grpc: SocketAddr, http: SocketAddr) -> Server {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    std::fs::create_dir_all(data_dir).unwrap();
    let cfg = data_dir.with_extension("toml");
    std::fs::write(&cfg, config).unwrap();
    let stderr_path = data_dir.with_extension(format!(
        "stderr.{}.log",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let mut child = Command::new(bin())
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--config")
        .arg(&cfg)
        .args(["--otlp-grpc-listen", &grpc.to_string()])
        .args(["--otlp-http-listen", &http.to_string()])
        .args(["--dashboard-listen", "127.0.0.1:0"])
        .env_remove("STALLWATCH_CONFIG")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&stderr_path).unwrap()))
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    let Ok(line) = rx.recv_timeout(LONG) else {
        let _ = child.kill();
        panic!(
            "no ready line; stderr:\n{}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        );
    };
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr = |k: &str| -> SocketAddr { ready[k].as_str().unwrap().parse().unwrap() };
    Server {
        grpc: addr("otlp_grpc"),
        http: addr("otlp_http"),
        dashboard: addr("dashboard"),
        data_dir: data_dir.to_path_buf(),
        ready,
        child,
        stderr_path,
    }
}

fn kv(key: &str, v: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

fn resource(service: &str) -> Option<Resource> {
    Some(Resource {
        attributes: vec![kv("service.name", Value::StringValue(service.into()))],
        ..Default::default()
    })
}

/// Trace `trace_no` with `n` spans (a root and children), one resource and scope.
fn traces(trace_no: u32, n: u32, service: &str) -> ExportTraceServiceRequest {
    let mut tid = [0u8; 16];
    tid[..4].copy_from_slice(&trace_no.to_be_bytes());
    tid[15] = 1;
    let spans = (0..n)
        .map(|i| Span {
            trace_id: tid.to_vec(),
            span_id: (u64::from(i) + 1).to_be_bytes().to_vec(),
            parent_span_id: if i == 0 {
                vec![]
            } else {
                1u64.to_be_bytes().to_vec()
            },
            name: if i == 0 {
                "invoke_agent".into()
            } else {
                format!("execute_tool t{i}")
            },
            kind: 1,
            start_time_unix_nano: 1_700_000_000_000_000_000 + u64::from(i),
            end_time_unix_nano: 1_700_000_001_000_000_000,
            attributes: vec![
                kv("gen_ai.tool.name", Value::StringValue(format!("t{i}"))),
                kv("n", Value::IntValue(i64::from(i))),
            ],
            status: Some(Status {
                code: 1,
                message: String::new(),
            }),
            ..Default::default()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: resource(service),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "fwd-test".into(),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn trace_hex(trace_no: u32) -> String {
    let mut tid = [0u8; 16];
    tid[..4].copy_from_slice(&trace_no.to_be_bytes());
    tid[15] = 1;
    hex::encode(tid)
}

fn logs(trace_no: u32, n: u32) -> ExportLogsServiceRequest {
    let tid = hex::decode(trace_hex(trace_no)).unwrap();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: resource("fwd-svc"),
            scope_logs: vec![ScopeLogs {
                scope: None,
                log_records: (0..n)
                    .map(|i| LogRecord {
                        time_unix_nano: 1_700_000_000_500_000_000 + u64::from(i),
                        severity_number: 9,
                        severity_text: "INFO".into(),
                        body: Some(AnyValue {
                            value: Some(Value::StringValue(format!("log {i}"))),
                        }),
                        trace_id: tid.clone(),
                        span_id: 1u64.to_be_bytes().to_vec(),
                        ..Default::default()
                    })
                    .collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn metrics(n: u32) -> ExportMetricsServiceRequest {
    let point = |i: u32, v: number_data_point::Value| NumberDataPoint {
        time_unix_nano: 1_700_000_000_000_000_000 + u64::from(i),
        value: Some(v),
        attributes: vec![kv("i", Value::IntValue(i64::from(i)))],
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: resource("fwd-svc"),
            scope_metrics: vec![ScopeMetrics {
                scope: None,
                metrics: vec![
                    Metric {
                        name: "fwd.gauge".into(),
                        unit: "ms".into(),
                        data: Some(Data::Gauge(Gauge {
                            data_points: (0..n)
                                .map(|i| {
                                    point(i, number_data_point::Value::AsDouble(f64::from(i) + 0.5))
                                })
                                .collect(),
                        })),
                        ..Default::default()
                    },
                    Metric {
                        name: "fwd.sum".into(),
                        data: Some(Data::Sum(Sum {
                            data_points: vec![point(0, number_data_point::Value::AsInt(42))],
                            aggregation_temporality: 2,
                            is_monotonic: true,
                        })),
                        ..Default::default()
                    },
                ],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn post(server: &Server, path: &str, body: Vec<u8>) {
    let resp = http_client()
        .post(server.otlp_http(path))
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{path} to {}", server.http);
}

/// Sends `spans_each` spans in each of `n` traces (numbered from `first`), plus `n` log
/// records and `n + 1` metric points. Answers (spans, logs, points) sent.
fn send_mix(server: &Server, first: u32, n: u32, spans_each: u32) -> (u64, u64, u64) {
    for t in first..first + n {
        post(
            server,
            "/v1/traces",
            traces(t, spans_each, "fwd-svc").encode_to_vec(),
        );
    }
    post(server, "/v1/logs", logs(first, n).encode_to_vec());
    post(server, "/v1/metrics", metrics(n).encode_to_vec());
    (u64::from(n * spans_each), u64::from(n), u64::from(n + 1))
}

/// `/metrics` samples, name{labels} → value.
fn samples(server: &Server) -> BTreeMap<String, f64> {
    let text = http_client()
        .get(server.api("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// Sum of the samples whose key starts with `prefix`.
fn sum(s: &BTreeMap<String, f64>, prefix: &str) -> u64 {
    s.iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| *v as u64)
        .sum()
}

/// What an upstream received over OTLP (spans, log records, metric points), since it started.
fn received(server: &Server) -> (u64, u64, u64) {
    let s = samples(server);
    (
        sum(&s, "stallwatch_otlp_spans_received_total"),
        sum(&s, "stallwatch_otlp_log_records_received_total"),
        sum(&s, "stallwatch_otlp_metric_points_received_total"),
    )
}

fn add(a: (u64, u64, u64), b: (u64, u64, u64)) -> (u64, u64, u64) {
    (a.0 + b.0, a.1 + b.1, a.2 + b.2)
}

fn span_count(server: &Server, trace_no: u32) -> usize {
    let (st, t) = server.get_json(&format!("/api/v1/traces/{}", trace_hex(trace_no)));
    if st != 200 {
        return 0;
    }
    t["spans"].as_array().map_or(0, |a| a.len())
}

/// Waits until `server` received exactly `want`, then checks nothing more arrives.
fn expect_exactly(server: &Server, want: (u64, u64, u64), what: &str) {
    let mut got = received(server);
    wait_until!(
        LONG,
        format!("{what}: {want:?} at the upstream (last {got:?})"),
        {
            let done = got.0 >= want.0 && got.1 >= want.1 && got.2 >= want.2;
            got = received(server);
            done
        }
    );
    // Two more poll intervals and a retry: nothing arrives twice.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        received(server),
        want,
        "{what}: the upstream received something twice"
    );
}

fn forward_config(b: SocketAddr, protocol: &str, extra: &str) -> String {
    format!(
        "[forward]\nendpoint = \"http://{b}\"\nprotocol = \"{protocol}\"\nretry_initial_ms = 100\nretry_max_ms = 500\ntimeout_ms = 5000\npoll_interval_ms = 50\n{extra}"
    )
}

#[test]
fn http_protobuf_upstream_outage_then_everything_arrives_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (b_grpc, b_http) = (free_addr(), free_addr());
    let b = start_on(&dir.path().join("b"), "", b_grpc, b_http);
    let a = start_on(
        &dir.path().join("a"),
        &forward_config(
            b_http,
            "http/protobuf",
            "[forward.headers]\nx-team = \"ml\"\n",
        ),
        free_addr(),
        free_addr(),
    );

    let first = send_mix(&a, 1, 4, 25);
    expect_exactly(&b, first, "before the outage");
    assert_eq!(span_count(&b, 1), 25);
    let (_, trace) = b.get_json(&format!("/api/v1/traces/{}", trace_hex(2)));
    let tool = span_named(&trace, "execute_tool t3");
    assert_eq!(attr(&tool["attributes"], "n")["intValue"], "3");
    assert_eq!(tool["parent_span_id"], "0000000000000001");
    assert_eq!(
        trace["logs"].as_array().map_or(0, |l| l.len()),
        0,
        "logs belong to trace 1"
    );
    let (_, trace1) = b.get_json(&format!("/api/v1/traces/{}", trace_hex(1)));
    assert_eq!(trace1["logs"].as_array().unwrap().len(), 4, "{trace1:#}");

    // Outage: A keeps accepting at once; its backlog grows and it retries.
    b.stop();
    let second = send_mix(&a, 100, 6, 30);
    wait_until!(LONG, "A to retry against the missing upstream", {
        let s = samples(&a);
        sum(&s, "stallwatch_forward_retries_total") >= 2
            && sum(&s, "stallwatch_forward_backlog_items{signal=\"traces\"}") == second.0
    });
    assert!(
        a.stderr().contains("upstream unavailable"),
        "{}",
        a.stderr()
    );

    // B comes back on the same ports (and the same data folder): all of it, once.
    let b = start_on(&dir.path().join("b"), "", b_grpc, b_http);
    expect_exactly(&b, second, "after the outage");
    for t in 100..106 {
        assert_eq!(span_count(&b, t), 30, "trace {t}");
    }
    assert_eq!(
        span_count(&b, 1),
        25,
        "data from before the outage is still there"
    );
    let s = samples(&a);
    assert_eq!(
        sum(&s, "stallwatch_forward_sent_items_total{signal=\"traces\"}"),
        first.0 + second.0
    );
    assert_eq!(sum(&s, "stallwatch_forward_dropped_items_total"), 0);
    assert!(
        a.stderr().contains("upstream reachable again"),
        "{}",
        a.stderr()
    );
}

#[test]
fn grpc_gzip_resumes_after_sigkill_mid_backlog_without_losing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let (b_grpc, b_http) = (free_addr(), free_addr());
    let (a_grpc, a_http) = (free_addr(), free_addr());
    let a_config = forward_config(
        b_grpc,
        "grpc",
        "compression = \"gzip\"\nbatch_max_spans = 100\n",
    );

    // Phase 1: acknowledged data is never sent again, even after SIGKILL of A.
    let b = start_on(&dir.path().join("b"), "", b_grpc, b_http);
    let a = start_on(&dir.path().join("a"), &a_config, a_grpc, a_http);
    let first = send_mix(&a, 1, 3, 40);
    expect_exactly(&b, first, "phase 1");
    wait_until!(LONG, "A to record the acknowledgement", {
        sum(
            &samples(&a),
            "stallwatch_forward_sent_items_total{signal=\"traces\"}",
        ) == first.0
    });
    a.crash();
    let a = start_on(&dir.path().join("a"), &a_config, a_grpc, a_http);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        received(&b),
        first,
        "a restarted A re-sent acknowledged data"
    );

    // Phase 2: a big backlog built while B is down, A killed while it drains.
    b.stop();
    let second = send_mix(&a, 1000, 60, 100);
    let b = start_on(&dir.path().join("b"), "", b_grpc, b_http);
    wait_until!(LONG, "the drain to start", received(&b).0 > 0);
    let mid = received(&b);
    a.crash();
    let a = start_on(&dir.path().join("a"), &a_config, a_grpc, a_http);
    let mut got = received(&b);
    wait_until!(
        LONG,
        format!("the rest of the backlog (at {got:?}, mid-drain kill at {mid:?})"),
        {
            let done = got.0 >= second.0 && got.1 >= second.1 && got.2 >= second.2;
            got = received(&b);
            done
        }
    );
    for t in 1000..1060 {
        assert_eq!(
            span_count(&b, t),
            100,
            "trace {t} is complete at the upstream"
        );
    }
    // At most the one request per signal in flight at the kill is sent again.
    std::thread::sleep(Duration::from_millis(1500));
    let got = received(&b);
    assert!(got.0 <= second.0 + 100, "{got:?} vs {second:?}");
    assert!(
        got.1 <= second.1 * 2 && got.2 <= second.2 * 2,
        "{got:?} vs {second:?}"
    );
    drop(a);
}

#[test]
fn queue_cap_drops_the_oldest_rows_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (b_grpc, b_http) = (free_addr(), free_addr());
    // Nothing listens on B's address yet.
    let a = start_on(
        &dir.path().join("a"),
        &forward_config(b_http, "http/protobuf", "max_queue_bytes = 20000\n"),
        free_addr(),
        free_addr(),
    );
    let mut sent = (0, 0, 0);
    for round in 0..5 {
        sent = add(sent, send_mix(&a, 1 + round * 10, 10, 20));
    }
    let queue_full =
        "stallwatch_forward_dropped_items_total{signal=\"traces\",reason=\"queue_full\"}";
    wait_until!(LONG, "A to drop the oldest rows past max_queue_bytes", {
        let s = samples(&a);
        sum(&s, queue_full) > 0 && sum(&s, "stallwatch_forward_backlog_bytes") <= 20000
    });
    let dropped = sum(&samples(&a), queue_full);
    assert!(
        a.stderr().contains("over max_queue_bytes"),
        "{}",
        a.stderr()
    );
    assert!(dropped < sent.0, "something is left to send");

    // The upstream appears: what was not dropped arrives; sent + dropped = accepted.
    let b = start_on(&dir.path().join("b"), "", b_grpc, b_http);
    wait_until!(LONG, "the kept spans to arrive", {
        let s = samples(&a);
        let d = sum(
            &s,
            "stallwatch_forward_dropped_items_total{signal=\"traces\"",
        );
        let f = sum(&s, "stallwatch_forward_sent_items_total{signal=\"traces\"}");
        d + f == sent.0 && received(&b).0 == f
    });
    assert!(
        span_count(&b, 50) == 20,
        "the newest trace survived the cap"
    );
    assert_eq!(span_count(&b, 1), 0, "the oldest trace was dropped");
}

#[test]
fn requests_the_upstream_finds_too_large_are_split_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (b_grpc, b_http) = (free_addr(), free_addr());
    // B refuses bodies over 2 KiB with 413; A's first requests carry everything at once.
    let b = start_on(
        &dir.path().join("b"),
        "[otlp]\nmax_request_bytes = 2048\n",
        b_grpc,
        b_http,
    );
    let a = start_on(
        &dir.path().join("a"),
        &forward_config(b_http, "http/protobuf", ""),
        free_addr(),
        free_addr(),
    );
    for t in 1..=10 {
        post(&a, "/v1/traces", traces(t, 5, "fwd-svc").encode_to_vec());
    }
    post(&a, "/v1/logs", logs(1, 60).encode_to_vec());
    expect_exactly(&b, (50, 60, 0), "split requests");
    let s = samples(&a);
    assert_eq!(sum(&s, "stallwatch_forward_dropped_items_total"), 0);
    assert!(
        sum(&s, "stallwatch_forward_requests_total{signal=\"logs\"}") > 1,
        "the logs went in several requests"
    );
    assert!(
        a.stderr().contains("sending smaller ones"),
        "{}",
        a.stderr()
    );
    for t in 1..=10 {
        assert_eq!(span_count(&b, t), 5, "trace {t}");
    }
}

#[test]
fn headers_reach_the_upstream_and_a_permanent_refusal_is_counted_as_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (b_grpc, b_http) = (free_addr(), free_addr());
    // B accepts only exporters carrying its ingest token.
    let b = start_on(
        &dir.path().join("b"),
        "[otlp]\ningest_token = \"s3cret\"\n",
        b_grpc,
        b_http,
    );
    let with_token = start_on(
        &dir.path().join("a1"),
        &forward_config(
            b_grpc,
            "grpc",
            "[forward.headers]\nAuthorization = \"Bearer s3cret\"\n",
        ),
        free_addr(),
        free_addr(),
    );
    let without = start_on(
        &dir.path().join("a2"),
        &forward_config(b_http, "http/protobuf", ""),
        free_addr(),
        free_addr(),
    );
    post(
        &with_token,
        "/v1/traces",
        traces(7, 3, "tok").encode_to_vec(),
    );
    post(&without, "/v1/traces", traces(8, 4, "none").encode_to_vec());
    wait_until!(
        LONG,
        "the token-carrying spans at B",
        span_count(&b, 7) == 3
    );
    wait_until!(LONG, "the refused request counted as dropped", {
        sum(
            &samples(&without),
            "stallwatch_forward_dropped_items_total{signal=\"traces\",reason=\"refused\"}",
        ) == 4
    });
    assert!(
        without.stderr().contains("refused a request for good"),
        "{}",
        without.stderr()
    );
    assert_eq!(span_count(&b, 8), 0);
    // Dropped means given up: the backlog empties and nothing is retried.
    wait_until!(LONG, "an empty backlog", {
        sum(
            &samples(&without),
            "stallwatch_forward_backlog_items{signal=\"traces\"}",
        ) == 0
    });
    assert_eq!(
        sum(&samples(&without), "stallwatch_forward_retries_total"),
        0
    );
}

/// One accepted export is one stored row, and may hold more spans than `batch_max_spans`:
/// it is sent in pieces of at most that many (each with its resource and scope), cut again
/// when the upstream still finds a piece too large, and the cursor moves once the last
/// piece is answered. It used to go whole, and the upstream's 413 dropped every span of it.
#[test]
fn one_large_export_is_sent_in_pieces_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (b_grpc, b_http) = (free_addr(), free_addr());
    let b = start_on(
        &dir.path().join("b"),
        "[otlp]\nmax_request_bytes = 2048\n",
        b_grpc,
        b_http,
    );
    let a = start_on(
        &dir.path().join("a"),
        &forward_config(b_http, "http/protobuf", "batch_max_spans = 20\n"),
        free_addr(),
        free_addr(),
    );
    post(&a, "/v1/traces", traces(1, 120, "big").encode_to_vec());
    expect_exactly(&b, (120, 0, 0), "one export in pieces");
    assert_eq!(span_count(&b, 1), 120);
    let s = samples(&a);
    assert_eq!(sum(&s, "stallwatch_forward_dropped_items_total"), 0);
    assert!(
        sum(&s, "stallwatch_forward_requests_total{signal=\"traces\"}") >= 6,
        "120 spans at most 20 a request"
    );
}

/// A tiny HTTP/1.1 upstream on a thread: each request is answered by `answer(path)` with
/// `Connection: close`; the paths it was asked for are kept in order.
struct TinyUpstream {
    addr: SocketAddr,
    paths: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl TinyUpstream {
    fn start(answer: impl Fn(&str) -> String + Send + 'static) -> Self {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let paths = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = paths.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let mut len = 0usize;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                }
                let mut body = vec![0u8; len];
                let _ = reader.read_exact(&mut body);
                seen.lock().unwrap().push(path.clone());
                let _ = conn.write_all(answer(&path).as_bytes());
            }
        });
        Self { addr, paths }
    }

    fn paths(&self) -> Vec<String> {
        self.paths.lock().unwrap().clone()
    }
}

/// The forwarder follows a redirect within the endpoint's origin (the export arrives),
/// and not one to another host or port, where `[forward.headers]` credentials would go
/// too: that export is refused for good, with the target named, and the other server
/// never hears from it.
#[test]
fn redirects_are_followed_within_the_endpoints_origin_only() {
    let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    let elsewhere = TinyUpstream::start(move |_| ok.to_string());
    let target = format!("http://{}/v1/traces", elsewhere.addr);
    let same = TinyUpstream::start(move |path| {
        if path == "/v1/traces" {
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: /moved/v1/traces\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string()
        } else {
            ok.to_string()
        }
    });
    let cross = TinyUpstream::start(move |_| {
        format!("HTTP/1.1 308 Permanent Redirect\r\nlocation: {target}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    });
    let dir = tempfile::tempdir().unwrap();
    let a = start_on(
        &dir.path().join("a"),
        &forward_config(
            same.addr,
            "http/protobuf",
            "[forward.headers]\nx-api-key = \"k\"\n",
        ),
        free_addr(),
        free_addr(),
    );
    post(&a, "/v1/traces", traces(1, 2, "same").encode_to_vec());
    wait_until!(LONG, "the export at the redirect's target", {
        same.paths() == ["/v1/traces", "/moved/v1/traces"]
    });
    wait_until!(LONG, "an empty backlog", {
        sum(
            &samples(&a),
            "stallwatch_forward_backlog_items{signal=\"traces\"}",
        ) == 0
    });
    assert_eq!(
        sum(&samples(&a), "stallwatch_forward_dropped_items_total"),
        0
    );

    let b = start_on(
        &dir.path().join("b"),
        &forward_config(
            cross.addr,
            "http/protobuf",
            "[forward.headers]\nx-api-key = \"k\"\n",
        ),
        free_addr(),
        free_addr(),
    );
    post(&b, "/v1/traces", traces(2, 3, "cross").encode_to_vec());
    wait_until!(LONG, "the redirected export refused", {
        sum(
            &samples(&b),
            "stallwatch_forward_dropped_items_total{signal=\"traces\",reason=\"refused\"}",
        ) == 3
    });
    let stderr = b.stderr();
    assert!(
        stderr.contains("redirect to http://") && stderr.contains("not followed"),
        "{stderr}"
    );
    assert_eq!(cross.paths(), ["/v1/traces"]);
    assert!(elsewhere.paths().is_empty(), "followed across origins");

    // A 302 within the origin is not followed either: a client follows it with a GET
    // without the body, and the upstream answered that GET 200 while the export was lost.
    let found = TinyUpstream::start(move |path| {
        if path == "/v1/traces" {
            "HTTP/1.1 302 Found\r\nlocation: /moved/v1/traces\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string()
        } else {
            ok.to_string()
        }
    });
    let c = start_on(
        &dir.path().join("c"),
        &forward_config(found.addr, "http/protobuf", ""),
        free_addr(),
        free_addr(),
    );
    post(&c, "/v1/traces", traces(3, 4, "found").encode_to_vec());
    wait_until!(LONG, "the 302 refused", {
        sum(
            &samples(&c),
            "stallwatch_forward_dropped_items_total{signal=\"traces\",reason=\"refused\"}",
        ) == 4
    });
    let stderr = c.stderr();
    assert!(
        stderr.contains("HTTP 302 redirect to /moved/v1/traces not followed")
            && stderr.contains("without its body"),
        "{stderr}"
    );
    assert_eq!(found.paths(), ["/v1/traces"], "the 302 was followed");
}

/// Each signal backs off alone: traces sent to an upstream that keeps answering 503 wait,
/// while logs and metrics sent to one that is up arrive (they used to wait behind the
/// traces' retries for as long as the outage lasted).
#[test]
fn a_signal_whose_upstream_is_down_does_not_hold_the_others() {
    let busy = TinyUpstream::start(|_| {
        "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string()
    });
    let dir = tempfile::tempdir().unwrap();
    let (b_grpc, b_http) = (free_addr(), free_addr());
    let b = start_on(&dir.path().join("b"), "", b_grpc, b_http);
    let a = start_on(
        &dir.path().join("a"),
        &forward_config(
            b_http,
            "http/protobuf",
            &format!("traces_endpoint = \"http://{}/v1/traces\"\n", busy.addr),
        ),
        free_addr(),
        free_addr(),
    );
    let (spans, logs_sent, points) = send_mix(&a, 1, 5, 3);
    wait_until!(LONG, "logs and metrics at the live upstream", {
        let (_, l, m) = received(&b);
        l == logs_sent && m == points
    });
    assert_eq!(received(&b).0, 0, "traces went to the live upstream");
    assert!(
        !busy.paths().is_empty(),
        "the traces' upstream was never tried"
    );
    wait_until!(LONG, "the traces' backlog kept", {
        sum(
            &samples(&a),
            "stallwatch_forward_backlog_items{signal=\"traces\"}",
        ) == spans
    });
    assert_eq!(
        sum(&samples(&a), "stallwatch_forward_dropped_items_total"),
        0
    );
}

/// A gRPC export that fails in the connection (here: a port that speaks HTTP/1.1 only, so
/// tonic reports an HTTP/2 protocol error as INTERNAL or UNKNOWN) is not an answer from the
/// upstream: it is retried and the backlog kept. It used to be dropped for good.
#[test]
fn a_grpc_connection_failure_is_retried_not_dropped() {
    let http1 = TinyUpstream::start(|_| {
        "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string()
    });
    let dir = tempfile::tempdir().unwrap();
    let a = start_on(
        &dir.path().join("a"),
        &forward_config(http1.addr, "grpc", ""),
        free_addr(),
        free_addr(),
    );
    post(&a, "/v1/traces", traces(1, 6, "grpc-h1").encode_to_vec());
    wait_until!(LONG, "retries against the HTTP/1.1 port", {
        sum(&samples(&a), "stallwatch_forward_retries_total") >= 3
    });
    wait_until!(LONG, "the backlog kept", {
        sum(
            &samples(&a),
            "stallwatch_forward_backlog_items{signal=\"traces\"}",
        ) == 6
    });
    assert_eq!(
        sum(&samples(&a), "stallwatch_forward_dropped_items_total"),
        0
    );
}
