//! Checkpoint reads: the active checkpoints (`open`, `committing`) from the journal table.

use axum::extract::{Query, State};
use axum::Json;
use serde_json::{json, Value};
use stallwatch_storage::checkpoints::CheckpointRow;

use crate::error::DashboardError;
use crate::json::nanos;
use crate::params::Params;
use crate::state::Shared;

fn checkpoint(c: &CheckpointRow) -> Value {
    json!({
        "id": c.id,
        "runner_id": c.runner_id,
        "workspace": String::from_utf8_lossy(&c.workspace),
        "staging": String::from_utf8_lossy(&c.staging),
        "state": c.state.as_str(),
        "detail": c.detail,
        "created_unix_nano": nanos(c.created_unix_nano),
        "updated_unix_nano": nanos(c.updated_unix_nano),
    })
}

/// `GET /api/v1/checkpoints[?runner_id=&cursor=&limit=]` → `{"items":[checkpoint...],
/// "next_cursor"}`: active checkpoints by id.
pub(crate) async fn list(
    State(ctx): State<Shared>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, DashboardError> {
    let mut p = Params::new(q)?;
    let runner_id = p.string("runner_id")?;
    let after = p.string("cursor")?.unwrap_or_default();
    let limit = p.limit(100, 1000)?;
    p.finish()?;
    let rows = ctx
        .app
        .storage
        .active_checkpoints(runner_id, after, limit)
        .await?;
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|c| c.id.clone()))
        .flatten();
    Ok(Json(json!({
        "items": rows.iter().map(checkpoint).collect::<Vec<_>>(),
        "next_cursor": next,
    })))
}
