//! The one adapter between [`crate::checkpoint`]'s own results and the control vocabulary
//! ([`stallwatch_vocabulary::control`]): the checkpoint module keeps its richer error (the
//! path, the state, the `io::Error`), the control reply carries the shared typed error whose
//! wire mapping lives only in `dashboards/`. No HTTP status here.

use stallwatch_storage::control::{
    CheckpointCreated, CheckpointError as WireError, CheckpointOutcome,
};

use crate::checkpoint::{CheckpointError, Created, Settled};

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
