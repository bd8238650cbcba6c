//! Metric reads (issue 13): `GET /api/v1/metrics` (the stored instruments) and
//! `GET /api/v1/metrics/{name}/points` (one instrument's points per series per step).
//!
//! How steps are aggregated and how p50/p90/p99 are estimated from histogram buckets
//! (linear interpolation within the bucket as Prometheus' `histogram_quantile` does;
//! geometric interpolation within exponential buckets) is written down in storage's
//! `telemetry/metrics_read.rs` and in the OpenAPI document.

use axum::extract::{Path, Query, State};
use axum::Json;
use serde_json::{json, Value};
use stallwatch_storage::model::now_unix_nano;
use stallwatch_storage::telemetry::{MetricSeries, PointsQuery, MAX_STEPS};

use crate::error::DashboardError;
use crate::json::nanos;
use crate::params::Params;
use crate::state::Shared;
use crate::wire::{Attrs, Scp};

/// Window when `from` is not given: the hour before `to`.
pub const DEFAULT_WINDOW_NS: u64 = 3_600_000_000_000;
/// Steps in the window when `step` is not given.
pub const DEFAULT_STEPS: u64 = 240;

/// `GET /api/v1/metrics[?service=]` → `{"items":[{"name","type","unit","description",
/// "service_name","point_count","first_time_unix_nano","last_time_unix_nano"}]}`, by name
/// then service.
pub(crate) async fn list(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let mut p = Params::new(q)?;
    let service = p.string("service")?;
    p.finish()?;
    let items: Vec<Value> = ctx
        .app
        .storage
        .instruments(service)
        .await?
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
    Ok(Json(json!({ "items": items })))
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

fn series_json(s: &MetricSeries) -> Value {
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
) -> Result<Json<Value>, DashboardError> {
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
    let known = ctx.app.storage.instruments(None).await?;
    if !known.iter().any(|i| i.name == name) {
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
    Ok(Json(json!({
        "name": name,
        "from_unix_nano": nanos(from),
        "to_unix_nano": nanos(to),
        "step_ms": step as f64 / 1e6,
        "series": series.iter().map(series_json).collect::<Vec<_>>(),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

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
