//! Fuzz target: arbitrary bytes as an OTLP protobuf export body (traces, logs and metrics)
//! through the collector's decode + validation layer into `stallwatch_storage::model`.
//!
//! Structured check: whatever prost decodes as an `Export*ServiceRequest` is re-encoded as
//! OTLP/JSON by an independent encoder (opentelemetry-proto's `with-serde`) and fed to the
//! JSON layer. Neither path may panic, and a request the protobuf path accepts must be
//! accepted by the JSON path with the same number of records. One known gap of the
//! reference encoder is skipped: serde_json writes a non-finite double (NaN, ±Infinity) as
//! `null`, which OTLP/JSON rightly refuses inside a repeated double (first finding of this
//! target; the OTLP/JSON form is the string `"NaN"`, which the JSON layer accepts).
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use stallwatch_collector::config::DEFAULT_MAX_NESTING_DEPTH;
use stallwatch_collector::decode::{decode_logs, decode_metrics, decode_traces, Format, Limits};

/// True when a JSON-side refusal is the reference encoder's non-finite-double gap.
fn encoder_gap(message: &str) -> bool {
    message.ends_with("got null")
}

const LIMITS: Limits = Limits {
    max_nesting_depth: DEFAULT_MAX_NESTING_DEPTH,
};

fuzz_target!(|data: &[u8]| {
    let pb = decode_traces(data, Format::Protobuf, &LIMITS);
    if let Ok(req) = ExportTraceServiceRequest::decode(data) {
        if let Ok(json) = serde_json::to_vec(&req) {
            let js = decode_traces(&json, Format::Json, &LIMITS);
            if let Ok(p) = &pb {
                match &js {
                    Ok(j) => assert_eq!(
                        (p.batch.span_count(), p.rejected),
                        (j.batch.span_count(), j.rejected),
                        "traces: protobuf and its JSON round trip disagree"
                    ),
                    Err(e) if encoder_gap(&e.0) => {}
                    Err(e) => panic!("traces: protobuf accepted, its JSON round trip refused: {e}"),
                }
            }
        }
    }

    let pb = decode_logs(data, Format::Protobuf, &LIMITS);
    if let Ok(req) = ExportLogsServiceRequest::decode(data) {
        if let Ok(json) = serde_json::to_vec(&req) {
            let js = decode_logs(&json, Format::Json, &LIMITS);
            if let Ok(p) = &pb {
                match &js {
                    Ok(j) => assert_eq!(
                        (p.batch.record_count(), p.rejected),
                        (j.batch.record_count(), j.rejected),
                        "logs: protobuf and its JSON round trip disagree"
                    ),
                    Err(e) if encoder_gap(&e.0) => {}
                    Err(e) => panic!("logs: protobuf accepted, its JSON round trip refused: {e}"),
                }
            }
        }
    }

    let pb = decode_metrics(data, Format::Protobuf, &LIMITS);
    if let Ok(req) = ExportMetricsServiceRequest::decode(data) {
        if let Ok(json) = serde_json::to_vec(&req) {
            let js = decode_metrics(&json, Format::Json, &LIMITS);
            if let Ok(p) = &pb {
                match &js {
                    Ok(j) => assert_eq!(
                        (p.batch.point_count(), p.rejected),
                        (j.batch.point_count(), j.rejected),
                        "metrics: protobuf and its JSON round trip disagree"
                    ),
                    Err(e) if encoder_gap(&e.0) => {}
                    Err(e) => {
                        panic!("metrics: protobuf accepted, its JSON round trip refused: {e}")
                    }
                }
            }
        }
    }
});
