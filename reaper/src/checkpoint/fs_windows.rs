//! The Windows arm of the checkpoint filesystem seam (docs/platforms.md, "Checkpoints on
//! Windows"; docs/design.md, Checkpoints): the same operations, rules and intent journal as
//! the Linux arm (`paths/fd.rs`, `commit.rs`, `rollback.rs`), carried out by path through
//! folders held open, since Windows has no `openat` / `renameat2`.
//!
//! - Every folder checked (the workspace root, `.workbench`, `checkpoints`, the staging
//!   folder and its subfolders, each destination folder) is opened with
//!   `FILE_FLAG_OPEN_REPARSE_POINT` (a link is opened, never followed), refused when it is a
//!   reparse point (symbolic link, junction, mount point) or not a folder, and held open
//!   without `FILE_SHARE_DELETE` until the operation ends: Windows then refuses to rename,
//!   delete or replace it meanwhile.
//! - Every staged file is opened the same way, refused when it is a reparse point or has
//!   more than one hard link (`nNumberOfLinks`, `GetFileInformationByHandle`), validated and
//!   flushed (`FlushFileBuffers`) through that handle, and held open without
//!   `FILE_SHARE_WRITE`, so its content cannot change between the check and the move. Its
//!   identity for the journal is (volume serial number, file index, size, last write time).
//! - The moves are [`move_file`] (`MoveFileExW` with `MOVEFILE_WRITE_THROUGH`). A file
//!   already at a destination is first kept as a hard link in
//!   `.workbench/checkpoints/{id}.undo/` (or moved there where the volume has no hard
//!   links), then replaced (`MOVEFILE_REPLACE_EXISTING`), so a conflict can undo every step:
//!   the staged file goes back to staging, the old file back to its place, created folders
//!   are removed. After each move the destination is looked at again and must be the
//!   validated file.
//! - Removal of a staging folder is std's `remove_dir_all`, which on Windows works by
//!   handle and removes a link itself, never what it points to.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::fs::OpenOptionsExt;
use std::os::windows::io::AsRawHandle;
use std::path::{Path, PathBuf};

use windows_sys::Win32::Storage::FileSystem::{
    CreateHardLinkW, GetFileInformationByHandle, BY_HANDLE_FILE_INFORMATION,
    FILE_ATTRIBUTE_DIRECTORY, FILE_ATTRIBUTE_REPARSE_POINT, FILE_FLAG_BACKUP_SEMANTICS,
    FILE_FLAG_OPEN_REPARSE_POINT, FILE_SHARE_DELETE, FILE_SHARE_READ, FILE_SHARE_WRITE,
};

use super::paths::{check_relative, invalid_ws, staging_components};
use super::recover::{roll_forward_entries, EntryMover};
use super::validate::validate_content;
use super::windows::{attributes, move_file};
use super::{CheckpointError, StagedFile};
use crate::failpoint;

/// `ERROR_SHARING_VIOLATION`, `ERROR_LOCK_VIOLATION`, `ERROR_ACCESS_DENIED`, `ERROR_USER_MAPPED_FILE`:
/// another program has the file open (or mapped) in a way that forbids the step.
const IN_USE: [i32; 4] = [32, 33, 5, 1224];

/// 100 ns ticks between 1601-01-01 (`FILETIME`) and the Unix epoch.
const FILETIME_UNIX_EPOCH: i64 = 116_444_736_000_000_000;

fn in_use(e: &io::Error) -> bool {
    e.raw_os_error().is_some_and(|c| IN_USE.contains(&c))
}

fn io_err(what: String) -> impl Fn(io::Error) -> CheckpointError {
    move |e| CheckpointError::io(what.clone(), e)
}

/// What `GetFileInformationByHandle` says about an opened file or folder.
struct Info {
    attributes: u32,
    volume: u64,
    index: u64,
    links: u32,
    size: u64,
    mtime_ns: i64,
}

