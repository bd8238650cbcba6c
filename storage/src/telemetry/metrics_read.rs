//! Metric reads: the stored instruments (`GET /api/v1/metrics`) and one instrument's
//! points per series, aggregated per step (`GET /api/v1/metrics/{name}/points`).
//!
//! Series: one per (resource attributes, scope name and version, point attributes), the
//! `series` column (see `schema.rs`, migration 2). Steps are `[from + k·step, from +
//! (k+1)·step)`; a step with no point is left out. Per step and series:
//!
//! - gauge: `value` = the last point's value in the step;
//! - sum: cumulative → the last value (the running total); delta → the sum of the step's
//!   values;
//! - histogram and exponential histogram: the distribution observed during the step, i.e.
//!   delta points merged (bucket counts added), or for cumulative points the last point of
//!   the step minus the last point of the previous step when both share their start time
//!   and bucket layout (else the last point as it is: the first step with data shows the
//!   distribution since the series' start time). From it: `count`, `sum`, and `p50`,
//!   `p90`, `p99` estimated from the buckets:
//!   - explicit buckets: linear interpolation within the bucket holding the rank, as
//!     Prometheus' `histogram_quantile` does (the first bucket's lower edge is 0 when its
//!     upper bound is positive, the `+Inf` bucket answers the highest finite bound);
//!   - exponential buckets (OTLP data model, base = 2^(2^-scale), bucket `i` covers
//!     `(base^i, base^(i+1)]`): geometric (log-linear) interpolation within the bucket,
//!     `base^(i + f)` for the fraction `f` of the bucket's count below the rank, because
//!     the buckets have equal widths in log space; the zero bucket answers 0; points of
//!     different scales are merged at the smaller scale (OTLP data model, "downscaling").
//!
//!   Both estimates are clamped to the points' `min`/`max` when they were sent.
//! - summary: `count`, `sum` of the last point; its own quantiles are in the points API of
//!   the raw data, not re-estimated here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection};
use serde_json::Value;

use super::encode::PointRow;
use super::read::snapshot;
use crate::error::StorageError;
use crate::model::{KeyValue, MetricKind, MetricPoint, Resource, Scope};

/// Most steps one points query may ask for (as Prometheus' 11,000 points per series).
pub const MAX_STEPS: u64 = 11_000;

/// One stored instrument of one service (`GET /api/v1/metrics`).
#[derive(Clone, Debug, PartialEq)]
pub struct Instrument {
    /// Metric name.
    pub name: String,
    /// Resource `service.name`.
    pub service: String,
    /// `gauge`, `sum`, `histogram`, `exponential_histogram` or `summary` (the latest seen).
    pub kind: String,
    /// Unit (UCUM).
    pub unit: String,
    /// Description.
    pub description: String,
    /// Stored data points.
    pub point_count: u64,
    /// Earliest point time, ns since the Unix epoch.
    pub first_time_unix_nano: u64,
    /// Latest point time, ns since the Unix epoch.
    pub last_time_unix_nano: u64,
}

/// One instrument's points query.
#[derive(Clone, Debug, PartialEq)]
pub struct PointsQuery {
    /// Metric name.
    pub name: String,
    /// Only this resource `service.name`.
    pub service: Option<String>,
    /// Window start (inclusive), ns since the Unix epoch.
    pub from_unix_nano: u64,
    /// Window end (exclusive), ns since the Unix epoch.
    pub to_unix_nano: u64,
    /// Step, ns (> 0; at most [`MAX_STEPS`] steps in the window).
    pub step_ns: u64,
}

/// One step of one series.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct StepValue {
    /// Step start, ns since the Unix epoch.
    pub start_unix_nano: u64,
    /// Points that fell in the step.
    pub points: u64,
    /// Gauge/sum value (see the module doc for which).
    pub value: Option<f64>,
    /// Histogram/summary count in the step.
    pub count: Option<u64>,
    /// Histogram/summary sum in the step.
    pub sum: Option<f64>,
    /// Estimated median (histograms).
    pub p50: Option<f64>,
    /// Estimated 90th percentile (histograms).
    pub p90: Option<f64>,
    /// Estimated 99th percentile (histograms).
    pub p99: Option<f64>,
}

