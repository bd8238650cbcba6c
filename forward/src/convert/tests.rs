//! Round trips: OTLP → records (the collector's decode) → OTLP (`convert.rs`) → records
//! must give the same records, so forwarding loses nothing the records keep.

#![allow(clippy::unwrap_used)]

use super::*;
use prost::Message;
use stallwatch_collector::decode::{decode_logs, decode_metrics, decode_traces, Format, Limits};

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
    use pc::any_value::Value as V;
    // Every kind of value, nested, in exemplar filtered attributes and metric metadata:
    // both come back from the stored `detail` (they were dropped on the way upstream).
    let filtered = vec![
        kv("s", V::StringValue("x".into())),
        kv("i", V::IntValue(-5)),
        kv("d", V::DoubleValue(1.5)),
        kv("b", V::BoolValue(true)),
        kv("y", V::BytesValue(vec![1, 255])),
        kv(
            "a",
            V::ArrayValue(pc::ArrayValue {
                values: vec![
                    pc::AnyValue {
                        value: Some(V::IntValue(i64::MAX)),
                    },
                    pc::AnyValue { value: None },
                ],
            }),
        ),
        kv(
            "m",
            V::KvlistValue(pc::KeyValueList {
                values: vec![kv("inner", V::StringValue("v".into()))],
            }),
        ),
    ];
    let exemplar = pm::Exemplar {
        filtered_attributes: filtered,
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
        metadata: vec![kv("origin", V::StringValue("sdk".into()))],
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
                                quantile_values: vec![pm::summary_data_point::ValueAtQuantile {
                                    quantile: 0.5,
                                    value: 2.0,
                                }],
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
    let g = &back.resource_metrics[0].scope_metrics[0].metrics[0];
    assert_eq!(
        g.metadata,
        req.resource_metrics[0].scope_metrics[0].metrics[0].metadata
    );
    let Some(Data::Gauge(gauge)) = &g.data else {
        panic!("a gauge: {g:?}")
    };
    assert_eq!(gauge.data_points[0].exemplars, vec![exemplar]);
}
