//! The one adapter between [`crate::checkpoint`]'s typed results and today's control
//! replies (`ControlError` with a status). It exists only until the HTTP mapping moves to
//! `dashboards/` (issue 10); then this file goes and the edge maps [`CheckpointError`].

use stallwatch_storage::control::{ControlError, ControlReply};

use crate::checkpoint::CheckpointError;

/// Maps a checkpoint error to its control error: bad input 400 (`path_escape`,
/// `bad_workspace`), 422 `invalid_file`, 404 `not_found`/`runner_not_found`, 409
/// `not_open`/`conflict`, transient 503 `io` (never 500).
pub fn control_error(e: CheckpointError) -> ControlError {
    let (status, code) = match &e {
        CheckpointError::NotFound { .. } => (404, "not_found"),
        CheckpointError::RunnerNotFound(_) => (404, "runner_not_found"),
        CheckpointError::NotOpen { .. } => (409, "not_open"),
        CheckpointError::Conflict { .. } => (409, "conflict"),
        CheckpointError::PathEscape { .. } => (400, "path_escape"),
        CheckpointError::InvalidWorkspace { .. } => (400, "bad_workspace"),
        CheckpointError::Validation { .. } => (422, "invalid_file"),
        CheckpointError::Io { .. } => (503, "io"),
    };
    ControlError::new(status, code, e.to_string())
}

/// A checkpoint result as a control reply (its JSON answer, or the mapped error).
pub fn reply<T: serde::Serialize>(r: Result<T, CheckpointError>) -> ControlReply {
    r.map(|v| serde_json::to_value(v).unwrap_or_default())
        .map_err(control_error)
}
