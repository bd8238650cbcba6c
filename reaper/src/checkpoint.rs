//! Checkpoints: a staging folder per transaction, validated and atomically committed into
//! the workspace, or rolled back leaving the workspace byte-for-byte as it was.
//!
//! DESIGN, Checkpoints: a tool writes into `{workspace}/.workbench/checkpoints/{id}/`, never
//! into the project folder. Commit = validate every file (content where the format has one:
//! JSON and `.ipynb` parse, CSV rows have the header's width, HDF5 carries its signature at
//! offset 0, 512, 1024, ...), fsync files and folders, write the intent journal
//! (`synchronous=FULL`), then `rename` each file into place; a crash in the middle is rolled
//! forward on restart ([`Checkpoints::roll_forward`]). Rollback = delete the staging folder.
//! Paths never leave the workspace root: `..`, absolute paths and symlinks pointing outside
//! are refused with a clear error; the staging folder and every folder between it and the
//! workspace root must not be symlinks (checked component by component, never followed, on
//! create, commit, roll-forward and rollback). The filesystem work is plain blocking code run on
//! tokio's blocking pool.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use stallwatch_storage::checkpoints::{CheckpointRow, CheckpointState};
use stallwatch_storage::control::{CheckpointCreated, CheckpointError, CheckpointOutcome};
use stallwatch_storage::model::{now_unix_nano, EventKind, NewIncident};
use stallwatch_storage::{EventBus, Storage};

use crate::failpoint;
use crate::stats::ReaperStats;

/// Staging folders live here, relative to the workspace root.
pub const STAGING_ROOT: &str = ".workbench/checkpoints";

/// HDF5 format signature (HDF5 spec, "Format Signature"): at offset 0, 512, 1024, 2048, ...
pub const HDF5_SIGNATURE: [u8; 8] = [0x89, b'H', b'D', b'F', b'\r', b'\n', 0x1a, b'\n'];

/// Extensions whose files must not be empty (the format has content).
const NEEDS_CONTENT: &[&str] = &[
    "json", "ipynb", "csv", "tsv", "h5", "hdf5", "hdf", "he5", "npy", "npz", "parquet", "png",
    "jpg", "jpeg", "pdf", "pkl", "pickle", "pt", "pth",
];

/// The staging folder of transaction `id` under `workspace`.
pub fn staging_dir(workspace: &Path, id: &str) -> PathBuf {
    workspace.join(STAGING_ROOT).join(id)
}

/// Checks a workspace root: absolute, an existing folder, not `/`. Answers its canonical
/// path. Errors: [`CheckpointError::InvalidWorkspace`], [`CheckpointError::PathEscape`] (`..`).
pub fn check_workspace(workspace: &Path) -> Result<PathBuf, CheckpointError> {
    if !workspace.is_absolute() {
        return Err(CheckpointError::InvalidWorkspace(format!(
            "workspace {} must be an absolute path",
            workspace.display()
        )));
    }
    if workspace
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(CheckpointError::PathEscape(format!(
            "workspace {} contains '..'",
            workspace.display()
        )));
    }
    let canon = fs::canonicalize(workspace).map_err(|e| {
        CheckpointError::InvalidWorkspace(format!("workspace {}: {e}", workspace.display()))
    })?;
    if !canon.is_dir() {
        return Err(CheckpointError::InvalidWorkspace(format!(
            "workspace {} is not a folder",
            workspace.display()
        )));
    }
    if canon.parent().is_none() {
        return Err(CheckpointError::InvalidWorkspace(format!(
            "workspace {} is the filesystem root; give the project folder",
            workspace.display()
        )));
    }
    Ok(canon)
}

