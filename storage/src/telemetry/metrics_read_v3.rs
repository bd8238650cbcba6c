//! The points query as migration 3 ran it (`GROUP BY series, step` in SQL over the window,
//! then one decode per step where needed), kept only as the reference the streaming query
//! of `metrics_read.rs` is tested against: both must answer the same series and steps.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use rusqlite::types::Value as SqlValue;
use rusqlite::{params_from_iter, Connection};
use serde_json::Value;

use super::metrics_hist::Hist;
use super::metrics_read::{fill_hist, MetricSeries, PointsQuery, StepValue};
use super::read::snapshot;
use crate::error::StorageError;
use crate::model::{MetricKind, MetricPoint, Resource, Scope};

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

/// Points of one instrument per series per step (see the module doc). The steps are
/// aggregated in SQL over the covering index `metric_points_series_time` (`GROUP BY series,
/// step`); payloads are decoded only for each series' first point (its identity), each
/// cumulative histogram step's last point, and the points of delta histograms.
pub(crate) fn metric_series(
    conn: &Connection,
    q: &PointsQuery,
) -> Result<Vec<MetricSeries>, StorageError> {
    let step_ns = q.step_ns.max(1);
    let from = q.from_unix_nano.min(i64::MAX as u64) as i64;
    let (filter, filter_args) = window_filter(q);
    let group_sql = format!(
        "SELECT series, (time_unix_nano - ?) / ? AS k, count(*), max(time_unix_nano), id, value,
                count, sum, total(value)
         FROM metric_points
         WHERE {filter} GROUP BY series, k ORDER BY series, k"
    );
    let mut group_args = vec![
        SqlValue::Integer(from),
        SqlValue::Integer(step_ns.min(i64::MAX as u64) as i64),
    ];
    group_args.extend(filter_args.iter().cloned());
    let in_step_sql = format!(
        "SELECT time_unix_nano, id, payload FROM metric_points
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