impl Info {
    fn is_reparse(&self) -> bool {
        self.attributes & FILE_ATTRIBUTE_REPARSE_POINT != 0
    }
    fn is_dir(&self) -> bool {
        self.attributes & FILE_ATTRIBUTE_DIRECTORY != 0
    }
    /// The validated file: not a link or folder, one link, the same identity.
    fn is(&self, f: &StagedFile) -> bool {
        !self.is_reparse()
            && !self.is_dir()
            && self.links == 1
            && (self.volume, self.index, self.size, self.mtime_ns)
                == (f.dev, f.ino, f.size, f.mtime_ns)
    }
}

fn info(f: &File) -> io::Result<Info> {
    // SAFETY: the handle is live for the call (owned by `f`); the structure is plain data
    // the call fills.
    #[allow(unsafe_code)]
    let i = unsafe {
        let mut i: BY_HANDLE_FILE_INFORMATION = std::mem::zeroed();
        if GetFileInformationByHandle(f.as_raw_handle() as _, &mut i) == 0 {
            return Err(io::Error::last_os_error());
        }
        i
    };
    let ticks =
        ((i.ftLastWriteTime.dwHighDateTime as i64) << 32) | i.ftLastWriteTime.dwLowDateTime as i64;
    Ok(Info {
        attributes: i.dwFileAttributes,
        volume: i.dwVolumeSerialNumber as u64,
        index: ((i.nFileIndexHigh as u64) << 32) | i.nFileIndexLow as u64,
        links: i.nNumberOfLinks,
        size: ((i.nFileSizeHigh as u64) << 32) | i.nFileSizeLow as u64,
        mtime_ns: ticks
            .saturating_sub(FILETIME_UNIX_EPOCH)
            .saturating_mul(100),
    })
}

/// [`info`] of `f`, opened on `path`, with the reparse-point bit of `path`'s own
/// attributes added: Wine opens some links' targets even with
/// `FILE_FLAG_OPEN_REPARSE_POINT`, while `GetFileAttributesW` still says "reparse point"
/// (docs/platforms.md, Wine).
fn info_of(f: &File, path: &Path) -> Result<Info, CheckpointError> {
    let reading = || io_err(format!("reading {}", path.display()));
    let mut i = info(f).map_err(reading())?;
    if !i.is_reparse() {
        let own = attributes(path).map_err(reading())?;
        i.attributes |= own.unwrap_or(0) & FILE_ATTRIBUTE_REPARSE_POINT;
    }
    Ok(i)
}

/// Looks at `path` itself (a reparse point is not followed) without opening its content
/// (no access rights, so no sharing conflict). `None` when it does not exist.
fn look(path: &Path) -> Result<Option<Info>, CheckpointError> {
    let opened = OpenOptions::new()
        .access_mode(0)
        .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE)
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_BACKUP_SEMANTICS)
        .open(path);
    match opened {
        Ok(f) => info_of(&f, path).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CheckpointError::io(
            format!("opening {}", path.display()),
            e,
        )),
    }
}

/// A folder held open (see the module docs) with the folders above it up to the one it
/// was reached from.
pub struct Dir {
    path: PathBuf,
    _held: Vec<File>,
}

/// Opens folder `path` without following a link and holds it without delete sharing.
/// `Ok(None)` when it does not exist.
///
/// Errors: [`CheckpointError::PathEscape`] when it is a reparse point or not a folder;
/// [`CheckpointError::Io`] otherwise.
fn hold_dir(path: &Path) -> Result<Option<File>, CheckpointError> {
    let opened = OpenOptions::new()
        .read(true)
        .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE)
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_BACKUP_SEMANTICS)
        .open(path);
    let f = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(CheckpointError::io(
                format!("opening {}", path.display()),
                e,
            ))
        }
    };
    let i = info_of(&f, path)?;
    if i.is_reparse() || !i.is_dir() {
        return Err(CheckpointError::PathEscape {
            path: path.to_path_buf(),
            why: format!(
                "{} is a reparse point (symbolic link, junction or mount point) or not a folder: checkpoint folders must not leave the workspace",
                path.display()
            ),
        });
    }
    Ok(Some(f))
}

