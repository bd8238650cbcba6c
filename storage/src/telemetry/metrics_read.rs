//! Metric reads: the stored instruments (`GET /api/v1/metrics`) and one instrument's
//! points per series, aggregated per step (`GET /api/v1/metrics/{name}/points`).
//!
//! Series: one per (resource attributes, scope name and version, point attributes), the
//! `series` column (see `schema.rs`, migration 2). Steps are `[from + k·step, from +
//! (k+1)·step)`; a step with no point is left out. Per step and series:
//!
//! - gauge: `value` = the last point's value in the step (of points at the same time, the
//!   one stored last);
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

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::encode::PointRow;
use super::metrics_hist::Hist;
use super::read::snapshot;
use super::{QueryError, MAX_NAMES_PAGE};
use crate::error::StorageError;
use crate::model::{KeyValue, MetricKind, MetricPoint, Resource, Scope};

/// The common table `s(x)` of [`SERIES_SQL`]: the distinct series of `(?1, ?2)`, then NULL.
macro_rules! series_cte {
    () => {
        "
WITH RECURSIVE s(x) AS (
    SELECT (SELECT series FROM metric_points INDEXED BY metric_points_series
            WHERE name = ?1 AND service = ?2 ORDER BY series LIMIT 1)
    UNION ALL
    SELECT (SELECT series FROM metric_points INDEXED BY metric_points_series
            WHERE name = ?1 AND service = ?2 AND series > s.x ORDER BY series LIMIT 1)
    FROM s WHERE s.x IS NOT NULL
)
"
    };
}

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

/// What one retention transaction deleted of one instrument: `(name, service)` →
/// (points, oldest point time, newest point time), ns.
pub(super) type PointsGone = HashMap<(String, String), (i64, i64, i64)>;

