//! The data folder: `stallwatch.db` (+ WAL), `token`, `lock`, `run/` (docs/design.md, Interfaces:
//! Files). Created with mode 0700; the token with `O_EXCL` and mode 0600, kept across
//! restarts; the lock is an `flock` held for the life of the process, so a crashed
//! instance's lock is free again and is simply taken over.
//!
//! On Windows (docs/platforms.md): the folder is `%LOCALAPPDATA%\stallwatch`, the folder and
//! token get a protected user-only DACL instead of modes, and the lock is `LockFileEx` (std's
//! `File::try_lock`) on `lock`, released by the kernel when the process dies.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
#[cfg(unix)]
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
#[cfg(unix)]
use rustix::fs::{flock, FlockOperation};

/// Token length in hex characters (32 random bytes).
pub const TOKEN_HEX_LEN: usize = 64;

/// The default data folder on Windows: `%LOCALAPPDATA%\stallwatch`.
#[cfg(windows)]
pub fn default_data_dir() -> Result<PathBuf> {
    let base = std::env::var_os("LOCALAPPDATA")
        .filter(|v| !v.is_empty())
        .context("LOCALAPPDATA is not set: pass --data-dir")?;
    Ok(PathBuf::from(base).join("stallwatch"))
}

/// The default data folder: `$XDG_DATA_HOME/stallwatch`, else `~/.local/share/stallwatch`.
#[cfg(unix)]
pub fn default_data_dir() -> Result<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("stallwatch"));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .context("neither XDG_DATA_HOME nor HOME is set: pass --data-dir")?;
    Ok(PathBuf::from(home).join(".local/share/stallwatch"))
}

/// An opened data folder. Holding it holds the instance lock.
#[derive(Debug)]
pub struct DataDir {
    /// The folder.
    pub path: PathBuf,
    /// The control-API bearer token (64 hex characters).
    pub token: String,
    _lock: (File, File),
}

impl DataDir {
    /// Creates (mode 0700) or opens the folder, takes the instance lock, and loads or
    /// creates the token.
    ///
    /// Errors: the folder cannot be created; another live stallwatch holds the lock (the
    /// message names its pid); the token file is malformed.
    pub fn open(path: &Path) -> Result<Self> {
        fs::create_dir_all(path)
            .with_context(|| format!("cannot create data folder {}", path.display()))?;
        private_dir(path)?;
        // On Windows `canonicalize` answers a `\\?\` verbatim path; an absolute one is
        // what SQLite and the pipe names want there.
        #[cfg(unix)]
        let resolved = path.canonicalize();
        #[cfg(windows)]
        let resolved = std::path::absolute(path);
        let path = resolved.with_context(|| format!("cannot resolve {}", path.display()))?;
        let lock = take_lock(&path, &path.join("lock"))?;
        let token = load_or_create_token(&path.join("token"))?;
        fs::create_dir_all(path.join("run"))
            .with_context(|| format!("cannot create {}", path.join("run").display()))?;
        private_dir(&path.join("run"))?;
        Ok(Self {
            path,
            token,
            _lock: lock,
        })
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.path.join("stallwatch.db")
    }
}

/// Takes the instance lock: an `flock` on the data folder itself (which survives someone
/// deleting the `lock` file) and on `lock`, which also records our pid for the message a
/// second instance prints.
#[cfg(unix)]
fn take_lock(dir: &Path, path: &Path) -> Result<(File, File)> {
    let dir_handle =
        File::open(dir).with_context(|| format!("cannot open data folder {}", dir.display()))?;
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot open lock file {}", path.display()))?;
    if flock(&dir_handle, FlockOperation::NonBlockingLockExclusive).is_err()
        || flock(&f, FlockOperation::NonBlockingLockExclusive).is_err()
    {
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        let holder = holder.trim();
        let who = if holder.is_empty() {
            "another process".to_string()
        } else {
            format!("stallwatch pid {holder}")
        };
        bail!(
            "data folder {} is in use by {who}; stop it or pass another --data-dir",
            path.parent().unwrap_or(path).display()
        );
    }
    f.set_len(0)?;
    f.seek(SeekFrom::Start(0))?;
    writeln!(f, "{}", std::process::id())?;
    f.sync_all()?;
    Ok((dir_handle, f))
}

