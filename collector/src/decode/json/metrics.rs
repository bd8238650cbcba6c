//! OTLP/JSON `ExportMetricsServiceRequest` → prost's metric wire types.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1 as pm;
use serde_json::Value;

use super::scalar::{
    boolean, double, enumeration, f64_field, hex_id, i32_field, list, object, opt_f64_field,
    opt_object, ranged, string, take, u32_field, u64_field, Obj,
};
use super::{attributes, envelope, key_values, raw_list, raw_object, raw_take, tree};
use crate::decode::path::Path;
use crate::decode::DecodeError;
use serde_json::value::RawValue;

fn temporality_from_name(s: &str) -> Option<i32> {
    pm::AggregationTemporality::from_str_name(s).map(|k| k as i32)
}

/// Decodes an OTLP/JSON `ExportMetricsServiceRequest` (also a `MetricsData`).
pub(crate) fn metrics(body: &[u8]) -> Result<ExportMetricsServiceRequest, DecodeError> {
    let resource_metrics = envelope(
        body,
        [
            ("resourceMetrics", "resource_metrics"),
            ("scopeMetrics", "scope_metrics"),
            ("metrics", "metrics"),
        ],
        metric_raw,
        |scope, metrics, schema_url| pm::ScopeMetrics {
            scope,
            metrics,
            schema_url,
        },
        |resource, scope_metrics, schema_url| pm::ResourceMetrics {
            resource,
            scope_metrics,
            schema_url,
        },
    )?;
    Ok(ExportMetricsServiceRequest { resource_metrics })
}

