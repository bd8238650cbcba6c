//! Every MANIFEST.json request of C01–C19, sent as its exact bytes to a real collector,
//! asserting the status code, the response body and encoding (against
//! `payloads/responses/`), and the rows stored, read back through `Storage`.
//!
//! Where the manifest allows a choice, ours is fixed here and in docs/design.md ("OTLP/JSON case
//! choices"): zero-length body → 200; unknown enum name → 400; empty or all-zero ids →
//! 200 with partial success; raw deflate → 200; logs and metrics are accepted.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use serde_json::Value;
use stallwatch_storage::model::{AnyValue, SpanState};

use crate::common::*;

/// Our answer where the manifest gives a choice (a string instead of a number).
fn chosen_status(file: &str, manifest_http: &Value) -> u16 {
    if let Some(n) = manifest_http.as_u64() {
        return n as u16;
    }
    let text = manifest_http.as_str().unwrap();
    let ours = match file {
        "crafted/c04_enum_unknown_name.json" => 400,
        _ => 200,
    };
    assert!(
        text.contains(&ours.to_string()),
        "{file}: manifest allows {text:?}, we answer {ours}"
    );
    ours
}

fn is_json(ct: &str) -> bool {
    ct == "application/json"
}

/// Sends one manifest entry over HTTP and checks everything the manifest states.
async fn check_http_entry(file: &str) {
    let e = entry(file);
    let h = start().await;
    let ct = e["content_type"].as_str().unwrap();
    let ce = e["content_encoding"].as_str();
    let path = e["path"].as_str().unwrap();
    let body = case_bytes(file);
    let expect = &e["expect"];
    let want = chosen_status(file, &expect["http"]);
    let resp = h.post(path, ct, ce, body.clone()).await;
    let status = resp.status().as_u16();
    let resp_ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let resp_body = resp.bytes().await.unwrap().to_vec();
    assert_eq!(
        status,
        want,
        "{file}: body {}",
        String::from_utf8_lossy(&resp_body)
    );
    assert_eq!(resp_ct, ct, "{file}: response in the request's encoding");

    // Response body shape, against payloads/responses/.
    if status == 200 {
        // The manifest allows storing, flagging or clamping a span that ends before it
        // starts; stallwatch refuses it in partial success (docs/design.md, Back-pressure
        // and limits).
        let end_before_start = file == "crafted/c08_end_before_start.json";
        if is_json(ct) {
            let got: Value = serde_json::from_slice(&resp_body).unwrap();
            let partial = end_before_start
                || expect["http"]
                    .as_str()
                    .is_some_and(|s| s.contains("partialSuccess"));
            if partial {
                let sample: Value = serde_json::from_slice(&case_bytes(
                    "responses/partial_success_2_rejected.json",
                ))
                .unwrap();
                let keys = |v: &Value| {
                    v["partialSuccess"]
                        .as_object()
                        .unwrap()
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                };
                assert_eq!(keys(&got), keys(&sample), "{file}: {got}");
                assert_eq!(got["partialSuccess"]["rejectedSpans"], "1", "{file}: {got}");
                assert!(
                    got["partialSuccess"]["errorMessage"]
                        .as_str()
                        .unwrap()
                        .contains(if end_before_start {
                            "ends before it starts"
                        } else {
                            "traceId"
                        }),
                    "{got}"
                );
            } else if path == "/v1/metrics" {
                // The official metrics example has only points: full success.
                assert_eq!(got, serde_json::json!({}), "{file}");
            } else {
                let sample: Value =
                    serde_json::from_slice(&case_bytes("responses/success_empty.json")).unwrap();
                assert_eq!(got, sample, "{file}");
            }
        } else {
            let partial = expect["http"]
                .as_str()
                .is_some_and(|s| s.contains("partialSuccess"));
            if partial {
                let r = ExportTraceServiceResponse::decode(&resp_body[..]).unwrap();
                assert_eq!(r.partial_success.unwrap().rejected_spans, 1, "{file}");
            } else {
                assert_eq!(
                    resp_body,
                    case_bytes("responses/success_empty.pb"),
                    "{file}"
                );
            }
        }
    } else {
        // Errors are google.rpc.Status in the request's encoding, naming the problem.
        assert!(is_json(ct), "all error cases in the manifest are JSON");
        let got: Value = serde_json::from_slice(&resp_body).unwrap();
        let sample: Value =
            serde_json::from_slice(&case_bytes("responses/error_status_400.json")).unwrap();
        let mut gk: Vec<_> = got.as_object().unwrap().keys().collect();
        let mut sk: Vec<_> = sample.as_object().unwrap().keys().collect();
        gk.sort();
        sk.sort();
        assert_eq!(gk, sk, "{file}: {got}");
        assert!(!got["message"].as_str().unwrap().is_empty());
        if let Some(code) = expect["rpc_status_code"].as_i64() {
            assert_eq!(got["code"].as_i64(), Some(code), "{file}: {got}");
        }
        if status == 413 {
            assert_eq!(got["code"], 8, "{file}");
        }
    }

    // Stored rows, read back through Storage.
    if let Some(n) = expect["stored_spans"].as_u64() {
        assert_eq!(h.stored_span_total().await, n, "{file}: stored spans");
    }
    if status != 200 {
        assert_eq!(
            h.stored_span_total().await,
            0,
            "{file}: nothing stored on error"
        );
    }
    if let Some(tid) = expect["trace_id"].as_str() {
        assert!(h.stored_spans(tid).await > 0, "{file}: trace {tid} stored");
    }
    let ids = json_trace_ids(&case_bytes(file));
    let first_span = || async {
        let id = stallwatch_storage::model::TraceId::from_hex(&ids[0]).unwrap();
        h.storage.trace(id).await.unwrap().unwrap().spans[0].clone()
    };
    if let Some(start) = expect["startTimeUnixNano"].as_str() {
        assert_eq!(
            first_span().await.span.start_time_unix_nano.to_string(),
            start,
            "{file}"
        );
    }
    if let Some(max) = expect["tokens.max"].as_i64() {
        let s = first_span().await;
        assert_eq!(
            stallwatch_storage::model::attr(&s.span.attributes, "tokens.max"),
            Some(&AnyValue::Int(max))
        );
    }
    if let (Some(kind), Some(code)) = (expect["kind"].as_i64(), expect["status_code"].as_i64()) {
        let s = first_span().await;
        assert_eq!(
            (i64::from(s.span.kind), i64::from(s.span.status.code)),
            (kind, code),
            "{file}"
        );
    }
    if expect["state"] == "open" {
        let id = stallwatch_storage::model::TraceId::from_hex(&ids[0]).unwrap();
        let t = h.storage.trace(id).await.unwrap().unwrap();
        assert!(
            t.spans
                .iter()
                .all(|s| s.state == SpanState::Open && s.span.duration_ns().is_none()),
            "{file}"
        );
    }
    if expect["state"] == "ended" {
        assert_eq!(first_span().await.state, SpanState::Ended, "{file}");
    }
    if expect.get("parent").is_some_and(Value::is_null) {
        assert_eq!(first_span().await.span.parent_span_id, None, "{file}");
    }
    if let Some(n) = expect["links"].as_u64() {
        assert_eq!(first_span().await.span.links.len() as u64, n, "{file}");
    }
    if let Some(hex) = expect["bytes_attr_hex"].as_str() {
        let want = AnyValue::Bytes(hex::decode(hex).unwrap());
        assert!(
            first_span()
                .await
                .span
                .attributes
                .iter()
                .any(|kv| kv.value == want),
            "{file}"
        );
    }
    if expect["dropped_counts_preserved"] == true {
        let s = first_span().await.span;
        assert!(s.dropped_attributes_count + s.dropped_events_count + s.dropped_links_count > 0);
    }
    if expect["service_name"].is_string() {
        let s = first_span().await;
        assert_eq!(
            s.resource.service_name(),
            stallwatch_storage::model::UNKNOWN_SERVICE
        );
    }
    // The server keeps serving after any of these.
    let again = h
        .post(
            "/v1/traces",
            "application/json",
            None,
            case_bytes("crafted/c01_ids_lowercase_hex.json"),
        )
        .await;
    assert_eq!(again.status(), 200, "{file}: server still serving");
}