/// Windows: `LockFileEx` (exclusive, fail immediately; std's `File::try_lock`) on `lock`.
/// A directory cannot be locked there, so the second handle is the lock file again; the
/// pid inside is read through a second handle, since a locked range cannot be read
/// through another handle.
#[cfg(windows)]
fn take_lock(_dir: &Path, path: &Path) -> Result<(File, File)> {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("cannot open lock file {}", path.display()))?;
    if f.try_lock().is_err() {
        let holder = fs::read_to_string(path.with_file_name("lock.pid")).unwrap_or_default();
        let holder = holder.trim();
        let who = if holder.is_empty() {
            "another process".to_string()
        } else {
            format!("stallwatch pid {holder}")
        };
        bail!(
            "data folder {} is in use by {who}; stop it or pass another --data-dir",
            path.parent().unwrap_or(path).display()
        );
    }
    f.set_len(0)?;
    f.seek(SeekFrom::Start(0))?;
    writeln!(f, "{}", std::process::id())?;
    f.sync_all()?;
    let pid_path = path.with_file_name("lock.pid");
    fs::write(&pid_path, format!("{}\n", std::process::id()))
        .with_context(|| format!("cannot write {}", pid_path.display()))?;
    let again = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok((again, f))
}

/// Makes `path` private to the user: mode 0700.
#[cfg(unix)]
fn private_dir(path: &Path) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot set mode 0700 on {}", path.display()))
}

/// Makes `path` private to the user: a protected DACL granting only the user (and
/// SYSTEM) full control, inherited by what is created inside.
#[cfg(windows)]
fn private_dir(path: &Path) -> Result<()> {
    crate::acl::restrict_to_user(path, true)
        .with_context(|| format!("cannot set a user-only ACL on {}", path.display()))
}

/// Creates the token file exclusively (mode 0600 on Unix; the folder's user-only DACL on
/// Windows, set again on the file itself).
fn create_token_file(path: &Path) -> std::io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let f = opts.open(path)?;
    #[cfg(windows)]
    crate::acl::restrict_to_user(path, false)?;
    Ok(f)
}

/// Tightens a token file that others could read (Unix: group/other mode bits).
#[cfg(unix)]
fn tighten_token(path: &Path, meta: &fs::Metadata) -> Result<()> {
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(path = %path.display(), "token file was readable by others; setting mode 0600");
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// Windows: the user-only DACL is (re)applied to an existing token.
#[cfg(windows)]
fn tighten_token(path: &Path, _meta: &fs::Metadata) -> Result<()> {
    crate::acl::restrict_to_user(path, false)
        .with_context(|| format!("cannot set a user-only ACL on {}", path.display()))
}

fn load_or_create_token(path: &Path) -> Result<String> {
    match create_token_file(path) {
        Ok(mut f) => {
            let mut bytes = [0u8; TOKEN_HEX_LEN / 2];
            rand::fill(&mut bytes);
            let token = hex::encode(bytes);
            f.write_all(token.as_bytes())?;
            f.sync_all()?;
            Ok(token)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // Never follow a symlink: it could make us chmod or read someone else's file.
            let meta = fs::symlink_metadata(path)?;
            if !meta.file_type().is_file() {
                bail!(
                    "token {} is not a regular file (a symlink?); delete it to make a new one",
                    path.display()
                );
            }
            tighten_token(path, &meta)?;
            let token = fs::read_to_string(path)
                .with_context(|| format!("cannot read token {}", path.display()))?
                .trim()
                .to_string();
            if token.len() != TOKEN_HEX_LEN || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!(
                    "token file {} is not {TOKEN_HEX_LEN} hex characters; delete it to make a new one",
                    path.display()
                );
            }
            Ok(token)
        }
        Err(e) => Err(e).with_context(|| format!("cannot create token {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_created_once_with_mode_0600_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = DataDir::open(dir.path()).unwrap();
        let t1 = a.token.clone();
        assert_eq!(t1.len(), 64);
        let mode = fs::metadata(dir.path().join("token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let dmode = fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(dmode & 0o777, 0o700);
        drop(a);
        let b = DataDir::open(dir.path()).unwrap();
        assert_eq!(b.token, t1);
    }

    #[test]
    fn second_open_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let _a = DataDir::open(dir.path()).unwrap();
        let err = DataDir::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
    }

    #[test]
    fn a_symlinked_token_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other.txt");
        fs::write(&other, "x").unwrap();
        fs::set_permissions(&other, fs::Permissions::from_mode(0o644)).unwrap();
        let data = dir.path().join("data");
        fs::create_dir_all(&data).unwrap();
        std::os::unix::fs::symlink(&other, data.join("token")).unwrap();
        let err = DataDir::open(&data).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        let mode = fs::metadata(&other).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644, "the symlink's target was chmodded");
    }

    #[test]
    fn deleting_the_lock_file_does_not_let_a_second_instance_in() {
        let dir = tempfile::tempdir().unwrap();
        let _a = DataDir::open(dir.path()).unwrap();
        fs::remove_file(dir.path().join("lock")).unwrap();
        let err = DataDir::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("in use"), "{err}");
    }

    #[test]
    fn malformed_token_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("token"), "short").unwrap();
        let err = DataDir::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("64 hex"), "{err}");
    }
}
