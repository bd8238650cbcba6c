//! The commit itself, by file descriptor (issue 17 #3–#7; `docs/design.md`, Checkpoints).
//!
//! [`prepare`] walks the staging folder through directory descriptors, opens every entry
//! with `O_NOFOLLOW`, `fstat`s what it opened (regular file, link count 1), validates the
//! content from that descriptor, fsyncs it and records its `(device, inode)`; symlinks,
//! hard-linked files and special files are refused. It then checks every destination in
//! the workspace, looking without creating (#7): a symlinked or non-folder parent, or a
//! folder where a file should land, refuses the whole plan before anything is touched.
//!
//! [`apply`] runs after the journal is written (the point of no return). Each file moves
//! with `renameat2` relative to the held folder descriptors: `RENAME_NOREPLACE` when the
//! destination is free, `RENAME_EXCHANGE` when a file is there (the old file takes the
//! staged name, so the step can be undone). After each move the destination is looked at
//! again: if it is not the inode that was validated (swapped for a symlink or another file
//! between the check and the move) or gained a link, the step is reversed. The rule for a
//! conflict that appears during the renames (a folder created at a destination, a parent
//! turned into a symlink, a swapped entry): every step done so far is undone in reverse
//! order, folders the commit created are removed, and the caller reopens the checkpoint and
//! answers a conflict, so the workspace is never left half-way.
//!
//! [`roll_forward`] finishes a journaled commit after a crash: an entry whose destination
//! already holds the validated inode is done; one whose staged name still holds it is
//! moved; anything else is skipped and reported. Idempotent.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::paths::{self, check_relative, open_dir_at};
use super::recover::{roll_forward_entries, EntryMover};
use super::rollback::names;
use super::validate::validate_content;
use super::{CheckpointError, StagedFile};
use crate::failpoint;

/// A fully validated commit plan: nothing has been created or moved yet.
pub struct Plan {
    /// The files, sorted by path.
    pub files: Vec<StagedFile>,
    /// Staging folders by relative path (`""` is the staging folder).
    staging_dirs: HashMap<PathBuf, OwnedFd>,
}

fn io_at(what: String) -> impl Fn(Errno) -> CheckpointError {
    move |e| CheckpointError::io(what.clone(), e.into())
}

fn parent_and_name(rel: &Path) -> (PathBuf, OsString) {
    let parent = rel.parent().map(Path::to_path_buf).unwrap_or_default();
    let name = rel.file_name().map(OsStr::to_os_string).unwrap_or_default();
    (parent, name)
}

