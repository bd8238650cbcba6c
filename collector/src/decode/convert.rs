//! Protobuf wire types (opentelemetry-proto) → storage records, with the validation both
//! encodings share: id lengths, empty or all-zero ids, attribute nesting depth.
//!
//! The JSON layer ([`super::json`]) produces the same wire types, so every rule here holds
//! for `application/json`, `application/x-protobuf` and gRPC alike. Values are moved, not
//! cloned: a 2 MiB attribute is copied once, by the wire decoder.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::logs::v1 as pl;
use opentelemetry_proto::tonic::metrics::v1 as pm;
use opentelemetry_proto::tonic::resource::v1 as pr;
use opentelemetry_proto::tonic::trace::v1 as pt;
use serde_json::{json, Map, Value};
use stallwatch_storage::model::{
    AnyValue, Event, KeyValue, Link, LogBatch, LogRecord, MetricBatch, MetricKind, MetricPoint,
    Resource, ResourceLogs, ResourceMetrics, ResourceSpans, Scope, ScopeLogs, ScopeMetrics,
    ScopeSpans, Span, SpanId, Status, TraceBatch, TraceId,
};

use super::path::Path;
use super::{DecodeError, Decoded, Limits};

/// Counts records refused one by one (partial success) and remembers why.
#[derive(Default)]
struct Refusals {
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

