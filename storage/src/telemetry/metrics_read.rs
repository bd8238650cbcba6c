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

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection};
use serde_json::Value;

use super::encode::PointRow;
use super::metrics_hist::Hist;
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
             FROM metric_points p INDEXED BY metric_points_series_time
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

/// One (series, step) as SQL aggregated it; `last_*` are the columns of the step's latest
/// point (SQLite "bare columns" of the `max(time_unix_nano)` aggregate: of points with
/// the same latest time, one of them).
struct Group {
    k: u64,
    points: u64,
    last_id: i64,
    last_value: Option<f64>,
    last_count: Option<i64>,
    last_sum: Option<f64>,
    /// `total(value)`: the step's values added (delta sums).
    total: f64,
}

/// The `WHERE` clause selecting one instrument's points in the window, for
/// `metric_points_series_time`, with its parameters: the service by equality, or each
/// service of the instrument (`metric_instruments`) as one index range.
fn window_filter(q: &PointsQuery) -> (String, Vec<SqlValue>) {
    let mut args = vec![SqlValue::Text(q.name.clone())];
    let mut sql = "name = ? AND service ".to_string();
    match &q.service {
        Some(s) => {
            sql.push_str("= ?");
            args.push(SqlValue::Text(s.clone()));
        }
        None => {
            sql.push_str("IN (SELECT service FROM metric_instruments WHERE name = ?)");
            args.push(SqlValue::Text(q.name.clone()));
        }
    }
    sql.push_str(" AND time_unix_nano >= ? AND time_unix_nano < ?");
    args.push(SqlValue::Integer(
        q.from_unix_nano.min(i64::MAX as u64) as i64
    ));
    args.push(SqlValue::Integer(q.to_unix_nano.min(i64::MAX as u64) as i64));
    (sql, args)
}

/// A step's histogram fields from its observed distribution.
fn fill_hist(out: &mut StepValue, h: &Hist) {
    out.count = Some(h.count);
    out.sum = h.sum;
    out.p50 = h.quantile(0.5);
    out.p90 = h.quantile(0.9);
    out.p99 = h.quantile(0.99);
}