/// Holds `rel`'s folders below `base` one at a time. `Ok(None)` when one is missing.
fn hold_below<'a>(
    base: &Path,
    rel: impl IntoIterator<Item = &'a std::ffi::OsStr>,
) -> Result<Option<Dir>, CheckpointError> {
    let (mut path, mut held) = (base.to_path_buf(), Vec::new());
    for c in rel {
        path.push(c);
        match hold_dir(&path)? {
            Some(f) => held.push(f),
            None => return Ok(None),
        }
    }
    Ok(Some(Dir { path, _held: held }))
}

/// A path as the journal stores it: UTF-8 (Windows names are UTF-16; one that is not
/// valid Unicode is refused).
///
/// Errors: [`CheckpointError::Validation`] naming it.
pub fn path_bytes(p: &Path) -> Result<Vec<u8>, CheckpointError> {
    p.to_str()
        .map(|s| s.as_bytes().to_vec())
        .ok_or_else(|| CheckpointError::Validation {
            path: p.to_path_buf(),
            why: "the name is not valid Unicode; rename it".into(),
        })
}

/// A path from the journal's UTF-8 bytes.
pub fn path_of(bytes: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(bytes).into_owned())
}

/// Opens and holds the workspace root folder (checked by [`super::check_workspace`]).
///
/// Errors: [`CheckpointError::InvalidWorkspace`] (missing, a reparse point, not a folder);
/// [`CheckpointError::Io`] for a transient fault.
pub fn open_root(workspace: &Path) -> Result<Dir, CheckpointError> {
    match hold_dir(workspace) {
        Ok(Some(f)) => Ok(Dir {
            path: workspace.to_path_buf(),
            _held: vec![f],
        }),
        Ok(None) => Err(invalid_ws(format!(
            "workspace {} does not exist",
            workspace.display()
        ))),
        Err(CheckpointError::PathEscape { why, .. }) => Err(invalid_ws(why)),
        Err(e) => Err(e),
    }
}

/// Creates the staging folder of `id` one folder at a time, refusing (and never creating
/// through) a `.workbench` or `.workbench\checkpoints` that is a reparse point. The
/// folders inherit the workspace's ACL.
///
/// Errors: [`CheckpointError::PathEscape`], [`CheckpointError::Io`].
pub fn create_staging(root: &Dir, _workspace: &Path, id: &str) -> Result<Dir, CheckpointError> {
    let (mut path, mut held) = (root.path.clone(), Vec::new());
    for c in staging_components(id) {
        path.push(c);
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(CheckpointError::io(
                    format!("creating {}", path.display()),
                    e,
                ))
            }
        }
        let f = hold_dir(&path)?.ok_or_else(|| {
            CheckpointError::io(
                format!("{} vanished while being created", path.display()),
                io::ErrorKind::NotFound.into(),
            )
        })?;
        held.push(f);
    }
    Ok(Dir { path, _held: held })
}

/// Opens and holds the staging folder of `id` and the folders above it. `Ok(None)` when
/// it is gone.
///
/// Errors: [`CheckpointError::PathEscape`] (a reparse point on the way),
/// [`CheckpointError::Io`].
pub fn open_staging(
    root: &Dir,
    _workspace: &Path,
    id: &str,
) -> Result<Option<Dir>, CheckpointError> {
    hold_below(&root.path, staging_components(id))
}

/// A fully validated commit plan: nothing has been created or moved yet.
pub struct Plan {
    /// The files, sorted by path.
    pub files: Vec<StagedFile>,
    /// The staging folder.
    staging: PathBuf,
    /// Staging folders and files, held as the module docs say.
    _dirs: Vec<Dir>,
    _files: Vec<File>,
}