    fn into_decoded<T>(self, batch: T, noun: &str) -> Decoded<T> {
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

fn any_value(
    v: Option<pc::AnyValue>,
    p: &Path,
    depth: usize,
    limits: &Limits,
) -> Result<AnyValue, DecodeError> {
    use pc::any_value::Value as V;
    if depth > limits.max_nesting_depth {
        return Err(DecodeError::at(
            p,
            format!(
                "attribute value nested deeper than {} levels",
                limits.max_nesting_depth
            ),
        ));
    }
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

/// Converts and validates a trace export. Spans with an empty or all-zero trace or span id
/// are refused one by one (partial success); wrong-length ids and over-deep attributes
/// refuse the whole request.
pub(crate) fn traces(
    req: ExportTraceServiceRequest,
    limits: &Limits,
) -> Result<Decoded<TraceBatch>, DecodeError> {
    let mut refusals = Refusals::default();
    let root = Path::ROOT;
    let prs = root.field("resourceSpans");
    let mut out = Vec::with_capacity(req.resource_spans.len());
    for (ri, rs) in req.resource_spans.into_iter().enumerate() {
        let pr = prs.index(ri);
        let resource = resource(rs.resource, rs.schema_url, &pr, limits)?;
        let pss = pr.field("scopeSpans");
        let mut scopes = Vec::with_capacity(rs.scope_spans.len());
        for (si, ss) in rs.scope_spans.into_iter().enumerate() {
            let ps = pss.index(si);
            let scope = scope(ss.scope, ss.schema_url, &ps, limits)?;
            let pspans = ps.field("spans");
            let mut spans = Vec::with_capacity(ss.spans.len());
            for (i, sp) in ss.spans.into_iter().enumerate() {
                let p = pspans.index(i);
                if let Some(span) = span(sp, &p, limits, &mut refusals)? {
                    spans.push(span);
                }
            }
            scopes.push(ScopeSpans { scope, spans });
        }
        out.push(ResourceSpans {
            resource,
            scope_spans: scopes,
        });
    }
    Ok(refusals.into_decoded(
        TraceBatch {
            resource_spans: out,
        },
        "span",
    ))
}

/// Decodes and converts a protobuf trace export one span at a time, with the rules of
/// [`traces`]: the request is scanned in place ([`super::wire`]) and each span is decoded
/// by prost from its own bytes and converted at once, so decoding holds the records plus
/// one span's wire types, never the whole request's (issue 17 #14). Errors name the
/// span's path.
pub(crate) fn traces_wire(
    body: &[u8],
    limits: &Limits,
) -> Result<Decoded<TraceBatch>, DecodeError> {
    use super::wire::{self, Fields};
    use prost::Message;
    const WHAT: &str = "ExportTraceServiceRequest";
    let bad = |p: &Path, why: &str| super::wire_error(WHAT, Some(p), why);
    let mut refusals = Refusals::default();
    let root = Path::ROOT;
    let prs = root.field("resourceSpans");
    let mut out = Vec::new();
    for f in Fields::new(body) {
        let (field, v) = f.map_err(|e| bad(&root, e))?;
        if field != 1 {
            continue;
        }
        let pr = prs.index(out.len());
        let rs = wire::len(v).map_err(|e| bad(&pr, e))?;
        // First pass: the resource and schema URL (they may follow the scopes on the wire).
        let mut res: Option<pr::Resource> = None;
        let mut schema_url = String::new();
        let mut n_scopes = 0;
        for f in Fields::new(rs) {
            let (field, v) = f.map_err(|e| bad(&pr, e))?;
            match field {
                1 => {
                    let b = wire::len(v).map_err(|e| bad(&pr.field("resource"), e))?;
                    res.get_or_insert_with(Default::default)
                        .merge(b)
                        .map_err(|e| bad(&pr.field("resource"), &e.to_string()))?;
                }
                2 => n_scopes += 1,
                3 => schema_url = wire::string(v).map_err(|e| bad(&pr.field("schemaUrl"), e))?,
                _ => {}
            }
        }
        let resource = resource(res, schema_url, &pr, limits)?;
        let pss = pr.field("scopeSpans");
        let mut scopes = Vec::with_capacity(n_scopes);
        for f in Fields::new(rs) {
            let (field, v) = f.map_err(|e| bad(&pr, e))?;
            if field != 2 {
                continue;
            }
            let ps = pss.index(scopes.len());
            let ss = wire::len(v).map_err(|e| bad(&ps, e))?;
            let mut sc: Option<pc::InstrumentationScope> = None;
            let mut schema_url = String::new();
            let mut n_spans = 0;
            for f in Fields::new(ss) {
                let (field, v) = f.map_err(|e| bad(&ps, e))?;
                match field {
                    1 => {
                        let b = wire::len(v).map_err(|e| bad(&ps.field("scope"), e))?;
                        sc.get_or_insert_with(Default::default)
                            .merge(b)
                            .map_err(|e| bad(&ps.field("scope"), &e.to_string()))?;
                    }
                    2 => n_spans += 1,
                    3 => {
                        schema_url = wire::string(v).map_err(|e| bad(&ps.field("schemaUrl"), e))?
                    }
                    _ => {}
                }
            }
            let scope = scope(sc, schema_url, &ps, limits)?;
            let pspans = ps.field("spans");
            let mut spans = Vec::with_capacity(n_spans);
            let mut i = 0;
            for f in Fields::new(ss) {
                let (field, v) = f.map_err(|e| bad(&ps, e))?;
                if field != 2 {
                    continue;
                }
                let p = pspans.index(i);
                i += 1;
                let b = wire::len(v).map_err(|e| bad(&p, e))?;
                let sp = pt::Span::decode(b).map_err(|e| bad(&p, &e.to_string()))?;
                if let Some(span) = span(sp, &p, limits, &mut refusals)? {
                    spans.push(span);
                }
            }
            scopes.push(ScopeSpans { scope, spans });
        }
        out.push(ResourceSpans {
            resource,
            scope_spans: scopes,
        });
    }
    Ok(refusals.into_decoded(
        TraceBatch {
            resource_spans: out,
        },
        "span",
    ))
}

fn span(
    sp: pt::Span,
    p: &Path,
    limits: &Limits,
    refusals: &mut Refusals,
) -> Result<Option<Span>, DecodeError> {
    let tid = trace_id(&sp.trace_id, &p.field("traceId"))?;
    let sid = span_id(&sp.span_id, &p.field("spanId"))?;
    // Empty or all-zero parent: a root span.
    let parent = span_id(&sp.parent_span_id, &p.field("parentSpanId"))?;
    let attrs = attributes(sp.attributes, &p.field("attributes"), limits)?;
    let pe = p.field("events");
    let mut events = Vec::with_capacity(sp.events.len());
    for (i, e) in sp.events.into_iter().enumerate() {
        let pi = pe.index(i);
        events.push(Event {
            time_unix_nano: e.time_unix_nano,
            name: e.name,
            attributes: attributes(e.attributes, &pi.field("attributes"), limits)?,
            dropped_attributes_count: e.dropped_attributes_count,
        });
    }
    let pl = p.field("links");
    let mut links = Vec::with_capacity(sp.links.len());
    for (i, l) in sp.links.into_iter().enumerate() {
        let pi = pl.index(i);
        // A link to an invalid (empty/zero) context is legal (OTel spec: such links are
        // kept when they carry attributes or trace state); wrong lengths are not.
        let ltid = trace_id(&l.trace_id, &pi.field("traceId"))?.unwrap_or_default();
        let lsid = span_id(&l.span_id, &pi.field("spanId"))?.unwrap_or_default();
        links.push(Link {
            trace_id: ltid,
            span_id: lsid,
            trace_state: l.trace_state,
            attributes: attributes(l.attributes, &pi.field("attributes"), limits)?,
            dropped_attributes_count: l.dropped_attributes_count,
            flags: l.flags,
        });
    }
    let (Some(trace_id), Some(span_id)) = (tid, sid) else {
        let which = if tid.is_none() { "traceId" } else { "spanId" };
        refusals.refuse(format!("{which} empty or all zero (first at {p}.{which})"));
        return Ok(None);
    };
    // An end before the start is no duration at all: refused one by one like a bad id
    // (docs/design.md, "Back-pressure and limits"). `end == 0` is an open-span snapshot.
    if sp.end_time_unix_nano != 0 && sp.end_time_unix_nano < sp.start_time_unix_nano {
        refusals.end_before_start += 1;
        refusals.refuse(format!(
            "span {:?} (spanId {}) ends before it starts: endTimeUnixNano {} < startTimeUnixNano {} (first at {p})",
            sp.name,
            hex::encode(span_id.0),
            sp.end_time_unix_nano,
            sp.start_time_unix_nano
        ));
        return Ok(None);
    }
    let status = sp.status.unwrap_or_default();
    Ok(Some(Span {
        trace_id,
        span_id,
        parent_span_id: parent,
        trace_state: sp.trace_state,
        flags: sp.flags,
        name: sp.name,
        kind: sp.kind,
        start_time_unix_nano: sp.start_time_unix_nano,
        end_time_unix_nano: sp.end_time_unix_nano,
        attributes: attrs,
        dropped_attributes_count: sp.dropped_attributes_count,
        events,
        dropped_events_count: sp.dropped_events_count,
        links,
        dropped_links_count: sp.dropped_links_count,
        status: Status {
            code: status.code,
            message: status.message,
        },
    }))
}

/// Converts and validates a log export. Trace/span ids are optional on logs: empty or all
/// zero means "not linked"; a wrong length refuses the request.
pub(crate) fn logs(
    req: ExportLogsServiceRequest,
    limits: &Limits,
) -> Result<Decoded<LogBatch>, DecodeError> {
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
                records.push(log_record(r, &plr.index(i), limits)?);
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
    Ok(Refusals::default().into_decoded(LogBatch { resource_logs: out }, "log record"))
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

/// A double as JSON: finite numbers as numbers, NaN and the infinities as the proto3-JSON
/// strings (serde_json would write `null`).
fn jf(d: f64) -> Value {
    if d.is_nan() {
        Value::from("NaN")
    } else if d == f64::INFINITY {
        Value::from("Infinity")
    } else if d == f64::NEG_INFINITY {
        Value::from("-Infinity")
    } else {
        Value::from(d)
    }
}

/// The detail fields both histogram kinds share: `min`, `max` (when present) and `flags`.
fn histogram_tail(d: &mut Map<String, Value>, min: Option<f64>, max: Option<f64>, flags: u32) {
    if let Some(v) = min {
        d.insert("min".into(), jf(v));
    }
    if let Some(v) = max {
        d.insert("max".into(), jf(v));
    }
    d.insert("flags".into(), flags.into());
}

fn any_to_json(v: &AnyValue) -> Value {
    match v {
        AnyValue::Empty => json!({}),
        AnyValue::String(s) => json!({ "stringValue": s }),
        AnyValue::Bool(b) => json!({ "boolValue": b }),
        AnyValue::Int(i) => json!({ "intValue": i.to_string() }),
        AnyValue::Double(d) => json!({ "doubleValue": jf(*d) }),
        AnyValue::Bytes(b) => json!({ "bytesValue": hex::encode(b) }),
        AnyValue::Array(a) => {
            json!({ "arrayValue": { "values": a.iter().map(any_to_json).collect::<Vec<_>>() } })
        }
        AnyValue::KvList(kv) => json!({ "kvlistValue": { "values": kvs_to_json(kv) } }),
    }
}

fn kvs_to_json(kvs: &[KeyValue]) -> Value {
    Value::Array(
        kvs.iter()
            .map(|kv| json!({ "key": kv.key, "value": any_to_json(&kv.value) }))
            .collect(),
    )
}

/// Exemplars as JSON for a point's `detail`; ids in lowercase hex (validated lengths).
fn exemplars(
    ex: Vec<pm::Exemplar>,
    p: &Path,
    limits: &Limits,
) -> Result<Option<Value>, DecodeError> {
    if ex.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(ex.len());
    for (i, e) in ex.into_iter().enumerate() {
        let pi = p.index(i);
        let tid = trace_id(&e.trace_id, &pi.field("traceId"))?;
        let sid = span_id(&e.span_id, &pi.field("spanId"))?;
        let attrs = attributes(
            e.filtered_attributes,
            &pi.field("filteredAttributes"),
            limits,
        )?;
        let mut m = Map::new();
        m.insert("time_unix_nano".into(), e.time_unix_nano.to_string().into());
        match e.value {
            Some(pm::exemplar::Value::AsDouble(d)) => {
                m.insert("as_double".into(), jf(d));
            }
            Some(pm::exemplar::Value::AsInt(v)) => {
                m.insert("as_int".into(), v.to_string().into());
            }
            None => {}
        }
        if let Some(t) = tid {
            m.insert("trace_id".into(), t.to_hex().into());
        }
        if let Some(s) = sid {
            m.insert("span_id".into(), s.to_hex().into());
        }
        if !attrs.is_empty() {
            m.insert("filtered_attributes".into(), kvs_to_json(&attrs));
        }
        out.push(Value::Object(m));
    }
    Ok(Some(Value::Array(out)))
}

/// Identity of the metric a point belongs to.
struct MetricHead<'a> {
    name: &'a str,
    description: &'a str,
    unit: &'a str,
    kind: MetricKind,
    metadata: &'a Option<Value>,
}

#[allow(clippy::too_many_arguments)]
fn point(
    head: &MetricHead<'_>,
    start: u64,
    time: u64,
    value: Option<f64>,
    count: Option<u64>,
    sum: Option<f64>,
    attributes: Vec<KeyValue>,
    mut detail: Map<String, Value>,
) -> MetricPoint {
    if let Some(md) = head.metadata {
        detail.insert("metadata".into(), md.clone());
    }
    MetricPoint {
        name: head.name.to_string(),
        description: head.description.to_string(),
        unit: head.unit.to_string(),
        kind: head.kind,
        start_time_unix_nano: start,
        time_unix_nano: time,
        value,
        count,
        sum,
        attributes,
        detail: Value::Object(detail).to_string(),
    }
}

fn temporality(t: i32) -> Value {
    match pm::AggregationTemporality::try_from(t) {
        Ok(k) => Value::from(k.as_str_name()),
        Err(_) => Value::from(t),
    }
}

/// Converts a metrics export into flattened points: gauge/sum keep `value` (int values are
/// also kept exactly in `detail.as_int`), histograms and summaries keep `count`/`sum`, and
/// everything else (buckets, quantiles, exemplars, temporality, flags) goes to `detail`.
/// A metric with no data is kept out and reported as a warning in partial success.
pub(crate) fn metrics(
    req: ExportMetricsServiceRequest,
    limits: &Limits,
) -> Result<Decoded<MetricBatch>, DecodeError> {
    let mut refusals = Refusals::default();
    let root = Path::ROOT;
    let prm = root.field("resourceMetrics");
    let mut out = Vec::with_capacity(req.resource_metrics.len());
    for (ri, rm) in req.resource_metrics.into_iter().enumerate() {
        let pr = prm.index(ri);
        let resource = resource(rm.resource, rm.schema_url, &pr, limits)?;
        let psm = pr.field("scopeMetrics");
        let mut scopes = Vec::with_capacity(rm.scope_metrics.len());
        for (si, sm) in rm.scope_metrics.into_iter().enumerate() {
            let ps = psm.index(si);
            let scope = scope(sm.scope, sm.schema_url, &ps, limits)?;
            let pms = ps.field("metrics");
            let mut points = Vec::new();
            for (mi, m) in sm.metrics.into_iter().enumerate() {
                metric(m, &pms.index(mi), limits, &mut points, &mut refusals)?;
            }
            scopes.push(ScopeMetrics { scope, points });
        }
        out.push(ResourceMetrics {
            resource,
            scope_metrics: scopes,
        });
    }
    Ok(refusals.into_decoded(
        MetricBatch {
            resource_metrics: out,
        },
        "data point",
    ))
}

fn metric(
    m: pm::Metric,
    p: &Path,
    limits: &Limits,
    points: &mut Vec<MetricPoint>,
    refusals: &mut Refusals,
) -> Result<(), DecodeError> {
    use pm::metric::Data;
    let metadata = if m.metadata.is_empty() {
        None
    } else {
        Some(kvs_to_json(&attributes(
            m.metadata,
            &p.field("metadata"),
            limits,
        )?))
    };
    let Some(data) = m.data else {
        refusals.warnings.push(format!(
            "metric {:?} at {p} has no data (gauge, sum, histogram, exponentialHistogram or summary); nothing stored for it",
            m.name
        ));
        return Ok(());
    };
    let kind = match &data {
        Data::Gauge(_) => MetricKind::Gauge,
        Data::Sum(_) => MetricKind::Sum,
        Data::Histogram(_) => MetricKind::Histogram,
        Data::ExponentialHistogram(_) => MetricKind::ExponentialHistogram,
        Data::Summary(_) => MetricKind::Summary,
    };
    let head = MetricHead {
        name: &m.name,
        description: &m.description,
        unit: &m.unit,
        kind,
        metadata: &metadata,
    };
    match data {
        Data::Gauge(g) => {
            let pd = p.field("gauge");
            number_points(&head, g.data_points, &pd, limits, Map::new(), points)?;
        }
        Data::Sum(s) => {
            let pd = p.field("sum");
            let mut base = Map::new();
            base.insert(
                "aggregation_temporality".into(),
                temporality(s.aggregation_temporality),
            );
            base.insert("is_monotonic".into(), s.is_monotonic.into());
            number_points(&head, s.data_points, &pd, limits, base, points)?;
        }
        Data::Histogram(h) => {
            let pd = p.field("histogram");
            let pdp = pd.field("dataPoints");
            for (i, dp) in h.data_points.into_iter().enumerate() {
                let pi = pdp.index(i);
                let attrs = attributes(dp.attributes, &pi.field("attributes"), limits)?;
                let mut d = Map::new();
                d.insert(
                    "aggregation_temporality".into(),
                    temporality(h.aggregation_temporality),
                );
                d.insert(
                    "bucket_counts".into(),
                    Value::Array(dp.bucket_counts.iter().map(|c| Value::from(*c)).collect()),
                );
                d.insert(
                    "explicit_bounds".into(),
                    Value::Array(dp.explicit_bounds.iter().map(|b| jf(*b)).collect()),
                );
                histogram_tail(&mut d, dp.min, dp.max, dp.flags);
                if let Some(ex) = exemplars(dp.exemplars, &pi.field("exemplars"), limits)? {
                    d.insert("exemplars".into(), ex);
                }
                points.push(point(
                    &head,
                    dp.start_time_unix_nano,
                    dp.time_unix_nano,
                    None,
                    Some(dp.count),
                    dp.sum,
                    attrs,
                    d,
                ));
            }
        }
        Data::ExponentialHistogram(h) => {
            let pd = p.field("exponentialHistogram");
            let pdp = pd.field("dataPoints");
            for (i, dp) in h.data_points.into_iter().enumerate() {
                let pi = pdp.index(i);
                let attrs = attributes(dp.attributes, &pi.field("attributes"), limits)?;
                let mut d = Map::new();
                d.insert(
                    "aggregation_temporality".into(),
                    temporality(h.aggregation_temporality),
                );
                d.insert("scale".into(), dp.scale.into());
                d.insert("zero_count".into(), dp.zero_count.into());
                d.insert("zero_threshold".into(), jf(dp.zero_threshold));
                for (name, b) in [("positive", dp.positive), ("negative", dp.negative)] {
                    if let Some(b) = b {
                        d.insert(
                            name.into(),
                            json!({ "offset": b.offset, "bucket_counts": b.bucket_counts }),
                        );
                    }
                }
                histogram_tail(&mut d, dp.min, dp.max, dp.flags);
                if let Some(ex) = exemplars(dp.exemplars, &pi.field("exemplars"), limits)? {
                    d.insert("exemplars".into(), ex);
                }
                points.push(point(
                    &head,
                    dp.start_time_unix_nano,
                    dp.time_unix_nano,
                    None,
                    Some(dp.count),
                    dp.sum,
                    attrs,
                    d,
                ));
            }
        }
        Data::Summary(s) => {
            let pd = p.field("summary");
            let pdp = pd.field("dataPoints");
            for (i, dp) in s.data_points.into_iter().enumerate() {
                let pi = pdp.index(i);
                let attrs = attributes(dp.attributes, &pi.field("attributes"), limits)?;
                let mut d = Map::new();
                d.insert(
                    "quantile_values".into(),
                    Value::Array(
                        dp.quantile_values
                            .iter()
                            .map(|q| json!({ "quantile": jf(q.quantile), "value": jf(q.value) }))
                            .collect(),
                    ),
                );
                d.insert("flags".into(), dp.flags.into());
                points.push(point(
                    &head,
                    dp.start_time_unix_nano,
                    dp.time_unix_nano,
                    None,
                    Some(dp.count),
                    Some(dp.sum),
                    attrs,
                    d,
                ));
            }
        }
    }
    Ok(())
}

fn number_points(
    head: &MetricHead<'_>,
    dps: Vec<pm::NumberDataPoint>,
    p: &Path,
    limits: &Limits,
    base: Map<String, Value>,
    points: &mut Vec<MetricPoint>,
) -> Result<(), DecodeError> {
    let pdp = p.field("dataPoints");
    for (i, dp) in dps.into_iter().enumerate() {
        let pi = pdp.index(i);
        let attrs = attributes(dp.attributes, &pi.field("attributes"), limits)?;
        let mut d = base.clone();
        let value = match dp.value {
            Some(pm::number_data_point::Value::AsDouble(v)) => Some(v),
            Some(pm::number_data_point::Value::AsInt(v)) => {
                d.insert("as_int".into(), v.to_string().into());
                Some(v as f64)
            }
            None => None,
        };
        d.insert("flags".into(), dp.flags.into());
        if let Some(ex) = exemplars(dp.exemplars, &pi.field("exemplars"), limits)? {
            d.insert("exemplars".into(), ex);
        }
        points.push(point(
            head,
            dp.start_time_unix_nano,
            dp.time_unix_nano,
            value,
            None,
            None,
            attrs,
            d,
        ));
    }
    Ok(())
}
