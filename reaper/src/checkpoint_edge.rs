//! The one adapter between [`crate::checkpoint`]'s own results and the control vocabulary
//! ([`stallwatch_vocabulary::control`]): the checkpoint module keeps its richer error (the
//! path, the state, the `io::Error`), the control reply carries the shared typed error whose
//! wire mapping lives only in `dashboards/`. No HTTP status here.

use stallwatch_storage::control::{
    CheckpointCreated, CheckpointError as WireError, CheckpointOutcome,
};

use std::path::Path;

use stallwatch_storage::control::{ControlRequest, RegisterError};

use crate::checkpoint::{CheckpointError, Checkpoints, Created, Settled};

impl From<CheckpointError> for WireError {
    fn from(e: CheckpointError) -> Self {
        let msg = e.to_string();
        match e {
            CheckpointError::NotFound { .. } => WireError::NotFound(msg),
            CheckpointError::RunnerNotFound(_) => WireError::RunnerNotFound(msg),
            CheckpointError::NotOpen { .. } => WireError::NotOpen(msg),
            CheckpointError::Conflict { .. } => WireError::Conflict(msg),
            CheckpointError::PathEscape { .. } => WireError::PathEscape(msg),
            CheckpointError::InvalidWorkspace { .. } => WireError::InvalidWorkspace(msg),
            CheckpointError::Validation { path, why } => WireError::Validation { path, why },
            CheckpointError::Io { .. } => WireError::Io(msg),
        }
    }
}

impl From<Created> for CheckpointCreated {
    fn from(c: Created) -> Self {
        Self {
            id: c.id,
            path: c.path,
        }
    }
}

impl From<Settled> for CheckpointOutcome {
    fn from(s: Settled) -> Self {
        Self {
            id: s.id,
            state: s.state.to_string(),
            files: s.files.map(|n| n as u64),
        }
    }
}

/// A checkpoint result as a control reply.
pub fn reply<T, U: From<T>>(r: Result<T, CheckpointError>) -> Result<U, WireError> {
    r.map(U::from).map_err(WireError::from)
}

/// True for the checkpoint control requests (create, commit, rollback), which
/// [`answer`] takes.
pub fn is_checkpoint(req: &ControlRequest) -> bool {
    matches!(
        req,
        ControlRequest::CreateCheckpoint { .. }
            | ControlRequest::CommitCheckpoint { .. }
            | ControlRequest::RollbackCheckpoint { .. }
    )
}

/// The checkpoint of a runner spawned with a `workspace` (`None` without one), created
/// before the runner starts so its staging folder can be injected.
///
/// Errors: [`RegisterError::Checkpoint`] with the checkpoint's own error.
pub async fn for_spawn(
    checkpoints: &Checkpoints,
    id: &str,
    workspace: Option<&Path>,
) -> Result<Option<Created>, RegisterError> {
    match workspace {
        Some(ws) => checkpoints
            .create(id, ws)
            .await
            .map(Some)
            .map_err(|e| RegisterError::Checkpoint(e.into())),
        None => Ok(None),
    }
}

/// Answers a checkpoint control request (create, commit, rollback) with `checkpoints`, on
/// every platform; `registered` tells whether a runner id is registered (a checkpoint is
/// created only for one). Any other request is handed back.
pub async fn answer(
    checkpoints: &Checkpoints,
    req: ControlRequest,
    registered: impl Fn(&str) -> bool,
    stopping: impl Fn(&str) -> bool,
) -> Option<ControlRequest> {
    match req {
        ControlRequest::CreateCheckpoint {
            runner_id,
            workspace,
            reply: to,
        } => {
            let r = if registered(&runner_id) {
                checkpoints.create(&runner_id, &workspace).await
            } else {
                Err(CheckpointError::RunnerNotFound(runner_id))
            };
            let _ = to.send(reply(r));
        }
        ControlRequest::CommitCheckpoint { id, reply: to } => {
            // A runner being stopped (a trip, a DELETE) wrote its files while it was stuck:
            // its open checkpoints are rolled back, never committed (a commit taken after
            // the trip put half-written output into the workspace, and the rollback then
            // found nothing to do).
            let r = match checkpoints.runner_of(&id).await {
                Ok(runner) if stopping(&runner) => Err(WireError::NotOpen(format!(
                    "checkpoint {id} not committed: its runner {runner} is being stopped, and its open checkpoints are rolled back"
                ))),
                _ => reply(checkpoints.commit(&id).await),
            };
            let _ = to.send(r);
        }
        ControlRequest::RollbackCheckpoint { id, reply: to } => {
            let _ = to.send(reply(checkpoints.rollback(&id, "requested").await));
        }
        other => return Some(other),
    }
    None
}
