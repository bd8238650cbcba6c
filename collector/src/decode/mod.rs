//! The one decode layer: OTLP request bodies (protobuf or JSON) → storage records.
//!
//! Protobuf goes through prost into opentelemetry-proto's wire types; JSON goes through
//! our own OTLP/JSON layer (`json.rs`) into the same wire types; then `convert.rs` validates
//! and converts both into `stallwatch_storage::model` batches. A [`DecodeError`] is a bad
//! request (HTTP 400 / gRPC `INVALID_ARGUMENT`) and names the field that was wrong;
//! records refused one by one (empty or all-zero ids) are counted in [`Decoded`] for
//! OTLP `partial_success`.

mod convert;
mod json;
mod path;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use stallwatch_storage::model::{LogBatch, MetricBatch, TraceBatch};

pub use path::Path;

/// The body encoding of an export request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Binary protobuf (`application/x-protobuf`, gRPC).
    Protobuf,
    /// OTLP/JSON (`application/json`).
    Json,
}

/// Limits applied while decoding.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Deepest attribute value nesting accepted (plain attribute value = 1).
    pub max_nesting_depth: usize,
}

/// A bad request: the message names the field (`resourceSpans[0]...traceId: ...`) and what
/// was wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

impl DecodeError {
    /// An error about the whole request.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
    /// An error about the field at `path`.
    pub fn at(path: &Path<'_>, message: impl AsRef<str>) -> Self {
        Self(format!("{path}: {}", message.as_ref()))
    }
}

/// A decoded, validated batch plus what was refused record by record.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded<T> {
    /// The accepted records.
    pub batch: T,
    /// Records refused (OTLP `rejected_spans` / `rejected_log_records` /
    /// `rejected_data_points`).
    pub rejected: u64,
    /// Of `rejected`, the spans refused because their end time is before their start
    /// time (counted apart in `/metrics`, reason `end_before_start`).
    pub rejected_end_before_start: u64,
    /// Why, for `partial_success.error_message`; empty when everything was accepted.
    /// May be non-empty with `rejected == 0` (a warning).
    pub message: String,
}

fn protobuf<M: Message + Default>(body: &[u8], what: &str) -> Result<M, DecodeError> {
    M::decode(body).map_err(|e| {
        let text = e.to_string();
        // prost prints the whole message stack; keep the error readable.
        let why = if text.ends_with("recursion limit reached") {
            "messages nested deeper than the protobuf recursion limit (attribute values nest at most max_nesting_depth levels)".to_string()
        } else if text.len() > 300 {
            let cut = text.char_indices().nth(300).map_or(text.len(), |(i, _)| i);
            format!("{}...", &text[..cut])
        } else {
            text
        };
        DecodeError::new(format!("cannot decode {what} protobuf: {why}"))
    })
}

/// Decodes a trace export (`ExportTraceServiceRequest`). An empty body is an empty batch.
///
/// Errors: [`DecodeError`] for malformed bodies, wrong-length or non-hex ids, out-of-range
/// or fractional integers, unknown enum names, over-deep attributes.
pub fn decode_traces(
    body: &[u8],
    format: Format,
    limits: &Limits,
) -> Result<Decoded<TraceBatch>, DecodeError> {
    let req: ExportTraceServiceRequest = match format {
        Format::Protobuf => protobuf(body, "ExportTraceServiceRequest")?,
        Format::Json => json::traces(body)?,
    };
    convert::traces(req, limits)
}

/// Decodes a log export (`ExportLogsServiceRequest`). Same errors as [`decode_traces`].
pub fn decode_logs(
    body: &[u8],
    format: Format,
    limits: &Limits,
) -> Result<Decoded<LogBatch>, DecodeError> {
    let req: ExportLogsServiceRequest = match format {
        Format::Protobuf => protobuf(body, "ExportLogsServiceRequest")?,
        Format::Json => json::logs(body)?,
    };
    convert::logs(req, limits)
}

/// Decodes a metrics export (`ExportMetricsServiceRequest`) into flattened points. Same
/// errors as [`decode_traces`].
pub fn decode_metrics(
    body: &[u8],
    format: Format,
    limits: &Limits,
) -> Result<Decoded<MetricBatch>, DecodeError> {
    let req: ExportMetricsServiceRequest = match format {
        Format::Protobuf => protobuf(body, "ExportMetricsServiceRequest")?,
        Format::Json => json::metrics(body)?,
    };
    convert::metrics(req, limits)
}

#[cfg(test)]
mod tests;
