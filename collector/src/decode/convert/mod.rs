//! Protobuf wire types (opentelemetry-proto) → storage records, with the validation both
//! encodings share: id lengths, empty or all-zero ids, attribute nesting depth.
//!
//! The JSON layer ([`super::json`]) produces the same wire types, so every rule here holds
//! for `application/json`, `application/x-protobuf` and gRPC alike. Values are moved, not
//! cloned: a 2 MiB attribute is copied once, by the wire decoder.
//!
//! Split by signal: the shared checks (ids, attributes, resource, scope) and logs here,
//! traces in `traces.rs`, metrics in `metrics.rs`.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::logs::v1 as pl;
use opentelemetry_proto::tonic::resource::v1 as pr;
use stallwatch_storage::model::{
    AnyValue, KeyValue, LogBatch, LogRecord, Resource, ResourceLogs, Scope, ScopeLogs, SpanId,
    TraceId,
};

use super::path::Path;
use super::{DecodeError, Decoded, Limits};

mod metrics;
mod span_wire;
mod traces;

pub(crate) use metrics::metrics;
#[cfg(test)]
pub(crate) use metrics::{
    histogram_buckets_invalid, histogram_count_invalid, summary_quantiles_invalid,
};
#[cfg(test)]
pub(crate) use traces::traces;
pub(crate) use traces::{traces_json, traces_wire, traces_wire_part, wire_cuts, WirePart};
pub use traces::{Collect, SpanSink};

/// Counts records refused one by one (partial success) and remembers why.
#[derive(Default)]
pub(crate) struct Refusals {
    count: u64,
    end_before_start: u64,
    first: Option<String>,
    warnings: Vec<String>,
}

impl Refusals {
    fn refuse(&mut self, why: String) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some(why);
        }
    }

    /// Adds what a later part of the same request refused (a trace export decoded in
    /// parts, [`traces_wire_part`]): the counts add up and the first reason stays the
    /// first in wire order, as one whole decode gives.
    pub(crate) fn merge(&mut self, later: Refusals) {
        self.count += later.count;
        self.end_before_start += later.end_before_start;
        if self.first.is_none() {
            self.first = later.first;
        }
        self.warnings.extend(later.warnings);
    }

    pub(crate) fn into_decoded<T>(self, batch: T, noun: &str) -> Decoded<T> {
        let mut message = String::new();
        if self.count > 0 {
            let plural = if self.count == 1 { "" } else { "s" };
            message = format!(
                "{} {noun}{plural} refused: {}",
                self.count,
                self.first.unwrap_or_default()
            );
        }
        for w in self.warnings {
            if !message.is_empty() {
                message.push_str("; ");
            }
            message.push_str(&w);
        }
        Decoded {
            batch,
            rejected: self.count,
            rejected_end_before_start: self.end_before_start,
            message,
        }
    }
}

/// Checks a trace id: 16 bytes → `Some`, empty or all zero → `None` (refuse the record),
/// any other length → a 400.
fn trace_id(bytes: &[u8], p: &Path) -> Result<Option<TraceId>, DecodeError> {
    match <[u8; 16]>::try_from(bytes) {
        Ok(b) => {
            let id = TraceId(b);
            Ok((!id.is_zero()).then_some(id))
        }
        Err(_) if bytes.is_empty() => Ok(None),
        Err(_) => Err(DecodeError::at(
            p,
            format!(
                "invalid trace id length: got {} bytes, want 16",
                bytes.len()
            ),
        )),
    }
}

/// Checks a span id: 8 bytes → `Some`, empty or all zero → `None`, else a 400.
fn span_id(bytes: &[u8], p: &Path) -> Result<Option<SpanId>, DecodeError> {
    match <[u8; 8]>::try_from(bytes) {
        Ok(b) => {
            let id = SpanId(b);
            Ok((!id.is_zero()).then_some(id))
        }
        Err(_) if bytes.is_empty() => Ok(None),
        Err(_) => Err(DecodeError::at(
            p,
            format!("invalid span id length: got {} bytes, want 8", bytes.len()),
        )),
    }
}

/// The nesting rule of attribute values, for both decoders: a value position deeper than
/// `limits.max_nesting_depth` (a top-level attribute value is depth 1) is refused, present
/// or not, before anything inside it is read.
fn check_depth(p: &Path, depth: usize, limits: &Limits) -> Result<(), DecodeError> {
    if depth > limits.max_nesting_depth {
        return Err(DecodeError::at(
            p,
            format!(
                "attribute value nested deeper than {} levels",
                limits.max_nesting_depth
            ),
        ));
    }
    Ok(())
}

fn any_value(
    v: Option<pc::AnyValue>,
    p: &Path,
    depth: usize,
    limits: &Limits,
) -> Result<AnyValue, DecodeError> {
    use pc::any_value::Value as V;
    check_depth(p, depth, limits)?;
    let Some(v) = v.and_then(|v| v.value) else {
        return Ok(AnyValue::Empty);
    };
    Ok(match v {
        V::StringValue(s) => AnyValue::String(s),
        V::BoolValue(b) => AnyValue::Bool(b),
        V::IntValue(i) => AnyValue::Int(i),
        V::DoubleValue(d) => AnyValue::Double(d),
        V::BytesValue(b) => AnyValue::Bytes(b),
        // Profiles-only string-table reference: treated as absent (proto comment).
        V::StringValueStrindex(_) => AnyValue::Empty,
        V::ArrayValue(a) => {
            let p = p.field("arrayValue");
            let p = p.field("values");
            let mut out = Vec::with_capacity(a.values.len());
            for (i, v) in a.values.into_iter().enumerate() {
                out.push(any_value(Some(v), &p.index(i), depth + 1, limits)?);
            }
            AnyValue::Array(out)
        }
        V::KvlistValue(kv) => {
            let p = p.field("kvlistValue");
            let p = p.field("values");
            AnyValue::KvList(key_values_at(kv.values, &p, depth + 1, limits)?)
        }
    })
}

