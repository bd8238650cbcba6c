//! Checkpoints: a staging folder per transaction, validated and atomically committed into
//! the workspace, or rolled back leaving the workspace byte-for-byte as it was
//! (`docs/design.md`, Checkpoints; issue 17 #1–#7).
//!
//! A tool writes into `{workspace}/.workbench/checkpoints/{id}/`, never into the project
//! folder. One request owns a checkpoint at a time: it claims it in the journal
//! (`open → committing` or `open → rolling_back`, [`stallwatch_storage::checkpoints`]) and a
//! second request is refused with [`CheckpointError::NotOpen`] without touching a file.
//! Commit = claim, validate every file without following links and check every
//! destination without creating anything (`fs::prepare`), write the intent journal with
//! each file's identity (`synchronous=FULL`, the point of no return), then move the files
//! (`fs::apply`). A conflict during the moves undoes them and reopens the checkpoint.
//! On start, before anything else touches a workspace, [`Checkpoints::recover`] rolls every
//! journaled commit forward and reopens one that had not reached its journal, whether or not
//! its runner lives. Rollback = claim, delete the staging folder without following links.
//!
//! The module is split along its seams. Platform-neutral: this orchestration, [`paths`]
//! (path rules), [`validate`] (content rules), `recover.rs` (settling what nobody will
//! finish: start-up recovery and a stopped runner's checkpoints), errors
//! ([`CheckpointError`], `error.rs`; the HTTP mapping lives at the edge). The filesystem
//! seam `fs` below has a Linux arm (`paths/fd.rs`, `commit.rs`, `rollback.rs`: directory
//! descriptors, `renameat2`) and a Windows arm (`fs_windows.rs`, `windows.rs`: folders held
//! open, `MoveFileExW`; docs/platforms.md, "Checkpoints on Windows"). The filesystem work
//! is plain blocking code on tokio's blocking pool.

#[cfg(unix)]
pub mod commit;
mod error;
#[cfg(windows)]
pub mod fs_windows;
pub mod paths;
mod recover;
#[cfg(unix)]
pub mod rollback;
pub mod validate;
#[cfg(windows)]
pub mod windows;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Serialize;
use stallwatch_storage::checkpoints::{CheckpointRow, CheckpointState};
use stallwatch_storage::keys;
use stallwatch_storage::model::{now_unix_nano, EventKind, NewIncident};
use stallwatch_storage::{EventBus, Storage};

use crate::stats::ReaperStats;
pub use error::CheckpointError;
pub use paths::{check_relative, check_workspace, staging_dir, STAGING_ROOT};
pub use validate::{csv_width_mismatch, has_hdf5_signature, HDF5_SIGNATURE};

/// The answer of [`Checkpoints::create`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Created {
    /// Transaction id.
    pub id: String,
    /// The staging folder (absolute).
    pub path: PathBuf,
}

/// The answer of a commit, rollback or roll-forward.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Settled {
    /// Transaction id.
    pub id: String,
    /// `committed` or `rolled_back`.
    pub state: &'static str,
    /// Files now in the workspace (commits only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<usize>,
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CheckpointError> + Send + 'static,
) -> Result<T, CheckpointError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        CheckpointError::io("checkpoint worker", std::io::Error::other(e.to_string()))
    })?
}

/// One staged file ready to move, as validated and as the intent journal records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedFile {
    /// Path relative to the staging folder (and to the workspace root).
    pub rel: PathBuf,
    /// Device of the validated file: `st_dev` on Linux, the volume serial number on Windows.
    pub dev: u64,
    /// The validated file: its inode on Linux, its file index on Windows
    /// (`GetFileInformationByHandle`).
    pub ino: u64,
    /// Its size, bytes, and modification time, ns since the epoch: together with the inode
    /// they tell the validated file from a new one that reused a freed inode number (a
    /// rename changes neither).
    pub size: u64,
    /// Modification time, ns since the Unix epoch.
    pub mtime_ns: i64,
}

