//! Metric reads (issue 13): `GET /api/v1/metrics` (the stored instruments) and
//! `GET /api/v1/metrics/{name}/points` (one instrument's points per series per step).
//!
//! How steps are aggregated and how p50/p90/p99 are estimated from histogram buckets
//! (linear interpolation within the bucket as Prometheus' `histogram_quantile` does;
//! geometric interpolation within exponential buckets) is written down in storage's
//! `telemetry/metrics_read.rs` and in the OpenAPI document.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{json, Value};
use stallwatch_storage::model::now_unix_nano;
use stallwatch_storage::telemetry::{
    MetricSeries, PointsQuery, StepValue, MAX_NAMES_PAGE, MAX_STEPS,
};

use crate::error::DashboardError;
use crate::json::nanos;
use crate::params::Params;
use crate::state::Shared;
use crate::wire::{Attrs, Scp};

/// Window when `from` is not given: the hour before `to`.
pub const DEFAULT_WINDOW_NS: u64 = 3_600_000_000_000;
/// Steps in the window when `step` is not given.
pub const DEFAULT_STEPS: u64 = 240;

/// `GET /api/v1/metrics[?service=&limit=&cursor=]` → `{"items":[{"name","type","unit",
/// "description","service_name","point_count","first_time_unix_nano",
/// "last_time_unix_nano"}],"next_cursor"}`, by name then service, a page at a time like
/// every list whose length follows what exporters send: `limit` 1..=1000 (default 1000),
/// `cursor` the previous page's `next_cursor` (`null` on the last page).
pub(crate) async fn list(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let mut p = Params::new(q)?;
    let service = p.string("service")?;
    let limit = p.limit(MAX_NAMES_PAGE as u64, MAX_NAMES_PAGE as u64)?;
    let cursor = p.string("cursor")?;
    p.finish()?;
    let page = ctx.app.storage.instruments(service, cursor, limit).await?;
    let items: Vec<Value> = page
        .items
        .iter()
        .map(|i| {
            json!({
                "name": i.name,
                "type": i.kind,
                "unit": i.unit,
                "description": i.description,
                "service_name": i.service,
                "point_count": i.point_count,
                "first_time_unix_nano": nanos(i.first_time_unix_nano),
                "last_time_unix_nano": nanos(i.last_time_unix_nano),
            })
        })
        .collect();
    Ok(Json(
        json!({ "items": items, "next_cursor": page.next_cursor }),
    ))
}

/// A step: Prometheus-style duration (`500ms`, `15s`, `5m`, `1h`, `1d`) or a bare number of
/// seconds; answers ns.
fn step_ns(v: &str) -> Result<u64, DashboardError> {
    let bad = || {
        DashboardError::bad_param(format!(
            "query parameter \"step\" must be a duration such as 500ms, 15s, 5m, 1h or a number of seconds, got {v:?}"
        ))
    };
    let (num, unit) = match v.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => v.split_at(i),
        None => (v, "s"),
    };
    let mult = match unit {
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        "d" => 86400e9,
        _ => return Err(bad()),
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    let ns = n * mult;
    if !(1e6..=1e18).contains(&ns) {
        return Err(DashboardError::bad_param(format!(
            "query parameter \"step\" must be from 1ms to ~31 years, got {v:?}"
        )));
    }
    Ok(ns as u64)
}

/// One series' steps as the points JSON, written straight to the output (a points query
/// answers thousands of steps: one `Value` map per step cost more than the query). Keys in
/// the order `serde_json::Value` maps write them (sorted), so the bytes are those of the
/// `json!` form this replaced (test `points_json_matches_the_value_form`).
struct StepsJ<'a>(&'a [StepValue]);

impl Serialize for StepsJ<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let fin = |v: Option<f64>| v.filter(|v| v.is_finite());
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for p in self.0 {
            struct Step<'a>(&'a StepValue, &'a dyn Fn(Option<f64>) -> Option<f64>);
            impl Serialize for Step<'_> {
                fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    let (p, fin) = (self.0, self.1);
                    let mut m = s.serialize_map(Some(8))?;
                    m.serialize_entry("count", &p.count)?;
                    m.serialize_entry("p50", &fin(p.p50))?;
                    m.serialize_entry("p90", &fin(p.p90))?;
                    m.serialize_entry("p99", &fin(p.p99))?;
                    m.serialize_entry("points", &p.points)?;
                    m.serialize_entry("sum", &fin(p.sum))?;
                    m.serialize_entry("time_unix_nano", &p.start_unix_nano.to_string())?;
                    m.serialize_entry("value", &fin(p.value))?;
                    m.end()
                }
            }
            seq.serialize_element(&Step(p, &fin))?;
        }
        seq.end()
    }
}

