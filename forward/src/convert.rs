//! Stored records back to OTLP protobuf: the reverse of `decode::convert`, so what
//! `[forward]` sends an upstream is the OTLP request stallwatch accepted (spans re-grouped
//! by resource and scope, ids as bytes, open spans with `end_time_unix_nano = 0`).
//!
//! Metric points were flattened on the way in (docs/design.md, telemetry model): points of one
//! scope that share a metric identity (name, description, unit, kind, temporality,
//! monotonicity) are gathered back into one `Metric`; buckets, quantiles, flags and
//! exemplars (with their filtered attributes) come back from the point's `detail` JSON, and
//! a metric's `metadata` from its first point's.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::logs::v1 as pl;
use opentelemetry_proto::tonic::metrics::v1 as pm;
use opentelemetry_proto::tonic::resource::v1 as pr;
use opentelemetry_proto::tonic::trace::v1 as pt;
use serde_json::Value;
use stallwatch_storage::model::{
    AnyValue, KeyValue, LogBatch, LogRecord, MetricBatch, MetricKind, MetricPoint, Resource, Scope,
    Span, TraceBatch,
};

fn any(v: &AnyValue) -> pc::AnyValue {
    use pc::any_value::Value as V;
    let value = match v {
        AnyValue::Empty => None,
        AnyValue::String(s) => Some(V::StringValue(s.clone())),
        AnyValue::Bool(b) => Some(V::BoolValue(*b)),
        AnyValue::Int(i) => Some(V::IntValue(*i)),
        AnyValue::Double(d) => Some(V::DoubleValue(*d)),
        AnyValue::Bytes(b) => Some(V::BytesValue(b.clone())),
        AnyValue::Array(a) => Some(V::ArrayValue(pc::ArrayValue {
            values: a.iter().map(any).collect(),
        })),
        AnyValue::KvList(kvs) => Some(V::KvlistValue(pc::KeyValueList { values: attrs(kvs) })),
    };
    pc::AnyValue { value }
}

fn attrs(kvs: &[KeyValue]) -> Vec<pc::KeyValue> {
    kvs.iter()
        .map(|kv| pc::KeyValue {
            key: kv.key.clone(),
            value: Some(any(&kv.value)),
            ..Default::default()
        })
        .collect()
}

/// An attribute value as a point's `detail` JSON stores it (`decode::convert::metrics`:
/// `{"stringValue": …}`, `intValue` a decimal string, `bytesValue` hex, `{}` empty).
fn json_any(v: &Value) -> pc::AnyValue {
    use pc::any_value::Value as V;
    let value = if let Some(s) = v.get("stringValue").and_then(Value::as_str) {
        Some(V::StringValue(s.to_owned()))
    } else if let Some(b) = v.get("boolValue").and_then(Value::as_bool) {
        Some(V::BoolValue(b))
    } else if let Some(i) = v.get("intValue") {
        match i {
            Value::String(s) => s.parse().ok().map(V::IntValue),
            Value::Number(n) => n.as_i64().map(V::IntValue),
            _ => None,
        }
    } else if v.get("doubleValue").is_some() {
        Some(V::DoubleValue(jf(v.get("doubleValue")).unwrap_or(f64::NAN)))
    } else if let Some(h) = v.get("bytesValue").and_then(Value::as_str) {
        hex::decode(h).ok().map(V::BytesValue)
    } else if let Some(a) = v.get("arrayValue") {
        Some(V::ArrayValue(pc::ArrayValue {
            values: match a.get("values") {
                Some(Value::Array(items)) => items.iter().map(json_any).collect(),
                _ => Vec::new(),
            },
        }))
    } else {
        v.get("kvlistValue").map(|k| {
            V::KvlistValue(pc::KeyValueList {
                values: json_kvs(k.get("values")),
            })
        })
    };
    pc::AnyValue { value }
}