/// Points of one instrument per series per step (see the module doc). The steps are
/// aggregated in SQL over the covering index `metric_points_series_time` (`GROUP BY series,
/// step`); payloads are decoded only for each series' first point (its identity), each
/// cumulative histogram step's last point, and the points of delta histograms.
pub(super) fn metric_series(
    conn: &Connection,
    q: &PointsQuery,
) -> Result<Vec<MetricSeries>, StorageError> {
    let step_ns = q.step_ns.max(1);
    let from = q.from_unix_nano.min(i64::MAX as u64) as i64;
    let (filter, filter_args) = window_filter(q);
    let group_sql = format!(
        "SELECT series, (time_unix_nano - ?) / ? AS k, count(*), max(time_unix_nano), id, value,
                count, sum, total(value)
         FROM metric_points INDEXED BY metric_points_series_time
         WHERE {filter} GROUP BY series, k ORDER BY series, k"
    );
    let mut group_args = vec![
        SqlValue::Integer(from),
        SqlValue::Integer(step_ns.min(i64::MAX as u64) as i64),
    ];
    group_args.extend(filter_args.iter().cloned());
    let in_step_sql = format!(
        "SELECT time_unix_nano, id, payload FROM metric_points INDEXED BY metric_points_series_time
         WHERE {filter} AND series = ? ORDER BY time_unix_nano, id"
    );
    snapshot(conn, |c| {
        let mut groups: Vec<(i64, Vec<Group>)> = Vec::new();
        {
            let mut st = c.prepare_cached(&group_sql)?;
            let mut rows = st.query(params_from_iter(group_args.iter()))?;
            while let Some(r) = rows.next()? {
                let series: i64 = r.get(0)?;
                let g = Group {
                    k: r.get::<_, i64>(1)? as u64,
                    points: r.get::<_, i64>(2)? as u64,
                    last_id: r.get(4)?,
                    last_value: r.get(5)?,
                    last_count: r.get(6)?,
                    last_sum: r.get(7)?,
                    total: r.get(8)?,
                };
                match groups.last_mut() {
                    Some((s, v)) if *s == series => v.push(g),
                    _ => groups.push((series, vec![g])),
                }
            }
        }
        // points of one series in a window, oldest first (time, id, payload)
        let mut in_step = c.prepare_cached(&in_step_sql)?;
        let mut points_of = |series: i64, lo: u64, hi: u64| {
            let mut args = filter_args.clone();
            let n = args.len();
            args[n - 2] = SqlValue::Integer(lo.min(i64::MAX as u64) as i64);
            args[n - 1] = SqlValue::Integer(hi.min(i64::MAX as u64) as i64);
            args.push(SqlValue::Integer(series));
            in_step
                .query_map(params_from_iter(args.iter()), |r| {
                    Ok((
                        r.get::<_, i64>(0)? as u64,
                        r.get::<_, i64>(1)?,
                        r.get::<_, Vec<u8>>(2)?,
                    ))
                })?
                .collect::<Result<Vec<_>, rusqlite::Error>>()
        };
        let mut by_id = c.prepare_cached("SELECT payload FROM metric_points WHERE id = ?1")?;
        let step_start = |k: u64| q.from_unix_nano.saturating_add(k.saturating_mul(step_ns));
        let mut out: Vec<((u64, i64), MetricSeries)> = Vec::with_capacity(groups.len());
        for (key, steps) in groups {
            let Some(first) = steps.first() else { continue };
            let lo = step_start(first.k);
            let first_points = points_of(key, lo, lo.saturating_add(step_ns))?;
            let Some((first_time, first_id, payload)) = first_points.first() else {
                continue;
            };
            let (res, scope, p) = decode_point(payload)?;
            let d: Value = serde_json::from_str(&p.detail).unwrap_or(Value::Null);
            let temporality = d
                .get("aggregation_temporality")
                .and_then(Value::as_str)
                .map(str::to_string);
            let delta = temporality.as_deref() == Some("AGGREGATION_TEMPORALITY_DELTA");
            let mut series = MetricSeries {
                key: key as u64,
                resource: Arc::new(res),
                scope: Arc::new(scope),
                attributes: p.attributes,
                kind: p.kind,
                unit: p.unit,
                description: p.description,
                temporality,
                steps: Vec::with_capacity(steps.len()),
            };
            let is_hist = matches!(
                series.kind,
                MetricKind::Histogram | MetricKind::ExponentialHistogram
            );
            // delta histograms: every point of the window, merged per step
            let mut delta_points = if is_hist && delta {
                points_of(key, q.from_unix_nano, q.to_unix_nano)?.into_iter()
            } else {
                Vec::new().into_iter()
            }
            .peekable();
            let mut prev_hist: Option<(u64, Hist)> = None;
            for g in &steps {
                let mut sv = StepValue {
                    start_unix_nano: step_start(g.k),
                    points: g.points,
                    ..StepValue::default()
                };
                match series.kind {
                    MetricKind::Gauge => sv.value = g.last_value,
                    MetricKind::Sum if delta => sv.value = Some(g.total),
                    MetricKind::Sum => sv.value = g.last_value,
                    MetricKind::Summary => {
                        sv.count = g.last_count.map(|c| c as u64);
                        sv.sum = g.last_sum;
                    }
                    _ if delta => {
                        let end = step_start(g.k).saturating_add(step_ns);
                        let mut merged: Option<Option<Hist>> = None;
                        while let Some((_, _, payload)) = delta_points.next_if(|(t, _, _)| *t < end)
                        {
                            let (_, _, p) = decode_point(&payload)?;
                            let h = Hist::from_point(&p);
                            merged = Some(match merged {
                                None => h,
                                Some(acc) => acc.zip(h).and_then(|(a, b)| a.add(&b)),
                            });
                        }
                        if let Some(Some(h)) = merged {
                            fill_hist(&mut sv, &h);
                        }
                    }
                    _ => {
                        let payload: Vec<u8> = by_id.query_row([g.last_id], |r| r.get(0))?;
                        let (_, _, p) = decode_point(&payload)?;
                        if let Some(h) = Hist::from_point(&p) {
                            let start = p.start_time_unix_nano;
                            let observed = match &prev_hist {
                                Some((s, prev)) if *s == start => h.minus(prev),
                                _ => None,
                            };
                            fill_hist(&mut sv, observed.as_ref().unwrap_or(&h));
                            prev_hist = Some((start, h));
                        }
                    }
                }
                series.steps.push(sv);
            }
            out.push(((*first_time, *first_id), series));
        }
        // series in the order of their first point, as they arrived
        out.sort_by_key(|(first, _)| *first);
        Ok(out.into_iter().map(|(_, s)| s).collect())
    })
}