/// Keeps `metric_instruments` exact in the transaction that deleted points `gone`: each
/// instrument's count goes down by what it lost, an instrument left without points goes,
/// and its first (last) time is read again when a deleted point may have been its oldest
/// (newest): one seek per series (the skip-scan of `SERIES_SQL`). Counting every
/// instrument's points again after a whole size step (`recompute_instruments`) left the
/// list wrong while the step ran on at the cap (an outside-style round saw counts 2-11x
/// the points stored), and it reads every stored point: at a 2 GiB cap, millions per step.
pub(super) fn forget_points(conn: &Connection, gone: &PointsGone) -> Result<(), rusqlite::Error> {
    for ((name, service), &(n, oldest, newest)) in gone {
        let left: Option<(i64, i64, i64)> = conn
            .prepare_cached(
                "UPDATE metric_instruments SET point_count = point_count - ?3
                 WHERE name = ?1 AND service = ?2
                 RETURNING point_count, first_time, last_time",
            )?
            .query_row(params![name, service, n], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()?;
        let Some((count, first, last)) = left else {
            continue;
        };
        if count <= 0 {
            conn.prepare_cached("DELETE FROM metric_instruments WHERE name = ?1 AND service = ?2")?
                .execute(params![name, service])?;
            continue;
        }
        if oldest <= first {
            reread_edge(conn, name, service, Edge::First)?;
        }
        if newest >= last {
            reread_edge(conn, name, service, Edge::Last)?;
        }
    }
    Ok(())
}

/// The read of one end of an instrument's time range: `$agg` of each series' first point
/// in `$order`, one seek per series (the skip-scan of `SERIES_SQL`).
macro_rules! edge_sql {
    ($agg:literal, $order:literal) => {
        concat!(
            series_cte!(),
            "SELECT ",
            $agg,
            "((SELECT time_unix_nano FROM metric_points INDEXED BY metric_points_series
                 WHERE name = ?1 AND service = ?2 AND series = s.x
                 ORDER BY time_unix_nano ",
            $order,
            " LIMIT 1)) FROM s WHERE x IS NOT NULL"
        )
    };
}

/// Which end of an instrument's time range [`reread_edge`] reads again.
#[derive(Clone, Copy)]
enum Edge {
    /// `first_time`: the oldest point's time.
    First,
    /// `last_time`: the newest point's time.
    Last,
}

impl Edge {
    /// The read of this end (`?1` name, `?2` service) and the update that stores it (`?3`).
    fn sql(self) -> (&'static str, &'static str) {
        match self {
            Edge::First => (
                edge_sql!("min", "ASC"),
                "UPDATE metric_instruments SET first_time = ?3 WHERE name = ?1 AND service = ?2",
            ),
            Edge::Last => (
                edge_sql!("max", "DESC"),
                "UPDATE metric_instruments SET last_time = ?3 WHERE name = ?1 AND service = ?2",
            ),
        }
    }
}

/// Reads one end of an instrument's time range again from its stored points (one seek
/// per series, the skip-scan of `SERIES_SQL`) and stores it; left as it is when no point
/// is stored.
fn reread_edge(
    conn: &Connection,
    name: &str,
    service: &str,
    edge: Edge,
) -> Result<(), rusqlite::Error> {
    let (read, update) = edge.sql();
    let t: Option<i64> = conn
        .prepare_cached(read)?
        .query_row(params![name, service], |r| r.get(0))?;
    if let Some(t) = t {
        conn.prepare_cached(update)?
            .execute(params![name, service, t])?;
    }
    Ok(())
}

/// One page of stored instruments, by name then service.
#[derive(Clone, Debug, PartialEq)]
pub struct InstrumentPage {
    /// The instruments.
    pub items: Vec<Instrument>,
    /// Cursor for the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

/// A page cursor: the (name, service) of the last instrument shown, each in hex (names may
/// hold any character), as `<name hex>.<service hex>`.
fn encode_cursor(i: &Instrument) -> String {
    format!("{}.{}", hex::encode(&i.name), hex::encode(&i.service))
}

fn decode_cursor(s: &str) -> Result<(String, String), QueryError> {
    let (n, sv) = s.split_once('.').ok_or(QueryError::BadCursor)?;
    let text = |h: &str| {
        hex::decode(h)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or(QueryError::BadCursor)
    };
    Ok((text(n)?, text(sv)?))
}

/// The stored instruments, by name then service, a page at a time: after `cursor` (the
/// previous page's `next_cursor`), at most `limit` (held to 1..=[`MAX_NAMES_PAGE`]);
/// optionally of one service. Without a service the page is read along the primary key
/// `(name, service)`, its rows only; one service's filters that walk.
pub(super) fn instruments(
    conn: &Connection,
    service: Option<&str>,
    cursor: Option<&str>,
    limit: usize,
) -> Result<InstrumentPage, QueryError> {
    let after = cursor.map(decode_cursor).transpose()?;
    let limit = limit.clamp(1, MAX_NAMES_PAGE);
    let mut sql = String::from(
        "SELECT name, service, kind, unit, description, point_count, first_time, last_time
         FROM metric_instruments WHERE 1",
    );
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    if let Some(s) = service {
        sql.push_str(" AND service = ?");
        args.push(s.to_string().into());
    }
    if let Some((n, s)) = after {
        sql.push_str(" AND (name, service) > (?, ?)");
        args.push(n.into());
        args.push(s.into());
    }
    sql.push_str(" ORDER BY name, service LIMIT ?");
    args.push((limit as i64 + 1).into());
    let mut st = conn.prepare_cached(&sql).map_err(StorageError::from)?;
    let rows = st
        .query_map(rusqlite::params_from_iter(args), |r| {
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
        })
        .map_err(StorageError::from)?;
    let mut items = rows
        .collect::<Result<Vec<_>, _>>()
        .map_err(StorageError::from)?;
    let more = items.len() > limit;
    items.truncate(limit);
    let next_cursor = if more {
        items.last().map(encode_cursor)
    } else {
        None
    };
    Ok(InstrumentPage { items, next_cursor })
}

/// Whether an instrument named `name` is stored (of any service): one seek.
pub(super) fn instrument_known(conn: &Connection, name: &str) -> Result<bool, StorageError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM metric_instruments WHERE name = ?1 LIMIT 1")?
        .query_row([name], |_| Ok(()))
        .optional()?
        .is_some())
}

fn decode_point(payload: &[u8]) -> Result<(Resource, Scope, MetricPoint), StorageError> {
    postcard::from_bytes(payload).map_err(|e| StorageError::Corrupt(e.to_string()))
}

