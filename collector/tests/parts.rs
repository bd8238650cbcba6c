//! Trace exports large enough to be decoded in parts side by side (issue 16): over every
//! transport and coding, what is stored, refused and answered is what one whole decode
//! gives. Each harness takes one export at a time, so it is cut wherever the machine has a
//! second core (`stallwatch_otlp_trace_exports_decoded_in_parts_total`); every part count is
//! checked by the unit tests in `chunks.rs`.

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1 as pt;
use prost::Message;

use crate::common::*;

const TRACES: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

/// `resources` × 2 scopes × `n` spans with a `pad`-byte attribute, 10 spans per trace;
/// the fourth span refused (all-zero trace id) and one late span too; a copy of the first
/// span sent again at the end, in a resource of its own. `bad`: one span id 3 bytes long
/// in the last resource (a 400).
fn export(resources: u64, n: u64, pad: usize, bad: bool) -> (Vec<u8>, u64) {
    let pad = "p".repeat(pad);
    let mut k = 0u64;
    let mut req = ExportTraceServiceRequest {
        resource_spans: (0..resources)
            .map(|r| pt::ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", &format!("parts-{r}"))],
                    ..Default::default()
                }),
                scope_spans: (0..2)
                    .map(|_| pt::ScopeSpans {
                        spans: (0..n)
                            .map(|_| {
                                k += 1;
                                pt::Span {
                                    trace_id: (u128::from(k / 10) + 1).to_be_bytes().to_vec(),
                                    span_id: k.to_be_bytes().to_vec(),
                                    name: format!("op{}", k % 7),
                                    start_time_unix_nano: 1_000 + k,
                                    end_time_unix_nano: 2_000 + k,
                                    attributes: vec![kv("pad", &pad)],
                                    ..Default::default()
                                }
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
    };
    let last = req.resource_spans.len() - 1;
    req.resource_spans[0].scope_spans[0].spans[3].trace_id = vec![0; 16];
    req.resource_spans[last].scope_spans[1].spans[(n - 2) as usize].trace_id = vec![0; 16];
    if bad {
        req.resource_spans[last].scope_spans[1].spans[(n - 5) as usize].span_id = vec![1, 2, 3];
    }
    let mut copy = req.resource_spans[0].clone();
    copy.scope_spans.truncate(1);
    copy.scope_spans[0].spans.truncate(1);
    req.resource_spans.push(copy);
    (req.encode_to_vec(), k)
}

/// The export a harness took alone was cut into parts where the machine has cores to spare
/// (this project's CI machines have 2), and never on one core.
fn assert_cut(h: &Harness) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cut = h.stats.trace_exports_decoded_in_parts();
    if cores > 1 {
        assert_eq!(cut, 1, "a lone export was not cut on {cores} cores");
    } else {
        assert_eq!(cut, 0, "an export was cut on one core");
    }
}

/// A 330 KB export (its first part decoded on the request's task) and a 1.8 MB one (every
/// part on the blocking pool, each in more than one chunk).
fn sizes() -> [(u64, u64, usize); 2] {
    [(2, 150, 1000), (4, 200, 1000)]
}

#[tokio::test]
async fn a_large_export_is_stored_once_whole_over_http_plain_and_gzip() {
    for (resources, n, pad) in sizes() {
        for gz in [false, true] {
            let h = start().await;
            let (body, spans) = export(resources, n, pad, false);
            assert!(body.len() > 300_000, "{}", body.len());
            let (body, ce) = if gz {
                (gzip(&body), Some("gzip"))
            } else {
                (body, None)
            };
            let r = h
                .post("/v1/traces", "application/x-protobuf", ce, body)
                .await;
            assert_eq!(r.status(), 200);
            let resp = ExportTraceServiceResponse::decode(r.bytes().await.unwrap()).unwrap();
            let ps = resp.partial_success.unwrap();
            assert_eq!(ps.rejected_spans, 2);
            assert!(
                ps.error_message.starts_with("2 spans refused: ")
                    && ps
                        .error_message
                        .contains("first at resourceSpans[0].scopeSpans[0].spans[3]"),
                "{}",
                ps.error_message
            );
            // Every accepted span once: the copy of the first is cut.
            assert_eq!(h.stored_span_total().await, spans - 2);
            assert_cut(&h);
            assert_eq!(
                h.stats.spans_received(),
                spans - 2 + 1,
                "the copy counts as received"
            );
        }
    }
}

#[tokio::test]
async fn a_large_export_is_stored_once_whole_over_grpc() {
    for (resources, n, pad) in sizes() {
        let h = start().await;
        let (body, spans) = export(resources, n, pad, false);
        let r = grpc_call(h.grpc, TRACES, &[], grpc_frame(false, &body)).await;
        assert_eq!(r.grpc_status, Some(0), "{r:?}");
        let resp = ExportTraceServiceResponse::decode(&r.message.unwrap()[..]).unwrap();
        assert_eq!(resp.partial_success.unwrap().rejected_spans, 2);
        assert_eq!(h.stored_span_total().await, spans - 2);
        assert_cut(&h);
    }
}

#[tokio::test]
async fn a_bad_span_late_in_a_large_export_refuses_all_of_it_naming_its_path() {
    for (resources, n, pad) in sizes() {
        let h = start().await;
        let (body, _) = export(resources, n, pad, true);
        let path = format!(
            "resourceSpans[{}].scopeSpans[1].spans[{}].spanId",
            resources - 1,
            n - 5
        );
        let r = h
            .post("/v1/traces", "application/x-protobuf", None, body.clone())
            .await;
        assert_eq!(r.status(), 400);
        let text = String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned();
        assert!(text.contains(&path), "{text}");
        let r = grpc_call(h.grpc, TRACES, &[], grpc_frame(false, &body)).await;
        assert_eq!(r.grpc_status, Some(3), "{r:?}");
        assert!(r.grpc_message.contains(&path), "{r:?}");
        assert_eq!(
            h.stored_span_total().await,
            0,
            "a bad request stores nothing"
        );
    }
}