/// Where a staged symlink would point once moved to `rel` (a lexical reading of its
/// target): true when it leaves the workspace root.
fn link_escapes(rel: &Path, target: &[u8]) -> bool {
    let t = Path::new(OsStr::from_bytes(target));
    if t.is_absolute() {
        return true;
    }
    let mut depth = rel.components().count() as i64 - 1;
    for c in t.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

/// Validates and fsyncs every staged file through descriptors and checks every
/// destination, creating nothing. Blocking.
///
/// Errors: [`CheckpointError::PathEscape`] (a symlink in staging or on the way to a
/// destination), [`CheckpointError::Validation`] (bad content, a hard link, a special file),
/// [`CheckpointError::Conflict`] (a folder where a file should land),
/// [`CheckpointError::Io`].
pub fn prepare(
    root: &OwnedFd,
    workspace: &Path,
    staging: OwnedFd,
    staging_path: &Path,
) -> Result<Plan, CheckpointError> {
    let mut files = Vec::new();
    let mut staging_dirs = HashMap::new();
    let mut stack = vec![(PathBuf::new(), staging)];
    while let Some((rel_dir, dir)) = stack.pop() {
        let shown_dir = staging_path.join(&rel_dir);
        for name in names(&dir, &shown_dir)? {
            let rel = rel_dir.join(&name);
            let shown = staging_path.join(&rel);
            let st = paths::kind_at(&dir, &name)
                .map_err(io_at(format!("{}", shown.display())))?
                .ok_or_else(|| CheckpointError::Conflict {
                    why: format!("{} vanished from staging during the commit", rel.display()),
                })?;
            match paths::file_type(&st) {
                FileType::Directory => {
                    let sub = open_dir_at(&dir, &name, &shown)?.ok_or_else(|| {
                        CheckpointError::Conflict {
                            why: format!("{} vanished from staging", rel.display()),
                        }
                    })?;
                    stack.push((rel, sub));
                }
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(&dir, &name, Vec::new())
                        .map(|c| c.into_bytes())
                        .unwrap_or_default();
                    let why = if link_escapes(&rel, &target) {
                        format!(
                            "staged symlink {} points outside the workspace (to {}); symlinks are refused in staging",
                            rel.display(),
                            String::from_utf8_lossy(&target)
                        )
                    } else {
                        format!(
                            "staged symlink {} is refused: a link harmless in staging can point outside the workspace from its new place",
                            rel.display()
                        )
                    };
                    return Err(CheckpointError::PathEscape { path: rel, why });
                }
                FileType::RegularFile => {
                    check_relative(&rel)?;
                    let fd = rustix::fs::openat(
                        &dir,
                        &name,
                        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
                        Mode::empty(),
                    )
                    .map_err(|e| match e {
                        Errno::LOOP => CheckpointError::PathEscape {
                            path: rel.clone(),
                            why: format!("{} became a symlink during the commit", rel.display()),
                        },
                        e => CheckpointError::io(format!("opening {}", shown.display()), e.into()),
                    })?;
                    let fst = rustix::fs::fstat(&fd)
                        .map_err(io_at(format!("fstat {}", shown.display())))?;
                    let (dev, ino, nlink) = paths::ident(&fst);
                    if paths::file_type(&fst) != FileType::RegularFile {
                        return Err(CheckpointError::Validation {
                            path: rel,
                            why: "is not a regular file".into(),
                        });
                    }
                    if nlink > 1 {
                        return Err(CheckpointError::Validation {
                            path: rel,
                            why: format!(
                                "has {nlink} hard links: a hard-linked file would share its inode with a file outside the workspace; copy it instead"
                            ),
                        });
                    }
                    let mut file = File::from(fd);
                    validate_content(&rel, fst.st_size.max(0) as u64, &mut file)?;
                    file.sync_all().map_err(|e| {
                        CheckpointError::io(format!("fsync {}", shown.display()), e)
                    })?;
                    let (size, mtime_ns) = paths::size_mtime(&fst);
                    files.push(StagedFile {
                        rel,
                        dev,
                        ino,
                        size,
                        mtime_ns,
                    });
                }
                _ => {
                    return Err(CheckpointError::Validation {
                        path: rel,
                        why: "is not a regular file".into(),
                    })
                }
            }
        }
        let _ = rustix::fs::fsync(&dir);
        staging_dirs.insert(rel_dir, dir);
    }
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    for f in &files {
        check_destination(root, workspace, &f.rel)?;
    }
    Ok(Plan {
        files,
        staging_dirs,
    })
}

/// Checks where `rel` lands without creating anything: each existing parent must be a real
/// folder (never a symlink), and the destination must not be a folder.
fn check_destination(root: &OwnedFd, workspace: &Path, rel: &Path) -> Result<(), CheckpointError> {
    let (parent, name) = parent_and_name(rel);
    let mut cur = rustix::io::dup(root).map_err(|e| CheckpointError::io("dup", e.into()))?;
    let mut shown = workspace.to_path_buf();
    for c in parent.iter() {
        shown.push(c);
        match paths::kind_at(&cur, c).map_err(io_at(format!("{}", shown.display())))? {
            None => return Ok(()), // created at apply time; nothing below it exists
            Some(st) if paths::file_type(&st) == FileType::Symlink => {
                return Err(CheckpointError::PathEscape {
                    path: rel.to_path_buf(),
                    why: format!(
                        "{} would be written outside the workspace (through the symlink {})",
                        rel.display(),
                        shown.display()
                    ),
                })
            }
            Some(st) if paths::file_type(&st) != FileType::Directory => {
                return Err(CheckpointError::Conflict {
                    why: format!(
                        "{} cannot be written: {} is a file in the workspace",
                        rel.display(),
                        shown.display()
                    ),
                })
            }
            Some(_) => {}
        }
        cur = open_dir_at(&cur, c, &shown)?.ok_or_else(|| CheckpointError::Conflict {
            why: format!("{} vanished during the commit", shown.display()),
        })?;
    }
    if let Some(st) = paths::kind_at(&cur, &name).map_err(io_at(format!("{}", rel.display())))? {
        if paths::file_type(&st) == FileType::Directory {
            return Err(CheckpointError::Conflict {
                why: format!("{} is a folder in the workspace", rel.display()),
            });
        }
    }
    Ok(())
}

