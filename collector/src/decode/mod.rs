//! The one decode layer: OTLP request bodies (protobuf or JSON) → storage records.
//!
//! Protobuf goes through prost into opentelemetry-proto's wire types; JSON goes through
//! our own OTLP/JSON layer (`json/`) into the same wire types; then `convert/` validates
//! and converts both into `stallwatch_storage::model` batches. Trace exports stream: one
//! span's wire types at a time, handed to a [`SpanSink`] ([`decode_traces_into`]). A [`DecodeError`] is a bad
//! request (HTTP 400 / gRPC `INVALID_ARGUMENT`) and names the field that was wrong;
//! records refused one by one (empty or all-zero ids) are counted in [`Decoded`] for
//! OTLP `partial_success`.

mod convert;
mod json;
mod path;
mod wire;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use prost::Message;
use stallwatch_storage::model::{LogBatch, MetricBatch, TraceBatch};

pub(crate) use convert::{wire_cuts, Refusals, WirePart};
pub use convert::{Collect, SpanSink};
pub(crate) use json::{lone_surrogates_warning, replace_lone_surrogates};
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
    /// An error about the field at `path`. A path longer than [`MAX_PATH_CHARS`] (deeply
    /// nested attribute values) keeps its head and tail, cut at field boundaries.
    pub fn at(path: &Path<'_>, message: impl AsRef<str>) -> Self {
        Self(format!(
            "{}: {}",
            short_path(&path.to_string()),
            message.as_ref()
        ))
    }
}

/// Longest field path an error message renders in full, chars.
pub const MAX_PATH_CHARS: usize = 160;

fn short_path(p: &str) -> String {
    // Paths are ASCII (field names and indexes), so byte offsets are char boundaries.
    if p.len() <= MAX_PATH_CHARS || !p.is_ascii() {
        return p.to_string();
    }
    let head = p[..MAX_PATH_CHARS / 2]
        .rfind('.')
        .unwrap_or(MAX_PATH_CHARS / 2);
    let tail = p[p.len() - MAX_PATH_CHARS / 2..]
        .find('.')
        .map_or(p.len() - MAX_PATH_CHARS / 2, |i| {
            p.len() - MAX_PATH_CHARS / 2 + i
        });
    format!("{}...{}", &p[..head], &p[tail..])
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

/// The 400 for a body prost (or the wire scan) cannot read: `cannot decode <what>
/// protobuf: [<path>: ]<why>`, with prost's message stack cut to a readable length.
fn wire_error(what: &str, at: Option<&Path<'_>>, text: &str) -> DecodeError {
    let why = if text.ends_with("recursion limit reached") {
        "messages nested deeper than the protobuf recursion limit (attribute values nest at most max_nesting_depth levels)".to_string()
    } else if text.len() > 300 {
        let cut = text.char_indices().nth(300).map_or(text.len(), |(i, _)| i);
        format!("{}...", &text[..cut])
    } else {
        text.to_string()
    };
    match at {
        Some(p) if !p.is_root() => DecodeError::new(format!(
            "cannot decode {what} protobuf: {}: {why}",
            short_path(&p.to_string())
        )),
        _ => DecodeError::new(format!("cannot decode {what} protobuf: {why}")),
    }
}

fn protobuf<M: Message + Default>(body: &[u8], what: &str) -> Result<M, DecodeError> {
    M::decode(body).map_err(|e| wire_error(what, None, &e.to_string()))
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
    let mut all = Collect::default();
    let d = decode_traces_into(body, format, limits, &mut all)?;
    Ok(Decoded {
        batch: all.0,
        rejected: d.rejected,
        rejected_end_before_start: d.rejected_end_before_start,
        message: d.message,
    })
}

/// Decodes a trace export span by span into `sink` (a resource, its scopes, each followed
/// by its accepted spans, in request order), never holding the whole request's wire types
/// or JSON tree: the protobuf body is scanned in place, the JSON body walked one span at a
/// time (issue 17 #14). On an error the sink may have seen part of the request: it must be
/// discarded. Same errors as [`decode_traces`].
pub fn decode_traces_into<'a>(
    body: &'a [u8],
    format: Format,
    limits: &Limits,
    sink: &mut dyn SpanSink<'a>,
) -> Result<Decoded<()>, DecodeError> {
    match format {
        Format::Protobuf => convert::traces_wire(body, limits, sink),
        Format::Json => convert::traces_json(body, limits, sink),
    }
}

/// [`decode_traces_into`] for the spans of one part of a protobuf trace export
/// ([`wire_cuts`] cuts it), so the parts of one large export can be decoded side by side,
/// each into its own sink. The parts' [`Refusals`], merged in wire order
/// ([`Refusals::merge`]), and their sinks in the same order give what one whole decode
/// gives; on an error in several parts, the first part's is the whole decode's.
pub(crate) fn decode_traces_part_into<'a>(
    body: &'a [u8],
    limits: &Limits,
    sink: &mut dyn SpanSink<'a>,
    part: WirePart,
) -> Result<Refusals, DecodeError> {
    convert::traces_wire_part(body, limits, sink, part)
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