/// Borrowing mirrors of the stored payload `(Resource, Scope, MetricPoint)` (the same
/// fields in the same order, so the same postcard encoding), for the histogram steps:
/// they need only a point's kind, start time, `count`, `sum` and `detail`, and reading
/// the strings in place saves an allocation per string and attribute of every step's
/// payload. `tests::lean_payload_reads_what_the_full_decode_reads` holds them to the model.
mod lean {
    use serde::Deserialize;

    use crate::model::MetricKind;

    /// `model::AnyValue`.
    #[derive(Deserialize)]
    #[allow(dead_code)] // read only to move past it
    pub(super) enum AnyValue<'a> {
        Empty,
        String(&'a str),
        Bool(bool),
        Int(i64),
        Double(f64),
        Bytes(Vec<u8>),
        Array(#[serde(borrow)] Vec<AnyValue<'a>>),
        KvList(#[serde(borrow)] Vec<KeyValue<'a>>),
    }

    /// `model::KeyValue`.
    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub(super) struct KeyValue<'a> {
        key: &'a str,
        #[serde(borrow)]
        value: AnyValue<'a>,
    }

    /// `model::Resource`.
    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub(super) struct Resource<'a> {
        #[serde(borrow)]
        attributes: Vec<KeyValue<'a>>,
        dropped_attributes_count: u32,
        schema_url: &'a str,
    }

    /// `model::Scope`.
    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub(super) struct Scope<'a> {
        name: &'a str,
        version: &'a str,
        #[serde(borrow)]
        attributes: Vec<KeyValue<'a>>,
        dropped_attributes_count: u32,
        schema_url: &'a str,
    }

    /// `model::MetricPoint`.
    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub(super) struct MetricPoint<'a> {
        name: &'a str,
        description: &'a str,
        unit: &'a str,
        pub(super) kind: MetricKind,
        pub(super) start_time_unix_nano: u64,
        time_unix_nano: u64,
        value: Option<f64>,
        pub(super) count: Option<u64>,
        pub(super) sum: Option<f64>,
        #[serde(borrow)]
        attributes: Vec<KeyValue<'a>>,
        pub(super) detail: &'a str,
    }

    /// A whole stored payload.
    pub(super) type Payload<'a> = (Resource<'a>, Scope<'a>, MetricPoint<'a>);
}

/// Stored payloads by point id, read into one reused buffer.
struct Payloads<'c> {
    by_id: rusqlite::CachedStatement<'c>,
    buf: Vec<u8>,
}

impl Payloads<'_> {
    /// The payload of point `id` (valid until the next call).
    fn get(&mut self, id: i64) -> Result<&[u8], StorageError> {
        let buf = &mut self.buf;
        buf.clear();
        self.by_id.query_row([id], |r| {
            buf.extend_from_slice(r.get_ref(0)?.as_blob()?);
            Ok(())
        })?;
        Ok(&self.buf)
    }
}

/// A stored point's histogram and start time, read from its payload without decoding
/// its strings into owned values; `Ok(None)` when it holds no histogram.
fn hist_of(payload: &[u8]) -> Result<Option<(u64, Hist)>, StorageError> {
    let (_, _, p): lean::Payload<'_> =
        postcard::from_bytes(payload).map_err(|e| StorageError::Corrupt(e.to_string()))?;
    Ok(Hist::from_detail(p.kind, p.count, p.sum, p.detail).map(|h| (p.start_time_unix_nano, h)))
}

/// One (series, step) as the points query aggregated it; `last_*` are the columns of the
/// step's latest point (greatest `(time_unix_nano, id)`).
struct Group {
    k: u64,
    points: u64,
    last_time: i64,
    last_id: i64,
    last_value: Option<f64>,
    last_count: Option<i64>,
    last_sum: Option<f64>,
    /// The step's values added (delta sums), as SQLite's `total()` adds them
    /// (Kahan-Babuska-Neumaier summation, SQLite 3.43+ `func.c`).
    total: f64,
    total_err: f64,
    /// `(time, id)` of each point, for delta histograms only (their payloads are merged).
    ids: Vec<(i64, i64)>,
}

impl Group {
    fn new(k: u64) -> Self {
        Group {
            k,
            points: 0,
            last_time: i64::MIN,
            last_id: i64::MIN,
            last_value: None,
            last_count: None,
            last_sum: None,
            total: 0.0,
            total_err: 0.0,
            ids: Vec::new(),
        }
    }

