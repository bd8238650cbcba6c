//! Incident reads (newest first, paged by `before_id`) and the webhook delivery log.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::Json;
use serde_json::{json, Value};
use stallwatch_storage::model::EventKind;
use stallwatch_storage::outbox::{DeliveryQuery, DeliveryState};
use stallwatch_storage::IncidentQuery;

use crate::error::DashboardError;
use crate::json;
use crate::params::Params;
use crate::state::Shared;

/// Default incident page size.
pub const DEFAULT_PAGE: u64 = 100;
/// Largest incident page size.
pub const MAX_PAGE: u64 = 1000;

/// `GET /api/v1/incidents[?runner_id=&event=&before_id=&limit=]` →
/// `{"items":[incident...],"next_cursor":before_id string|null}`.
pub(crate) async fn list(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let mut p = Params::new(q)?;
    let runner_id = p.string("runner_id")?;
    let kind = match p.string("event")? {
        None => None,
        Some(e) => Some(EventKind::parse(&e).ok_or_else(|| {
            DashboardError::bad_param(format!("query parameter \"event\": unknown event {e:?}"))
        })?),
    };
    let before_id = match p.string("cursor")? {
        None => p.u64_in("before_id", 1, i64::MAX as u64)?.map(|v| v as i64),
        Some(c) => Some(c.parse::<i64>().map_err(|_| DashboardError::BadRequest {
            code: "invalid_cursor",
            message: "invalid cursor".into(),
        })?),
    };
    let limit = p.limit(DEFAULT_PAGE, MAX_PAGE)?;
    p.finish()?;
    let items = ctx
        .app
        .storage
        .incidents(IncidentQuery {
            runner_id,
            kind,
            before_id,
            limit,
        })
        .await?;
    let next = (items.len() == limit)
        .then(|| items.last().map(|i| i.id.to_string()))
        .flatten();
    Ok(Json(json!({
        "items": items.iter().map(json::incident).collect::<Vec<_>>(),
        "next_cursor": next,
    })))
}

/// `GET /api/v1/incidents/{id}` → one incident; 404 when unknown.
pub(crate) async fn one(
    State(ctx): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    Params::new(q)?.finish()?;
    let id: i64 = id.parse().map_err(|_| {
        DashboardError::bad_param(format!("incident id must be an integer, got {id:?}"))
    })?;
    match ctx.app.storage.incident(id).await? {
        Some(i) => Ok(Json(json::incident(&i))),
        None => Err(DashboardError::NotFound(format!("incident {id} not found"))),
    }
}

/// `GET /api/v1/webhooks/deliveries[?state=&incident_id=&before_id=&limit=]` →
/// `{"items":[delivery with attempt_log...],"next_cursor"}`, newest first.
pub(crate) async fn deliveries(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let mut p = Params::new(q)?;
    let state = match p.string("state")? {
        None => None,
        Some(s) => Some(DeliveryState::parse(&s).ok_or_else(|| {
            DashboardError::bad_param(format!(
                "query parameter \"state\" must be pending, delivered or failed, got {s:?}"
            ))
        })?),
    };
    let incident_id = p
        .u64_in("incident_id", 1, i64::MAX as u64)?
        .map(|v| v as i64);
    let before_id = match p.string("cursor")? {
        None => p.u64_in("before_id", 1, i64::MAX as u64)?.map(|v| v as i64),
        Some(c) => Some(c.parse::<i64>().map_err(|_| DashboardError::BadRequest {
            code: "invalid_cursor",
            message: "invalid cursor".into(),
        })?),
    };
    let limit = p.limit(50, 200)?;
    p.finish()?;
    let rows = ctx
        .app
        .storage
        .deliveries(DeliveryQuery {
            state,
            incident_id,
            before_id,
            limit,
        })
        .await?;
    let attempts = ctx
        .app
        .storage
        .delivery_attempts(rows.iter().map(|d| d.id).collect())
        .await?;
    let mut by_id: HashMap<i64, Vec<_>> = HashMap::new();
    for a in &attempts {
        by_id.entry(a.delivery_id).or_default().push(a);
    }
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|d| d.id.to_string()))
        .flatten();
    Ok(Json(json!({
        "items": rows.iter().map(|d| json::delivery(d, by_id.get(&d.id).map(Vec::as_slice).unwrap_or(&[]))).collect::<Vec<_>>(),
        "next_cursor": next,
    })))
}