/// One metric from its JSON tree; its data points are numbered from `first` in paths.
fn metric(v: Value, p: &Path, first: usize) -> Result<pm::Metric, DecodeError> {
    use pm::metric::Data;
    let mut o = object(v, p)?;
    let name = string(&mut o, "name", "name", p)?;
    let description = string(&mut o, "description", "description", p)?;
    let unit = string(&mut o, "unit", "unit", p)?;
    let metadata = key_values(&mut o, "metadata", "metadata", p)?;
    let mut data = Vec::with_capacity(1);
    if let Some(mut g) = opt_object(&mut o, "gauge", "gauge", p)? {
        let pg = p.field("gauge");
        data.push(Data::Gauge(pm::Gauge {
            data_points: number_points(&mut g, &pg, first)?,
        }));
    }
    if let Some(mut s) = opt_object(&mut o, "sum", "sum", p)? {
        let ps = p.field("sum");
        data.push(Data::Sum(pm::Sum {
            data_points: number_points(&mut s, &ps, first)?,
            aggregation_temporality: temporality(&mut s, &ps)?,
            is_monotonic: take(&mut s, "isMonotonic", "is_monotonic")
                .map(|v| boolean(v, &ps.field("isMonotonic")))
                .transpose()?
                .unwrap_or(false),
        }));
    }
    if let Some(mut h) = opt_object(&mut o, "histogram", "histogram", p)? {
        let ph = p.field("histogram");
        let dps = list(&mut h, "dataPoints", "data_points", &ph)?;
        let pd = ph.field("dataPoints");
        let mut data_points = Vec::with_capacity(dps.len());
        for (i, dp) in dps.into_iter().enumerate() {
            let pi = pd.index(first + i);
            let mut d = object(dp, &pi)?;
            data_points.push(pm::HistogramDataPoint {
                attributes: attributes(&mut d, &pi)?,
                start_time_unix_nano: u64_field(
                    &mut d,
                    "startTimeUnixNano",
                    "start_time_unix_nano",
                    &pi,
                )?,
                time_unix_nano: u64_field(&mut d, "timeUnixNano", "time_unix_nano", &pi)?,
                count: u64_field(&mut d, "count", "count", &pi)?,
                sum: opt_f64_field(&mut d, "sum", "sum", &pi)?,
                bucket_counts: u64_list(&mut d, "bucketCounts", "bucket_counts", &pi)?,
                explicit_bounds: f64_list(&mut d, "explicitBounds", "explicit_bounds", &pi)?,
                exemplars: exemplars(&mut d, &pi)?,
                flags: u32_field(&mut d, "flags", "flags", &pi)?,
                min: opt_f64_field(&mut d, "min", "min", &pi)?,
                max: opt_f64_field(&mut d, "max", "max", &pi)?,
            });
        }
        data.push(Data::Histogram(pm::Histogram {
            data_points,
            aggregation_temporality: temporality(&mut h, &ph)?,
        }));
    }
    if let Some(mut h) = opt_object(&mut o, "exponentialHistogram", "exponential_histogram", p)? {
        let ph = p.field("exponentialHistogram");
        let dps = list(&mut h, "dataPoints", "data_points", &ph)?;
        let pd = ph.field("dataPoints");
        let mut data_points = Vec::with_capacity(dps.len());
        for (i, dp) in dps.into_iter().enumerate() {
            let pi = pd.index(first + i);
            let mut d = object(dp, &pi)?;
            data_points.push(pm::ExponentialHistogramDataPoint {
                attributes: attributes(&mut d, &pi)?,
                start_time_unix_nano: u64_field(
                    &mut d,
                    "startTimeUnixNano",
                    "start_time_unix_nano",
                    &pi,
                )?,
                time_unix_nano: u64_field(&mut d, "timeUnixNano", "time_unix_nano", &pi)?,
                count: u64_field(&mut d, "count", "count", &pi)?,
                sum: opt_f64_field(&mut d, "sum", "sum", &pi)?,
                scale: i32_field(&mut d, "scale", "scale", &pi)?,
                zero_count: u64_field(&mut d, "zeroCount", "zero_count", &pi)?,
                positive: buckets(&mut d, "positive", &pi)?,
                negative: buckets(&mut d, "negative", &pi)?,
                flags: u32_field(&mut d, "flags", "flags", &pi)?,
                exemplars: exemplars(&mut d, &pi)?,
                min: opt_f64_field(&mut d, "min", "min", &pi)?,
                max: opt_f64_field(&mut d, "max", "max", &pi)?,
                zero_threshold: f64_field(&mut d, "zeroThreshold", "zero_threshold", &pi)?,
            });
        }
        data.push(Data::ExponentialHistogram(pm::ExponentialHistogram {
            data_points,
            aggregation_temporality: temporality(&mut h, &ph)?,
        }));
    }
    if let Some(mut s) = opt_object(&mut o, "summary", "summary", p)? {
        let ps = p.field("summary");
        let dps = list(&mut s, "dataPoints", "data_points", &ps)?;
        let pd = ps.field("dataPoints");
        let mut data_points = Vec::with_capacity(dps.len());
        for (i, dp) in dps.into_iter().enumerate() {
            let pi = pd.index(first + i);
            let mut d = object(dp, &pi)?;
            let qs = list(&mut d, "quantileValues", "quantile_values", &pi)?;
            let pq = pi.field("quantileValues");
            let mut quantile_values = Vec::with_capacity(qs.len());
            for (qi, q) in qs.into_iter().enumerate() {
                let pqi = pq.index(qi);
                let mut q = object(q, &pqi)?;
                quantile_values.push(pm::summary_data_point::ValueAtQuantile {
                    quantile: f64_field(&mut q, "quantile", "quantile", &pqi)?,
                    value: f64_field(&mut q, "value", "value", &pqi)?,
                });
            }
            data_points.push(pm::SummaryDataPoint {
                attributes: attributes(&mut d, &pi)?,
                start_time_unix_nano: u64_field(
                    &mut d,
                    "startTimeUnixNano",
                    "start_time_unix_nano",
                    &pi,
                )?,
                time_unix_nano: u64_field(&mut d, "timeUnixNano", "time_unix_nano", &pi)?,
                count: u64_field(&mut d, "count", "count", &pi)?,
                sum: f64_field(&mut d, "sum", "sum", &pi)?,
                quantile_values,
                flags: u32_field(&mut d, "flags", "flags", &pi)?,
            });
        }
        data.push(Data::Summary(pm::Summary { data_points }));
    }
    if data.len() > 1 {
        return Err(DecodeError::at(
            p,
            "metric sets more than one of gauge, sum, histogram, exponentialHistogram, summary",
        ));
    }
    Ok(pm::Metric {
        name,
        description,
        unit,
        metadata,
        data: data.pop(),
    })
}