/// A `[{"key", "value"}]` list as a point's `detail` JSON stores attributes (exemplar
/// filtered attributes, metric metadata).
fn json_kvs(v: Option<&Value>) -> Vec<pc::KeyValue> {
    let Some(Value::Array(items)) = v else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|kv| {
            Some(pc::KeyValue {
                key: kv.get("key")?.as_str()?.to_owned(),
                value: Some(json_any(kv.get("value").unwrap_or(&Value::Null))),
                ..Default::default()
            })
        })
        .collect()
}

fn resource(r: &Resource) -> pr::Resource {
    pr::Resource {
        attributes: attrs(&r.attributes),
        dropped_attributes_count: r.dropped_attributes_count,
        ..Default::default()
    }
}

fn scope(s: &Scope) -> pc::InstrumentationScope {
    pc::InstrumentationScope {
        name: s.name.clone(),
        version: s.version.clone(),
        attributes: attrs(&s.attributes),
        dropped_attributes_count: s.dropped_attributes_count,
    }
}

fn span(s: &Span) -> pt::Span {
    pt::Span {
        trace_id: s.trace_id.0.to_vec(),
        span_id: s.span_id.0.to_vec(),
        trace_state: s.trace_state.clone(),
        parent_span_id: s.parent_span_id.map(|p| p.0.to_vec()).unwrap_or_default(),
        flags: s.flags,
        name: s.name.clone(),
        kind: s.kind,
        start_time_unix_nano: s.start_time_unix_nano,
        end_time_unix_nano: s.end_time_unix_nano,
        attributes: attrs(&s.attributes),
        dropped_attributes_count: s.dropped_attributes_count,
        events: s
            .events
            .iter()
            .map(|e| pt::span::Event {
                time_unix_nano: e.time_unix_nano,
                name: e.name.clone(),
                attributes: attrs(&e.attributes),
                dropped_attributes_count: e.dropped_attributes_count,
            })
            .collect(),
        dropped_events_count: s.dropped_events_count,
        links: s
            .links
            .iter()
            .map(|l| pt::span::Link {
                trace_id: l.trace_id.0.to_vec(),
                span_id: l.span_id.0.to_vec(),
                trace_state: l.trace_state.clone(),
                attributes: attrs(&l.attributes),
                dropped_attributes_count: l.dropped_attributes_count,
                flags: l.flags,
            })
            .collect(),
        dropped_links_count: s.dropped_links_count,
        status: Some(pt::Status {
            message: s.status.message.clone(),
            code: s.status.code,
        }),
    }
}