/// The filesystem seam of checkpoints (docs/platforms.md, "durable rename"): the same
/// operations on each platform, called by the platform-neutral orchestration here and in
/// `recover.rs`. Linux: directory descriptors (`paths/fd.rs`, `commit.rs`, `rollback.rs`);
/// Windows: folders held open and `MoveFileExW` (`fs_windows.rs`, `windows.rs`).
#[cfg(unix)]
mod fs {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::{Path, PathBuf};

    pub use super::commit::{apply, prepare, roll_forward};
    pub use super::paths::{create_staging, open_root, open_staging};
    pub use super::rollback::remove_staging;
    use super::CheckpointError;

    /// A path as the journal stores it (its bytes).
    pub fn path_bytes(p: &Path) -> Result<Vec<u8>, CheckpointError> {
        Ok(p.as_os_str().as_bytes().to_vec())
    }

    /// A path from the journal's bytes.
    pub fn path_of(bytes: &[u8]) -> PathBuf {
        PathBuf::from(std::ffi::OsString::from_vec(bytes.to_vec()))
    }
}
use fs::path_of;
#[cfg(windows)]
use fs_windows as fs;

/// The checkpoint operations with their journal and incidents.
#[derive(Clone)]
pub struct Checkpoints {
    storage: Storage,
    events: EventBus,
    stats: Arc<ReaperStats>,
    /// stallwatch's data folder (canonical): no workspace may lie inside it.
    data_dir: Option<PathBuf>,
}

/// How [`for_each_active`](Checkpoints::for_each_active) settles each active checkpoint.
#[derive(Clone, Copy)]
enum Settle<'a> {
    /// Start-up recovery: `committing` rolled forward, `rolling_back` finished, `open` left
    /// for its runner.
    Recover,
    /// A runner's end: `committing` rolled forward, the rest rolled back for `reason`.
    Runner { reason: &'a str },
}

impl Checkpoints {
    /// Builds the manager.
    pub fn new(storage: Storage, events: EventBus, stats: Arc<ReaperStats>) -> Self {
        Self {
            storage,
            events,
            stats,
            data_dir: None,
        }
    }