/// One series: its identity and its steps, oldest first.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricSeries {
    /// The series key (hex in the API).
    pub key: u64,
    /// Its resource.
    pub resource: Arc<Resource>,
    /// Its scope.
    pub scope: Arc<Scope>,
    /// Point attributes (the attribute set).
    pub attributes: Vec<KeyValue>,
    /// Kind of its newest point.
    pub kind: MetricKind,
    /// Unit.
    pub unit: String,
    /// Description.
    pub description: String,
    /// Aggregation temporality (`AGGREGATION_TEMPORALITY_DELTA`/`_CUMULATIVE`) when the
    /// kind has one.
    pub temporality: Option<String>,
    /// Steps with at least one point.
    pub steps: Vec<StepValue>,
}

/// Adds a commit's points to `metric_instruments` (called by the writer inside its
/// transaction).
pub(super) fn upsert_instruments(
    conn: &Connection,
    rows: &[PointRow],
) -> Result<(), rusqlite::Error> {
    type Acc<'a> = (&'a str, &'a str, &'a str, u64, i64, i64);
    let mut acc: HashMap<(&str, &str), Acc<'_>> = HashMap::new();
    for r in rows {
        let t = r.time as i64;
        let e = acc.entry((r.name.as_str(), r.service.as_str())).or_insert((
            r.kind,
            &r.unit,
            &r.description,
            0,
            t,
            t,
        ));
        e.0 = r.kind;
        e.1 = &r.unit;
        e.2 = &r.description;
        e.3 += 1;
        e.4 = e.4.min(t);
        e.5 = e.5.max(t);
    }
    let mut st = conn.prepare_cached(
        "INSERT INTO metric_instruments(name, service, kind, unit, description, point_count,
                                        first_time, last_time)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT(name, service) DO UPDATE SET
            kind = excluded.kind, unit = excluded.unit, description = excluded.description,
            point_count = point_count + excluded.point_count,
            first_time = min(first_time, excluded.first_time),
            last_time = max(last_time, excluded.last_time)",
    )?;
    for ((name, service), (kind, unit, desc, n, first, last)) in acc {
        st.execute(params![
            name, service, kind, unit, desc, n as i64, first, last
        ])?;
    }
    Ok(())
}

/// Recounts `metric_instruments` after retention deleted points; drops emptied rows.
pub(super) fn recompute_instruments(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.execute_batch(
        "BEGIN IMMEDIATE;
         UPDATE metric_instruments SET (point_count, first_time, last_time) =
            (SELECT count(*), coalesce(min(time_unix_nano), 0), coalesce(max(time_unix_nano), 0)
             FROM metric_points p INDEXED BY metric_points_name_time
             WHERE p.name = metric_instruments.name AND p.service = metric_instruments.service);
         DELETE FROM metric_instruments WHERE point_count = 0;
         COMMIT;",
    )
    .inspect_err(|_| {
        let _ = conn.execute_batch("ROLLBACK");
    })
}