/// The members of a metric that hold its data points (lowerCamelCase, snake_case).
const DATA_MEMBERS: [(&str, &str); 5] = [
    ("gauge", "gauge"),
    ("sum", "sum"),
    ("histogram", "histogram"),
    ("exponentialHistogram", "exponential_histogram"),
    ("summary", "summary"),
];
/// Data points of one metric made into one JSON tree at a time.
const POINTS_PER_TREE: usize = 1024;

/// One metric from its unparsed text, with the rules of [`metric`], its data points
/// [`POINTS_PER_TREE`] at a time: a metric holding most of a 20 MiB body never becomes one
/// JSON tree (issue 17 #14).
fn metric_raw(raw: &RawValue, p: &Path) -> Result<pm::Metric, DecodeError> {
    use pm::metric::Data;
    let mut o = raw_object(raw, p)?;
    // Everything but the points, as one small tree: the checks of the whole metric.
    let mut lists = Vec::new();
    let mut head = Obj::new();
    for (camel, snake) in DATA_MEMBERS {
        let Some(r) = raw_take(&mut o, camel, snake) else {
            continue;
        };
        let pd = p.field(camel);
        let mut d = raw_object(r, &pd)?;
        let points = raw_list(&mut d, "dataPoints", "data_points", &pd)?;
        let mut rest = Obj::new();
        for (k, v) in d {
            rest.insert(k, tree(v)?);
        }
        head.insert(camel.to_string(), Value::Object(rest));
        lists.push((camel, points));
    }
    for (k, v) in o {
        head.insert(k, tree(v)?);
    }
    let mut m = metric(Value::Object(head), p, 0)?;
    for (camel, points) in lists {
        for (n, batch) in points.chunks(POINTS_PER_TREE).enumerate() {
            let trees = batch
                .iter()
                .map(|r| tree(r))
                .collect::<Result<Vec<_>, _>>()?;
            let mut data = Obj::new();
            data.insert("dataPoints".into(), Value::Array(trees));
            let mut one = Obj::new();
            one.insert(camel.to_string(), Value::Object(data));
            let part = metric(Value::Object(one), p, n * POINTS_PER_TREE)?;
            match (&mut m.data, part.data) {
                (Some(Data::Gauge(a)), Some(Data::Gauge(b))) => a.data_points.extend(b.data_points),
                (Some(Data::Sum(a)), Some(Data::Sum(b))) => a.data_points.extend(b.data_points),
                (Some(Data::Histogram(a)), Some(Data::Histogram(b))) => {
                    a.data_points.extend(b.data_points)
                }
                (Some(Data::ExponentialHistogram(a)), Some(Data::ExponentialHistogram(b))) => {
                    a.data_points.extend(b.data_points)
                }
                (Some(Data::Summary(a)), Some(Data::Summary(b))) => {
                    a.data_points.extend(b.data_points)
                }
                // `metric` refused a metric with more than one data member above.
                _ => {
                    return Err(DecodeError::at(
                        p,
                        "metric sets more than one of gauge, sum, histogram, exponentialHistogram, summary",
                    ))
                }
            }
        }
    }
    Ok(m)
}

fn temporality(o: &mut Obj, p: &Path) -> Result<i32, DecodeError> {
    enumeration(
        o,
        "aggregationTemporality",
        "aggregation_temporality",
        p,
        temporality_from_name,
        "AGGREGATION_TEMPORALITY_CUMULATIVE",
    )
}