/// One series of the points JSON (keys sorted, as [`StepsJ`]); the identity parts go
/// through `Value` once per series, so they are written exactly as before.
struct SeriesJ<'a>(&'a MetricSeries);

impl Serialize for SeriesJ<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = |x: Result<Value, serde_json::Error>| x.unwrap_or(Value::Null);
        let x = self.0;
        let mut m = s.serialize_map(Some(10))?;
        m.serialize_entry("attributes", &v(serde_json::to_value(Attrs(&x.attributes))))?;
        m.serialize_entry("description", &x.description)?;
        m.serialize_entry("key", &format!("{:016x}", x.key))?;
        m.serialize_entry("points", &StepsJ(&x.steps))?;
        m.serialize_entry(
            "resource",
            &json!({ "attributes": v(serde_json::to_value(Attrs(&x.resource.attributes))) }),
        )?;
        m.serialize_entry("scope", &v(serde_json::to_value(Scp(&x.scope))))?;
        m.serialize_entry("service_name", x.resource.service_name())?;
        m.serialize_entry("temporality", &x.temporality)?;
        m.serialize_entry("type", x.kind.as_str())?;
        m.serialize_entry("unit", &x.unit)?;
        m.end()
    }
}

/// The points answer (keys sorted, as [`StepsJ`]).
struct PointsJ<'a> {
    name: &'a str,
    from: u64,
    to: u64,
    step: u64,
    series: &'a [MetricSeries],
}

impl Serialize for PointsJ<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct All<'a>(&'a [MetricSeries]);
        impl Serialize for All<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().map(SeriesJ))
            }
        }
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("from_unix_nano", &self.from.to_string())?;
        m.serialize_entry("name", self.name)?;
        m.serialize_entry("series", &All(self.series))?;
        m.serialize_entry("step_ms", &(self.step as f64 / 1e6))?;
        m.serialize_entry("to_unix_nano", &self.to.to_string())?;
        m.end()
    }
}