/// One move done, for the undo.
struct Done {
    rel: PathBuf,
    /// The destination held a file, now at the staged name (exchanged).
    exchanged: bool,
}

/// Destination folders, opened (and created when missing) from the root by descriptor.
struct DestDirs<'a> {
    root: &'a OwnedFd,
    workspace: &'a Path,
    open: HashMap<PathBuf, OwnedFd>,
    /// Folders this commit created, in creation order.
    created: Vec<PathBuf>,
}

impl DestDirs<'_> {
    fn get(&mut self, rel_dir: &Path) -> Result<&OwnedFd, CheckpointError> {
        if !self.open.contains_key(rel_dir) {
            let mut cur =
                rustix::io::dup(self.root).map_err(|e| CheckpointError::io("dup", e.into()))?;
            let mut sofar = PathBuf::new();
            for c in rel_dir.iter() {
                sofar.push(c);
                if let Some(fd) = self.open.get(&sofar) {
                    cur = rustix::io::dup(fd).map_err(|e| CheckpointError::io("dup", e.into()))?;
                    continue;
                }
                let shown = self.workspace.join(&sofar);
                match rustix::fs::mkdirat(&cur, c, Mode::from_raw_mode(0o755)) {
                    Ok(()) => self.created.push(sofar.clone()),
                    Err(Errno::EXIST) => {}
                    Err(e) => {
                        return Err(CheckpointError::io(
                            format!("creating {}", shown.display()),
                            e.into(),
                        ))
                    }
                }
                let fd = open_dir_at(&cur, c, &shown)
                    .map_err(|_| CheckpointError::Conflict {
                        why: format!(
                            "{} became a symlink or a file during the commit",
                            shown.display()
                        ),
                    })?
                    .ok_or_else(|| CheckpointError::Conflict {
                        why: format!("{} vanished during the commit", shown.display()),
                    })?;
                self.open.insert(
                    sofar.clone(),
                    rustix::io::dup(&fd).map_err(|e| CheckpointError::io("dup", e.into()))?,
                );
                cur = fd;
            }
            self.open.insert(rel_dir.to_path_buf(), cur);
        }
        self.open
            .get(rel_dir)
            .ok_or_else(|| CheckpointError::io("destination folder", Errno::NOENT.into()))
    }
}

/// Moves staged `name` of `src` to `name` of `dst`: `RENAME_NOREPLACE` when free,
/// `RENAME_EXCHANGE` when a non-folder is there. Answers whether it exchanged.
fn move_one(
    src: &OwnedFd,
    dst: &OwnedFd,
    name: &OsStr,
    rel: &Path,
) -> Result<bool, CheckpointError> {
    for _ in 0..3 {
        match paths::kind_at(dst, name).map_err(io_at(format!("{}", rel.display())))? {
            None => match rustix::fs::renameat_with(src, name, dst, name, RenameFlags::NOREPLACE) {
                Ok(()) => return Ok(false),
                Err(Errno::EXIST) => continue, // appeared meanwhile: look again
                Err(Errno::INVAL) | Err(Errno::NOSYS) => {
                    // The filesystem has no renameat2 flags: plain rename.
                    rustix::fs::renameat(src, name, dst, name)
                        .map_err(io_at(format!("rename {}", rel.display())))?;
                    return Ok(false);
                }
                Err(e) => {
                    return Err(CheckpointError::io(
                        format!("rename {}", rel.display()),
                        e.into(),
                    ))
                }
            },
            Some(st) if paths::file_type(&st) == FileType::Directory => {
                return Err(CheckpointError::Conflict {
                    why: format!(
                        "a folder appeared at {} during the commit; the commit was undone",
                        rel.display()
                    ),
                })
            }
            Some(_) => match rustix::fs::renameat_with(src, name, dst, name, RenameFlags::EXCHANGE)
            {
                Ok(()) => return Ok(true),
                Err(Errno::NOENT) => continue, // went away meanwhile
                Err(Errno::INVAL) | Err(Errno::NOSYS) => {
                    rustix::fs::renameat(src, name, dst, name)
                        .map_err(io_at(format!("rename {}", rel.display())))?;
                    return Ok(false);
                }
                Err(e) => {
                    return Err(CheckpointError::io(
                        format!("rename {}", rel.display()),
                        e.into(),
                    ))
                }
            },
        }
    }
    Err(CheckpointError::Conflict {
        why: format!(
            "{} kept changing during the commit; the commit was undone",
            rel.display()
        ),
    })
}