macro_rules! http_cases {
    ($($name:ident => $file:literal,)*) => {
        $(
            #[tokio::test]
            async fn $name() {
                check_http_entry($file).await;
            }
        )*
        /// Every C01–C19 HTTP request file in the manifest has a test above.
        #[test]
        fn every_manifest_http_case_has_a_test() {
            let covered = [$($file),*];
            for e in manifest() {
                let case = e["case"].as_str().unwrap_or("");
                let n: u32 = case.trim_start_matches('C').parse().unwrap_or(99);
                if n <= 19 && e["transport"] == "http" && e["file"].is_string() {
                    let f = e["file"].as_str().unwrap();
                    assert!(covered.contains(&f), "no test for {f}");
                }
            }
        }
    };
}

http_cases! {
    c01_ids_lowercase_hex => "crafted/c01_ids_lowercase_hex.json",
    c01_ids_mixedcase_hex => "crafted/c01_ids_mixedcase_hex.json",
    c01_ids_base64_refused_naming_trace_id => "crafted/c01_ids_base64.json",
    c02_int64_as_strings => "crafted/c02_int64_as_strings.json",
    c02_int64_as_numbers_keep_precision => "crafted/c02_int64_as_numbers.json",
    c02_int64_out_of_range_refused => "crafted/c02_int64_out_of_range.json",
    c02_int64_fractional_refused => "crafted/c02_int64_fractional.json",
    c02_double_special_strings => "crafted/c02_double_special_strings.json",
    c04_enums_as_names => "crafted/c04_enums_as_names.json",
    c04_enums_unknown_values_kept => "crafted/c04_enums_unknown_values.json",
    c04_enum_unknown_name_refused => "crafted/c04_enum_unknown_name.json",
    c05_snake_case_field_names => "crafted/c05_snake_case_field_names.json",
    c05_official_example_snake_case_numeric_int64 => "upstream/otelproto_examples_trace_v7de58cc_snakecase_numeric_int64.json",
    c07_empty_object => "crafted/c07_empty_object.json",
    c07_empty_resource_spans => "crafted/c07_empty_resourceSpans.json",
    c07_zero_length_body => "crafted/c07_empty_zero_length_body.json",
    c07_empty_at_every_level => "crafted/c07_empty_at_every_level.json",
    c07_no_resource_no_scope_default_service => "crafted/c07_no_resource_no_scope.json",
    c08_open_span_no_end_time => "crafted/c08_open_span_no_end_time.json",
    c08_end_before_start => "crafted/c08_end_before_start.json",
    c09_trace_id_empty_string_partial_success => "crafted/c09_trace_id_empty_string.json",
    c09_trace_id_all_zero_partial_success => "crafted/c09_trace_id_all_zero.json",
    c09_ids_wrong_length_refused => "crafted/c09_ids_wrong_length.json",
    c09_ids_non_hex_refused => "crafted/c09_ids_non_hex.json",
    c09_root_span_empty_parent => "crafted/c09_root_span_empty_parent.json",
    c09_trace_id_all_zero_protobuf_partial_success => "crafted/c09_trace_id_all_zero.pb",
    c11_attr_2mib_stored_whole => "crafted/c11_attr_2mib.json",
    c13_duplicate_span_same_batch_stored_once => "crafted/c13_duplicate_span_same_batch.json",
    c14_gzip => "crafted/c14_trace.json.gz",
    c14_x_gzip => "crafted/c14_trace.json.gz.as_x-gzip",
    c14_multimember_gzip => "crafted/c14_trace_multimember.json.gz",
    c14_truncated_gzip_refused => "crafted/c14_trace_truncated.json.gz",
    c14_plain_json_labelled_gzip_refused => "crafted/c14_plain_json_labelled_gzip.json",
    c14_zlib_deflate => "crafted/c14_trace.json.zlib",
    c14_raw_deflate => "crafted/c14_trace.json.rawdeflate",
    c14_gzip_bomb_stopped_at_limit => "crafted/c14_gzip_bomb_100mib.json.gz",
    c14_protobuf_gzip => "crafted/c14_trace.pb.gz",
    c14_protobuf_plain => "crafted/c14_trace.pb",
    c19_official_trace_json_as_protobuf => "crafted/c19_official_trace_json_as_protobuf.pb",
    c19_official_trace_json => "upstream/otelproto_examples_trace.json",
    c19_official_trace_protobuf => "upstream/otelproto_examples_trace.protobuf-bin",
    c19_official_logs => "upstream/otelproto_examples_logs.json",
    c19_official_metrics => "upstream/otelproto_examples_metrics.json",
    c19_official_events => "upstream/otelproto_examples_events.json",
    c19_jaeger_span_links => "upstream/jaeger_otlp_span_links_v900a9d7.json",
    c19_jaeger_fields_dropped_counts => "upstream/jaeger_otlp_fields_trace.json",
    c19_jaeger_scope_attributes => "upstream/jaeger_otlp_scope_attributes.json",
    c19_jaeger_bytes_value => "upstream/jaeger_span_tags_trace_bytesValue.json",
    c19_jaeger_memory_traces => "upstream/jaeger_memory_otel_traces_01.json",
}

