//! Removing a staging folder by descriptor: every entry is looked at with
//! `statat(AT_SYMLINK_NOFOLLOW)` and removed with `unlinkat` relative to the folder that
//! holds it, so a symlink is removed as a link and never followed, wherever it points
//! (`docs/design.md`, Checkpoints: rollback leaves the workspace byte-for-byte as it was).

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType};
use rustix::io::Errno;

use super::paths::{self, open_dir_at};
use super::CheckpointError;

/// The names in folder `dir` (without `.` and `..`).
pub fn names(dir: impl AsFd, shown: &Path) -> Result<Vec<OsString>, CheckpointError> {
    let err = |e: Errno| CheckpointError::io(format!("reading {}", shown.display()), e.into());
    let d = Dir::read_from(dir).map_err(err)?;
    let mut out = Vec::new();
    for ent in d {
        let ent = ent.map_err(err)?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    out.sort();
    Ok(out)
}

/// Removes entry `name` of `parent` and, if it is a folder, everything below it, never
/// following a symlink. A missing entry is fine.
///
/// Errors: [`CheckpointError::Io`] naming the entry.
pub fn remove_tree(parent: &OwnedFd, name: &OsStr, shown: &Path) -> Result<(), CheckpointError> {
    let err = |e: Errno| CheckpointError::io(format!("removing {}", shown.display()), e.into());
    let Some(st) = paths::kind_at(parent, name).map_err(err)? else {
        return Ok(());
    };
    if paths::file_type(&st) == FileType::Directory {
        if let Some(dir) = open_dir_at(parent, name, shown)? {
            for n in names(&dir, shown)? {
                remove_tree(&dir, &n, &shown.join(&n))?;
            }
        }
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(err(e)),
        }
    } else {
        match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(err(e)),
        }
    }
    Ok(())
}

/// Removes the staging folder of `id` below the workspace root `root` (missing is fine) and
/// fsyncs `.workbench/checkpoints`.
///
/// Errors: [`CheckpointError::PathEscape`] when `.workbench` or `.workbench/checkpoints` is
/// a symlink (nothing is removed through it), [`CheckpointError::Io`].
pub fn remove_staging(root: &OwnedFd, workspace: &Path, id: &str) -> Result<(), CheckpointError> {
    let [wb, cps, name] = paths::staging_components(id);
    let Some(parent) = paths::open_below(root, [wb, cps], workspace)? else {
        return Ok(());
    };
    remove_tree(&parent, name, &paths::staging_dir(workspace, id))?;
    let _ = rustix::fs::fsync(&parent);
    Ok(())
}