/// Validates and flushes every staged file through its handle and checks every
/// destination, creating nothing. Blocking.
///
/// Errors: [`CheckpointError::PathEscape`] (a reparse point in staging or on the way to a
/// destination), [`CheckpointError::Validation`] (bad content, a hard link),
/// [`CheckpointError::Conflict`] (a folder where a file should land, a staged file open for
/// writing by another program), [`CheckpointError::Io`].
pub fn prepare(
    root: &Dir,
    _workspace: &Path,
    staging: Dir,
    staging_path: &Path,
) -> Result<Plan, CheckpointError> {
    let (mut files, mut held_files, mut dirs) = (Vec::new(), Vec::new(), Vec::new());
    let mut stack = vec![(PathBuf::new(), staging)];
    while let Some((rel_dir, dir)) = stack.pop() {
        let reading = || format!("reading {}", dir.path.display());
        let mut names = std::fs::read_dir(&dir.path)
            .map_err(io_err(reading()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<Vec<OsString>>>()
            .map_err(io_err(reading()))?;
        names.sort();
        for name in names {
            let rel = rel_dir.join(&name);
            let path = dir.path.join(&name);
            let vanished = || CheckpointError::Conflict {
                why: format!("{} vanished from staging during the commit", rel.display()),
            };
            let seen = look(&path)?.ok_or_else(vanished)?;
            if seen.is_reparse() {
                return Err(CheckpointError::PathEscape {
                    why: format!(
                        "staged {} is a reparse point (symbolic link, junction or mount point); links are refused in staging: one harmless in staging can point outside the workspace from its new place",
                        rel.display()
                    ),
                    path: rel,
                });
            }
            if seen.is_dir() {
                let f = hold_dir(&path)?.ok_or_else(vanished)?;
                stack.push((
                    rel,
                    Dir {
                        path,
                        _held: vec![f],
                    },
                ));
                continue;
            }
            check_relative(&rel)?;
            path_bytes(&rel)?;
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .share_mode(FILE_SHARE_READ | FILE_SHARE_DELETE)
                .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT)
                .open(&path)
                .map_err(|e| match e {
                    e if in_use(&e) => CheckpointError::Conflict {
                        why: format!(
                            "staged {} is open for writing by another program; close it and commit again",
                            rel.display()
                        ),
                    },
                    e if e.kind() == io::ErrorKind::NotFound => vanished(),
                    e => CheckpointError::io(format!("opening {}", path.display()), e),
                })?;
            let i = info_of(&file, &path)?;
            if i.is_reparse() || i.is_dir() || (i.volume, i.index) != (seen.volume, seen.index) {
                return Err(CheckpointError::Validation {
                    path: rel,
                    why: "changed in staging while it was being validated".into(),
                });
            }
            if i.links > 1 {
                return Err(CheckpointError::Validation {
                    path: rel,
                    why: format!(
                        "has {} hard links: a hard-linked file would share its content with a file outside the workspace; copy it instead",
                        i.links
                    ),
                });
            }
            validate_content(&rel, i.size, &mut file)?;
            file.sync_all()
                .map_err(io_err(format!("flushing {}", path.display())))?;
            files.push(StagedFile {
                rel,
                dev: i.volume,
                ino: i.index,
                size: i.size,
                mtime_ns: i.mtime_ns,
            });
            held_files.push(file);
        }
        dirs.push(dir);
    }
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    for f in &files {
        check_destination(root, &f.rel)?;
    }
    Ok(Plan {
        files,
        staging: staging_path.to_path_buf(),
        _dirs: dirs,
        _files: held_files,
    })
}

/// Checks where `rel` lands without creating anything: each existing folder on the way is
/// a real folder (never a reparse point), and the destination is not a folder or a link.
fn check_destination(root: &Dir, rel: &Path) -> Result<(), CheckpointError> {
    let mut at = root.path.clone();
    let parent = rel.parent().unwrap_or(Path::new(""));
    for c in parent.iter() {
        at.push(c);
        match look(&at)? {
            None => return Ok(()), // created at apply time; nothing below it exists
            Some(i) if i.is_reparse() => {
                return Err(CheckpointError::PathEscape {
                    path: rel.to_path_buf(),
                    why: format!(
                        "{} would be written outside the workspace (through the reparse point {})",
                        rel.display(),
                        at.display()
                    ),
                })
            }
            Some(i) if !i.is_dir() => {
                return Err(CheckpointError::Conflict {
                    why: format!(
                        "{} cannot be written: {} is a file in the workspace",
                        rel.display(),
                        at.display()
                    ),
                })
            }
            Some(_) => {}
        }
    }
    match look(&root.path.join(rel))? {
        Some(i) if i.is_reparse() => Err(CheckpointError::PathEscape {
            path: rel.to_path_buf(),
            why: format!(
                "{} is a reparse point in the workspace; a checkpoint never replaces a link",
                rel.display()
            ),
        }),
        Some(i) if i.is_dir() => Err(CheckpointError::Conflict {
            why: format!("{} is a folder in the workspace", rel.display()),
        }),
        _ => Ok(()),
    }
}

/// Destination folders, held (and created when missing) from the root.
struct DestDirs<'a> {
    root: &'a Dir,
    held: HashMap<PathBuf, File>,
    /// Folders this commit created, in creation order.
    created: Vec<PathBuf>,
}