/// Checks that the staging folder lies under `workspace` and that neither it nor any
/// folder between the workspace root and it is a symlink (each component is looked at with
/// `symlink_metadata`, never followed), and that it resolves to itself. Answers whether the
/// staging folder exists. Errors: `PathEscape` (a symlink or a path outside the
/// workspace), `Io`. Blocking.
pub fn verify_staging(staging: &Path, workspace: &Path) -> Result<bool, CheckpointError> {
    let escape = |why: String| CheckpointError::PathEscape(why);
    let rel = staging.strip_prefix(workspace).map_err(|_| {
        escape(format!(
            "staging folder {} is not under the workspace {}",
            staging.display(),
            workspace.display()
        ))
    })?;
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(escape(format!(
            "staging folder {} leaves the workspace",
            staging.display()
        )));
    }
    let mut cur = workspace.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(escape(format!(
                    "{} is a symlink: checkpoint folders must not leave the workspace",
                    cur.display()
                )))
            }
            Ok(m) if !m.is_dir() => {
                return Err(escape(format!("{} is not a folder", cur.display())))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(CheckpointError::Io(format!("{}: {e}", cur.display()))),
        }
    }
    let canon = fs::canonicalize(staging)
        .map_err(|e| CheckpointError::Io(format!("{}: {e}", staging.display())))?;
    if canon != staging {
        return Err(escape(format!(
            "staging folder {} resolves to {} (a symlinked workspace folder)",
            staging.display(),
            canon.display()
        )));
    }
    Ok(true)
}

/// Creates `{workspace}/.workbench/checkpoints/{id}` one folder at a time, refusing (and
/// never creating through) a symlinked `.workbench` or `.workbench/checkpoints`. Errors:
/// `PathEscape`, `Io`. Blocking.
pub fn create_staging(staging: &Path, workspace: &Path) -> Result<(), CheckpointError> {
    let rel = staging.strip_prefix(workspace).map_err(|_| {
        CheckpointError::PathEscape(format!("{} is not under the workspace", staging.display()))
    })?;
    let mut cur = workspace.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        match fs::create_dir(&cur) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(CheckpointError::Io(format!(
                    "creating {}: {e}",
                    cur.display()
                )))
            }
        }
        // A symlink is refused before anything is created below it.
        let m = fs::symlink_metadata(&cur)
            .map_err(|e| CheckpointError::Io(format!("{}: {e}", cur.display())))?;
        if m.file_type().is_symlink() || !m.is_dir() {
            return Err(CheckpointError::PathEscape(format!(
                    "{} is a symlink or not a folder: checkpoint folders must stay inside the workspace",
                    cur.display()
                ),
            ));
        }
    }
    verify_staging(staging, workspace).map(|_| ())
}

/// Checks that `rel` is a plain relative path (only normal components, no `..`, not
/// absolute, not under `.workbench/`).
pub fn check_relative(rel: &Path) -> Result<(), CheckpointError> {
    if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(CheckpointError::PathEscape(format!(
            "path {} leaves the workspace root ('..' or absolute)",
            rel.display()
        )));
    }
    if rel.components().next() == Some(Component::Normal(OsStr::new(".workbench"))) {
        return Err(CheckpointError::PathEscape(format!(
            "path {} would overwrite stallwatch's .workbench folder",
            rel.display()
        )));
    }
    Ok(())
}

