//! OTLP/HTTP behaviour beyond the manifest files: bad input never gives a 500 and the
//! server keeps serving, the ingest token, media types, limits, back-pressure, responses
//! in the request's encoding, observations after commit, graceful shutdown.

use std::io::Write as _;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use serde_json::{json, Value};
use stallwatch_collector::RefuseReason;
use stallwatch_storage::control::ObservedData;
use stallwatch_storage::MetricsSource;
use tokio::io::AsyncWriteExt;

use crate::common::*;

const GOOD: &str = "crafted/c01_ids_lowercase_hex.json";

#[tokio::test]
async fn garbage_never_gives_500_and_the_server_keeps_serving() {
    let h = start().await;
    let mut garbage: Vec<(&str, Option<&str>, Vec<u8>)> = vec![
        ("application/json", None, b"{\"resourceSpans\": [".to_vec()),
        ("application/json", None, b"\xff\xfe\x00garbage".to_vec()),
        ("application/json", None, b"[1,2,3]".to_vec()),
        (
            "application/json",
            None,
            b"{\"resourceSpans\": [{\"scopeSpans\": [{\"spans\": [{\"traceId\": {}}]}]}]}".to_vec(),
        ),
        ("application/json", None, "[".repeat(100_000).into_bytes()),
        (
            "application/json",
            Some("gzip"),
            b"\x1f\x8b\x08\x00garbage".to_vec(),
        ),
        ("application/json", Some("zstd"), b"not zstd".to_vec()),
        (
            "application/json",
            Some("deflate"),
            b"\x78\x9c broken".to_vec(),
        ),
        (
            "application/x-protobuf",
            None,
            b"\x0a\xff\xff\xff\xff\x0f".to_vec(),
        ),
        ("application/x-protobuf", None, vec![0xff; 1000]),
        (
            "application/x-protobuf",
            None,
            case_bytes("upstream/otelproto_examples_trace.json"),
        ),
        (
            "application/x-protobuf",
            None,
            case_bytes("upstream/otelproto_examples_metrics.protobuf-bin"),
        ),
    ];
    for i in 0..50u8 {
        garbage.push((
            "application/x-protobuf",
            None,
            (0..200)
                .map(|j: u32| (j as u8).wrapping_mul(31).wrapping_add(i))
                .collect(),
        ));
    }
    for (ct, ce, body) in garbage {
        let r = h.post("/v1/traces", ct, ce, body.clone()).await;
        let s = r.status().as_u16();
        assert!(
            s == 200 || s == 400,
            "{ct} {ce:?} {:?}: {s}",
            &body[..body.len().min(20)]
        );
        assert_ne!(s, 500);
    }
    let r = h
        .post("/v1/traces", "application/json", None, case_bytes(GOOD))
        .await;
    assert_eq!(r.status(), 200, "good request after garbage");
    assert!(h.stats.requests_refused(RefuseReason::BadRequest) >= 10);
}

#[tokio::test]
async fn metrics_protobuf_posted_to_traces_is_400_never_stored() {
    let h = start().await;
    // A metrics request on /v1/traces decodes as unknown fields or a type clash.
    let r = h
        .post(
            "/v1/traces",
            "application/x-protobuf",
            None,
            case_bytes("upstream/otelproto_examples_metrics.protobuf-bin"),
        )
        .await;
    assert!(r.status() == 400 || r.status() == 200, "{}", r.status());
    assert_eq!(h.stored_span_total().await, 0);
}

#[tokio::test]
async fn errors_are_rpc_status_in_the_request_encoding() {
    let h = start().await;
    let mut bad = case_bytes("crafted/c19_official_trace_json_as_protobuf.pb");
    bad.truncate(bad.len() - 3);
    let r = h
        .post("/v1/traces", "application/x-protobuf", None, bad)
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/x-protobuf");
    let body = r.bytes().await.unwrap();
    // google.rpc.Status: field 1 code (varint 3), field 2 message.
    assert_eq!(&body[..2], b"\x08\x03", "{body:?}");
    let sample = case_bytes("responses/error_status_400.pb");
    assert_eq!(&sample[..2], b"\x08\x03");
    assert!(String::from_utf8_lossy(&body).contains("ExportTraceServiceRequest"));
}