/// True when entry `name` of `dir` is the validated inode, a regular file with one link.
fn is_validated(dir: &OwnedFd, name: &OsStr, f: &StagedFile) -> bool {
    match paths::kind_at(dir, name) {
        Ok(Some(st)) => {
            let (dev, ino, nlink) = paths::ident(&st);
            paths::file_type(&st) == FileType::RegularFile
                && (dev, ino, nlink) == (f.dev, f.ino, 1)
                && paths::size_mtime(&st) == (f.size, f.mtime_ns)
        }
        _ => false,
    }
}

/// Reverses one move (best effort; errors are collected by the caller).
fn undo_one(src: &OwnedFd, dst: &OwnedFd, name: &OsStr, exchanged: bool) -> Result<(), Errno> {
    if exchanged {
        rustix::fs::renameat_with(src, name, dst, name, RenameFlags::EXCHANGE)
    } else {
        rustix::fs::renameat_with(dst, name, src, name, RenameFlags::NOREPLACE)
    }
}

/// What [`apply`] did.
#[derive(Debug)]
pub struct Applied {
    /// Files moved into the workspace.
    pub moved: usize,
}

/// Moves every planned file into the workspace (see the module docs for the rules).
/// Hits failpoint `checkpoint.after_rename` after each move. Blocking.
///
/// Errors: [`CheckpointError::Conflict`] or [`CheckpointError::Validation`] after a
/// complete undo (the workspace is as it was); [`CheckpointError::Io`] when a move or the
/// undo failed (the journal then rolls it forward at the next start).
pub fn apply(root: &OwnedFd, workspace: &Path, plan: &Plan) -> Result<Applied, CheckpointError> {
    let mut dests = DestDirs {
        root,
        workspace,
        open: HashMap::new(),
        created: Vec::new(),
    };
    let mut done: Vec<Done> = Vec::new();
    let mut failure = None;
    for f in &plan.files {
        let (parent, name) = parent_and_name(&f.rel);
        let Some(src) = plan.staging_dirs.get(&parent) else {
            failure = Some(CheckpointError::io(
                format!("staging folder of {}", f.rel.display()),
                Errno::NOENT.into(),
            ));
            break;
        };
        let step = dests.get(&parent).and_then(|dst| {
            let dst = rustix::io::dup(dst).map_err(|e| CheckpointError::io("dup", e.into()))?;
            if !is_validated(src, &name, f) {
                return Err(CheckpointError::Validation {
                    path: f.rel.clone(),
                    why: "changed in staging after it was validated (swapped, linked or replaced); the commit was undone".into(),
                });
            }
            let exchanged = move_one(src, &dst, &name, &f.rel)?;
            if !is_validated(&dst, &name, f) {
                // Swapped between the check and the move: put it back, then undo the rest.
                let _ = undo_one(src, &dst, &name, exchanged);
                return Err(CheckpointError::Validation {
                    path: f.rel.clone(),
                    why: "was swapped during the commit (not the file that was validated); the commit was undone".into(),
                });
            }
            Ok(exchanged)
        });
        match step {
            Ok(exchanged) => {
                done.push(Done {
                    rel: f.rel.clone(),
                    exchanged,
                });
                failpoint::hit("checkpoint.after_rename");
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    if let Some(e) = failure {
        let mut undo_errors = Vec::new();
        for d in done.iter().rev() {
            let (parent, name) = parent_and_name(&d.rel);
            let (Some(src), Some(dst)) = (plan.staging_dirs.get(&parent), dests.open.get(&parent))
            else {
                undo_errors.push(d.rel.display().to_string());
                continue;
            };
            if undo_one(src, dst, &name, d.exchanged).is_err() {
                undo_errors.push(d.rel.display().to_string());
            }
        }
        for dir in dests.created.iter().rev() {
            let (parent, name) = parent_and_name(dir);
            if let Some(p) = dests
                .open
                .get(&parent)
                .and_then(|p| rustix::io::dup(p).ok())
            {
                let _ = rustix::fs::unlinkat(&p, &name, rustix::fs::AtFlags::REMOVEDIR);
            } else if parent.as_os_str().is_empty() {
                let _ = rustix::fs::unlinkat(root, &name, rustix::fs::AtFlags::REMOVEDIR);
            }
        }
        let _ = rustix::fs::fsync(root);
        if !undo_errors.is_empty() {
            return Err(CheckpointError::io(
                format!(
                    "{e}; undoing failed for {} (rolled forward at the next start)",
                    undo_errors.join(", ")
                ),
                std::io::ErrorKind::Other.into(),
            ));
        }
        return Err(e);
    }
    for fd in dests.open.values() {
        let _ = rustix::fs::fsync(fd);
    }
    for fd in plan.staging_dirs.values() {
        let _ = rustix::fs::fsync(fd);
    }
    let _ = rustix::fs::fsync(root);
    Ok(Applied { moved: done.len() })
}

/// Finishes a journaled commit after a crash (see the module docs). Answers the files
/// moved now and the entries skipped (neither place holds the validated inode). Blocking.
///
/// Errors: [`CheckpointError::PathEscape`] (a symlinked folder on the way),
/// [`CheckpointError::Io`].
pub fn roll_forward(
    root: &OwnedFd,
    workspace: &Path,
    staging: Option<&OwnedFd>,
    staging_path: &Path,
    entries: &[StagedFile],
) -> Result<(usize, Vec<String>), CheckpointError> {
    let mut mover = Mover {
        dests: DestDirs {
            root,
            workspace,
            open: HashMap::new(),
            created: Vec::new(),
        },
        staging,
        staging_path,
    };
    let r = roll_forward_entries(&mut mover, entries)?;
    for fd in mover.dests.open.values() {
        let _ = rustix::fs::fsync(fd);
    }
    let _ = rustix::fs::fsync(root);
    Ok(r)
}

/// The Linux steps of a roll-forward, by descriptor.
struct Mover<'a> {
    dests: DestDirs<'a>,
    staging: Option<&'a OwnedFd>,
    staging_path: &'a Path,
}

impl EntryMover for Mover<'_> {
    fn landed(&mut self, f: &StagedFile) -> Result<bool, CheckpointError> {
        let (parent, name) = parent_and_name(&f.rel);
        Ok(is_validated(self.dests.get(&parent)?, &name, f))
    }

    fn move_staged(&mut self, f: &StagedFile) -> Result<bool, CheckpointError> {
        let (parent, name) = parent_and_name(&f.rel);
        let src = match self.staging {
            Some(s) => paths::open_below(s, parent.iter(), self.staging_path)?,
            None => None,
        };
        let Some(src) = src.filter(|s| is_validated(s, &name, f)) else {
            return Ok(false);
        };
        move_one(&src, self.dests.get(&parent)?, &name, &f.rel).map(|_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_links_are_read_from_their_new_place() {
        assert!(link_escapes(Path::new("a.txt"), b"../x"));
        assert!(link_escapes(Path::new("d/a.txt"), b"../../../a"));
        assert!(!link_escapes(Path::new("d/a.txt"), b"../b.txt"));
        assert!(link_escapes(Path::new("a.txt"), b"/etc/passwd"));
    }
}