impl DestDirs<'_> {
    fn get(&mut self, rel_dir: &Path) -> Result<(), CheckpointError> {
        let (mut at, mut sofar) = (self.root.path.clone(), PathBuf::new());
        for c in rel_dir.iter() {
            at.push(c);
            sofar.push(c);
            if self.held.contains_key(&sofar) {
                continue;
            }
            match std::fs::create_dir(&at) {
                Ok(()) => self.created.push(sofar.clone()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(CheckpointError::io(format!("creating {}", at.display()), e)),
            }
            let f = hold_dir(&at)
                .map_err(|_| CheckpointError::Conflict {
                    why: format!(
                        "{} became a reparse point or a file during the commit",
                        at.display()
                    ),
                })?
                .ok_or_else(|| CheckpointError::Conflict {
                    why: format!("{} vanished during the commit", at.display()),
                })?;
            self.held.insert(sofar.clone(), f);
        }
        Ok(())
    }

    /// Lets go of the folders and removes the ones this commit created (empty ones only).
    fn release_and_remove_created(&mut self) {
        self.held.clear();
        for rel in self.created.iter().rev() {
            let _ = std::fs::remove_dir(self.root.path.join(rel));
        }
    }
}

/// True when `path` is the validated file (not a link, one link, the same identity).
fn is_validated(path: &Path, f: &StagedFile) -> bool {
    matches!(look(path), Ok(Some(i)) if i.is(f))
}

/// `{staging}.undo`: where a commit keeps the files it replaces until it is done.
fn undo_dir(staging: &Path) -> PathBuf {
    let mut p = staging.as_os_str().to_os_string();
    p.push(".undo");
    PathBuf::from(p)
}

/// Keeps the file at `to` as `backup`: a hard link (so `to` can then be replaced in one
/// step), or, where the volume has none, `to` moved there. Answers whether it linked.
fn back_up(to: &Path, backup: &Path) -> io::Result<bool> {
    if let Some(p) = backup.parent() {
        std::fs::create_dir_all(p)?;
    }
    let wide = |p: &Path| -> Vec<u16> { p.as_os_str().encode_wide().chain(Some(0)).collect() };
    let (wb, wt) = (wide(backup), wide(to));
    // SAFETY: both are NUL-terminated wide strings that outlive the call.
    #[allow(unsafe_code)]
    let linked = unsafe { CreateHardLinkW(wb.as_ptr(), wt.as_ptr(), std::ptr::null()) } != 0;
    if !linked {
        move_file(to, backup, false)?;
    }
    Ok(linked)
}