/// The stored instruments, by name then service; optionally of one service.
pub(super) fn instruments(
    conn: &Connection,
    service: Option<&str>,
) -> Result<Vec<Instrument>, StorageError> {
    let mut st = conn.prepare_cached(
        "SELECT name, service, kind, unit, description, point_count, first_time, last_time
         FROM metric_instruments WHERE ?1 IS NULL OR service = ?1 ORDER BY name, service",
    )?;
    let rows = st.query_map([service], |r| {
        Ok(Instrument {
            name: r.get(0)?,
            service: r.get(1)?,
            kind: r.get(2)?,
            unit: r.get(3)?,
            description: r.get(4)?,
            point_count: r.get::<_, i64>(5)? as u64,
            first_time_unix_nano: r.get::<_, i64>(6)? as u64,
            last_time_unix_nano: r.get::<_, i64>(7)? as u64,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn decode_point(payload: &[u8]) -> Result<(Resource, Scope, MetricPoint), StorageError> {
    postcard::from_bytes(payload).map_err(|e| StorageError::Corrupt(e.to_string()))
}

/// A number in a point's `detail` JSON (numbers, or `"NaN"`/`"Infinity"`/`"-Infinity"`).
fn jnum(v: &Value) -> Option<f64> {
    match v {
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

fn ju64s(v: Option<&Value>) -> Vec<u64> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|x| x.as_u64().or_else(|| x.as_str()?.parse().ok()).unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}

/// A histogram's buckets, in a form that can be added, subtracted and ranked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Dist {
    /// Explicit bounds; `counts.len() == bounds.len() + 1`.
    Explicit {
        /// Upper bounds.
        bounds: Vec<f64>,
        /// Counts per bucket.
        counts: Vec<u64>,
    },
    /// Exponential buckets at `scale`, by bucket index.
    Exp {
        /// Scale.
        scale: i32,
        /// Zero bucket count.
        zero: u64,
        /// Positive buckets, index → count.
        pos: BTreeMap<i32, u64>,
        /// Negative buckets (by magnitude index) → count.
        neg: BTreeMap<i32, u64>,
    },
}

/// The observed part of a histogram point: its distribution, count, sum, min, max.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Hist {
    pub(crate) dist: Dist,
    pub(crate) count: u64,
    pub(crate) sum: Option<f64>,
    pub(crate) min: Option<f64>,
    pub(crate) max: Option<f64>,
}

fn exp_buckets(v: Option<&Value>) -> BTreeMap<i32, u64> {
    let Some(v) = v else { return BTreeMap::new() };
    let off = v.get("offset").and_then(Value::as_i64).unwrap_or(0) as i32;
    ju64s(v.get("bucket_counts"))
        .into_iter()
        .enumerate()
        .filter(|(_, c)| *c > 0)
        .map(|(i, c)| (off + i as i32, c))
        .collect()
}

impl Hist {
    /// Reads a histogram or exponential histogram point.
    pub(crate) fn from_point(p: &MetricPoint) -> Option<Hist> {
        let d: Value = serde_json::from_str(&p.detail).ok()?;
        let dist = match p.kind {
            MetricKind::Histogram => Dist::Explicit {
                bounds: d
                    .get("explicit_bounds")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(jnum).collect())
                    .unwrap_or_default(),
                counts: ju64s(d.get("bucket_counts")),
            },
            MetricKind::ExponentialHistogram => Dist::Exp {
                scale: d.get("scale").and_then(Value::as_i64).unwrap_or(0) as i32,
                zero: d.get("zero_count").and_then(Value::as_u64).unwrap_or(0),
                pos: exp_buckets(d.get("positive")),
                neg: exp_buckets(d.get("negative")),
            },
            _ => return None,
        };
        Some(Hist {
            dist,
            count: p.count.unwrap_or(0),
            sum: p.sum,
            min: d.get("min").and_then(jnum),
            max: d.get("max").and_then(jnum),
        })
    }

    /// `self + other` (delta points of one step), `None` when the layouts differ.
    pub(crate) fn add(&self, o: &Hist) -> Option<Hist> {
        Some(Hist {
            dist: self.dist.bucketwise(&o.dist, |a, b| a.checked_add(b))?,
            count: self.count.checked_add(o.count)?,
            sum: match (self.sum, o.sum) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            },
            min: opt_fold(self.min, o.min, f64::min),
            max: opt_fold(self.max, o.max, f64::max),
        })
    }

    /// `self - earlier` (cumulative points), `None` when the layouts differ or a count
    /// went down (a reset).
    pub(crate) fn minus(&self, e: &Hist) -> Option<Hist> {
        Some(Hist {
            dist: self.dist.bucketwise(&e.dist, u64::checked_sub)?,
            count: self.count.checked_sub(e.count)?,
            sum: match (self.sum, e.sum) {
                (Some(a), Some(b)) => Some(a - b),
                _ => None,
            },
            // min/max of a cumulative point cover its whole window: not of the step
            min: None,
            max: None,
        })
    }

    /// The `q` quantile (0..=1) estimated from the buckets (see the module doc), clamped to
    /// `min`/`max` when known; `None` when the distribution is empty.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        let v = self.dist.quantile(q)?;
        let v = match self.min {
            Some(m) if v < m => m,
            _ => v,
        };
        Some(match self.max {
            Some(m) if v > m => m,
            _ => v,
        })
    }
}

fn opt_fold(a: Option<f64>, b: Option<f64>, f: fn(f64, f64) -> f64) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(f(a, b)),
        (x, None) | (None, x) => x,
    }
}