/// Lists the files of a staging folder (relative paths, sorted). Symlinks are kept only
/// when they resolve inside `workspace`; anything else (sockets, devices) is refused.
pub fn staged_files(staging: &Path, workspace: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel_dir) = stack.pop() {
        let dir = staging.join(&rel_dir);
        let rd = fs::read_dir(&dir)
            .map_err(|e| CheckpointError::Io(format!("reading {}: {e}", dir.display())))?;
        for entry in rd {
            let entry =
                entry.map_err(|e| CheckpointError::Io(format!("{}: {e}", dir.display())))?;
            let rel = rel_dir.join(entry.file_name());
            let ft = entry
                .file_type()
                .map_err(|e| CheckpointError::Io(format!("{}: {e}", rel.display())))?;
            if ft.is_dir() {
                stack.push(rel);
            } else if ft.is_symlink() {
                let target = fs::canonicalize(entry.path()).map_err(|e| {
                    CheckpointError::PathEscape(format!(
                        "symlink {} does not resolve: {e}",
                        rel.display()
                    ))
                })?;
                if !target.starts_with(workspace) {
                    return Err(CheckpointError::PathEscape(format!(
                        "symlink {} points outside the workspace ({})",
                        rel.display(),
                        target.display()
                    )));
                }
                check_relative(&rel)?;
                out.push(rel);
            } else if ft.is_file() {
                check_relative(&rel)?;
                out.push(rel);
            } else {
                return Err(CheckpointError::NotAFile(rel.clone()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Counts the fields of each CSV record (RFC 4180 quoting; newlines inside quotes belong to
/// the field). Answers the first record whose width differs from the header's.
pub fn csv_width_mismatch(data: &[u8], sep: u8) -> Option<(usize, usize, usize)> {
    let mut widths = Vec::new();
    let (mut fields, mut in_quotes, mut any) = (1usize, false, false);
    let mut i = 0;
    while i < data.len() {
        let c = data[i];
        if in_quotes {
            if c == b'"' {
                if data.get(i + 1) == Some(&b'"') {
                    i += 1;
                } else {
                    in_quotes = false;
                }
            }
        } else if c == b'"' {
            in_quotes = true;
            any = true;
        } else if c == sep {
            fields += 1;
            any = true;
        } else if c == b'\n' {
            if any {
                widths.push(fields);
            }
            fields = 1;
            any = false;
        } else if c != b'\r' {
            any = true;
        }
        i += 1;
    }
    if any {
        widths.push(fields);
    }
    let header = *widths.first()?;
    widths
        .iter()
        .enumerate()
        .find(|(_, w)| **w != header)
        .map(|(row, w)| (row + 1, *w, header))
}

/// True when the HDF5 signature sits at offset 0, 512, 1024, 2048, ... of `data`.
pub fn has_hdf5_signature(data: &[u8]) -> bool {
    let mut off = 0usize;
    loop {
        match data.get(off..off + 8) {
            Some(s) if s == HDF5_SIGNATURE => return true,
            Some(_) => {}
            None => return false,
        }
        off = if off == 0 { 512 } else { off * 2 };
    }
}

/// Validates one staged file by its extension (issue 4, Checkpoints).
pub fn validate_file(path: &Path, rel: &Path) -> Result<(), CheckpointError> {
    let meta = fs::symlink_metadata(path)
        .map_err(|e| CheckpointError::Io(format!("{}: {e}", rel.display())))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let ext = rel
        .extension()
        .and_then(OsStr::to_str)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    let invalid = |why: String| CheckpointError::Validation {
        path: rel.to_path_buf(),
        why,
    };
    if meta.len() == 0 {
        return if NEEDS_CONTENT.contains(&ext.as_str()) {
            Err(invalid(format!("empty .{ext} file")))
        } else {
            Ok(())
        };
    }
    let read_all = || -> Result<Vec<u8>, CheckpointError> {
        fs::read(path).map_err(|e| CheckpointError::Io(format!("{}: {e}", rel.display())))
    };
    match ext.as_str() {
        "json" => {
            serde_json::from_slice::<serde_json::Value>(&read_all()?)
                .map_err(|e| invalid(format!("not valid JSON: {e}")))?;
        }
        "ipynb" => {
            let v: serde_json::Value = serde_json::from_slice(&read_all()?)
                .map_err(|e| invalid(format!("notebook is not valid JSON: {e}")))?;
            if !v.get("cells").is_some_and(|c| c.is_array()) {
                return Err(invalid("notebook has no \"cells\" list".into()));
            }
        }
        "csv" | "tsv" => {
            let sep = if ext == "csv" { b',' } else { b'\t' };
            if let Some((row, w, header)) = csv_width_mismatch(&read_all()?, sep) {
                return Err(invalid(format!(
                    "row {row} has {w} fields, the header has {header}"
                )));
            }
        }
        "h5" | "hdf5" | "hdf" | "he5" => {
            // Read only what the signature search needs: offsets up to the file size.
            let mut f = File::open(path)
                .map_err(|e| CheckpointError::Io(format!("{}: {e}", rel.display())))?;
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)
                .map_err(|e| CheckpointError::Io(format!("{}: {e}", rel.display())))?;
            if !has_hdf5_signature(&buf) {
                return Err(invalid(
                    "no HDF5 signature at offset 0, 512, 1024, ...".into(),
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Resolves where `rel` lands in the workspace, refusing a destination whose existing
/// parent folders resolve outside it (a symlinked folder), and creating missing folders.
pub fn destination(workspace: &Path, rel: &Path) -> Result<PathBuf, CheckpointError> {
    check_relative(rel)?;
    let dest = workspace.join(rel);
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| CheckpointError::Io(format!("creating {}: {e}", parent.display())))?;
        let canon = fs::canonicalize(parent)
            .map_err(|e| CheckpointError::Io(format!("{}: {e}", parent.display())))?;
        if !canon.starts_with(workspace) {
            return Err(CheckpointError::PathEscape(format!(
                "{} would be written outside the workspace (through {})",
                rel.display(),
                canon.display()
            )));
        }
    }
    if let Ok(m) = fs::symlink_metadata(&dest) {
        if m.is_dir() {
            return Err(CheckpointError::Conflict(rel.to_path_buf()));
        }
    }
    Ok(dest)
}

fn fsync_path(p: &Path) -> Result<(), CheckpointError> {
    File::open(p)
        .and_then(|f| f.sync_all())
        .map_err(|e| CheckpointError::Io(format!("fsync {}: {e}", p.display())))
}

/// Validates and fsyncs every staged file and checks every destination. Answers the
/// relative paths to rename, in order. Blocking.
pub fn prepare_commit(staging: &Path, workspace: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    if !verify_staging(staging, workspace)? {
        return Err(CheckpointError::Io(format!(
            "staging folder {} is missing",
            staging.display()
        )));
    }
    let files = staged_files(staging, workspace)?;
    for rel in &files {
        let p = staging.join(rel);
        validate_file(&p, rel)?;
        destination(workspace, rel)?;
    }
    fsync_files(staging, &files)?;
    fsync_dirs(staging, &files)?;
    Ok(files)
}

/// Threads used to fsync staged files: the device queues concurrent flushes, so a few
/// threads cut the time of a large checkpoint.
const FSYNC_THREADS: usize = 8;

/// fsyncs every regular staged file, on up to [`FSYNC_THREADS`] threads.
fn fsync_files(root: &Path, files: &[PathBuf]) -> Result<(), CheckpointError> {
    let chunk = files.len().div_ceil(FSYNC_THREADS).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || -> Result<(), CheckpointError> {
                    for rel in part {
                        let p = root.join(rel);
                        if !fs::symlink_metadata(&p)
                            .map(|m| m.is_symlink())
                            .unwrap_or(false)
                        {
                            fsync_path(&p)?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| internal("fsync thread panicked"))?)
    })
}

fn fsync_dirs(root: &Path, files: &[PathBuf]) -> Result<(), CheckpointError> {
    let mut dirs: Vec<PathBuf> = files
        .iter()
        .filter_map(|f| f.parent().map(|p| root.join(p)))
        .collect();
    dirs.push(root.to_path_buf());
    dirs.sort();
    dirs.dedup();
    for d in dirs {
        if d.exists() {
            fsync_path(&d)?;
        }
    }
    Ok(())
}

/// Renames each journaled file still in staging into the workspace (idempotent: a file
/// already moved is skipped), fsyncs the touched folders, removes the staging folder.
/// Blocking. Hits failpoint `checkpoint.after_rename` after each rename.
pub fn apply_renames(
    staging: &Path,
    workspace: &Path,
    rels: &[PathBuf],
) -> Result<usize, CheckpointError> {
    let mut moved = 0;
    if !verify_staging(staging, workspace)? {
        // Every file was renamed and the folder removed before a crash.
        return Ok(0);
    }
    for rel in rels {
        let src = staging.join(rel);
        if fs::symlink_metadata(&src).is_err() {
            continue; // renamed before a crash
        }
        let dest = destination(workspace, rel)?;
        fs::rename(&src, &dest)
            .map_err(|e| CheckpointError::Io(format!("rename {}: {e}", rel.display())))?;
        moved += 1;
        failpoint::hit("checkpoint.after_rename");
    }
    fsync_dirs(workspace, rels)?;
    remove_staging(staging)?;
    Ok(moved)
}

/// Removes a staging folder (missing is fine) and fsyncs its parent. Blocking.
pub fn remove_staging(staging: &Path) -> Result<(), CheckpointError> {
    match fs::remove_dir_all(staging) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(CheckpointError::Io(format!(
                "removing {}: {e}",
                staging.display()
            )))
        }
    }
    if let Some(parent) = staging.parent() {
        if parent.exists() {
            fsync_path(parent)?;
        }
    }
    Ok(())
}

fn internal(e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Internal(e.to_string())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CheckpointError> + Send + 'static,
) -> Result<T, CheckpointError> {
    tokio::task::spawn_blocking(f).await.map_err(internal)?
}

/// The checkpoint operations with their journal and incidents.
#[derive(Clone)]
pub struct Checkpoints {
    storage: Storage,
    events: EventBus,
    stats: Arc<ReaperStats>,
    /// stallwatch's data folder (canonical): no workspace may lie inside it.
    data_dir: Option<PathBuf>,
}

fn path_of(bytes: &[u8]) -> PathBuf {
    PathBuf::from(std::ffi::OsString::from_vec(bytes.to_vec()))
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
        self.data_dir = Some(fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()));
        self
    }

    /// Creates the staging folder of a new transaction for `runner_id` under `workspace`.
    /// Answers `{"id","path"}`. Errors: `InvalidWorkspace` (also inside the data folder)
    /// or `PathEscape`, `Io`.
    pub async fn create(
        &self,
        runner_id: &str,
        workspace: &Path,
    ) -> Result<CheckpointCreated, CheckpointError> {
        let ws = check_workspace(workspace)?;
        if let Some(data) = &self.data_dir {
            if ws.starts_with(data) {
                return Err(CheckpointError::InvalidWorkspace(format!(
                    "workspace {} is inside stallwatch's data folder {}",
                    workspace.display(),
                    data.display()
                )));
            }
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let staging = staging_dir(&ws, &id);
        let st = staging.clone();
        let w2 = ws.clone();
        blocking(move || {
            create_staging(&st, &w2)?;
            if let Some(p) = st.parent() {
                fsync_path(p)?;
            }
            Ok(())
        })
        .await?;
        let now = now_unix_nano();
        self.storage
            .create_checkpoint(CheckpointRow {
                id: id.clone(),
                runner_id: runner_id.to_string(),
                workspace: ws.as_os_str().as_bytes().to_vec(),
                staging: staging.as_os_str().as_bytes().to_vec(),
                state: CheckpointState::Open,
                detail: serde_json::json!({}),
                created_unix_nano: now,
                updated_unix_nano: now,
            })
            .await
            .map_err(internal)?;
        Ok(CheckpointCreated { id, path: staging })
    }

    async fn row(&self, id: &str) -> Result<CheckpointRow, CheckpointError> {
        self.storage
            .checkpoint(id.to_string())
            .await
            .map_err(internal)?
            .ok_or_else(|| CheckpointError::NotFound(format!("no checkpoint {id}")))
    }

    /// Validates, fsyncs, journals and renames every staged file into the workspace.
    /// Answers `{"id","state":"committed","files"}`. Errors: `NotFound`, `NotOpen`,
    /// `Validation` (nothing moved), `PathEscape`, `Io`.
    pub async fn commit(&self, id: &str) -> Result<CheckpointOutcome, CheckpointError> {
        let row = self.row(id).await?;
        if row.state != CheckpointState::Open {
            return Err(CheckpointError::NotOpen(format!(
                "checkpoint {id} is {}",
                row.state.as_str()
            )));
        }
        let (staging, ws) = (path_of(&row.staging), path_of(&row.workspace));
        let (s2, w2) = (staging.clone(), ws.clone());
        let files = blocking(move || prepare_commit(&s2, &w2)).await?;
        let journal = files
            .iter()
            .map(|p| p.as_os_str().as_bytes().to_vec())
            .collect();
        let began = self
            .storage
            .begin_checkpoint_commit(id.to_string(), journal, now_unix_nano())
            .await
            .map_err(internal)?;
        if !began {
            return Err(CheckpointError::NotOpen(format!(
                "checkpoint {id} is not open"
            )));
        }
        self.finish_commit(&row, files).await
    }

    async fn finish_commit(
        &self,
        row: &CheckpointRow,
        files: Vec<PathBuf>,
    ) -> Result<CheckpointOutcome, CheckpointError> {
        let (staging, ws) = (path_of(&row.staging), path_of(&row.workspace));
        let n = files.len();
        blocking(move || apply_renames(&staging, &ws, &files)).await?;
        let detail = serde_json::json!({"files": n});
        self.storage
            .finish_checkpoint(
                row.id.clone(),
                vec![CheckpointState::Committing],
                CheckpointState::Committed,
                detail.clone(),
                now_unix_nano(),
            )
            .await
            .map_err(internal)?;
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
        Ok(CheckpointOutcome::committed(row.id.clone(), n as u64))
    }

    /// Rolls a `committing` checkpoint forward from its intent journal (after a crash).
    pub async fn roll_forward(&self, id: &str) -> Result<CheckpointOutcome, CheckpointError> {
        let row = self.row(id).await?;
        if row.state != CheckpointState::Committing {
            return Err(CheckpointError::NotCommitting(format!(
                "checkpoint {id} is {}",
                row.state.as_str()
            )));
        }
        let journal = self
            .storage
            .checkpoint_journal(id.to_string())
            .await
            .map_err(internal)?;
        let files: Vec<PathBuf> = journal.iter().map(|b| path_of(b)).collect();
        self.finish_commit(&row, files).await
    }

    /// Removes the staging folder of an `open` checkpoint; the workspace is untouched.
    /// Answers `{"id","state":"rolled_back"}`. Errors: `NotFound`, `NotOpen` (already committed
    /// or in a commit, which only rolls forward), `Io`.
    pub async fn rollback(
        &self,
        id: &str,
        reason: &str,
    ) -> Result<CheckpointOutcome, CheckpointError> {
        let row = self.row(id).await?;
        match row.state {
            CheckpointState::Open => {}
            CheckpointState::RolledBack => return Ok(CheckpointOutcome::rolled_back(id)),
            s => {
                return Err(CheckpointError::NotOpen(format!(
                    "checkpoint {id} is {}",
                    s.as_str()
                )))
            }
        }
        let (staging, ws) = (path_of(&row.staging), path_of(&row.workspace));
        blocking(move || {
            // Never delete through a symlink: a symlinked staging folder or parent is refused.
            if verify_staging(&staging, &ws)? {
                remove_staging(&staging)?;
            }
            Ok(())
        })
        .await?;
        let detail = serde_json::json!({"reason": reason});
        self.storage
            .finish_checkpoint(
                id.to_string(),
                vec![CheckpointState::Open],
                CheckpointState::RolledBack,
                detail.clone(),
                now_unix_nano(),
            )
            .await
            .map_err(internal)?;
        self.stats
            .checkpoints_rolled_back
            .fetch_add(1, Ordering::Relaxed);
        self.incident(
            EventKind::CheckpointRolledBack,
            &row,
            format!("checkpoint {id} rolled back: {reason}"),
            detail,
        )
        .await;
        Ok(CheckpointOutcome::rolled_back(id))
    }

    /// Settles every active checkpoint of `runner_id` (or of every runner): `open` ones are
    /// rolled back, `committing` ones rolled forward. Answers the ids handled and the
    /// errors met (the loop goes on after an error).
    pub async fn settle_runner(
        &self,
        runner_id: Option<&str>,
        reason: &str,
        batch: usize,
    ) -> (Vec<String>, Vec<String>) {
        let (mut done, mut errors) = (Vec::new(), Vec::new());
        let mut after = String::new();
        loop {
            let rows = match self
                .storage
                .active_checkpoints(runner_id.map(str::to_string), after.clone(), batch)
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    errors.push(format!("listing checkpoints: {e}"));
                    break;
                }
            };
            let Some(last) = rows.last() else { break };
            after = last.id.clone();
            for row in rows {
                let r = match row.state {
                    CheckpointState::Committing => self.roll_forward(&row.id).await,
                    _ => self.rollback(&row.id, reason).await,
                };
                match r {
                    Ok(_) => done.push(row.id),
                    Err(e) => errors.push(format!("checkpoint {}: {e}", row.id)),
                }
            }
        }
        (done, errors)
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
            idempotency_key: format!("{}:{}", kind.as_str(), row.id),
            at_unix_nano: now_unix_nano(),
        };
        if let Err(e) = self.events.publish(inc).await {
            tracing::warn!(checkpoint = %row.id, "incident not recorded: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_widths_with_quotes_and_newlines() {
        assert_eq!(csv_width_mismatch(b"a,b\n1,2\n\"x,\ny\",3\n", b','), None);
        assert_eq!(csv_width_mismatch(b"a,b\n1,2,3\n", b','), Some((2, 3, 2)));
        assert_eq!(csv_width_mismatch(b"a,b\r\n1,2\r\n", b','), None);
    }

    #[test]
    fn hdf5_signature_at_power_of_two_offsets() {
        let mut d = vec![0u8; 2048 + 8];
        assert!(!has_hdf5_signature(&d));
        d[1024..1032].copy_from_slice(&HDF5_SIGNATURE);
        assert!(has_hdf5_signature(&d));
        let mut e = vec![0u8; 800];
        e[300..308].copy_from_slice(&HDF5_SIGNATURE);
        assert!(!has_hdf5_signature(&e), "300 is not a valid offset");
    }

    #[test]
    fn relative_paths_must_stay_inside() {
        assert!(check_relative(Path::new("a/b.json")).is_ok());
        assert!(check_relative(Path::new("../x")).is_err());
        assert!(check_relative(Path::new("/etc/passwd")).is_err());
        assert!(check_relative(Path::new(".workbench/x")).is_err());
    }

    #[test]
    fn empty_files_only_where_the_format_has_no_content() {
        let d = tempfile::tempdir().unwrap();
        let init = d.path().join("__init__.py");
        fs::write(&init, b"").unwrap();
        assert!(validate_file(&init, Path::new("pkg/__init__.py")).is_ok());
        let j = d.path().join("a.json");
        fs::write(&j, b"").unwrap();
        assert!(matches!(
            validate_file(&j, Path::new("a.json")).unwrap_err(),
            CheckpointError::Validation { .. }
        ));
        fs::write(&j, b"{\"a\": [1,").unwrap();
        assert!(validate_file(&j, Path::new("a.json")).is_err());
        let nb = d.path().join("n.ipynb");
        fs::write(&nb, br#"{"cells": [], "metadata": {}}"#).unwrap();
        assert!(validate_file(&nb, Path::new("n.ipynb")).is_ok());
    }
}
