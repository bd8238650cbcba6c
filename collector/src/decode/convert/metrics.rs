//! Metric exports → flattened [`MetricPoint`]s, with what a point does not keep in its
//! columns (buckets, quantiles, exemplars, temporality, flags) as JSON `detail`.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1 as pm;
use serde_json::{json, Map, Value};
use stallwatch_storage::model::{
    AnyValue, KeyValue, MetricBatch, MetricKind, MetricPoint, ResourceMetrics, ScopeMetrics,
};

use super::{attributes, resource, scope, span_id, trace_id, Refusals};
use crate::decode::path::Path;
use crate::decode::{DecodeError, Decoded, Limits};

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
                let at = pms.index(mi);
                let first = points.len();
                metric(m, &at, limits, &mut points, &mut refusals)?;
                // a point timed after what is stored is refused alone (partial success)
                let mut i = first;
                while i < points.len() {
                    let t = points[i].time_unix_nano.max(points[i].start_time_unix_nano);
                    if t > super::LATEST_STORED_TIME {
                        refusals.refuse(super::too_late("data point", &at, t));
                        points.remove(i);
                    } else {
                        i += 1;
                    }
                }
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

/// Scales an exponential histogram point may have (OpenTelemetry metrics data model,
/// "ExponentialHistogram", Scale: "-10 to 20"); outside it a bucket index cannot be mapped
/// to a bound.
const EXPONENTIAL_SCALES: std::ops::RangeInclusive<i32> = -10..=20;

/// Why a histogram point's buckets are not a histogram, if they are not (OTLP
/// `metrics.proto`, `HistogramDataPoint`): `explicit_bounds` must be strictly increasing
/// (no NaN), and `bucket_counts` must have one more entry than it, or none. Stored, unsorted
/// bounds gave percentiles that went down as the rank went up.
pub(crate) fn histogram_buckets_invalid(bounds: &[f64], counts: usize) -> Option<String> {
    if let Some(i) = bounds.iter().position(|b| b.is_nan()) {
        return Some(format!("explicit_bounds[{i}] is NaN"));
    }
    if let Some(i) = bounds.windows(2).position(|w| w[0] >= w[1]) {
        return Some(format!(
            "explicit_bounds are not strictly increasing ({} then {} at index {})",
            bounds[i],
            bounds[i + 1],
            i + 1
        ));
    }
    if counts != 0 && counts != bounds.len() + 1 {
        return Some(format!(
            "bucket_counts has {counts} entries for {} explicit_bounds: it needs {} (or none)",
            bounds.len(),
            bounds.len() + 1
        ));
    }
    None
}

/// Why a histogram point's `count` disagrees with its buckets, if it does: OTLP
/// `metrics.proto` requires `count` to equal the sum of `bucket_counts`
/// (`HistogramDataPoint`), or of the positive and negative `bucket_counts` plus
/// `zero_count` (`ExponentialHistogramDataPoint`). A point with no bucket counts at all
/// is not checked (its count stands alone). Stored, such a point gave percentiles from
/// buckets that did not hold the population the count and rate said.
pub(crate) fn histogram_count_invalid(
    count: u64,
    buckets: impl IntoIterator<Item = u64>,
) -> Option<String> {
    let mut any = false;
    let mut total: Option<u64> = Some(0);
    for b in buckets {
        any = true;
        total = total.and_then(|t| t.checked_add(b));
    }
    match total {
        _ if !any => None,
        Some(t) if t == count => None,
        Some(t) => Some(format!("bucket counts sum to {t} but count is {count}")),
        None => Some(format!("bucket counts sum past 2^64 but count is {count}")),
    }
}

/// Why a summary point's quantiles are not a summary's, if they are not (OTLP
/// `metrics.proto`, `SummaryDataPoint.ValueAtQuantile`): each `quantile` "must be in the
/// interval [0.0, 1.0]", and "quantile values must NOT be negative". A NaN value is kept
/// (Prometheus reports a quantile with no observations so).
pub(crate) fn summary_quantiles_invalid(quantiles: &[(f64, f64)]) -> Option<String> {
    for (i, &(q, v)) in quantiles.iter().enumerate() {
        if !(0.0..=1.0).contains(&q) {
            return Some(format!(
                "quantile_values[{i}].quantile is {q}: a quantile is from 0 to 1"
            ));
        }
        if v < 0.0 {
            return Some(format!(
                "quantile_values[{i}].value is {v}: quantile values must not be negative"
            ));
        }
    }
    None
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
                if let Some(why) =
                    histogram_buckets_invalid(&dp.explicit_bounds, dp.bucket_counts.len())
                {
                    refusals.refuse(format!("data point at {pi}: {why}"));
                    continue;
                }
                if let Some(why) =
                    histogram_count_invalid(dp.count, dp.bucket_counts.iter().copied())
                {
                    refusals.refuse(format!("data point at {pi}: {why}"));
                    continue;
                }
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
                if !EXPONENTIAL_SCALES.contains(&dp.scale) {
                    refusals.refuse(format!(
                        "data point at {pi}: scale {} is outside the exponential histogram's {} to {}",
                        dp.scale,
                        EXPONENTIAL_SCALES.start(),
                        EXPONENTIAL_SCALES.end()
                    ));
                    continue;
                }
                let buckets = [&dp.positive, &dp.negative]
                    .into_iter()
                    .flatten()
                    .flat_map(|b| b.bucket_counts.iter().copied());
                let zero = (dp.zero_count != 0).then_some(dp.zero_count);
                if let Some(why) =
                    histogram_count_invalid(dp.count, zero.into_iter().chain(buckets))
                {
                    refusals.refuse(format!("data point at {pi}: {why}"));
                    continue;
                }
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
                let quantiles: Vec<(f64, f64)> = dp
                    .quantile_values
                    .iter()
                    .map(|q| (q.quantile, q.value))
                    .collect();
                if let Some(why) = summary_quantiles_invalid(&quantiles) {
                    refusals.refuse(format!("data point at {pi}: {why}"));
                    continue;
                }
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
