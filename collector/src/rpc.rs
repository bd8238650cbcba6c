//! Response bodies: OTLP export responses (with `partial_success`) and `google.rpc.Status`
//! errors, in protobuf or hand-written OTLP/JSON (64-bit counts are strings there, which
//! `with-serde` gets wrong). Also the `google.rpc.RetryInfo` detail for retryable answers.
//!
//! The message types (`google.rpc.Status`, `google.rpc.RetryInfo`, `google.protobuf.Any` and
//! `Duration`, from googleapis `google/rpc/status.proto` and `error_details.proto`) are
//! public: the forwarder (`stallwatch-forward`) reads them from an upstream's answers, as the
//! OTLP spec's "Throttling" section asks of a client.

use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use prost::Message;
use serde_json::{json, Map, Value};

use crate::decode::Format;
use crate::ingest::Signal;

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProtoAny {
    /// Type URL.
    #[prost(string, tag = "1")]
    pub type_url: String,
    /// Encoded message.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProtoDuration {
    /// Whole seconds.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// Nanoseconds.
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RetryInfo {
    /// How long the client should wait.
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    /// gRPC code.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// Human message.
    #[prost(string, tag = "2")]
    pub message: String,
    /// Details (RetryInfo).
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<ProtoAny>,
}

/// Type URL of `google.rpc.RetryInfo`.
pub const RETRY_INFO_TYPE: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// A `google.rpc.Status`, with a RetryInfo detail when `retry_after_s` is set.
pub fn status(code: i32, message: &str, retry_after_s: Option<u64>) -> RpcStatus {
    let details = retry_after_s
        .map(|s| ProtoAny {
            type_url: RETRY_INFO_TYPE.into(),
            value: RetryInfo {
                retry_delay: Some(ProtoDuration {
                    seconds: i64::try_from(s).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
            }
            .encode_to_vec(),
        })
        .into_iter()
        .collect();
    RpcStatus {
        code,
        message: message.to_string(),
        details,
    }
}

/// Encodes a status for an HTTP error body.
pub(crate) fn encode_status(
    format: Format,
    code: i32,
    message: &str,
    retry_after_s: Option<u64>,
) -> Vec<u8> {
    match format {
        Format::Protobuf => status(code, message, retry_after_s).encode_to_vec(),
        Format::Json => {
            let mut m = Map::new();
            m.insert("code".into(), code.into());
            m.insert("message".into(), message.into());
            if let Some(s) = retry_after_s {
                m.insert(
                    "details".into(),
                    json!([{ "@type": RETRY_INFO_TYPE, "retryDelay": format!("{s}s") }]),
                );
            }
            Value::Object(m).to_string().into_bytes()
        }
    }
}

/// Encodes an export response: empty on full success, `partial_success` when records were
/// refused (or a warning is attached).
pub(crate) fn encode_export_response(
    format: Format,
    signal: Signal,
    rejected: u64,
    message: &str,
) -> Vec<u8> {
    let partial = rejected > 0 || !message.is_empty();
    let rejected_i64 = i64::try_from(rejected).unwrap_or(i64::MAX);
    match format {
        Format::Protobuf => match signal {
            Signal::Traces => ExportTraceServiceResponse {
                partial_success: partial.then(|| ExportTracePartialSuccess {
                    rejected_spans: rejected_i64,
                    error_message: message.to_string(),
                }),
            }
            .encode_to_vec(),
            Signal::Logs => ExportLogsServiceResponse {
                partial_success: partial.then(|| ExportLogsPartialSuccess {
                    rejected_log_records: rejected_i64,
                    error_message: message.to_string(),
                }),
            }
            .encode_to_vec(),
            Signal::Metrics => ExportMetricsServiceResponse {
                partial_success: partial.then(|| ExportMetricsPartialSuccess {
                    rejected_data_points: rejected_i64,
                    error_message: message.to_string(),
                }),
            }
            .encode_to_vec(),
        },
        Format::Json => {
            if !partial {
                return b"{}".to_vec();
            }
            let key = match signal {
                Signal::Traces => "rejectedSpans",
                Signal::Logs => "rejectedLogRecords",
                Signal::Metrics => "rejectedDataPoints",
            };
            let mut ps = Map::new();
            if rejected > 0 {
                // int64 in OTLP/JSON is a decimal string.
                ps.insert(key.into(), rejected.to_string().into());
            }
            if !message.is_empty() {
                ps.insert("errorMessage".into(), message.into());
            }
            json!({ "partialSuccess": Value::Object(ps) })
                .to_string()
                .into_bytes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_partial_success_has_string_count() {
        let body = encode_export_response(Format::Json, Signal::Traces, 2, "2 spans refused");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["partialSuccess"]["rejectedSpans"], "2");
        assert_eq!(v["partialSuccess"]["errorMessage"], "2 spans refused");
        let body = encode_export_response(Format::Json, Signal::Logs, 0, "");
        assert_eq!(body, b"{}");
    }

    #[test]
    fn protobuf_full_success_is_empty() {
        assert!(encode_export_response(Format::Protobuf, Signal::Metrics, 0, "").is_empty());
        let body = encode_export_response(Format::Protobuf, Signal::Traces, 3, "why");
        let r = ExportTraceServiceResponse::decode(&body[..]).unwrap();
        let ps = r.partial_success.unwrap();
        assert_eq!((ps.rejected_spans, ps.error_message.as_str()), (3, "why"));
    }

    #[test]
    fn retry_info_round_trips() {
        let st =
            RpcStatus::decode(&encode_status(Format::Protobuf, 14, "busy", Some(2))[..]).unwrap();
        assert_eq!(st.code, 14);
        assert_eq!(st.details[0].type_url, RETRY_INFO_TYPE);
        let ri = RetryInfo::decode(&st.details[0].value[..]).unwrap();
        assert_eq!(ri.retry_delay.unwrap().seconds, 2);
        let v: Value =
            serde_json::from_slice(&encode_status(Format::Json, 3, "bad", None)).unwrap();
        assert_eq!(v, json!({"code": 3, "message": "bad"}));
    }
}