#[tokio::test]
async fn partial_success_in_protobuf_names_the_count() {
    let h = start().await;
    let r = h
        .post(
            "/v1/traces",
            "application/x-protobuf",
            None,
            case_bytes("crafted/c09_trace_id_all_zero.pb"),
        )
        .await;
    assert_eq!(r.status(), 200);
    let resp = ExportTraceServiceResponse::decode(r.bytes().await.unwrap()).unwrap();
    let ps = resp.partial_success.unwrap();
    assert_eq!(ps.rejected_spans, 1);
    assert!(
        ps.error_message.contains("1 span refused"),
        "{}",
        ps.error_message
    );
    assert_eq!(h.stats.records_refused(RefuseReason::InvalidId), 1);
}

#[tokio::test]
async fn unknown_media_type_is_415_and_missing_is_415() {
    let h = start().await;
    let r = h
        .post("/v1/traces", "text/plain", None, case_bytes(GOOD))
        .await;
    assert_eq!(r.status(), 415);
    let r = h
        .client
        .post(h.url("/v1/traces"))
        .body(case_bytes(GOOD))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let r = h
        .post(
            "/v1/traces",
            "application/json; charset=utf-8",
            None,
            case_bytes(GOOD),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = h
        .post("/v1/nope", "application/json", None, case_bytes(GOOD))
        .await;
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn ingest_token_is_required_when_set() {
    let h = start_with(|c| c.ingest_token = Some("s3cret".into())).await;
    let r = h
        .post("/v1/traces", "application/json", None, case_bytes(GOOD))
        .await;
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let r = h
        .client
        .post(h.url("/v1/traces"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer wrong!")
        .body(case_bytes(GOOD))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = h
        .client
        .post(h.url("/v1/traces"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer s3cret")
        .body(case_bytes(GOOD))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(h.stats.requests_refused(RefuseReason::Unauthenticated), 2);
}

#[tokio::test]
async fn zstd_and_deflate_encodings_store_spans() {
    let h = start().await;
    let body = case_bytes(GOOD);
    let z = zstd::encode_all(&body[..], 3).unwrap();
    assert_eq!(
        h.post("/v1/traces", "application/json", Some("zstd"), z)
            .await
            .status(),
        200
    );
    let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    d.write_all(&body).unwrap();
    assert_eq!(
        h.post(
            "/v1/traces",
            "application/json",
            Some("deflate"),
            d.finish().unwrap()
        )
        .await
        .status(),
        200
    );
    assert_eq!(h.stored_span_total().await, 2);
}

#[tokio::test]
async fn body_over_the_limit_is_413_before_and_after_decompression() {
    let h = start_with(|c| {
        c.max_request_bytes = 64 * 1024;
        c.max_inflight_bytes = 1024 * 1024;
    })
    .await;
    let big = format!(
        "{{\"resourceSpans\": [], \"pad\": \"{}\"}}",
        "x".repeat(100 * 1024)
    );
    let r = h
        .post(
            "/v1/traces",
            "application/json",
            None,
            big.clone().into_bytes(),
        )
        .await;
    assert_eq!(r.status(), 413);
    let r = h
        .post(
            "/v1/traces",
            "application/json",
            Some("gzip"),
            gzip(big.as_bytes()),
        )
        .await;
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], 8);
    assert!(v["message"].as_str().unwrap().contains("65536"), "{v}");
    assert_eq!(
        h.post("/v1/traces", "application/json", None, case_bytes(GOOD))
            .await
            .status(),
        200
    );
}

#[tokio::test]
async fn attribute_nesting_deeper_than_32_is_400() {
    let h = start().await;
    let mut v = json!({"stringValue": "leaf"});
    for _ in 1..33 {
        v = json!({"arrayValue": {"values": [v]}});
    }
    let req = json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "b7ad6b7169203331",
        "attributes": [{"key": "deep", "value": v}]}]}]}]});
    let r = h
        .post(
            "/v1/traces",
            "application/json",
            None,
            req.to_string().into_bytes(),
        )
        .await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("deeper than 32"),
        "{body}"
    );
}