    /// One Kahan-Babuska-Neumaier step, as SQLite's `total()` does for REAL values.
    fn add_value(&mut self, r: f64) {
        let s = self.total;
        let t = s + r;
        if s.abs() > r.abs() {
            self.total_err += (s - t) + r;
        } else {
            self.total_err += (r - t) + s;
        }
        self.total = t;
    }

    fn total(&self) -> f64 {
        self.total + self.total_err
    }
}

/// The services an instrument's points query reads: the one asked for, or every service
/// of the instrument (`metric_instruments`).
fn services(conn: &Connection, q: &PointsQuery) -> Result<Vec<String>, rusqlite::Error> {
    match &q.service {
        Some(s) => Ok(vec![s.clone()]),
        None => conn
            .prepare_cached(
                "SELECT service FROM metric_instruments WHERE name = ?1 ORDER BY service",
            )?
            .query_map([&q.name], |r| r.get(0))?
            .collect(),
    }
}

/// The distinct series of one (name, service): a skip-scan of `metric_points_series`, one
/// index seek per series.
const SERIES_SQL: &str = concat!(series_cte!(), "SELECT x FROM s WHERE x IS NOT NULL");

/// One series' points in the window, in index order (time), from the covering index.
const SERIES_POINTS_SQL: &str = "
SELECT time_unix_nano, id, value, count, sum FROM metric_points INDEXED BY metric_points_series
WHERE name = ?1 AND service = ?2 AND series = ?3 AND time_unix_nano >= ?4 AND time_unix_nano < ?5
ORDER BY time_unix_nano";

/// One series' steps (points in the window grouped by step, oldest first); `None` when it
/// has no point in the window. `keep_ids`: keep each point's `(time, id)` (delta
/// histograms, whose payloads are merged).
fn series_steps(
    conn: &Connection,
    q: &PointsQuery,
    service: &str,
    series: i64,
    keep_ids: bool,
) -> Result<Option<Vec<Group>>, rusqlite::Error> {
    let from = q.from_unix_nano.min(i64::MAX as u64) as i64;
    let to = q.to_unix_nano.min(i64::MAX as u64) as i64;
    let step = q.step_ns.clamp(1, i64::MAX as u64) as i64;
    let mut st = conn.prepare_cached(SERIES_POINTS_SQL)?;
    let mut rows = st.query(params![q.name, service, series, from, to])?;
    let mut groups: Vec<Group> = Vec::new();
    while let Some(r) = rows.next()? {
        let time: i64 = r.get(0)?;
        let id: i64 = r.get(1)?;
        let k = ((time - from) / step) as u64;
        if groups.last().is_none_or(|g| g.k != k) {
            groups.push(Group::new(k));
        }
        let Some(g) = groups.last_mut() else { continue };
        g.points += 1;
        let value: Option<f64> = r.get(2)?;
        if let Some(v) = value {
            g.add_value(v);
        }
        if (time, id) > (g.last_time, g.last_id) {
            g.last_time = time;
            g.last_id = id;
            g.last_value = value;
            g.last_count = r.get(3)?;
            g.last_sum = r.get(4)?;
        }
        if keep_ids {
            g.ids.push((time, id));
        }
    }
    Ok((!groups.is_empty()).then_some(groups))
}

/// A step's histogram fields from its observed distribution.
pub(super) fn fill_hist(out: &mut StepValue, h: &Hist) {
    out.count = Some(h.count);
    out.sum = h.sum;
    out.p50 = h.quantile(0.5);
    out.p90 = h.quantile(0.9);
    out.p99 = h.quantile(0.99);
}