fn key_values_at(
    kvs: Vec<pc::KeyValue>,
    p: &Path,
    depth: usize,
    limits: &Limits,
) -> Result<Vec<KeyValue>, DecodeError> {
    let mut out = Vec::with_capacity(kvs.len());
    for (i, kv) in kvs.into_iter().enumerate() {
        let pi = p.index(i);
        let value = any_value(kv.value, &pi.field("value"), depth, limits)?;
        out.push(KeyValue { key: kv.key, value });
    }
    Ok(out)
}

/// Attributes at their top level (values are depth 1).
fn attributes(
    kvs: Vec<pc::KeyValue>,
    p: &Path,
    limits: &Limits,
) -> Result<Vec<KeyValue>, DecodeError> {
    key_values_at(kvs, p, 1, limits)
}

fn resource(
    r: Option<pr::Resource>,
    schema_url: String,
    p: &Path,
    limits: &Limits,
) -> Result<Resource, DecodeError> {
    let r = r.unwrap_or_default();
    let p = p.field("resource");
    Ok(Resource {
        attributes: attributes(r.attributes, &p.field("attributes"), limits)?,
        dropped_attributes_count: r.dropped_attributes_count,
        schema_url,
    })
}

fn scope(
    s: Option<pc::InstrumentationScope>,
    schema_url: String,
    p: &Path,
    limits: &Limits,
) -> Result<Scope, DecodeError> {
    let s = s.unwrap_or_default();
    let p = p.field("scope");
    Ok(Scope {
        name: s.name,
        version: s.version,
        attributes: attributes(s.attributes, &p.field("attributes"), limits)?,
        dropped_attributes_count: s.dropped_attributes_count,
        schema_url,
    })
}

/// The latest time stallwatch stores, ns since the Unix epoch: i64::MAX
/// (2262-04-11T23:47:16.854775807Z), what SQLite's INTEGER holds. Log records and metric
/// points are rows keyed by their time; one timed later is refused (partial success) rather
/// than stored where no time range can reach it.
pub(crate) const LATEST_STORED_TIME: u64 = i64::MAX as u64;

/// Why a record timed `t` is refused: [`LATEST_STORED_TIME`].
pub(crate) fn too_late(what: &str, at: &Path, t: u64) -> String {
    format!(
        "{what} at {at}: time {t} ns is after 2262-04-11T23:47:16Z, the latest time stallwatch stores"
    )
}

/// Converts and validates a log export. Trace/span ids are optional on logs: empty or all
/// zero means "not linked"; a wrong length refuses the request. A record timed after
/// [`LATEST_STORED_TIME`] is refused alone (partial success).
pub(crate) fn logs(
    req: ExportLogsServiceRequest,
    limits: &Limits,
) -> Result<Decoded<LogBatch>, DecodeError> {
    let mut refusals = Refusals::default();
    let root = Path::ROOT;
    let prl = root.field("resourceLogs");
    let mut out = Vec::with_capacity(req.resource_logs.len());
    for (ri, rl) in req.resource_logs.into_iter().enumerate() {
        let pr = prl.index(ri);
        let resource = resource(rl.resource, rl.schema_url, &pr, limits)?;
        let psl = pr.field("scopeLogs");
        let mut scopes = Vec::with_capacity(rl.scope_logs.len());
        for (si, sl) in rl.scope_logs.into_iter().enumerate() {
            let ps = psl.index(si);
            let scope = scope(sl.scope, sl.schema_url, &ps, limits)?;
            let plr = ps.field("logRecords");
            let mut records = Vec::with_capacity(sl.log_records.len());
            for (i, r) in sl.log_records.into_iter().enumerate() {
                let at = plr.index(i);
                let time = if r.time_unix_nano != 0 {
                    r.time_unix_nano
                } else {
                    r.observed_time_unix_nano
                };
                if time > LATEST_STORED_TIME {
                    refusals.refuse(too_late("log record", &at, time));
                    continue;
                }
                records.push(log_record(r, &at, limits)?);
            }
            scopes.push(ScopeLogs {
                scope,
                log_records: records,
            });
        }
        out.push(ResourceLogs {
            resource,
            scope_logs: scopes,
        });
    }
    Ok(refusals.into_decoded(LogBatch { resource_logs: out }, "log record"))
}

fn log_record(r: pl::LogRecord, p: &Path, limits: &Limits) -> Result<LogRecord, DecodeError> {
    let trace_id = trace_id(&r.trace_id, &p.field("traceId"))?;
    let span_id = span_id(&r.span_id, &p.field("spanId"))?;
    Ok(LogRecord {
        time_unix_nano: r.time_unix_nano,
        observed_time_unix_nano: r.observed_time_unix_nano,
        severity_number: r.severity_number,
        severity_text: r.severity_text,
        body: any_value(r.body, &p.field("body"), 1, limits)?,
        attributes: attributes(r.attributes, &p.field("attributes"), limits)?,
        dropped_attributes_count: r.dropped_attributes_count,
        flags: r.flags,
        trace_id,
        span_id,
        event_name: r.event_name,
    })
}
