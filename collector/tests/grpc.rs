//! OTLP/gRPC over a raw HTTP/2 client: status codes for bad input, over-size,
//! back-pressure and authentication; gzip `grpc-encoding`; the three services.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use tokio::io::AsyncWriteExt;

use crate::common::*;

const TRACES: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
const LOGS: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
const METRICS: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

fn trace_pb() -> Vec<u8> {
    case_bytes("crafted/c14_trace.pb")
}

#[tokio::test]
async fn export_ok_and_gzip_grpc_encoding_accepted() {
    let h = start().await;
    let r = grpc_call(h.grpc, TRACES, &[], grpc_frame(false, &trace_pb())).await;
    assert_eq!(r.grpc_status, Some(0), "{r:?}");
    let r = grpc_call(
        h.grpc,
        TRACES,
        &[("grpc-encoding", "gzip")],
        grpc_frame(true, &gzip(&trace_pb())),
    )
    .await;
    assert_eq!(r.grpc_status, Some(0), "{r:?}");
    assert!(ExportTraceServiceResponse::decode(&r.message.unwrap()[..])
        .unwrap()
        .partial_success
        .is_none());
    assert_eq!(h.stored_span_total().await, 2);
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_problem() {
    let h = start().await;
    let r = grpc_call(
        h.grpc,
        TRACES,
        &[],
        grpc_frame(false, b"\x0a\xff\xff\xff\xff\x0f"),
    )
    .await;
    assert_eq!(r.grpc_status, Some(3), "{r:?}");
    assert!(
        r.grpc_message.contains("ExportTraceServiceRequest"),
        "{r:?}"
    );
    // Wrong-length id in protobuf: 400-class, naming the field.
    let req = opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
        resource_spans: vec![opentelemetry_proto::tonic::trace::v1::ResourceSpans {
            scope_spans: vec![opentelemetry_proto::tonic::trace::v1::ScopeSpans {
                spans: vec![opentelemetry_proto::tonic::trace::v1::Span {
                    trace_id: vec![1; 15],
                    span_id: vec![2; 8],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let r = grpc_call(h.grpc, TRACES, &[], grpc_frame(false, &req.encode_to_vec())).await;
    assert_eq!(r.grpc_status, Some(3));
    assert!(
        r.grpc_message
            .contains("spans[0].traceId: invalid trace id length: got 15 bytes, want 16"),
        "{r:?}"
    );
    // Corrupt gzip, compressed flag without encoding, truncated frame, two messages.
    let r = grpc_call(
        h.grpc,
        TRACES,
        &[("grpc-encoding", "gzip")],
        grpc_frame(true, b"not gzip"),
    )
    .await;
    assert_eq!(r.grpc_status, Some(3), "{r:?}");
    let r = grpc_call(h.grpc, TRACES, &[], grpc_frame(true, &trace_pb())).await;
    assert_eq!(r.grpc_status, Some(3), "{r:?}");
    let mut short = grpc_frame(false, &trace_pb());
    short.truncate(short.len() - 4);
    let r = grpc_call(h.grpc, TRACES, &[], short).await;
    assert_eq!(r.grpc_status, Some(3), "{r:?}");
    let mut two = grpc_frame(false, &trace_pb());
    two.extend(grpc_frame(false, &trace_pb()));
    let r = grpc_call(h.grpc, TRACES, &[], two).await;
    assert_eq!(r.grpc_status, Some(3), "{r:?}");
    let r = grpc_call(h.grpc, TRACES, &[], vec![]).await;
    assert_eq!(r.grpc_status, Some(3), "{r:?}");
    // Still serving.
    let r = grpc_call(h.grpc, TRACES, &[], grpc_frame(false, &trace_pb())).await;
    assert_eq!(r.grpc_status, Some(0));
}

#[tokio::test]
async fn all_zero_ids_are_partial_success_over_grpc() {
    let h = start().await;
    let r = grpc_call(
        h.grpc,
        TRACES,
        &[],
        grpc_frame(false, &case_bytes("crafted/c09_trace_id_all_zero.pb")),
    )
    .await;
    assert_eq!(r.grpc_status, Some(0));
    let ps = ExportTraceServiceResponse::decode(&r.message.unwrap()[..])
        .unwrap()
        .partial_success
        .unwrap();
    assert_eq!(ps.rejected_spans, 1);
    assert!(!ps.error_message.is_empty());
}

#[tokio::test]
async fn oversize_is_resource_exhausted_without_retry_info() {
    let h = start_with(|c| c.max_request_bytes = 64 * 1024).await;
    let r = grpc_call(
        h.grpc,
        TRACES,
        &[],
        grpc_frame(false, &vec![0u8; 100 * 1024]),
    )
    .await;
    assert_eq!(r.grpc_status, Some(8), "{r:?}");
    assert!(r.details.is_none());
    // A small gzip message inflating past the limit: same answer.
    let bomb = gzip(&vec![0x0a; 1024 * 1024]);
    let r = grpc_call(
        h.grpc,
        TRACES,
        &[("grpc-encoding", "gzip")],
        grpc_frame(true, &bomb),
    )
    .await;
    assert_eq!(r.grpc_status, Some(8), "{r:?}");
}

#[tokio::test]
async fn unauthenticated_without_the_ingest_token() {
    let h = start_with(|c| c.ingest_token = Some("tok".into())).await;
    let r = grpc_call(h.grpc, TRACES, &[], grpc_frame(false, &trace_pb())).await;
    assert_eq!(r.grpc_status, Some(16));
    let r = grpc_call(
        h.grpc,
        TRACES,
        &[("authorization", "Bearer tok")],
        grpc_frame(false, &trace_pb()),
    )
    .await;
    assert_eq!(r.grpc_status, Some(0));
}

#[tokio::test]
async fn unknown_method_and_encoding_are_unimplemented() {
    let h = start().await;
    let r = grpc_call(h.grpc, "/foo.Bar/Baz", &[], grpc_frame(false, &trace_pb())).await;
    assert_eq!(r.grpc_status, Some(12));
    let r = grpc_call(
        h.grpc,
        TRACES,
        &[("grpc-encoding", "snappy")],
        grpc_frame(true, &trace_pb()),
    )
    .await;
    assert_eq!(r.grpc_status, Some(12));
}

#[tokio::test]
async fn logs_and_metrics_services_accept_exports() {
    let h = start().await;
    let logs_json = case_bytes("upstream/otelproto_examples_logs.json");
    // Re-encode the official JSON examples as protobuf through a JSON POST round trip is
    // not possible, so send minimal protobuf requests.
    let logs = opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest {
        resource_logs: vec![opentelemetry_proto::tonic::logs::v1::ResourceLogs {
            scope_logs: vec![opentelemetry_proto::tonic::logs::v1::ScopeLogs {
                log_records: vec![opentelemetry_proto::tonic::logs::v1::LogRecord {
                    time_unix_nano: 1,
                    trace_id: vec![7; 16],
                    span_id: vec![8; 8],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let r = grpc_call(h.grpc, LOGS, &[], grpc_frame(false, &logs.encode_to_vec())).await;
    assert_eq!(r.grpc_status, Some(0), "{r:?}");
    ExportLogsServiceResponse::decode(&r.message.unwrap()[..]).unwrap();
    assert!(!logs_json.is_empty());
    let metrics = case_bytes("upstream/otelproto_examples_metrics.protobuf-bin");
    let r = grpc_call(h.grpc, METRICS, &[], grpc_frame(false, &metrics)).await;
    assert_eq!(r.grpc_status, Some(0), "{r:?}");
    ExportMetricsServiceResponse::decode(&r.message.unwrap()[..]).unwrap();
    assert!(h.stats.metric_points_received() >= 1);
    assert_eq!(h.stats.log_records_received(), 1);
}

#[tokio::test]
async fn inflight_budget_full_is_unavailable_with_retry_info() {
    let h = start_with(|c| {
        c.max_request_bytes = 600 * 1024;
        c.max_inflight_bytes = 1024 * 1024;
    })
    .await;
    // Hold 600 KiB of the budget with an HTTP request whose body never finishes.
    let mut s = tokio::net::TcpStream::connect(h.http).await.unwrap();
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{",
        600 * 1024
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while h.stats.inflight_bytes() < 600 * 1024 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let r = grpc_call(
        h.grpc,
        TRACES,
        &[],
        grpc_frame(false, &vec![0u8; 500 * 1024]),
    )
    .await;
    assert_eq!(r.grpc_status, Some(14), "{r:?}");
    let details = r.details.expect("RetryInfo detail");
    // google.rpc.Status whose detail names RetryInfo.
    assert!(String::from_utf8_lossy(&details).contains("type.googleapis.com/google.rpc.RetryInfo"));
    drop(s);
}

/// A trace export of `n` spans with a 200-byte attribute each (~250 bytes a span).
fn padded_export(n: u64) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::trace::v1 as pt;
    ExportTraceServiceRequest {
        resource_spans: vec![pt::ResourceSpans {
            scope_spans: vec![pt::ScopeSpans {
                spans: (0..n)
                    .map(|i| pt::Span {
                        trace_id: [[0x5a; 8], (i / 32 + 1).to_be_bytes()].concat(),
                        span_id: (i + 1).to_be_bytes().to_vec(),
                        name: format!("slow link {i}"),
                        start_time_unix_nano: 1_700_000_000_000_000_000 + i,
                        end_time_unix_nano: 1_700_000_000_000_500_000 + i,
                        attributes: vec![KeyValue {
                            key: "pad".into(),
                            value: Some(AnyValue {
                                value: Some(any_value::Value::StringValue("p".repeat(200))),
                            }),
                            ..Default::default()
                        }],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// One trace export over its own HTTP/2 connection, the stream's DATA sent `first` bytes
/// at once, then `piece` bytes every `every`, never ended by the client before the answer
/// (when it is cut): answers grpc-status,
/// grpc-message, how long after connecting the answer came, and the connection (still
/// open).
async fn paced_grpc(
    addr: std::net::SocketAddr,
    data: Vec<u8>,
    first: usize,
    piece: usize,
    every: std::time::Duration,
) -> (
    Option<i32>,
    String,
    std::time::Duration,
    h2::client::SendRequest<bytes::Bytes>,
) {
    let t0 = tokio::time::Instant::now();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await.unwrap();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{TRACES}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (resp, mut send) = client.send_request(req, false).unwrap();
    let writer = tokio::spawn(async move {
        let (head, rest) = data.split_at(first);
        let pieces: Vec<Vec<u8>> = std::iter::once(head.to_vec())
            .chain(rest.chunks(piece).map(<[u8]>::to_vec))
            .collect();
        let last = pieces.len() - 1;
        for (i, p) in pieces.into_iter().enumerate() {
            if send.send_data(bytes::Bytes::from(p), i == last).is_err() {
                break; // the server answered and reset the stream
            }
            tokio::time::sleep(every).await;
        }
        send
    });
    let resp = tokio::time::timeout(std::time::Duration::from_secs(30), resp)
        .await
        .expect("no answer within 30 s")
        .unwrap();
    let (parts, mut body) = resp.into_parts();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.ok().flatten();
    let took = t0.elapsed();
    writer.abort();
    let get = |k: &str| {
        trailers
            .as_ref()
            .and_then(|t| t.get(k))
            .or_else(|| parts.headers.get(k))
            .map(|v| v.to_str().unwrap().to_string())
    };
    (
        get("grpc-status").map(|s| s.parse().unwrap()),
        get("grpc-message")
            .map(|m| percent_decode(&m))
            .unwrap_or_default(),
        took,
        client,
    )
}

/// The trickle of the outside tester's report over gRPC: HTTP/2 streams whose message
/// prefix declares 100 kB (reserved at once with its decode share) and whose DATA frames
/// then carry a byte every 200 ms hold the budget, so a real export is `UNAVAILABLE`; each
/// is cut soon after the 1 s grace with `INVALID_ARGUMENT` naming the rule, the budget
/// is released and the real export is stored while the trickling connections are still
/// open. Beside them, an export streamed at twice the minimum rate for several times the
/// grace is stored (the slow-but-legitimate link).
#[tokio::test]
async fn trickled_streams_are_cut_and_release_the_budget_and_a_slow_steady_one_is_stored() {
    const RATE: u64 = 32 * 1024;
    let h = start_with(|c| {
        c.max_request_bytes = 256 * 1024;
        c.max_inflight_bytes = 1024 * 1024;
        c.listen.body_min_rate = RATE;
        c.listen.body_rate_grace = std::time::Duration::from_millis(1000);
    })
    .await;
    let ms = std::time::Duration::from_millis;
    const CLAIM: usize = 100_000;
    let mut trickle = (CLAIM as u32).to_be_bytes().to_vec();
    trickle.insert(0, 0);
    trickle.extend(vec![0u8; CLAIM]);
    let tricklers: Vec<_> = (0..3)
        .map(|_| tokio::spawn(paced_grpc(h.grpc, trickle.clone(), 5, 1, ms(200))))
        .collect();
    // each holds its declared message and its decode share (2× for protobuf traces)
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while h.stats.inflight_bytes() < 3 * 3 * CLAIM as u64 {
        assert!(tokio::time::Instant::now() < deadline, "budget never held");
        tokio::time::sleep(ms(10)).await;
    }
    let real = grpc_frame(false, &padded_export(300));
    let r = grpc_call(h.grpc, TRACES, &[], real.clone()).await;
    assert_eq!(
        r.grpc_status,
        Some(14),
        "the tricklers did not hold the budget: {r:?}"
    );
    let mut open = Vec::new();
    for t in tricklers {
        let (status, message, took, conn) = t.await.unwrap();
        assert_eq!(status, Some(3), "{message}");
        assert!(message.contains("too slowly"), "{message}");
        assert!(message.contains("body_min_bytes_per_s"), "{message}");
        assert!(
            took < std::time::Duration::from_secs(5),
            "cut only after {took:?}"
        );
        open.push(conn);
    }
    assert_eq!(
        h.stats
            .requests_refused(stallwatch_collector::RefuseReason::BodyTooSlow),
        3
    );
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while h.stats.inflight_bytes() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "budget not released"
        );
        tokio::time::sleep(ms(10)).await;
    }
    let r = grpc_call(h.grpc, TRACES, &[], real).await;
    assert_eq!(r.grpc_status, Some(0), "{r:?}");
    assert_eq!(h.stored_span_total().await, 300);

    // The healthy case: a different ~80 kB export at twice the minimum rate, over 1 s.
    let mut slow = padded_export(300);
    let mut other =
        opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::decode(
            &slow[..],
        )
        .unwrap();
    for s in &mut other.resource_spans[0].scope_spans[0].spans {
        s.trace_id[0] = 0xa5;
    }
    slow = grpc_frame(false, &other.encode_to_vec());
    let (status, message, took, _conn) =
        paced_grpc(h.grpc, slow, 0, (2 * RATE / 16) as usize, ms(62)).await;
    assert_eq!(status, Some(0), "{message}");
    assert!(took > ms(1000), "not slow: {took:?}");
    assert_eq!(h.stored_span_total().await, 600);
    drop(open);
}