/// A trace batch as an OTLP `ExportTraceServiceRequest`.
pub fn traces(batch: &TraceBatch) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: batch
            .resource_spans
            .iter()
            .map(|rs| pt::ResourceSpans {
                resource: Some(resource(&rs.resource)),
                schema_url: rs.resource.schema_url.clone(),
                scope_spans: rs
                    .scope_spans
                    .iter()
                    .map(|ss| pt::ScopeSpans {
                        scope: Some(scope(&ss.scope)),
                        schema_url: ss.scope.schema_url.clone(),
                        spans: ss.spans.iter().map(span).collect(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn log(r: &LogRecord) -> pl::LogRecord {
    pl::LogRecord {
        time_unix_nano: r.time_unix_nano,
        observed_time_unix_nano: r.observed_time_unix_nano,
        severity_number: r.severity_number,
        severity_text: r.severity_text.clone(),
        body: match r.body {
            AnyValue::Empty => None,
            ref b => Some(any(b)),
        },
        attributes: attrs(&r.attributes),
        dropped_attributes_count: r.dropped_attributes_count,
        flags: r.flags,
        trace_id: r.trace_id.map(|t| t.0.to_vec()).unwrap_or_default(),
        span_id: r.span_id.map(|s| s.0.to_vec()).unwrap_or_default(),
        event_name: r.event_name.clone(),
    }
}

/// A log batch as an OTLP `ExportLogsServiceRequest`.
pub fn logs(batch: &LogBatch) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: batch
            .resource_logs
            .iter()
            .map(|rl| pl::ResourceLogs {
                resource: Some(resource(&rl.resource)),
                schema_url: rl.resource.schema_url.clone(),
                scope_logs: rl
                    .scope_logs
                    .iter()
                    .map(|sl| pl::ScopeLogs {
                        scope: Some(scope(&sl.scope)),
                        schema_url: sl.scope.schema_url.clone(),
                        log_records: sl.log_records.iter().map(log).collect(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

// ------------------------------------------------------------------ metrics

/// A JSON number, or the strings `NaN`, `Infinity`, `-Infinity` (see `decode::convert`).
fn jf(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            other => other.parse().ok(),
        },
        _ => None,
    }
}

fn ju64(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

fn temporality(d: &Value) -> i32 {
    match d.get("aggregation_temporality") {
        Some(Value::String(s)) => {
            pm::AggregationTemporality::from_str_name(s).unwrap_or_default() as i32
        }
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0) as i32,
        _ => 0,
    }
}

fn exemplars(d: &Value) -> Vec<pm::Exemplar> {
    let Some(Value::Array(list)) = d.get("exemplars") else {
        return Vec::new();
    };
    list.iter()
        .map(|e| {
            let hex_of = |k: &str| {
                e.get(k)
                    .and_then(Value::as_str)
                    .and_then(|h| hex::decode(h).ok())
                    .unwrap_or_default()
            };
            let value = if let Some(i) = e
                .get("as_int")
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok())
            {
                Some(pm::exemplar::Value::AsInt(i))
            } else {
                jf(e.get("as_double")).map(pm::exemplar::Value::AsDouble)
            };
            pm::Exemplar {
                filtered_attributes: json_kvs(e.get("filtered_attributes")),
                time_unix_nano: ju64(e.get("time_unix_nano")),
                trace_id: hex_of("trace_id"),
                span_id: hex_of("span_id"),
                value,
            }
        })
        .collect()
}

fn buckets(d: &Value, k: &str) -> Option<pm::exponential_histogram_data_point::Buckets> {
    let b = d.get(k)?;
    Some(pm::exponential_histogram_data_point::Buckets {
        offset: b.get("offset").and_then(Value::as_i64).unwrap_or(0) as i32,
        bucket_counts: b
            .get("bucket_counts")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| ju64(Some(v))).collect())
            .unwrap_or_default(),
    })
}

/// The identity of the metric a point belongs to.
#[derive(PartialEq)]
struct Identity {
    name: String,
    description: String,
    unit: String,
    kind: MetricKind,
    temporality: i32,
    monotonic: bool,
}

fn empty_data(kind: MetricKind, temporality: i32, monotonic: bool) -> pm::metric::Data {
    use pm::metric::Data;
    match kind {
        MetricKind::Gauge => Data::Gauge(pm::Gauge::default()),
        MetricKind::Sum => Data::Sum(pm::Sum {
            data_points: Vec::new(),
            aggregation_temporality: temporality,
            is_monotonic: monotonic,
        }),
        MetricKind::Histogram => Data::Histogram(pm::Histogram {
            data_points: Vec::new(),
            aggregation_temporality: temporality,
        }),
        MetricKind::ExponentialHistogram => Data::ExponentialHistogram(pm::ExponentialHistogram {
            data_points: Vec::new(),
            aggregation_temporality: temporality,
        }),
        MetricKind::Summary => Data::Summary(pm::Summary::default()),
    }
}

fn push_point(data: &mut pm::metric::Data, p: &MetricPoint, d: &Value) {
    use pm::metric::Data;
    let flags = ju64(d.get("flags")) as u32;
    let attributes = attrs(&p.attributes);
    match data {
        Data::Gauge(pm::Gauge { data_points }) | Data::Sum(pm::Sum { data_points, .. }) => {
            let value = match d
                .get("as_int")
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok())
            {
                Some(i) => Some(pm::number_data_point::Value::AsInt(i)),
                None => p.value.map(pm::number_data_point::Value::AsDouble),
            };
            data_points.push(pm::NumberDataPoint {
                attributes,
                start_time_unix_nano: p.start_time_unix_nano,
                time_unix_nano: p.time_unix_nano,
                exemplars: exemplars(d),
                flags,
                value,
            });
        }
        Data::Histogram(h) => h.data_points.push(pm::HistogramDataPoint {
            attributes,
            start_time_unix_nano: p.start_time_unix_nano,
            time_unix_nano: p.time_unix_nano,
            count: p.count.unwrap_or(0),
            sum: p.sum,
            bucket_counts: d
                .get("bucket_counts")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|v| ju64(Some(v))).collect())
                .unwrap_or_default(),
            explicit_bounds: d
                .get("explicit_bounds")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|v| jf(Some(v))).collect())
                .unwrap_or_default(),
            exemplars: exemplars(d),
            flags,
            min: jf(d.get("min")),
            max: jf(d.get("max")),
        }),
        Data::ExponentialHistogram(h) => h.data_points.push(pm::ExponentialHistogramDataPoint {
            attributes,
            start_time_unix_nano: p.start_time_unix_nano,
            time_unix_nano: p.time_unix_nano,
            count: p.count.unwrap_or(0),
            sum: p.sum,
            scale: d.get("scale").and_then(Value::as_i64).unwrap_or(0) as i32,
            zero_count: ju64(d.get("zero_count")),
            positive: buckets(d, "positive"),
            negative: buckets(d, "negative"),
            flags,
            exemplars: exemplars(d),
            min: jf(d.get("min")),
            max: jf(d.get("max")),
            zero_threshold: jf(d.get("zero_threshold")).unwrap_or(0.0),
        }),
        Data::Summary(s) => s.data_points.push(pm::SummaryDataPoint {
            attributes,
            start_time_unix_nano: p.start_time_unix_nano,
            time_unix_nano: p.time_unix_nano,
            count: p.count.unwrap_or(0),
            sum: p.sum.unwrap_or(0.0),
            quantile_values: d
                .get("quantile_values")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|q| pm::summary_data_point::ValueAtQuantile {
                            quantile: jf(q.get("quantile")).unwrap_or(0.0),
                            value: jf(q.get("value")).unwrap_or(0.0),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            flags,
        }),
    }
}

fn scope_metrics(points: &[MetricPoint]) -> Vec<pm::Metric> {
    let mut ids: Vec<Identity> = Vec::new();
    let mut out: Vec<pm::Metric> = Vec::new();
    for p in points {
        let d: Value = serde_json::from_str(&p.detail).unwrap_or(Value::Null);
        let id = Identity {
            name: p.name.clone(),
            description: p.description.clone(),
            unit: p.unit.clone(),
            kind: p.kind,
            temporality: temporality(&d),
            monotonic: d
                .get("is_monotonic")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        let i = match ids.iter().rposition(|x| *x == id) {
            Some(i) => i,
            None => {
                out.push(pm::Metric {
                    name: id.name.clone(),
                    description: id.description.clone(),
                    unit: id.unit.clone(),
                    metadata: json_kvs(d.get("metadata")),
                    data: Some(empty_data(id.kind, id.temporality, id.monotonic)),
                });
                ids.push(id);
                out.len() - 1
            }
        };
        if let Some(data) = out[i].data.as_mut() {
            push_point(data, p, &d);
        }
    }
    out
}

/// A metric batch as an OTLP `ExportMetricsServiceRequest`.
pub fn metrics(batch: &MetricBatch) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: batch
            .resource_metrics
            .iter()
            .map(|rm| pm::ResourceMetrics {
                resource: Some(resource(&rm.resource)),
                schema_url: rm.resource.schema_url.clone(),
                scope_metrics: rm
                    .scope_metrics
                    .iter()
                    .map(|sm| pm::ScopeMetrics {
                        scope: Some(scope(&sm.scope)),
                        schema_url: sm.scope.schema_url.clone(),
                        metrics: scope_metrics(&sm.points),
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests;
