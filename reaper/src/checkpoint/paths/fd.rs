//! The Linux arm of the checkpoint filesystem seam, by directory descriptor: every folder
//! below the workspace root is reached one component at a time with
//! `openat(O_DIRECTORY | O_NOFOLLOW)`, so a symlink anywhere fails with `ELOOP`/`ENOTDIR`
//! instead of being followed, and nothing is re-resolved by path after it was checked.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::super::CheckpointError;
use super::{invalid_ws, staging_components};

/// Opens the workspace root folder (`O_DIRECTORY | O_NOFOLLOW`).
///
/// Errors: [`CheckpointError::InvalidWorkspace`] (missing, not a folder, a symlink, no
/// access), [`CheckpointError::Io`] for a transient fault.
pub fn open_root(workspace: &Path) -> Result<OwnedFd, CheckpointError> {
    rustix::fs::open(workspace, dir_flags(), Mode::empty()).map_err(|e| match e {
        Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::ACCESS | Errno::PERM => {
            invalid_ws(format!(
                "workspace {}: {}",
                workspace.display(),
                std::io::Error::from(e)
            ))
        }
        e => CheckpointError::io(
            format!("opening workspace {}", workspace.display()),
            e.into(),
        ),
    })
}

/// Flags of every folder opened below the root.
pub fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Opens folder `name` in `dir` without following a symlink. `Ok(None)` when it does not
/// exist. `shown` names it in errors.
///
/// Errors: [`CheckpointError::PathEscape`] when it is a symlink or not a folder;
/// [`CheckpointError::Io`] otherwise.
pub fn open_dir_at(
    dir: impl AsFd,
    name: &OsStr,
    shown: &Path,
) -> Result<Option<OwnedFd>, CheckpointError> {
    match rustix::fs::openat(dir, name, dir_flags(), Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(Errno::LOOP) | Err(Errno::NOTDIR) => Err(CheckpointError::PathEscape {
            path: shown.to_path_buf(),
            why: format!(
                "{} is a symlink or not a folder: checkpoint folders must not leave the workspace",
                shown.display()
            ),
        }),
        Err(e) => Err(CheckpointError::io(
            format!("opening {}", shown.display()),
            e.into(),
        )),
    }
}

/// Opens `rel` (folders only) below `root` one component at a time, never following a
/// symlink. `Ok(None)` when a component is missing.
///
/// Errors: as [`open_dir_at`].
pub fn open_below<'a>(
    root: &OwnedFd,
    rel: impl IntoIterator<Item = &'a OsStr>,
    base: &Path,
) -> Result<Option<OwnedFd>, CheckpointError> {
    let mut cur = rustix::io::dup(root).map_err(|e| CheckpointError::io("dup", e.into()))?;
    let mut shown = base.to_path_buf();
    for c in rel {
        shown.push(c);
        match open_dir_at(&cur, c, &shown)? {
            Some(fd) => cur = fd,
            None => return Ok(None),
        }
    }
    Ok(Some(cur))
}

/// Creates the staging folder of `id` below the workspace root `root` one folder at a time
/// (`mkdirat`, mode 0700), refusing (and never creating through) a symlinked `.workbench` or
/// `.workbench/checkpoints`. Answers the staging folder's descriptor.
///
/// Errors: [`CheckpointError::PathEscape`], [`CheckpointError::Io`].
pub fn create_staging(
    root: &OwnedFd,
    workspace: &Path,
    id: &str,
) -> Result<OwnedFd, CheckpointError> {
    let mut cur = rustix::io::dup(root).map_err(|e| CheckpointError::io("dup", e.into()))?;
    let mut shown = workspace.to_path_buf();
    for c in staging_components(id) {
        shown.push(c);
        match rustix::fs::mkdirat(&cur, c, Mode::RWXU) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => {
                return Err(CheckpointError::io(
                    format!("creating {}", shown.display()),
                    e.into(),
                ))
            }
        }
        cur = open_dir_at(&cur, c, &shown)?.ok_or_else(|| {
            CheckpointError::io(
                format!("{} vanished while being created", shown.display()),
                std::io::ErrorKind::NotFound.into(),
            )
        })?;
    }
    let _ = rustix::fs::fsync(&cur);
    Ok(cur)
}

/// Opens the staging folder of `id` below `root`. `Ok(None)` when it is gone.
///
/// Errors: [`CheckpointError::PathEscape`] (a symlinked staging folder or parent, whose
/// message says "symlink"), [`CheckpointError::Io`].
pub fn open_staging(
    root: &OwnedFd,
    workspace: &Path,
    id: &str,
) -> Result<Option<OwnedFd>, CheckpointError> {
    open_below(root, staging_components(id), workspace)
}

/// What a directory entry is, looked at without following it.
pub fn kind_at(dir: impl AsFd, name: &OsStr) -> Result<Option<rustix::fs::Stat>, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The file type of a `stat`.
pub fn file_type(st: &rustix::fs::Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// `(device, inode, link count)` of a `stat`.
#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
pub fn ident(st: &rustix::fs::Stat) -> (u64, u64, u64) {
    (st.st_dev as u64, st.st_ino as u64, st.st_nlink as u64)
}

/// `(size in bytes, modification time in ns since the Unix epoch)` of a `stat`.
#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
pub fn size_mtime(st: &rustix::fs::Stat) -> (u64, i64) {
    (
        st.st_size.max(0) as u64,
        (st.st_mtime as i64)
            .saturating_mul(1_000_000_000)
            .saturating_add(st.st_mtime_nsec as i64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_never_followed_through_a_symlink() {
        let ws = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(out.path(), ws.path().join(".workbench")).unwrap();
        let root = open_root(ws.path()).unwrap();
        assert!(matches!(
            create_staging(&root, ws.path(), "x"),
            Err(CheckpointError::PathEscape { .. })
        ));
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    }
}