/// Holds `n` bytes of the in-flight budget with a request whose body never finishes.
async fn hold_budget(h: &Harness, n: usize) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(h.http).await.unwrap();
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n{{"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while h.stats.inflight_bytes() < n as u64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "budget never charged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s
}

#[tokio::test]
async fn inflight_budget_full_is_503_with_retry_after() {
    let h = start_with(|c| {
        c.max_request_bytes = 600 * 1024;
        c.max_inflight_bytes = 1024 * 1024;
    })
    .await;
    // 300 KiB declared: its body and its decode-time share (1× for JSON traces) are
    // charged at once, 600 KiB of the 1 MiB budget.
    let _held = hold_budget(&h, 300 * 1024).await;
    assert!(h.stats.inflight_bytes() >= 600 * 1024);
    let big = format!(
        "{{\"resourceSpans\": [], \"pad\": \"{}\"}}",
        "x".repeat(500 * 1024)
    );
    let r = h
        .post("/v1/traces", "application/json", None, big.into_bytes())
        .await;
    assert_eq!(r.status(), 503);
    let ra: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ra >= 1);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], 14);
    assert_eq!(
        v["details"][0]["@type"],
        "type.googleapis.com/google.rpc.RetryInfo"
    );
    assert_eq!(h.stats.requests_refused(RefuseReason::InflightFull), 1);
    // Small requests still fit.
    assert_eq!(
        h.post("/v1/traces", "application/json", None, case_bytes(GOOD))
            .await
            .status(),
        200
    );
}

