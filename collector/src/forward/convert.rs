//! Stored records back to OTLP protobuf: the reverse of `decode::convert`, so what
//! `[forward]` sends an upstream is the OTLP request stallwatch accepted (spans re-grouped
//! by resource and scope, ids as bytes, open spans with `end_time_unix_nano = 0`).
//!
//! Metric points were flattened on the way in (docs/design.md, telemetry model): points of one
//! scope that share a metric identity (name, description, unit, kind, temporality,
//! monotonicity) are gathered back into one `Metric`; buckets, quantiles, flags and
//! exemplars come back from the point's `detail` JSON. Metric `metadata` and exemplar
//! filtered attributes are not rebuilt.

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
                filtered_attributes: Vec::new(),
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
                    metadata: Vec::new(),
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
mod tests {
    #![allow(clippy::unwrap_used)]
    //! Round trips: OTLP → records (the collector's decode) → OTLP (this module) → records
    //! must give the same records, so forwarding loses nothing the records keep.
    use super::*;
    use crate::decode::{decode_logs, decode_metrics, decode_traces, Format, Limits};
    use prost::Message;

    const LIMITS: Limits = Limits {
        max_nesting_depth: 32,
    };

    fn kv(k: &str, v: pc::any_value::Value) -> pc::KeyValue {
        pc::KeyValue {
            key: k.into(),
            value: Some(pc::AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }

    fn res(service: &str) -> Option<pr::Resource> {
        Some(pr::Resource {
            attributes: vec![kv(
                "service.name",
                pc::any_value::Value::StringValue(service.into()),
            )],
            dropped_attributes_count: 2,
            ..Default::default()
        })
    }

    fn scope() -> Option<pc::InstrumentationScope> {
        Some(pc::InstrumentationScope {
            name: "s".into(),
            version: "1".into(),
            attributes: vec![kv("k", pc::any_value::Value::BoolValue(true))],
            dropped_attributes_count: 0,
        })
    }

    #[test]
    fn traces_round_trip() {
        use pc::any_value::Value as V;
        let span = pt::Span {
            trace_id: vec![7; 16],
            span_id: vec![1; 8],
            parent_span_id: vec![2; 8],
            trace_state: "a=b".into(),
            flags: 0x301,
            name: "execute_tool x".into(),
            kind: 3,
            start_time_unix_nano: 10,
            end_time_unix_nano: 0,
            attributes: vec![
                kv("i", V::IntValue(i64::MAX)),
                kv("d", V::DoubleValue(f64::INFINITY)),
                kv("b", V::BytesValue(vec![0, 255])),
                kv(
                    "a",
                    V::ArrayValue(pc::ArrayValue {
                        values: vec![pc::AnyValue {
                            value: Some(V::StringValue("x".into())),
                        }],
                    }),
                ),
                kv(
                    "m",
                    V::KvlistValue(pc::KeyValueList {
                        values: vec![kv("n", V::IntValue(1))],
                    }),
                ),
            ],
            dropped_attributes_count: 1,
            events: vec![pt::span::Event {
                time_unix_nano: 11,
                name: "e".into(),
                attributes: vec![kv("x", V::IntValue(2))],
                dropped_attributes_count: 3,
            }],
            dropped_events_count: 4,
            links: vec![pt::span::Link {
                trace_id: vec![8; 16],
                span_id: vec![9; 8],
                trace_state: "c=d".into(),
                attributes: vec![],
                dropped_attributes_count: 5,
                flags: 1,
            }],
            dropped_links_count: 6,
            status: Some(pt::Status {
                message: "boom".into(),
                code: 2,
            }),
        };
        let mut other = span.clone();
        other.span_id = vec![3; 8];
        other.end_time_unix_nano = 20;
        let req = ExportTraceServiceRequest {
            resource_spans: vec![pt::ResourceSpans {
                resource: res("svc"),
                scope_spans: vec![pt::ScopeSpans {
                    scope: scope(),
                    spans: vec![span, other],
                    schema_url: "https://opentelemetry.io/schemas/1.30.0".into(),
                }],
                schema_url: "https://opentelemetry.io/schemas/1.29.0".into(),
            }],
        };
        let first = decode_traces(&req.encode_to_vec(), Format::Protobuf, &LIMITS)
            .unwrap()
            .batch;
        assert_eq!(first.span_count(), 2);
        let again = decode_traces(&traces(&first).encode_to_vec(), Format::Protobuf, &LIMITS)
            .unwrap()
            .batch;
        assert_eq!(again, first);
    }

    #[test]
    fn logs_round_trip() {
        let req = ExportLogsServiceRequest {
            resource_logs: vec![pl::ResourceLogs {
                resource: res("svc"),
                scope_logs: vec![pl::ScopeLogs {
                    scope: scope(),
                    log_records: vec![
                        pl::LogRecord {
                            time_unix_nano: 1,
                            observed_time_unix_nano: 2,
                            severity_number: 17,
                            severity_text: "ERROR".into(),
                            body: Some(pc::AnyValue {
                                value: Some(pc::any_value::Value::StringValue("b".into())),
                            }),
                            attributes: vec![kv("k", pc::any_value::Value::IntValue(1))],
                            dropped_attributes_count: 1,
                            flags: 1,
                            trace_id: vec![7; 16],
                            span_id: vec![1; 8],
                            event_name: "ev".into(),
                        },
                        pl::LogRecord {
                            observed_time_unix_nano: 5,
                            ..Default::default()
                        },
                    ],
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        let first = decode_logs(&req.encode_to_vec(), Format::Protobuf, &LIMITS)
            .unwrap()
            .batch;
        let again = decode_logs(&logs(&first).encode_to_vec(), Format::Protobuf, &LIMITS)
            .unwrap()
            .batch;
        assert_eq!(again, first);
    }

    #[test]
    fn metrics_round_trip_every_kind() {
        use pm::metric::Data;
        let attrs = vec![kv("host", pc::any_value::Value::StringValue("a".into()))];
        let exemplar = pm::Exemplar {
            filtered_attributes: vec![],
            time_unix_nano: 9,
            trace_id: vec![7; 16],
            span_id: vec![1; 8],
            value: Some(pm::exemplar::Value::AsInt(3)),
        };
        let number = |v: pm::number_data_point::Value| pm::NumberDataPoint {
            attributes: attrs.clone(),
            start_time_unix_nano: 1,
            time_unix_nano: 2,
            exemplars: vec![exemplar.clone()],
            flags: 1,
            value: Some(v),
        };
        let metric = |name: &str, data: Data| pm::Metric {
            name: name.into(),
            description: "d".into(),
            unit: "ms".into(),
            metadata: vec![],
            data: Some(data),
        };
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![pm::ResourceMetrics {
                resource: res("svc"),
                scope_metrics: vec![pm::ScopeMetrics {
                    scope: scope(),
                    metrics: vec![
                        metric(
                            "g",
                            Data::Gauge(pm::Gauge {
                                data_points: vec![
                                    number(pm::number_data_point::Value::AsDouble(f64::NAN)),
                                    number(pm::number_data_point::Value::AsDouble(0.5)),
                                ],
                            }),
                        ),
                        metric(
                            "s",
                            Data::Sum(pm::Sum {
                                data_points: vec![number(pm::number_data_point::Value::AsInt(
                                    i64::MAX,
                                ))],
                                aggregation_temporality: 1,
                                is_monotonic: true,
                            }),
                        ),
                        metric(
                            "h",
                            Data::Histogram(pm::Histogram {
                                data_points: vec![pm::HistogramDataPoint {
                                    attributes: attrs.clone(),
                                    start_time_unix_nano: 1,
                                    time_unix_nano: 2,
                                    count: 6,
                                    sum: Some(12.5),
                                    bucket_counts: vec![1, 2, 3],
                                    explicit_bounds: vec![1.0, 5.0],
                                    exemplars: vec![],
                                    flags: 0,
                                    min: Some(0.5),
                                    max: Some(9.0),
                                }],
                                aggregation_temporality: 2,
                            }),
                        ),
                        metric(
                            "e",
                            Data::ExponentialHistogram(pm::ExponentialHistogram {
                                data_points: vec![pm::ExponentialHistogramDataPoint {
                                    attributes: attrs.clone(),
                                    start_time_unix_nano: 1,
                                    time_unix_nano: 2,
                                    count: 4,
                                    sum: None,
                                    scale: -2,
                                    zero_count: 1,
                                    positive: Some(pm::exponential_histogram_data_point::Buckets {
                                        offset: -1,
                                        bucket_counts: vec![1, 2],
                                    }),
                                    negative: None,
                                    flags: 0,
                                    exemplars: vec![],
                                    min: None,
                                    max: Some(3.0),
                                    zero_threshold: 0.001,
                                }],
                                aggregation_temporality: 1,
                            }),
                        ),
                        metric(
                            "q",
                            Data::Summary(pm::Summary {
                                data_points: vec![pm::SummaryDataPoint {
                                    attributes: attrs.clone(),
                                    start_time_unix_nano: 1,
                                    time_unix_nano: 2,
                                    count: 3,
                                    sum: 7.0,
                                    quantile_values: vec![
                                        pm::summary_data_point::ValueAtQuantile {
                                            quantile: 0.5,
                                            value: 2.0,
                                        },
                                    ],
                                    flags: 0,
                                }],
                            }),
                        ),
                    ],
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        let first = decode_metrics(&req.encode_to_vec(), Format::Protobuf, &LIMITS)
            .unwrap()
            .batch;
        assert_eq!(first.point_count(), 6);
        let back = metrics(&first);
        let names: Vec<_> = back.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["g", "s", "h", "e", "q"],
            "points regrouped per metric"
        );
        let again = decode_metrics(&back.encode_to_vec(), Format::Protobuf, &LIMITS)
            .unwrap()
            .batch;
        // NaN != NaN: compare the debug text, which prints NaN alike.
        assert_eq!(format!("{again:?}"), format!("{first:?}"));
    }
}