    /// Refuses workspaces inside stallwatch's data folder `dir` (its database, sockets and
    /// token live there). A folder that cannot be resolved is kept as given.
    pub fn with_data_dir(mut self, dir: &Path) -> Self {
        self.data_dir = Some(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()));
        self
    }

    /// Creates the staging folder of a new transaction for `runner_id` under `workspace`.
    ///
    /// Errors: [`CheckpointError::InvalidWorkspace`] (also inside the data folder),
    /// [`CheckpointError::PathEscape`], [`CheckpointError::Io`].
    pub async fn create(
        &self,
        runner_id: &str,
        workspace: &Path,
    ) -> Result<Created, CheckpointError> {
        let ws = check_workspace(workspace)?;
        if let Some(data) = &self.data_dir {
            if ws.starts_with(data) {
                return Err(CheckpointError::InvalidWorkspace {
                    why: format!(
                        "workspace {} is inside stallwatch's data folder {}",
                        workspace.display(),
                        data.display()
                    ),
                });
            }
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let staging = staging_dir(&ws, &id);
        let (w2, id2) = (ws.clone(), id.clone());
        blocking(move || {
            let root = fs::open_root(&w2)?;
            fs::create_staging(&root, &w2, &id2).map(|_| ())
        })
        .await?;
        let now = now_unix_nano();
        self.storage
            .create_checkpoint(CheckpointRow {
                id: id.clone(),
                runner_id: runner_id.to_string(),
                workspace: fs::path_bytes(&ws)?,
                staging: fs::path_bytes(&staging)?,
                state: CheckpointState::Open,
                detail: serde_json::json!({}),
                created_unix_nano: now,
                updated_unix_nano: now,
            })
            .await
            .map_err(CheckpointError::storage)?;
        Ok(Created { id, path: staging })
    }

    /// The runner checkpoint `id` belongs to.
    ///
    /// Errors: [`CheckpointError::NotFound`]; a storage failure as [`CheckpointError::Io`].
    pub async fn runner_of(&self, id: &str) -> Result<String, CheckpointError> {
        Ok(self.row(id).await?.runner_id)
    }

    async fn row(&self, id: &str) -> Result<CheckpointRow, CheckpointError> {
        self.storage
            .checkpoint(id.to_string())
            .await
            .map_err(CheckpointError::storage)?
            .ok_or_else(|| CheckpointError::NotFound { id: id.to_string() })
    }

    async fn claim(&self, id: &str, to: CheckpointState) -> Result<(), CheckpointError> {
        match self
            .storage
            .claim_checkpoint(id.to_string(), CheckpointState::Open, to, now_unix_nano())
            .await
            .map_err(CheckpointError::storage)?
        {
            Ok(()) => Ok(()),
            Err(None) => Err(CheckpointError::NotFound { id: id.to_string() }),
            Err(Some(s)) => Err(CheckpointError::NotOpen {
                id: id.to_string(),
                state: s.as_str(),
            }),
        }
    }

    async fn reopen(&self, id: &str) {
        if let Err(e) = self
            .storage
            .reopen_checkpoint(id.to_string(), now_unix_nano())
            .await
        {
            tracing::error!(
                checkpoint = id,
                "reopening after a refused commit failed: {e}"
            );
        }
    }

    /// Claims, validates, journals and moves every staged file into the workspace.
    ///
    /// Errors: [`CheckpointError::NotFound`], [`CheckpointError::NotOpen`] (another request
    /// owns it, or it is finished); after a refusal that moved nothing (the checkpoint is
    /// open again): [`CheckpointError::Validation`], [`CheckpointError::PathEscape`],
    /// [`CheckpointError::Conflict`]; [`CheckpointError::Io`].
    pub async fn commit(&self, id: &str) -> Result<Settled, CheckpointError> {
        let row = self.row(id).await?;
        self.claim(id, CheckpointState::Committing).await?;
        let (ws, cid) = (path_of(&row.workspace), row.id.clone());
        let staging_path = path_of(&row.staging);
        let prepared = blocking(move || {
            let root = fs::open_root(&ws)?;
            let staging =
                fs::open_staging(&root, &ws, &cid)?.ok_or_else(|| CheckpointError::Conflict {
                    why: format!("staging folder {} is missing", staging_path.display()),
                })?;
            let plan = fs::prepare(&root, &ws, staging, &staging_path)?;
            Ok((root, ws, plan))
        })
        .await;
        let (root, ws, plan) = match prepared {
            Ok(p) => p,
            Err(e) => {
                self.reopen(id).await;
                return Err(e);
            }
        };
        let journal: Result<Vec<Vec<u8>>, CheckpointError> =
            plan.files.iter().map(|f| fs::path_bytes(&f.rel)).collect();
        let journal = match journal {
            Ok(j) => j,
            Err(e) => {
                self.reopen(id).await;
                return Err(e);
            }
        };
        // [dev, ino, size, mtime_ns] of each journaled file, in journal order.
        let inodes: Vec<serde_json::Value> = plan
            .files
            .iter()
            .map(|f| serde_json::json!([f.dev, f.ino, f.size, f.mtime_ns]))
            .collect();
        let wrote = self
            .storage
            .write_checkpoint_journal(
                id.to_string(),
                journal,
                serde_json::json!({"inodes": inodes}),
                now_unix_nano(),
            )
            .await;
        match wrote {
            Ok(true) => {}
            Ok(false) => {
                return Err(CheckpointError::NotOpen {
                    id: id.to_string(),
                    state: "committing",
                })
            }
            Err(e) => {
                self.reopen(id).await;
                return Err(CheckpointError::storage(e));
            }
        }
        let n = plan.files.len();
        let (w2, cid) = (ws.clone(), row.id.clone());
        let applied = blocking(move || {
            let r = fs::apply(&root, &w2, &plan);
            // The plan holds the staging folders open (on Windows without delete sharing).
            drop(plan);
            if r.is_ok() {
                fs::remove_staging(&root, &w2, &cid)?;
            }
            r
        })
        .await;
        match applied {
            Ok(_) => self.finish_commit(&row, n, Vec::new()).await,
            Err(e @ (CheckpointError::Conflict { .. } | CheckpointError::Validation { .. })) => {
                // Undone completely: the workspace is as it was.
                self.reopen(id).await;
                Err(e)
            }
            // Left `committing` with its journal: rolled forward at the next start.
            Err(e) => Err(e),
        }
    }

    async fn finish_commit(
        &self,
        row: &CheckpointRow,
        n: usize,
        skipped: Vec<String>,
    ) -> Result<Settled, CheckpointError> {
        let detail = serde_json::json!({"files": n, "skipped": skipped});
        self.storage
            .finish_checkpoint(
                row.id.clone(),
                vec![CheckpointState::Committing],
                CheckpointState::Committed,
                detail.clone(),
                now_unix_nano(),
            )
            .await
            .map_err(CheckpointError::storage)?;
        self.stats
            .checkpoints_committed
            .fetch_add(1, Ordering::Relaxed);
        self.incident(
            EventKind::CheckpointCommitted,
            row,
            format!("checkpoint {} committed ({n} files)", row.id),
            detail,
        )
        .await;
        Ok(Settled {
            id: row.id.clone(),
            state: "committed",
            files: Some(n),
        })
    }

    /// Claims an `open` checkpoint and removes its staging folder; the workspace is
    /// untouched. Rolling back a rolled-back checkpoint answers the same.
    ///
    /// Errors: [`CheckpointError::NotFound`], [`CheckpointError::NotOpen`] (committed, or a
    /// commit or another rollback owns it), [`CheckpointError::PathEscape`] (a symlinked staging folder or
    /// parent: nothing is removed through it), [`CheckpointError::Io`].
    pub async fn rollback(&self, id: &str, reason: &str) -> Result<Settled, CheckpointError> {
        let row = self.row(id).await?;
        match row.state {
            CheckpointState::Open => {}
            CheckpointState::RolledBack => {
                return Ok(Settled {
                    id: id.to_string(),
                    state: "rolled_back",
                    files: None,
                })
            }
            s => {
                return Err(CheckpointError::NotOpen {
                    id: id.to_string(),
                    state: s.as_str(),
                })
            }
        }
        // Look first (read only): a symlinked staging folder is refused before the claim.
        let (w2, c2) = (path_of(&row.workspace), row.id.clone());
        blocking(move || {
            let root = fs::open_root(&w2)?;
            fs::open_staging(&root, &w2, &c2).map(|_| ())
        })
        .await?;
        self.claim(id, CheckpointState::RollingBack).await?;
        self.finish_rollback(&row, reason).await
    }

    /// Removes the staging folder of a `rolling_back` checkpoint this caller owns and
    /// marks it `rolled_back`.
    async fn finish_rollback(
        &self,
        row: &CheckpointRow,
        reason: &str,
    ) -> Result<Settled, CheckpointError> {
        let id = row.id.as_str();
        let (ws, cid) = (path_of(&row.workspace), row.id.clone());
        blocking(move || {
            let root = fs::open_root(&ws)?;
            fs::remove_staging(&root, &ws, &cid)
        })
        .await?;
        let detail = serde_json::json!({"reason": reason});
        self.storage
            .finish_checkpoint(
                id.to_string(),
                vec![CheckpointState::RollingBack],
                CheckpointState::RolledBack,
                detail.clone(),
                now_unix_nano(),
            )
            .await
            .map_err(CheckpointError::storage)?;
        self.stats
            .checkpoints_rolled_back
            .fetch_add(1, Ordering::Relaxed);
        self.incident(
            EventKind::CheckpointRolledBack,
            row,
            format!("checkpoint {id} rolled back: {reason}"),
            detail,
        )
        .await;
        Ok(Settled {
            id: id.to_string(),
            state: "rolled_back",
            files: None,
        })
    }

    async fn incident(
        &self,
        kind: EventKind,
        row: &CheckpointRow,
        reason: String,
        evidence: serde_json::Value,
    ) {
        let inc = NewIncident {
            kind,
            runner_id: Some(row.runner_id.clone()),
            tool_name: None,
            trace_id: None,
            span_id: None,
            reason,
            evidence: serde_json::json!({"checkpoint_id": row.id, "detail": evidence}),
            idempotency_key: keys::checkpoint(kind, &row.id),
            at_unix_nano: now_unix_nano(),
        };
        if let Err(e) = self.events.publish(inc).await {
            tracing::warn!(checkpoint = %row.id, "incident not recorded: {e}");
        }
    }
}