/// One move done, for the undo.
struct Done {
    rel: PathBuf,
    /// The file the destination held, kept for the undo.
    backup: Option<PathBuf>,
}

/// Reverses one move: the staged file back to staging, the old file back to its place.
fn undo_one(root: &Path, staging: &Path, d: &Done) -> io::Result<()> {
    let to = root.join(&d.rel);
    move_file(&to, &staging.join(&d.rel), false)?;
    if let Some(b) = &d.backup {
        move_file(b, &to, true)?;
    }
    Ok(())
}

/// What [`apply`] did.
#[derive(Debug)]
pub struct Applied {
    /// Files moved into the workspace.
    pub moved: usize,
}

/// Moves every planned file into the workspace (see the module docs). Hits failpoint
/// `checkpoint.after_rename` after each move. Blocking.
///
/// Errors: [`CheckpointError::Conflict`] (also a destination in use by another program)
/// or [`CheckpointError::Validation`] after a complete undo (the workspace is as it was);
/// [`CheckpointError::Io`] when a move or the undo failed (the journal then rolls it
/// forward at the next start).
pub fn apply(root: &Dir, _workspace: &Path, plan: &Plan) -> Result<Applied, CheckpointError> {
    let undo = undo_dir(&plan.staging);
    let mut dests = DestDirs {
        root,
        held: HashMap::new(),
        created: Vec::new(),
    };
    let mut done: Vec<Done> = Vec::new();
    let mut failure = None;
    for f in &plan.files {
        let from = plan.staging.join(&f.rel);
        let to = root.path.join(&f.rel);
        let step = (|| {
            dests.get(f.rel.parent().unwrap_or(Path::new("")))?;
            if !is_validated(&from, f) {
                return Err(CheckpointError::Validation {
                    path: f.rel.clone(),
                    why: "changed in staging after it was validated (swapped, linked or replaced); the commit was undone".into(),
                });
            }
            let in_use_conflict = |e: io::Error| {
                if in_use(&e) {
                    CheckpointError::Conflict {
                        why: format!(
                            "{} is in use by another program; the commit was undone: {e}",
                            f.rel.display()
                        ),
                    }
                } else if e.kind() == io::ErrorKind::AlreadyExists {
                    CheckpointError::Conflict {
                        why: format!(
                            "a file appeared at {} during the commit; the commit was undone",
                            f.rel.display()
                        ),
                    }
                } else {
                    CheckpointError::io(format!("moving {}", f.rel.display()), e)
                }
            };
            let backup = match look(&to)? {
                None => None,
                Some(i) if i.is_dir() => {
                    return Err(CheckpointError::Conflict {
                        why: format!(
                            "a folder appeared at {} during the commit; the commit was undone",
                            f.rel.display()
                        ),
                    })
                }
                Some(i) if i.is_reparse() => {
                    return Err(CheckpointError::Conflict {
                        why: format!(
                        "a reparse point appeared at {} during the commit; the commit was undone",
                        f.rel.display()
                    ),
                    })
                }
                Some(_) => {
                    let b = undo.join(&f.rel);
                    let linked = back_up(&to, &b).map_err(in_use_conflict)?;
                    Some((b, linked))
                }
            };
            let moved = move_file(&from, &to, backup.as_ref().is_some_and(|(_, l)| *l));
            if let Err(e) = moved {
                if let Some((b, false)) = &backup {
                    let _ = move_file(b, &to, false);
                } else if let Some((b, true)) = &backup {
                    let _ = std::fs::remove_file(b);
                }
                return Err(in_use_conflict(e));
            }
            let d = Done {
                rel: f.rel.clone(),
                backup: backup.map(|(b, _)| b),
            };
            if !is_validated(&to, f) {
                // Swapped between the check and the move: put it back, then undo the rest.
                let _ = undo_one(&root.path, &plan.staging, &d);
                return Err(CheckpointError::Validation {
                    path: f.rel.clone(),
                    why: "was swapped during the commit (not the file that was validated); the commit was undone".into(),
                });
            }
            Ok(d)
        })();
        match step {
            Ok(d) => {
                done.push(d);
                failpoint::hit("checkpoint.after_rename");
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    if let Some(e) = failure {
        let undo_errors: Vec<String> = done
            .iter()
            .rev()
            .filter(|d| undo_one(&root.path, &plan.staging, d).is_err())
            .map(|d| d.rel.display().to_string())
            .collect();
        dests.release_and_remove_created();
        if !undo_errors.is_empty() {
            return Err(CheckpointError::io(
                format!(
                    "{e}; undoing failed for {} (rolled forward at the next start)",
                    undo_errors.join(", ")
                ),
                io::ErrorKind::Other.into(),
            ));
        }
        let _ = std::fs::remove_dir_all(&undo);
        return Err(e);
    }
    let _ = std::fs::remove_dir_all(&undo);
    Ok(Applied { moved: done.len() })
}

/// Finishes a journaled commit after a crash: an entry whose destination already holds the
/// validated file is done; one whose staged name still holds it is moved (replacing what
/// is there); anything else is skipped and reported. Idempotent. Blocking.
///
/// Errors: [`CheckpointError::PathEscape`] (a journal entry that is not plain names).
pub fn roll_forward(
    root: &Dir,
    _workspace: &Path,
    staging: Option<&Dir>,
    staging_path: &Path,
    entries: &[StagedFile],
) -> Result<(usize, Vec<String>), CheckpointError> {
    let mut mover = Mover {
        dests: DestDirs {
            root,
            held: HashMap::new(),
            created: Vec::new(),
        },
        staged: staging.is_some(),
        staging_path,
    };
    roll_forward_entries(&mut mover, entries)
}

/// The Windows steps of a roll-forward.
struct Mover<'a> {
    dests: DestDirs<'a>,
    /// The staging folder still exists.
    staged: bool,
    staging_path: &'a Path,
}

impl EntryMover for Mover<'_> {
    fn landed(&mut self, f: &StagedFile) -> Result<bool, CheckpointError> {
        self.dests.get(f.rel.parent().unwrap_or(Path::new("")))?;
        Ok(is_validated(&self.dests.root.path.join(&f.rel), f))
    }

    fn move_staged(&mut self, f: &StagedFile) -> Result<bool, CheckpointError> {
        let from = self.staging_path.join(&f.rel);
        if !self.staged || !is_validated(&from, f) {
            return Ok(false);
        }
        let to = self.dests.root.path.join(&f.rel);
        move_file(&from, &to, true)
            .map(|()| true)
            .map_err(io_err(format!("moving {}", f.rel.display())))
    }
}

/// Removes the staging folder of `id` and its `.undo` folder (missing is fine), never
/// following a link: a staging folder that is itself a link is removed as the link.
///
/// Errors: [`CheckpointError::PathEscape`] when `.workbench` or `.workbench\checkpoints`
/// is a reparse point (nothing is removed through it), [`CheckpointError::Io`].
pub fn remove_staging(root: &Dir, _workspace: &Path, id: &str) -> Result<(), CheckpointError> {
    let [wb, cps, _] = staging_components(id);
    let Some(parent) = hold_below(&root.path, [wb, cps])? else {
        return Ok(());
    };
    let staging = parent.path.join(id);
    for path in [undo_dir(&staging), staging] {
        let removed = match look(&path)? {
            None => continue,
            Some(i) if i.is_reparse() && i.is_dir() => {
                std::fs::remove_dir(&path).or_else(|_| std::fs::remove_file(&path))
            }
            Some(i) if i.is_reparse() => std::fs::remove_file(&path),
            Some(_) => std::fs::remove_dir_all(&path),
        };
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(CheckpointError::io(
                    format!("removing {}", path.display()),
                    e,
                ))
            }
        }
    }
    Ok(())
}
