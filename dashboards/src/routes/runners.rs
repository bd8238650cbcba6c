//! Runner reads from the watchdog's board: the list, one runner, breakers, and admission
//! (`GET /api/v1/runners/{id}/admit`: 200 in CLOSED, 503 with `Retry-After` in OPEN and
//! HALF_OPEN, 404 for an unknown runner; docs/design.md, Control endpoints).

use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::error::DashboardError;
use crate::json;
use crate::params::Params;
use crate::state::Shared;

/// `GET /api/v1/runners` → `{"items":[runner...]}` ordered by id.
pub(crate) async fn list(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    Params::new(q)?.finish()?;
    let board = ctx.app.board.borrow().clone();
    Ok(Json(
        json!({ "items": board.values().map(json::runner).collect::<Vec<_>>() }),
    ))
}

/// `GET /api/v1/runners/{id}` → one runner; 404 when unknown.
pub(crate) async fn one(
    State(ctx): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    Params::new(q)?.finish()?;
    let board = ctx.app.board.borrow().clone();
    board
        .get(&id)
        .map(|r| Json(json::runner(r)))
        .ok_or_else(|| DashboardError::NotFound(format!("runner {id:?} not found")))
}

/// `GET /api/v1/breakers` → `{"items":[{"runner_id","state","reason","retry_after_ms"}]}`.
pub(crate) async fn breakers(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    Params::new(q)?.finish()?;
    let board = ctx.app.board.borrow().clone();
    let items: Vec<Value> = board
        .values()
        .map(|r| {
            json!({
                "runner_id": r.id,
                "state": r.breaker.as_str(),
                "verdict": r.verdict,
                "reason": r.reason,
                "retry_after_ms": r.retry_after_ms,
            })
        })
        .collect();
    Ok(Json(json!({ "items": items })))
}

/// `GET /api/v1/runners/{id}/admit` → `{"state","admit","reason","retry_after_ms","lifecycle"}`
/// ([`json::admission`]).
pub(crate) async fn admit(
    State(ctx): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Response, DashboardError> {
    Params::new(q)?.finish()?;
    let status = ctx.app.board.borrow().get(&id).cloned();
    let Some(r) = status else {
        return Err(DashboardError::NotFound(format!("runner {id:?} not found")));
    };
    let (admit, retry_after_ms, body) = json::admission(&r);
    if admit {
        return Ok((StatusCode::OK, Json(body)).into_response());
    }
    let secs = json::retry_after_secs(retry_after_ms.unwrap_or(1000));
    let mut resp = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        resp.headers_mut().insert(http::header::RETRY_AFTER, v);
    }
    Ok(resp)
}