#[tokio::test]
async fn observation_after_commit_carries_the_spans_and_arrival_time() {
    let mut h = start().await;
    let before = std::time::Instant::now();
    let r = h
        .post("/v1/traces", "application/json", None, case_bytes(GOOD))
        .await;
    assert_eq!(r.status(), 200);
    let obs = h.next_observation().await;
    assert!(obs.received >= before);
    match obs.data {
        ObservedData::Traces { open, ended } => assert_eq!(open.span_count() + ended.len(), 2),
        other => panic!("{other:?}"),
    }
    // By the time it was observed, it is committed.
    assert_eq!(h.stored_spans("4bf92f3577b34da6a3ce929d0e0e4736").await, 2);
    let r = h
        .post(
            "/v1/logs",
            "application/json",
            None,
            case_bytes("upstream/otelproto_examples_logs.json"),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(matches!(
        h.next_observation().await.data,
        ObservedData::Logs(_)
    ));
    // Nothing is observed for a request that stored nothing.
    assert_eq!(
        h.post("/v1/traces", "application/json", None, b"{}".to_vec())
            .await
            .status(),
        200
    );
    assert!(h.observations.try_recv().is_err());
}

#[tokio::test]
async fn logs_are_stored_and_linked_to_their_trace() {
    let h = start().await;
    let req = json!({"resourceLogs": [{"scopeLogs": [{"logRecords": [{
        "timeUnixNano": "1700000000123456789", "body": {"stringValue": "tool started"},
        "traceId": "4BF92F3577B34DA6A3CE929D0E0E4736", "spanId": "b7ad6b7169203331"}]}]}]});
    assert_eq!(
        h.post("/v1/traces", "application/json", None, case_bytes(GOOD))
            .await
            .status(),
        200
    );
    assert_eq!(
        h.post(
            "/v1/logs",
            "application/json",
            None,
            req.to_string().into_bytes()
        )
        .await
        .status(),
        200
    );
    let id =
        stallwatch_storage::model::TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
    let t = h.storage.trace(id).await.unwrap().unwrap();
    assert_eq!(t.logs.len(), 1);
    assert_eq!(
        t.logs[0].record.span_id.unwrap().to_hex(),
        "b7ad6b7169203331"
    );
    assert_eq!(h.stats.log_records_received(), 1);
}

#[tokio::test]
async fn counters_render_in_prometheus_text() {
    let h = start().await;
    assert_eq!(
        h.post("/v1/traces", "application/json", None, case_bytes(GOOD))
            .await
            .status(),
        200
    );
    assert_eq!(
        h.post("/v1/traces", "text/plain", None, vec![])
            .await
            .status(),
        415
    );
    let mut out = String::new();
    h.stats.render_prometheus(&mut out);
    assert!(
        out.contains("stallwatch_otlp_spans_received_total 2"),
        "{out}"
    );
    assert!(
        out.contains("stallwatch_otlp_requests_refused_total{reason=\"unsupported_media_type\"} 1"),
        "{out}"
    );
    assert!(out.contains("# TYPE stallwatch_otlp_inflight_bytes gauge"));
}

#[tokio::test]
async fn shutdown_stops_accepting_and_run_returns() {
    let h = start().await;
    assert_eq!(
        h.post("/v1/traces", "application/json", None, case_bytes(GOOD))
            .await
            .status(),
        200
    );
    h.shutdown.cancel();
    let res = tokio::time::timeout(Duration::from_secs(30), h.task)
        .await
        .unwrap()
        .unwrap();
    assert!(res.is_ok(), "{res:?}");
    let fresh = reqwest::Client::new();
    assert!(fresh
        .post(format!("http://{}/v1/traces", h.http))
        .send()
        .await
        .is_err());
}

#[tokio::test]
async fn c11_body_far_over_the_limit_gets_a_clear_413_not_a_reset() {
    let h = start_with(|c| {
        c.max_request_bytes = 1024 * 1024;
        c.max_inflight_bytes = 4 * 1024 * 1024;
    })
    .await;
    let body = vec![b' '; 24 * 1024 * 1024];
    for chunked in [false, true] {
        let rb = h
            .client
            .post(h.url("/v1/traces"))
            .header("content-type", "application/json");
        let rb = if chunked {
            let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
                body.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
            rb.body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        } else {
            rb.body(body.clone())
        };
        let r = rb
            .send()
            .await
            .expect("a clear answer, not a dropped connection");
        assert_eq!(r.status(), 413, "chunked={chunked}");
    }
}

#[tokio::test]
async fn stalled_body_is_refused_and_releases_the_budget() {
    use tokio::io::AsyncReadExt;
    let h = start_with(|c| c.body_idle_timeout = Duration::from_millis(300)).await;
    let mut held = hold_budget(&h, 100 * 1024).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), held.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("stalled"), "{text}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while h.stats.inflight_bytes() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "budget not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A valid span of the multi-chunk exports below (~300 bytes on the wire).
fn chunk_test_span(i: u64) -> opentelemetry_proto::tonic::trace::v1::Span {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    let mut trace_id = [0u8; 16];
    // 32 spans a trace: 625 traces, within `stored_span_total`'s page of 1,000
    trace_id[..8].copy_from_slice(&(i / 32 + 1).to_be_bytes());
    opentelemetry_proto::tonic::trace::v1::Span {
        trace_id: trace_id.to_vec(),
        span_id: (i + 1).to_be_bytes().to_vec(),
        name: format!("tools/call read_file {i}"),
        start_time_unix_nano: 1_700_000_000_000_000_000 + i,
        end_time_unix_nano: 1_700_000_000_000_500_000 + i,
        attributes: (0..6)
            .map(|k| KeyValue {
                key: format!("workbench.attr.{k}"),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(format!(
                        "{:032x}",
                        i * 31 + k
                    ))),
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Issue 17 #14: a large export is encoded for storage in ~1 MiB chunks while it decodes,
/// but a bad span in its last chunk still refuses the whole request with a 400 and stores
/// none of the earlier chunks, over protobuf and OTLP/JSON; the same export without the
/// bad span is stored whole (the healthy case), and the server keeps serving.
#[tokio::test]
async fn a_bad_span_in_the_last_chunk_of_a_large_export_stores_nothing() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
    let h = start().await;
    // ~6 MiB of spans: several chunks before the bad one
    let n = 20_000u64;
    let request = |bad: bool| {
        let mut spans: Vec<_> = (0..n).map(chunk_test_span).collect();
        if bad {
            spans.push(opentelemetry_proto::tonic::trace::v1::Span {
                trace_id: vec![7; 5],
                ..chunk_test_span(n)
            });
        }
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    };
    let body = request(true).encode_to_vec();
    assert!(body.len() > 5 * 1024 * 1024, "{} bytes", body.len());
    let r = h
        .post("/v1/traces", "application/x-protobuf", None, body)
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        h.stored_span_total().await,
        0,
        "protobuf: chunks were stored"
    );

    // the same as OTLP/JSON (ids in hex), the bad span last
    let mut json_spans: Vec<Value> = (0..n)
        .map(|i| {
            let s = chunk_test_span(i);
            json!({
                "traceId": hex::encode(&s.trace_id),
                "spanId": hex::encode(&s.span_id),
                "name": s.name,
                "startTimeUnixNano": s.start_time_unix_nano.to_string(),
                "endTimeUnixNano": s.end_time_unix_nano.to_string(),
                "attributes": s.attributes.iter().enumerate().map(|(k, _)| json!({
                    "key": format!("workbench.attr.{k}"),
                    "value": {"stringValue": format!("{:032x}", i * 31 + k as u64)},
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json_spans.push(json!({"traceId": "not hex at all, and too short", "spanId": "0102030405060708", "name": "bad"}));
    let json_body =
        serde_json::to_vec(&json!({"resourceSpans": [{"scopeSpans": [{"spans": json_spans}]}]}))
            .expect("json");
    assert!(json_body.len() > 5 * 1024 * 1024);
    let r = h
        .post("/v1/traces", "application/json", None, json_body)
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(h.stored_span_total().await, 0, "JSON: chunks were stored");

    // the healthy case: the same export without the bad span is stored whole
    let r = h
        .post(
            "/v1/traces",
            "application/x-protobuf",
            None,
            request(false).encode_to_vec(),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(h.stored_span_total().await, n);
}

/// A coded export that by itself needs more than `max_inflight_bytes` (its gzip body plus
/// what that decompresses to) can never be taken, even by an idle collector: it is refused
/// as too large (413 / `RESOURCE_EXHAUSTED`, no retry), not as busy (503 with a retry that
/// fails forever), over both transports. The same body sent plain fits and is accepted.
#[tokio::test]
async fn a_coded_export_that_alone_outgrows_the_budget_is_too_large_not_busy() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::trace::v1 as pt;
    const BUDGET: usize = 3_000_000;
    let h = start_with(|c| {
        c.max_request_bytes = BUDGET;
        c.max_inflight_bytes = BUDGET;
    })
    .await;
    // ~2.3 MB of hex digits of a pseudo-random stream in one attribute: gzip keeps about
    // half, so body + decompressed ≈ 3.5 MB.
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let noise: String = (0..2_300_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from_digit((x & 15) as u32, 16).unwrap()
        })
        .collect();
    let body = ExportTraceServiceRequest {
        resource_spans: vec![pt::ResourceSpans {
            scope_spans: vec![pt::ScopeSpans {
                spans: vec![pt::Span {
                    trace_id: vec![7; 16],
                    span_id: vec![8; 8],
                    name: "big".into(),
                    start_time_unix_nano: 1,
                    end_time_unix_nano: 2,
                    attributes: vec![KeyValue {
                        key: "noise".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue(noise)),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec();
    let gz = gzip(&body);
    assert!(
        body.len() < BUDGET && gz.len() + body.len() > BUDGET,
        "{} / {}",
        gz.len(),
        body.len()
    );
    let r = h
        .post(
            "/v1/traces",
            "application/x-protobuf",
            Some("gzip"),
            gz.clone(),
        )
        .await;
    assert_eq!(r.status(), 413);
    assert!(r.headers().get("retry-after").is_none());
    let text = String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned();
    assert!(text.contains("max_inflight_bytes (3000000)"), "{text}");
    let r = grpc_call(
        h.grpc,
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        &[("grpc-encoding", "gzip")],
        grpc_frame(true, &gz),
    )
    .await;
    assert_eq!(r.grpc_status, Some(8), "RESOURCE_EXHAUSTED: {r:?}");
    assert!(r.grpc_message.contains("max_inflight_bytes"), "{r:?}");
    assert!(r.details.is_none(), "no RetryInfo: {r:?}");
    assert_eq!(h.stats.requests_refused(RefuseReason::TooLarge), 2);
    assert_eq!(h.stats.requests_refused(RefuseReason::InflightFull), 0);
    // Plain, it fits.
    let r = h
        .post("/v1/traces", "application/x-protobuf", None, body)
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(h.stored_span_total().await, 1);
}

/// A protobuf trace export of `n` spans (~300 bytes each on the wire), in traces of their
/// own for each `tag`.
fn spans_export(n: u64, tag: u8) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: (0..n)
                    .map(|i| {
                        let mut s = chunk_test_span(i);
                        s.trace_id[15] = tag;
                        s
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// One raw OTLP/HTTP client: a `POST /v1/traces` head declaring `len` bytes (the body
/// given is sent as is, `piece` bytes every `every`, its writing never closed by the
/// client), then the whole answer the server sends before it closes. Answers the answer
/// and how long after connecting it was complete.
async fn paced_export(
    addr: std::net::SocketAddr,
    ct: &'static str,
    len: usize,
    body: Vec<u8>,
    piece: usize,
    every: Duration,
) -> (String, Duration) {
    use tokio::io::AsyncReadExt;
    let t0 = tokio::time::Instant::now();
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let (mut rd, mut wr) = s.into_split();
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: {ct}\r\nContent-Length: {len}\r\n\r\n"
    );
    wr.write_all(head.as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move {
        for p in body.chunks(piece) {
            if wr.write_all(p).await.is_err() {
                break;
            }
            tokio::time::sleep(every).await;
        }
        wr
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), rd.read_to_end(&mut answer)).await;
    let took = t0.elapsed();
    writer.abort();
    (String::from_utf8_lossy(&answer).into_owned(), took)
}

/// The outside tester's report: clients that declare a body and send it a byte at a time
/// hold the in-flight budget (reserved from Content-Length, with its decode share) while
/// never tripping the gap timeouts, so real exports got 503 for as long as they kept
/// going. Here three such clients (5 B/s, each reserving 300 kB of a 1 MiB budget) make a
/// real 90 kB export a 503; each is cut soon after the 1 s grace with a 400 naming the
/// rule, counted as `body_too_slow`; the budget comes back to 0 and the same export is
/// stored, though the trickling clients never stopped or closed on their side. Beside
/// them, an export sent at twice the minimum rate for several times the grace is stored
/// (the slow-but-legitimate link).
#[tokio::test]
async fn trickled_bodies_are_cut_and_release_the_budget_and_a_slow_steady_export_is_stored() {
    const RATE: u64 = 32 * 1024;
    let h = start_with(|c| {
        c.max_request_bytes = 256 * 1024;
        c.max_inflight_bytes = 1024 * 1024;
        c.listen.body_min_rate = RATE;
        c.listen.body_rate_grace = Duration::from_millis(1000);
    })
    .await;
    let ms = Duration::from_millis;
    const CLAIM: usize = 150_000;
    let tricklers: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn(paced_export(
                h.http,
                "application/json",
                CLAIM,
                vec![b' '; CLAIM],
                1,
                ms(200),
            ))
        })
        .collect();
    // each holds its declared body and its decode share (1× for JSON traces)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h.stats.inflight_bytes() < 3 * 2 * CLAIM as u64 {
        assert!(tokio::time::Instant::now() < deadline, "budget never held");
        tokio::time::sleep(ms(10)).await;
    }
    let real = spans_export(300, 1);
    assert!(real.len() > 80_000, "{}", real.len());
    let r = h
        .post("/v1/traces", "application/x-protobuf", None, real.clone())
        .await;
    assert_eq!(r.status(), 503, "the tricklers did not hold the budget");
    for t in tricklers {
        let (text, took) = t.await.unwrap();
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        assert!(text.contains("too slowly"), "{text}");
        assert!(text.contains("body_min_bytes_per_s"), "{text}");
        assert!(took < Duration::from_secs(5), "cut only after {took:?}");
    }
    assert_eq!(h.stats.requests_refused(RefuseReason::BodyTooSlow), 3);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while h.stats.inflight_bytes() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "budget not released"
        );
        tokio::time::sleep(ms(10)).await;
    }
    let r = h
        .post("/v1/traces", "application/x-protobuf", None, real.clone())
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(h.stored_span_total().await, 300);

    // The healthy case: ~90 kB at twice the minimum rate (4 kB every 62 ms), ~1.4 s.
    let slow = spans_export(300, 2);
    let (text, took) = paced_export(
        h.http,
        "application/x-protobuf",
        slow.len(),
        slow.clone(),
        (2 * RATE / 16) as usize,
        ms(62),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(took > ms(1000), "not slow: {took:?}");
    assert_eq!(h.stored_span_total().await, 600);
    assert_eq!(h.stats.requests_refused(RefuseReason::BodyTooSlow), 3);
}