impl Dist {
    /// `op` applied bucket by bucket to `self` and `other` (the one bookkeeping behind
    /// [`Hist::add`] and [`Hist::minus`]): explicit layouts must have the same bounds;
    /// exponential ones are first downscaled to the smaller scale, a bucket missing on
    /// one side counts 0 and empty buckets are dropped. `None` when the layouts differ or
    /// `op` refuses a bucket (an overflow, or a count that went down).
    fn bucketwise(&self, other: &Dist, op: impl Fn(u64, u64) -> Option<u64>) -> Option<Dist> {
        match (self, other) {
            (
                Dist::Explicit { bounds, counts },
                Dist::Explicit {
                    bounds: b2,
                    counts: c2,
                },
            ) if bounds == b2 && counts.len() == c2.len() => Some(Dist::Explicit {
                bounds: bounds.clone(),
                counts: counts
                    .iter()
                    .zip(c2)
                    .map(|(a, b)| op(*a, *b))
                    .collect::<Option<_>>()?,
            }),
            (Dist::Exp { scale: s1, .. }, Dist::Exp { scale: s2, .. }) => {
                let s = (*s1).min(*s2);
                let (
                    Dist::Exp { zero, pos, neg, .. },
                    Dist::Exp {
                        zero: z2,
                        pos: p2,
                        neg: n2,
                        ..
                    },
                ) = (self.downscale(s), other.downscale(s))
                else {
                    return None;
                };
                let each = |mut a: BTreeMap<i32, u64>, b: BTreeMap<i32, u64>| {
                    for (k, v) in b {
                        let x = a.entry(k).or_default();
                        *x = op(*x, v)?;
                    }
                    a.retain(|_, v| *v > 0);
                    Some(a)
                };
                Some(Dist::Exp {
                    scale: s,
                    zero: op(zero, z2)?,
                    pos: each(pos, p2)?,
                    neg: each(neg, n2)?,
                })
            }
            _ => None,
        }
    }

    /// The same distribution at a smaller (or equal) `scale`: index `i` becomes
    /// `i >> (old - new)` (OTLP data model, exponential histogram downscaling).
    fn downscale(&self, to: i32) -> Dist {
        match self {
            Dist::Exp {
                scale,
                zero,
                pos,
                neg,
            } if *scale > to => {
                let shift = (scale - to).min(31) as u32;
                let down = |m: &BTreeMap<i32, u64>| {
                    let mut out = BTreeMap::new();
                    for (k, v) in m {
                        *out.entry(k >> shift).or_default() += v;
                    }
                    out
                };
                Dist::Exp {
                    scale: to,
                    zero: *zero,
                    pos: down(pos),
                    neg: down(neg),
                }
            }
            other => other.clone(),
        }
    }

