//! Why a checkpoint operation was refused or failed, as one typed error; the HTTP mapping
//! lives at the edge (`dashboards/src/error.rs`).

use super::*;

/// Why a checkpoint operation was refused or failed. No HTTP here: the edge maps each
/// variant (bad input → 400/422, state → 404/409, transient → 503).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// No checkpoint with that id.
    #[error("no checkpoint {id}")]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// The checkpoint is not `open`: finished, or owned by another request (`committing`,
    /// `rolling_back`).
    #[error("checkpoint {id} is {state}")]
    NotOpen {
        /// The id.
        id: String,
        /// Where it stands (`committing`, `rolling_back`, `committed`, `rolled_back`).
        state: &'static str,
    },
    /// The workspace changed under the commit (a folder appeared at a destination, ...);
    /// the commit was undone and the checkpoint is open again.
    #[error("{why}")]
    Conflict {
        /// What happened.
        why: String,
    },
    /// A path would leave the workspace: `..`, absolute, or through a symlink.
    #[error("{why}")]
    PathEscape {
        /// The offending path.
        path: PathBuf,
        /// The rule it broke.
        why: String,
    },
    /// The workspace root is unusable (relative, missing, not a folder, `/`, inside the
    /// data folder, no access).
    #[error("{why}")]
    InvalidWorkspace {
        /// Why.
        why: String,
    },
    /// A staged entry breaks a content or kind rule; nothing was moved.
    #[error("{}: {why}", path.display())]
    Validation {
        /// The entry, relative to the staging folder.
        path: PathBuf,
        /// The rule.
        why: String,
    },
    /// The runner named for a new checkpoint is not registered.
    #[error("no runner {0} is registered")]
    RunnerNotFound(String),
    /// A transient fault (I/O, storage, a worker thread); worth retrying.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

impl CheckpointError {
    /// A transient I/O fault while doing `what`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
    pub(super) fn storage(e: impl std::fmt::Display) -> Self {
        Self::io("checkpoint journal", std::io::Error::other(e.to_string()))
    }
}