#[tokio::test]
async fn c01_mixed_case_resend_creates_no_new_rows() {
    let h = start().await;
    for f in [
        "crafted/c01_ids_lowercase_hex.json",
        "crafted/c01_ids_mixedcase_hex.json",
        "crafted/c01_ids_lowercase_hex.json",
    ] {
        let r = h
            .post("/v1/traces", "application/json", None, case_bytes(f))
            .await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(h.stored_spans("4bf92f3577b34da6a3ce929d0e0e4736").await, 2);
    assert_eq!(h.stored_span_total().await, 2);
}

#[tokio::test]
async fn c19_json_and_protobuf_twins_store_the_same_span() {
    let h = start().await;
    let r = h
        .post(
            "/v1/traces",
            "application/json",
            None,
            case_bytes("upstream/otelproto_examples_trace.json"),
        )
        .await;
    assert_eq!(r.status(), 200);
    let id =
        stallwatch_storage::model::TraceId::from_hex("5b8efff798038103d269b633813fc60c").unwrap();
    let from_json = h.storage.trace(id).await.unwrap().unwrap().spans[0]
        .span
        .clone();
    let h2 = start().await;
    let r = h2
        .post(
            "/v1/traces",
            "application/x-protobuf",
            None,
            case_bytes("upstream/otelproto_examples_trace.protobuf-bin"),
        )
        .await;
    assert_eq!(r.status(), 200);
    let from_pb = h2.storage.trace(id).await.unwrap().unwrap().spans[0]
        .span
        .clone();
    assert_eq!(from_json, from_pb);
}

#[tokio::test]
async fn c19_official_trace_grpc_frame_ok() {
    let h = start().await;
    let r = grpc_call(
        h.grpc,
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        &[],
        case_bytes("crafted/c19_official_trace.grpc-frame"),
    )
    .await;
    assert_eq!(r.grpc_status, Some(0), "{r:?}");
    assert_eq!(
        entry("crafted/c19_official_trace.grpc-frame")["expect"]["grpc"],
        "OK"
    );
    let msg = r.message.unwrap();
    assert!(ExportTraceServiceResponse::decode(&msg[..])
        .unwrap()
        .partial_success
        .is_none());
    assert_eq!(h.stored_spans("5b8efff798038103d269b633813fc60c").await, 1);
}

#[tokio::test]
async fn c11_grpc_5mib_message_accepted_under_the_raised_limit() {
    let h = start().await;
    let msg = gunzip(&case_bytes("crafted/c11_grpc_5mib_attr.pb.gz"));
    assert!(msg.len() > 4 * 1024 * 1024);
    let r = grpc_call(
        h.grpc,
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        &[],
        grpc_frame(false, &msg),
    )
    .await;
    assert_eq!(r.grpc_status, Some(0), "{r:?}");
    assert_eq!(h.stored_span_total().await, 1);
    // The same message over a lower limit: RESOURCE_EXHAUSTED, no RetryInfo, no crash.
    let small = start_with(|c| c.max_request_bytes = 4 * 1024 * 1024).await;
    let r = grpc_call(
        small.grpc,
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        &[],
        grpc_frame(false, &msg),
    )
    .await;
    assert_eq!(r.grpc_status, Some(8), "{r:?}");
    assert!(r.details.is_none());
}

#[tokio::test]
async fn c11_attr_2mib_is_stored_whole() {
    let h = start().await;
    let body = case_bytes("crafted/c11_attr_2mib.json");
    let r = h
        .post("/v1/traces", "application/json", None, body.clone())
        .await;
    assert_eq!(r.status(), 200);
    let ids = json_trace_ids(&body);
    let id = stallwatch_storage::model::TraceId::from_hex(&ids[0]).unwrap();
    let t = h.storage.trace(id).await.unwrap().unwrap();
    let longest = t.spans[0]
        .span
        .attributes
        .iter()
        .filter_map(|kv| kv.value.as_str().map(str::len))
        .max()
        .unwrap();
    assert!(longest >= 2 * 1024 * 1024 - 1024, "{longest}");
}

#[tokio::test]
async fn c13_duplicate_span_ended_copy_wins_and_resend_changes_nothing() {
    let mut h = start().await;
    let body = case_bytes("crafted/c13_duplicate_span_same_batch.json");
    for _ in 0..2 {
        assert_eq!(
            h.post("/v1/traces", "application/json", None, body.clone())
                .await
                .status(),
            200
        );
    }
    assert_eq!(h.stored_span_total().await, 1);
    let id =
        stallwatch_storage::model::TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
    let t = h.storage.trace(id).await.unwrap().unwrap();
    assert_eq!(t.spans[0].state, SpanState::Ended);
    // The watchdog sees each committed request once.
    let _ = h.next_observation().await;
    let _ = h.next_observation().await;
    assert!(h.observations.try_recv().is_err());
}

#[tokio::test]
async fn c16_get_on_export_path_is_405_with_allow_post() {
    let h = start().await;
    let r = h.client.get(h.url("/v1/traces")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    let v: Value = r.json().await.unwrap();
    assert!(v["message"].as_str().unwrap().contains("POST"));
}

#[tokio::test]
async fn c14_unknown_content_encoding_is_415() {
    let h = start().await;
    let r = h
        .post(
            "/v1/traces",
            "application/json",
            Some("br"),
            case_bytes("crafted/c01_ids_lowercase_hex.json"),
        )
        .await;
    assert_eq!(r.status(), 415);
    let v: Value = r.json().await.unwrap();
    assert!(v["message"].as_str().unwrap().contains("br"), "{v}");
    assert_eq!(h.stored_span_total().await, 0);
}