    fn quantile(&self, q: f64) -> Option<f64> {
        let q = q.clamp(0.0, 1.0);
        match self {
            Dist::Explicit { bounds, counts } => {
                let total: u64 = counts.iter().sum();
                if total == 0 || bounds.len() + 1 != counts.len() {
                    return None;
                }
                let rank = q * total as f64;
                let mut cum = 0u64;
                for (i, c) in counts.iter().enumerate() {
                    let before = cum;
                    cum += c;
                    if (cum as f64) < rank || *c == 0 {
                        continue;
                    }
                    if i == bounds.len() {
                        // the +Inf bucket: answer the highest finite bound
                        return bounds.last().copied();
                    }
                    let upper = bounds[i];
                    let lower = if i == 0 {
                        if upper > 0.0 {
                            0.0
                        } else {
                            return Some(upper);
                        }
                    } else {
                        bounds[i - 1]
                    };
                    let f = (rank - before as f64) / *c as f64;
                    return Some(lower + (upper - lower) * f);
                }
                bounds.last().copied()
            }
            Dist::Exp {
                scale,
                zero,
                pos,
                neg,
            } => {
                let total: u64 = pos.values().sum::<u64>() + neg.values().sum::<u64>() + zero;
                if total == 0 {
                    return None;
                }
                let base_log2 = (-f64::from(*scale)).exp2(); // log2(base)
                let pow = |x: f64| (x * base_log2).exp2(); // base^x
                let rank = q * total as f64;
                let mut cum = 0u64;
                // ascending values: negatives by decreasing magnitude, zero, positives
                for (i, c) in neg.iter().rev() {
                    let before = cum;
                    cum += c;
                    if (cum as f64) >= rank {
                        let f = (rank - before as f64) / *c as f64;
                        return Some(-pow(f64::from(*i) + 1.0 - f));
                    }
                }
                cum += zero;
                if *zero > 0 && (cum as f64) >= rank {
                    return Some(0.0);
                }
                for (i, c) in pos {
                    let before = cum;
                    cum += c;
                    if (cum as f64) >= rank {
                        let f = (rank - before as f64) / *c as f64;
                        return Some(pow(f64::from(*i) + f));
                    }
                }
                pos.keys().next_back().map(|i| pow(f64::from(*i) + 1.0))
            }
        }
    }
}

/// Series being aggregated.
struct Acc {
    series: MetricSeries,
    delta: bool,
    /// Current step index and its state.
    step: Option<(u64, StepState)>,
    /// Last cumulative histogram of the previous step (the baseline), with its start time.
    prev_hist: Option<(u64, Hist)>,
}

#[derive(Default)]
struct StepState {
    points: u64,
    value: Option<f64>,
    count: Option<u64>,
    sum: Option<f64>,
    hist: Option<Hist>,
    hist_start: u64,
    hist_bad: bool,
    /// Cumulative histograms: the payload of the step's last point, decoded only when the
    /// step closes (the earlier points of the step are covered by it).
    last_cumulative: Option<Vec<u8>>,
}

impl Acc {
    fn close(&mut self, from: u64, step_ns: u64) -> Result<(), StorageError> {
        let Some((k, mut st)) = self.step.take() else {
            return Ok(());
        };
        if let Some(payload) = st.last_cumulative.take() {
            let (_, _, p) = decode_point(&payload)?;
            st.hist_start = p.start_time_unix_nano;
            st.hist = Hist::from_point(&p);
            st.hist_bad = st.hist.is_none();
        }
        let mut out = StepValue {
            start_unix_nano: from + k * step_ns,
            points: st.points,
            value: st.value,
            count: st.count,
            sum: st.sum,
            ..StepValue::default()
        };
        if let Some(h) = st.hist.filter(|_| !st.hist_bad) {
            let observed = if self.delta {
                Some(h.clone())
            } else {
                match &self.prev_hist {
                    Some((start, prev)) if *start == st.hist_start => h.minus(prev),
                    _ => None,
                }
                .or_else(|| Some(h.clone()))
            };
            if let Some(o) = observed {
                out.count = Some(o.count);
                out.sum = o.sum;
                out.p50 = o.quantile(0.5);
                out.p90 = o.quantile(0.9);
                out.p99 = o.quantile(0.99);
            }
            if !self.delta {
                self.prev_hist = Some((st.hist_start, h));
            }
        }
        self.series.steps.push(out);
        Ok(())
    }
}

