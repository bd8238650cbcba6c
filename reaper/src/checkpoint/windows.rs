//! The checkpoint commit step on Windows (docs/platforms.md, "durable rename (checkpoints)";
//! docs/design.md, Checkpoints): the seam's Windows arm next to the Linux `renameat2` one in
//! `commit.rs`.
//!
//! A staged file lands in the workspace with `MoveFileExW(MOVEFILE_REPLACE_EXISTING |
//! MOVEFILE_WRITE_THROUGH)` after `FlushFileBuffers` on it (std's `File::sync_all`), so the
//! call returns only once the content and the move are on disk. Reparse points (symbolic
//! links, junctions, mount points) are refused the way Linux refuses symlinks: the staged
//! file, the destination when it exists, and every folder between each root and them are
//! looked at without following (`GetFileAttributesW` on the path, and the attributes of a
//! handle opened with `FILE_FLAG_OPEN_REPARSE_POINT`); one reparse point anywhere refuses the
//! file before anything moves.
//!
//! Self-contained (std and windows-sys only), so the Windows test probe compiles this very
//! file and runs it under Wine. The checkpoint seam's Windows arm (`fs_windows.rs`) moves
//! every file with [`move_file`] after its own checks.

use std::ffi::OsStr;
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::fs::OpenOptionsExt;
use std::os::windows::io::AsRawHandle;
use std::path::{Component, Path, PathBuf};

use windows_sys::Win32::Storage::FileSystem::{
    GetFileAttributesW, GetFileInformationByHandle, MoveFileExW, BY_HANDLE_FILE_INFORMATION,
    FILE_ATTRIBUTE_REPARSE_POINT, FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OPEN_REPARSE_POINT,
    INVALID_FILE_ATTRIBUTES, MOVEFILE_REPLACE_EXISTING, MOVEFILE_WRITE_THROUGH,
};

/// A NUL-terminated UTF-16 copy of `p` for the `W` calls.
fn wide(p: &Path) -> Vec<u16> {
    OsStr::new(p).encode_wide().chain(Some(0)).collect()
}

/// The attributes of `path` itself (a reparse point is not followed), or `None` when it
/// does not exist.
pub fn attributes(path: &Path) -> io::Result<Option<u32>> {
    let w = wide(path);
    // SAFETY: `w` is a NUL-terminated wide string that outlives the call.
    #[allow(unsafe_code)]
    let a = unsafe { GetFileAttributesW(w.as_ptr()) };
    if a != INVALID_FILE_ATTRIBUTES {
        return Ok(Some(a));
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::NotFound => Ok(None),
        _ => Err(io::Error::new(
            e.kind(),
            format!("cannot read the attributes of {}: {e}", path.display()),
        )),
    }
}

/// The attributes of the object a handle opened on `path` without following reaches.
fn handle_attributes(path: &Path) -> io::Result<u32> {
    let f = std::fs::OpenOptions::new()
        .access_mode(0)
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display())))?;
    // SAFETY: the handle is live for the call (owned by `f`); the structure is plain data
    // the call fills.
    #[allow(unsafe_code)]
    unsafe {
        let mut info: BY_HANDLE_FILE_INFORMATION = std::mem::zeroed();
        if GetFileInformationByHandle(f.as_raw_handle() as _, &mut info) == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(info.dwFileAttributes)
    }
}

fn reparse_error(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is a reparse point (symbolic link, junction or mount point): refused",
            path.display()
        ),
    )
}

/// Refuses `path` when it is a reparse point; answers whether it exists.
///
/// Errors: `InvalidInput` naming the path for a reparse point; the I/O error otherwise.
pub fn refuse_reparse_point(path: &Path) -> io::Result<bool> {
    let Some(a) = attributes(path)? else {
        return Ok(false);
    };
    if a & FILE_ATTRIBUTE_REPARSE_POINT != 0
        || handle_attributes(path)? & FILE_ATTRIBUTE_REPARSE_POINT != 0
    {
        return Err(reparse_error(path));
    }
    Ok(true)
}

/// `rel` as plain names only (no root, drive, `.` or `..`), so it cannot leave its root.
///
/// Errors: `InvalidInput` naming `rel`.
pub fn check_relative(rel: &Path) -> io::Result<()> {
    let plain =
        rel.components().count() > 0 && rel.components().all(|c| matches!(c, Component::Normal(_)));
    if plain {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} must be a relative path of plain names", rel.display()),
        ))
    }
}

/// Refuses a reparse point at `root` or at any component of `root\rel`; answers whether
/// `root\rel` exists. A missing folder on the way is an error unless it is the last
/// component.
fn check_chain(root: &Path, rel: &Path) -> io::Result<bool> {
    if !refuse_reparse_point(root)? {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} does not exist", root.display()),
        ));
    }
    let mut at = PathBuf::from(root);
    let names: Vec<_> = rel.components().collect();
    for (i, c) in names.iter().enumerate() {
        at.push(c.as_os_str());
        let exists = refuse_reparse_point(&at)?;
        if !exists {
            if i + 1 == names.len() {
                return Ok(false);
            }
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("folder {} does not exist", at.display()),
            ));
        }
    }
    Ok(true)
}

/// Moves the staged file `staging\rel` to `workspace\rel`, replacing what is there:
/// reparse points refused on both sides, the staged file flushed (`FlushFileBuffers`),
/// then `MoveFileExW(MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)`. The destination
/// folder must exist. Answers whether a file was replaced.
///
/// Errors: `InvalidInput` for a reparse point, a `rel` that is not plain names, or a
/// folder where a file should land; `NotFound` for a missing staged file or destination
/// folder; the system's error when the flush or the move fails. Nothing has moved then.
pub fn commit_file(staging: &Path, workspace: &Path, rel: &Path) -> io::Result<bool> {
    check_relative(rel)?;
    let from = staging.join(rel);
    let to = workspace.join(rel);
    if !check_chain(staging, rel)? {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("staged file {} does not exist", from.display()),
        ));
    }
    if std::fs::symlink_metadata(&from)?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("staged {} is a folder, not a file", from.display()),
        ));
    }
    let replaced = check_chain(workspace, rel)?;
    if replaced && std::fs::symlink_metadata(&to)?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is a folder where a file should land", to.display()),
        ));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT)
        .open(&from)
        .and_then(|f| f.sync_all())
        .map_err(|e| io::Error::new(e.kind(), format!("cannot flush {}: {e}", from.display())))?;
    move_file(&from, &to, true)?;
    Ok(replaced)
}

/// `MoveFileExW(from, to, MOVEFILE_WRITE_THROUGH)`, with `MOVEFILE_REPLACE_EXISTING` when
/// `replace`: returns once the move is on disk. Without `replace` an existing `to` fails
/// with `AlreadyExists` and nothing moves.
///
/// Errors: the system's error naming both paths.
pub fn move_file(from: &Path, to: &Path, replace: bool) -> io::Result<()> {
    let (wf, wt) = (wide(from), wide(to));
    let flags = if replace {
        MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH
    } else {
        MOVEFILE_WRITE_THROUGH
    };
    // SAFETY: both are NUL-terminated wide strings that outlive the call.
    #[allow(unsafe_code)]
    let ok = unsafe { MoveFileExW(wf.as_ptr(), wt.as_ptr(), flags) };
    if ok == 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot move {} to {}: {e}", from.display(), to.display()),
        ));
    }
    Ok(())
}