fn number_points(
    o: &mut Obj,
    p: &Path,
    first: usize,
) -> Result<Vec<pm::NumberDataPoint>, DecodeError> {
    use pm::number_data_point::Value as NV;
    let dps = list(o, "dataPoints", "data_points", p)?;
    let pd = p.field("dataPoints");
    let mut out = Vec::with_capacity(dps.len());
    for (i, dp) in dps.into_iter().enumerate() {
        let pi = pd.index(first + i);
        let mut d = object(dp, &pi)?;
        let as_double = take(&mut d, "asDouble", "as_double")
            .map(|v| double(v, &pi.field("asDouble")))
            .transpose()?;
        let as_int = take(&mut d, "asInt", "as_int")
            .map(|v| ranged::<i64>(v, &pi.field("asInt"), "int64"))
            .transpose()?;
        let value = match (as_double, as_int) {
            (Some(_), Some(_)) => {
                return Err(DecodeError::at(
                    &pi,
                    "data point sets both asDouble and asInt",
                ))
            }
            (Some(v), None) => Some(NV::AsDouble(v)),
            (None, Some(v)) => Some(NV::AsInt(v)),
            (None, None) => None,
        };
        out.push(pm::NumberDataPoint {
            attributes: attributes(&mut d, &pi)?,
            start_time_unix_nano: u64_field(
                &mut d,
                "startTimeUnixNano",
                "start_time_unix_nano",
                &pi,
            )?,
            time_unix_nano: u64_field(&mut d, "timeUnixNano", "time_unix_nano", &pi)?,
            exemplars: exemplars(&mut d, &pi)?,
            flags: u32_field(&mut d, "flags", "flags", &pi)?,
            value,
        });
    }
    Ok(out)
}

fn exemplars(o: &mut Obj, p: &Path) -> Result<Vec<pm::Exemplar>, DecodeError> {
    use pm::exemplar::Value as EV;
    let items = list(o, "exemplars", "exemplars", p)?;
    let pe = p.field("exemplars");
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let pi = pe.index(i);
        let mut e = object(item, &pi)?;
        let value = if let Some(v) = take(&mut e, "asDouble", "as_double") {
            Some(EV::AsDouble(double(v, &pi.field("asDouble"))?))
        } else if let Some(v) = take(&mut e, "asInt", "as_int") {
            Some(EV::AsInt(ranged(v, &pi.field("asInt"), "int64")?))
        } else {
            None
        };
        out.push(pm::Exemplar {
            filtered_attributes: key_values(
                &mut e,
                "filteredAttributes",
                "filtered_attributes",
                &pi,
            )?,
            time_unix_nano: u64_field(&mut e, "timeUnixNano", "time_unix_nano", &pi)?,
            span_id: hex_id(&mut e, "spanId", "span_id", &pi, 8)?,
            trace_id: hex_id(&mut e, "traceId", "trace_id", &pi, 16)?,
            value,
        });
    }
    Ok(out)
}

fn buckets(
    o: &mut Obj,
    name: &'static str,
    p: &Path,
) -> Result<Option<pm::exponential_histogram_data_point::Buckets>, DecodeError> {
    let Some(mut b) = opt_object(o, name, name, p)? else {
        return Ok(None);
    };
    let pb = p.field(name);
    Ok(Some(pm::exponential_histogram_data_point::Buckets {
        offset: i32_field(&mut b, "offset", "offset", &pb)?,
        bucket_counts: u64_list(&mut b, "bucketCounts", "bucket_counts", &pb)?,
    }))
}

fn u64_list(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<Vec<u64>, DecodeError> {
    let items = list(o, c, s, p)?;
    let pl = p.field(c);
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| ranged(v, &pl.index(i), "uint64"))
        .collect()
}

fn f64_list(
    o: &mut Obj,
    c: &'static str,
    s: &'static str,
    p: &Path,
) -> Result<Vec<f64>, DecodeError> {
    let items = list(o, c, s, p)?;
    let pl = p.field(c);
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| double(v, &pl.index(i)))
        .collect()
}