/// Points of one instrument per series per step (see the module doc).
pub(super) fn metric_series(
    conn: &Connection,
    q: &PointsQuery,
) -> Result<Vec<MetricSeries>, StorageError> {
    let mut sql = "SELECT series, time_unix_nano, value, count, sum, payload
         FROM metric_points INDEXED BY metric_points_name_time
         WHERE name = ? AND time_unix_nano >= ? AND time_unix_nano < ?"
        .to_string();
    let mut args = vec![
        SqlValue::Text(q.name.clone()),
        SqlValue::Integer(q.from_unix_nano.min(i64::MAX as u64) as i64),
        SqlValue::Integer(q.to_unix_nano.min(i64::MAX as u64) as i64),
    ];
    if let Some(s) = &q.service {
        sql.push_str(" AND service = ?");
        args.push(SqlValue::Text(s.clone()));
    }
    sql.push_str(" ORDER BY time_unix_nano, id");
    let step_ns = q.step_ns.max(1);
    snapshot(conn, |c| {
        let mut st = c.prepare_cached(&sql)?;
        let mut rows = st.query(params_from_iter(args.iter()))?;
        let mut accs: HashMap<i64, Acc> = HashMap::new();
        let mut order: Vec<i64> = Vec::new();
        while let Some(r) = rows.next()? {
            let key: i64 = r.get(0)?;
            let time = r.get::<_, i64>(1)? as u64;
            let value: Option<f64> = r.get(2)?;
            let count: Option<i64> = r.get(3)?;
            let sum: Option<f64> = r.get(4)?;
            let k = (time - q.from_unix_nano.min(time)) / step_ns;
            let acc = match accs.get_mut(&key) {
                Some(a) => a,
                None => {
                    let payload: Vec<u8> = r.get(5)?;
                    let (res, scope, p) = decode_point(&payload)?;
                    let d: Value = serde_json::from_str(&p.detail).unwrap_or(Value::Null);
                    let temporality = d
                        .get("aggregation_temporality")
                        .and_then(Value::as_str)
                        .map(str::to_string);
                    order.push(key);
                    accs.entry(key).or_insert(Acc {
                        delta: temporality.as_deref() == Some("AGGREGATION_TEMPORALITY_DELTA"),
                        series: MetricSeries {
                            key: key as u64,
                            resource: Arc::new(res),
                            scope: Arc::new(scope),
                            attributes: p.attributes,
                            kind: p.kind,
                            unit: p.unit,
                            description: p.description,
                            temporality,
                            steps: Vec::new(),
                        },
                        step: None,
                        prev_hist: None,
                    })
                }
            };
            if acc.step.as_ref().is_some_and(|(sk, _)| *sk != k) {
                acc.close(q.from_unix_nano, step_ns)?;
            }
            let kind = acc.series.kind;
            let delta = acc.delta;
            let (_, s) = acc.step.get_or_insert_with(|| (k, StepState::default()));
            s.points += 1;
            match kind {
                MetricKind::Gauge => s.value = value,
                MetricKind::Sum if delta => {
                    s.value = Some(s.value.unwrap_or(0.0) + value.unwrap_or(0.0))
                }
                MetricKind::Sum => s.value = value,
                MetricKind::Summary => {
                    s.count = count.map(|c| c as u64);
                    s.sum = sum;
                }
                MetricKind::Histogram | MetricKind::ExponentialHistogram if !delta => {
                    s.last_cumulative = Some(r.get(5)?);
                }
                MetricKind::Histogram | MetricKind::ExponentialHistogram => {
                    let payload: Vec<u8> = r.get(5)?;
                    let (_, _, p) = decode_point(&payload)?;
                    // delta points: the step's distribution is all of them merged
                    match Hist::from_point(&p) {
                        Some(h) => {
                            s.hist = match s.hist.take() {
                                None => Some(h),
                                Some(prev) => {
                                    let merged = prev.add(&h);
                                    if merged.is_none() {
                                        s.hist_bad = true;
                                    }
                                    merged
                                }
                            };
                        }
                        None => s.hist_bad = true,
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(order.len());
        for key in order {
            if let Some(mut a) = accs.remove(&key) {
                a.close(q.from_unix_nano, step_ns)?;
                out.push(a.series);
            }
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn explicit(bounds: &[f64], counts: &[u64]) -> Hist {
        Hist {
            dist: Dist::Explicit {
                bounds: bounds.to_vec(),
                counts: counts.to_vec(),
            },
            count: counts.iter().sum(),
            sum: None,
            min: None,
            max: None,
        }
    }

    #[test]
    fn explicit_quantiles_interpolate_linearly_like_histogram_quantile() {
        // 10 in (0,10], 10 in (10,20]: the median is the top of the first bucket
        let h = explicit(&[10.0, 20.0], &[10, 10, 0]);
        assert_eq!(h.quantile(0.5), Some(10.0));
        assert_eq!(h.quantile(0.75), Some(15.0));
        assert_eq!(h.quantile(0.25), Some(5.0));
        // everything in +Inf: the highest finite bound
        let h = explicit(&[10.0, 20.0], &[0, 0, 5]);
        assert_eq!(h.quantile(0.99), Some(20.0));
        assert_eq!(explicit(&[1.0], &[0, 0]).quantile(0.5), None);
    }

    #[test]
    fn quantiles_are_clamped_to_min_and_max() {
        let mut h = explicit(&[100.0], &[4, 0]);
        h.min = Some(30.0);
        h.max = Some(40.0);
        assert_eq!(h.quantile(0.01), Some(30.0));
        assert_eq!(h.quantile(0.99), Some(40.0));
    }

    #[test]
    fn exponential_quantiles_interpolate_geometrically() {
        // scale 0: base 2; bucket 1 covers (2, 4], bucket 2 covers (4, 8]
        let h = Hist {
            dist: Dist::Exp {
                scale: 0,
                zero: 0,
                pos: [(1, 10), (2, 10)].into_iter().collect(),
                neg: BTreeMap::new(),
            },
            count: 20,
            sum: None,
            min: None,
            max: None,
        };
        assert_eq!(h.quantile(0.5), Some(4.0));
        let p75 = h.quantile(0.75).unwrap();
        assert!((p75 - 4.0 * 2f64.sqrt()).abs() < 1e-9, "{p75}");
    }

    #[test]
    fn cumulative_histograms_subtract_and_refuse_resets() {
        let a = explicit(&[10.0], &[2, 1]);
        let b = explicit(&[10.0], &[5, 1]);
        let d = b.minus(&a).unwrap();
        assert_eq!(d.count, 3);
        assert_eq!(d.dist, explicit(&[10.0], &[3, 0]).dist);
        assert!(a.minus(&b).is_none(), "a count that went down is a reset");
        assert!(
            explicit(&[5.0], &[1, 1]).minus(&a).is_none(),
            "other bounds"
        );
    }

    #[test]
    fn exponential_merge_downscales_to_the_smaller_scale() {
        let fine = Hist {
            dist: Dist::Exp {
                scale: 1,
                zero: 1,
                pos: [(2, 3), (3, 4)].into_iter().collect(),
                neg: BTreeMap::new(),
            },
            count: 8,
            sum: Some(1.0),
            min: None,
            max: None,
        };
        let coarse = Hist {
            dist: Dist::Exp {
                scale: 0,
                zero: 0,
                pos: [(1, 1)].into_iter().collect(),
                neg: BTreeMap::new(),
            },
            count: 1,
            sum: Some(2.0),
            min: None,
            max: None,
        };
        let m = fine.add(&coarse).unwrap();
        assert_eq!(m.count, 9);
        assert_eq!(m.sum, Some(3.0));
        match m.dist {
            Dist::Exp {
                scale, zero, pos, ..
            } => {
                assert_eq!(scale, 0);
                assert_eq!(zero, 1);
                // scale-1 indices 2 and 3 both fold into scale-0 index 1
                assert_eq!(pos.into_iter().collect::<Vec<_>>(), vec![(1, 8)]);
            }
            other => panic!("{other:?}"),
        }
    }
}