/// `GET /api/v1/metrics/{name}/points?service=&from=&to=&step=` → `{"name",
/// "from_unix_nano","to_unix_nano","step_ms","series":[{"key","service_name","resource",
/// "scope","attributes","type","unit","description","temporality","points":[{
/// "time_unix_nano" (step start),"points","value","count","sum","p50","p90","p99"}]}]}`.
/// `from`/`to` are ns since the Unix epoch (default: the hour before now), `step` a
/// duration (default: the window / 240); at most 11,000 steps. 404 when no instrument has
/// that name.
pub(crate) async fn points(
    State(ctx): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Response, DashboardError> {
    let mut p = Params::new(q)?;
    let service = p.string("service")?;
    let to = p
        .u64_in("to", 1, i64::MAX as u64)?
        .unwrap_or_else(now_unix_nano);
    let from = p
        .u64_in("from", 0, i64::MAX as u64)?
        .unwrap_or_else(|| to.saturating_sub(DEFAULT_WINDOW_NS));
    if to <= from {
        return Err(DashboardError::bad_param("to must be after from"));
    }
    let step = match p.string("step")? {
        Some(v) => step_ns(&v)?,
        None => (to - from).div_ceil(DEFAULT_STEPS).max(1_000_000),
    };
    p.finish()?;
    if (to - from).div_ceil(step) > MAX_STEPS {
        return Err(DashboardError::bad_param(format!(
            "the window holds {} steps of {step} ns; at most {MAX_STEPS}: give a larger step",
            (to - from).div_ceil(step)
        )));
    }
    if !ctx.app.storage.instrument_known(name.clone()).await? {
        return Err(DashboardError::NotFound(format!(
            "metric {name:?} not found"
        )));
    }
    let series = ctx
        .app
        .storage
        .metric_series(PointsQuery {
            name: name.clone(),
            service,
            from_unix_nano: from,
            to_unix_nano: to,
            step_ns: step,
        })
        .await?;
    Ok(Json(PointsJ {
        name: &name,
        from,
        to,
        step,
        series: &series,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stallwatch_storage::model::{AnyValue, KeyValue, MetricKind, Resource, Scope};
    use std::sync::Arc;

    /// The `json!` form the points answer had before [`PointsJ`].
    fn series_json_value(s: &MetricSeries) -> Value {
        let points: Vec<Value> = s
            .steps
            .iter()
            .map(|p| {
                json!({
                    "time_unix_nano": nanos(p.start_unix_nano),
                    "points": p.points,
                    "value": p.value.filter(|v| v.is_finite()),
                    "count": p.count,
                    "sum": p.sum.filter(|v| v.is_finite()),
                    "p50": p.p50.filter(|v| v.is_finite()),
                    "p90": p.p90.filter(|v| v.is_finite()),
                    "p99": p.p99.filter(|v| v.is_finite()),
                })
            })
            .collect();
        json!({
            "key": format!("{:016x}", s.key),
            "service_name": s.resource.service_name(),
            "resource": { "attributes": serde_json::to_value(Attrs(&s.resource.attributes)).unwrap_or(Value::Null) },
            "scope": serde_json::to_value(Scp(&s.scope)).unwrap_or(Value::Null),
            "attributes": serde_json::to_value(Attrs(&s.attributes)).unwrap_or(Value::Null),
            "type": s.kind.as_str(),
            "unit": s.unit,
            "description": s.description,
            "temporality": s.temporality,
            "points": points,
        })
    }

    #[test]
    fn points_json_matches_the_value_form() {
        let step = |t: u64, v: Option<f64>, c: Option<u64>| StepValue {
            start_unix_nano: t,
            points: 3,
            value: v,
            count: c,
            sum: c.map(|c| c as f64 * 0.25),
            p50: c.map(|_| 1.5),
            p90: c.map(|_| f64::INFINITY),
            p99: None,
        };
        let s = MetricSeries {
            key: 0xab,
            resource: Arc::new(Resource {
                attributes: vec![KeyValue::new(
                    "service.name",
                    AnyValue::String("api".into()),
                )],
                ..Resource::default()
            }),
            scope: Arc::new(Scope {
                name: "sc".into(),
                version: "1".into(),
                ..Scope::default()
            }),
            attributes: vec![
                KeyValue::new("z", AnyValue::Int(-3)),
                KeyValue::new("a", AnyValue::Double(0.1)),
            ],
            kind: MetricKind::Histogram,
            unit: "ms".into(),
            description: "d \"q\"".into(),
            temporality: Some("AGGREGATION_TEMPORALITY_DELTA".into()),
            steps: vec![
                step(1_767_225_600_000_000_000, Some(-0.5), None),
                step(2, None, Some(7)),
                step(3, Some(f64::NAN), Some(0)),
            ],
        };
        let series = vec![
            s.clone(),
            MetricSeries {
                temporality: None,
                ..s
            },
        ];
        let old = json!({
            "name": "n",
            "from_unix_nano": nanos(5),
            "to_unix_nano": nanos(u64::MAX),
            "step_ms": 15_000.5,
            "series": series.iter().map(series_json_value).collect::<Vec<_>>(),
        });
        let new = PointsJ {
            name: "n",
            from: 5,
            to: u64::MAX,
            step: 15_000_500_000,
            series: &series,
        };
        assert_eq!(
            serde_json::to_string(&new).unwrap(),
            serde_json::to_string(&old).unwrap()
        );
    }

    #[test]
    fn steps_parse_like_prometheus_durations() {
        assert_eq!(step_ns("500ms").unwrap(), 500_000_000);
        assert_eq!(step_ns("15s").unwrap(), 15_000_000_000);
        assert_eq!(step_ns("2m").unwrap(), 120_000_000_000);
        assert_eq!(step_ns("1.5").unwrap(), 1_500_000_000);
        assert!(step_ns("0s").is_err());
        assert!(step_ns("5y").is_err());
        assert!(step_ns("abc").is_err());
    }
}