/// Points of one instrument per series per step (see the module doc). Each series is read
/// in index order from the covering index `metric_points_series` (`name, service, series,
/// time`, then the aggregated columns; no sort) and grouped by step as it streams; payloads
/// are decoded only for each series' first point (its identity), each cumulative histogram
/// step's last point, and the points of delta histograms.
pub(super) fn metric_series(
    conn: &Connection,
    q: &PointsQuery,
) -> Result<Vec<MetricSeries>, StorageError> {
    let step_ns = q.step_ns.max(1);
    snapshot(conn, |c| {
        let mut payloads = Payloads {
            by_id: c.prepare_cached("SELECT payload FROM metric_points WHERE id = ?1")?,
            buf: Vec::new(),
        };
        let step_start = |k: u64| q.from_unix_nano.saturating_add(k.saturating_mul(step_ns));
        let mut out: Vec<((i64, i64), MetricSeries)> = Vec::new();
        for service in services(c, q)? {
            let keys = c
                .prepare_cached(SERIES_SQL)?
                .query_map(params![q.name, service], |r| r.get::<_, i64>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            for key in keys {
                // the identity first: whether the series is a delta histogram decides
                // whether the step's point ids are kept
                let Some((first_time, first_id)) = series_first(c, q, &service, key)? else {
                    continue;
                };
                let (res, scope, p) = decode_point(payloads.get(first_id)?)?;
                let d: Value = serde_json::from_str(&p.detail).unwrap_or(Value::Null);
                let temporality = d
                    .get("aggregation_temporality")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let delta = temporality.as_deref() == Some("AGGREGATION_TEMPORALITY_DELTA");
                let is_hist = matches!(
                    p.kind,
                    MetricKind::Histogram | MetricKind::ExponentialHistogram
                );
                let Some(steps) = series_steps(c, q, &service, key, is_hist && delta)? else {
                    continue;
                };
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
                let mut prev_hist: Option<(u64, Hist)> = None;
                for mut g in steps {
                    let mut sv = StepValue {
                        start_unix_nano: step_start(g.k),
                        points: g.points,
                        ..StepValue::default()
                    };
                    match series.kind {
                        MetricKind::Gauge => sv.value = g.last_value,
                        MetricKind::Sum if delta => sv.value = Some(g.total()),
                        MetricKind::Sum => sv.value = g.last_value,
                        MetricKind::Summary => {
                            sv.count = g.last_count.map(|c| c as u64);
                            sv.sum = g.last_sum;
                        }
                        _ if delta => {
                            // merged in arrival order within equal times, as stored
                            g.ids.sort_unstable();
                            let mut merged: Option<Option<Hist>> = None;
                            for (_, id) in &g.ids {
                                let h = hist_of(payloads.get(*id)?)?.map(|(_, h)| h);
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
                            if let Some((start, h)) = hist_of(payloads.get(g.last_id)?)? {
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
                out.push(((first_time, first_id), series));
            }
        }
        // series in the order of their first point, as they arrived
        out.sort_by_key(|(first, _)| *first);
        Ok(out.into_iter().map(|(_, s)| s).collect())
    })
}

/// A series' first point `(time, id)` in the window (one index seek; among points of the
/// same first time, the first stored).
fn series_first(
    conn: &Connection,
    q: &PointsQuery,
    service: &str,
    series: i64,
) -> Result<Option<(i64, i64)>, rusqlite::Error> {
    let from = q.from_unix_nano.min(i64::MAX as u64) as i64;
    let to = q.to_unix_nano.min(i64::MAX as u64) as i64;
    conn.prepare_cached(
        "SELECT time_unix_nano, min(id) FROM metric_points INDEXED BY metric_points_series
         WHERE name = ?1 AND service = ?2 AND series = ?3 AND time_unix_nano = (
             SELECT min(time_unix_nano) FROM metric_points INDEXED BY metric_points_series
             WHERE name = ?1 AND service = ?2 AND series = ?3
               AND time_unix_nano >= ?4 AND time_unix_nano < ?5)",
    )?
    .query_row(params![q.name, service, series, from, to], |r| {
        Ok(r.get::<_, Option<i64>>(0)?.zip(r.get::<_, Option<i64>>(1)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AnyValue, MetricBatch, ResourceMetrics, ScopeMetrics};
    use crate::{Storage, StorageConfig};

    const SEC: u64 = 1_000_000_000;

    /// A small deterministic generator (64-bit LCG, Knuth's MMIX constants).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % n
        }
    }

    const CUM: &str = "AGGREGATION_TEMPORALITY_CUMULATIVE";
    const DELTA: &str = "AGGREGATION_TEMPORALITY_DELTA";

    /// Point `n` of series `set` of an instrument, at `time`; cumulative histograms reset
    /// (new start time) at n = 40.
    fn point(name: &str, kind: MetricKind, temp: &str, set: u64, n: u64, time: u64) -> MetricPoint {
        let start = if n >= 40 { 40 * SEC } else { 0 };
        let c = if temp == CUM { n % 40 + 1 } else { 1 + n % 3 } * 4;
        let (value, detail) = match kind {
            MetricKind::Gauge => (Some((n * 7 + set) as f64 * 0.1 - 3.0), "{}".to_string()),
            MetricKind::Sum => (
                Some(if temp == CUM {
                    c as f64
                } else {
                    0.1 * (n % 7) as f64 + 1e-3
                }),
                format!(r#"{{"aggregation_temporality":"{temp}","is_monotonic":true}}"#),
            ),
            MetricKind::Histogram => (
                None,
                format!(
                    r#"{{"aggregation_temporality":"{temp}","explicit_bounds":[1,5,10],"bucket_counts":["{}","{}","{}","{}"],"min":0.5,"max":30}}"#,
                    c / 4,
                    c / 2,
                    c / 8,
                    c - c / 4 - c / 2 - c / 8
                ),
            ),
            MetricKind::ExponentialHistogram => (
                None,
                format!(
                    r#"{{"aggregation_temporality":"{temp}","scale":{},"zero_count":"1","positive":{{"offset":2,"bucket_counts":["{}","{}"]}},"min":0,"max":40}}"#,
                    if temp == DELTA { n % 2 } else { 1 },
                    c / 2,
                    c - c / 2 - 1
                ),
            ),
            _ => (None, r#"{"quantile_values":[]}"#.to_string()),
        };
        let hist = !matches!(kind, MetricKind::Gauge | MetricKind::Sum);
        MetricPoint {
            name: name.into(),
            description: format!("{name} description"),
            unit: "ms".into(),
            kind,
            start_time_unix_nano: start,
            time_unix_nano: time,
            value,
            count: hist.then_some(c),
            sum: hist.then_some(c as f64 * 2.5),
            attributes: vec![KeyValue::new("set", AnyValue::String(format!("s{set}")))],
            detail,
        }
    }

    /// The borrowing payload mirror reads what the full decode reads, for a payload with
    /// every attribute value kind, encoded as the writer encodes it.
    #[test]
    fn lean_payload_reads_what_the_full_decode_reads() {
        let kv = |k: &str, v: AnyValue| KeyValue::new(k, v);
        let every = vec![
            kv("e", AnyValue::Empty),
            kv("s", AnyValue::String("x".into())),
            kv("b", AnyValue::Bool(true)),
            kv("i", AnyValue::Int(-7)),
            kv("d", AnyValue::Double(f64::NAN)),
            kv("y", AnyValue::Bytes(vec![0, 255, 3])),
            kv(
                "a",
                AnyValue::Array(vec![AnyValue::Int(1), AnyValue::String("z".into())]),
            ),
            kv(
                "l",
                AnyValue::KvList(vec![kv("n", AnyValue::Array(vec![AnyValue::Empty]))]),
            ),
        ];
        let res = Resource {
            attributes: every.clone(),
            dropped_attributes_count: 3,
            schema_url: "https://r".into(),
        };
        let scope = Scope {
            name: "sc".into(),
            version: "1.2".into(),
            attributes: every.clone(),
            dropped_attributes_count: 4,
            schema_url: "https://s".into(),
        };
        for (kind, temp) in [
            (MetricKind::Histogram, CUM),
            (MetricKind::ExponentialHistogram, DELTA),
            (MetricKind::Gauge, CUM),
        ] {
            let mut p = point("h", kind, temp, 1, 45, 99 * SEC);
            p.attributes = every.clone();
            let prefix = postcard::to_allocvec(&(&res, &scope)).unwrap();
            let payload = postcard::to_extend(&p, prefix).unwrap();
            let (_, _, full) = decode_point(&payload).unwrap();
            let want = Hist::from_point(&full).map(|h| (full.start_time_unix_nano, h));
            assert_eq!(want.is_some(), kind != MetricKind::Gauge);
            assert_eq!(hist_of(&payload).unwrap(), want);
            assert!(hist_of(&payload[..payload.len() - 1]).is_err());
        }
    }

    /// The streaming points query answers exactly what migration 3's `GROUP BY` query
    /// answered (`metrics_read_v3.rs`), for every kind and temporality, several services,
    /// gaps, equal times across series, a cumulative reset, windows cut mid-series and
    /// steps from 1 s to the whole window.
    #[tokio::test]
    async fn the_streaming_points_query_answers_what_the_group_by_query_did() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stallwatch.db");
        let st = Storage::open(StorageConfig::new(&path)).unwrap();
        let instruments = [
            ("g", MetricKind::Gauge, CUM),
            ("cs", MetricKind::Sum, CUM),
            ("ds", MetricKind::Sum, DELTA),
            ("ch", MetricKind::Histogram, CUM),
            ("dh", MetricKind::Histogram, DELTA),
            ("ce", MetricKind::ExponentialHistogram, CUM),
            ("de", MetricKind::ExponentialHistogram, DELTA),
            ("sm", MetricKind::Summary, CUM),
        ];
        let mut rng = Lcg(7);
        for service in ["api", "worker"] {
            let mut points = Vec::new();
            for (name, kind, temp) in instruments {
                for set in 0..3 {
                    let mut time = SEC;
                    for n in 0..80 {
                        // gaps of 1..=10 s and one long gap (series share some times)
                        time += (1 + rng.next(10)) * SEC + if n == 50 { 120 * SEC } else { 0 };
                        points.push(point(name, kind, temp, set, n, time));
                    }
                }
            }
            // in several requests, series interleaved, as exporters send them
            points.sort_by_key(|p| p.time_unix_nano);
            for chunk in points.chunks(97) {
                st.write_metrics(Arc::new(MetricBatch {
                    resource_metrics: vec![ResourceMetrics {
                        resource: Resource {
                            attributes: vec![KeyValue::new(
                                "service.name",
                                AnyValue::String(service.into()),
                            )],
                            ..Resource::default()
                        },
                        scope_metrics: vec![ScopeMetrics {
                            scope: Scope {
                                name: "test".into(),
                                ..Scope::default()
                            },
                            points: chunk.to_vec(),
                        }],
                    }],
                }))
                .await
                .unwrap();
            }
        }
        // two points of one series at the same time, in two requests: the step shows the
        // one stored last (the GROUP BY query picked either)
        for v in [1.0, 2.0] {
            let mut p = point("tie", MetricKind::Gauge, CUM, 0, 0, 5 * SEC);
            p.value = Some(v);
            st.write_metrics(Arc::new(MetricBatch {
                resource_metrics: vec![ResourceMetrics {
                    resource: Resource::default(),
                    scope_metrics: vec![ScopeMetrics {
                        scope: Scope::default(),
                        points: vec![p],
                    }],
                }],
            }))
            .await
            .unwrap();
        }
        st.shutdown().await;
        drop(st);
        let conn = Connection::open(&path).unwrap();
        let tie = PointsQuery {
            name: "tie".into(),
            service: None,
            from_unix_nano: 0,
            to_unix_nano: 10 * SEC,
            step_ns: 10 * SEC,
        };
        let tie = metric_series(&conn, &tie).unwrap();
        assert_eq!(
            (tie.len(), tie[0].steps[0].points, tie[0].steps[0].value),
            (1, 2, Some(2.0))
        );
        let mut compared = 0;
        for (name, _, _) in instruments {
            for service in [None, Some("api"), Some("worker"), Some("nobody")] {
                for (from, to, step) in [
                    (0, 10_000 * SEC, 10_000 * SEC),
                    (0, 10_000 * SEC, 7 * SEC),
                    (100 * SEC, 300 * SEC, SEC),
                    (33 * SEC, 400 * SEC, 60 * SEC),
                    (250 * SEC, 260 * SEC, 3 * SEC),
                ] {
                    let q = PointsQuery {
                        name: name.into(),
                        service: service.map(str::to_string),
                        from_unix_nano: from,
                        to_unix_nano: to,
                        step_ns: step,
                    };
                    let new = metric_series(&conn, &q).unwrap();
                    let old = super::super::metrics_read_v3::metric_series(&conn, &q).unwrap();
                    assert_eq!(new, old, "{q:?}");
                    compared += new.iter().map(|s| s.steps.len()).sum::<usize>();
                }
            }
        }
        assert!(compared > 5_000, "the comparison covered {compared} steps");
    }
}
