//! The data folder: `stallwatch.db` (+ WAL), `token`, `lock`, `run/` (docs/design.md, Interfaces:
//! Files). Created with mode 0700; the token with `O_EXCL` and mode 0600, kept across
//! restarts; the lock is an `flock` held for the life of the process, so a crashed
//! instance's lock is free again and is simply taken over.
//!
//! The `flock` lives on the folder's inode: if someone deletes the data folder and a second
//! instance re-creates it, the new folder is a new inode with a free lock. So the instance
//! lock is also a name that no file operation can remove: an abstract UNIX socket
//! (`unix(7)`, Linux) named after the user and the folder's canonical path,
//! `stallwatch/v1/<uid>/<sha256 of the path>`, bound for the life of the process and
//! released by the kernel when it exits (even on SIGKILL). A second instance on the same
//! path is refused while the first runs, whatever happened to the folder, and learns the
//! holder's pid from the socket's peer credentials (`SO_PEERCRED`). The running instance
//! itself notices a deleted database (its (device, inode) is checked before each commit)
//! and stops acknowledging (503 `storage_gone`, an ERROR line); it does not re-create the
//! folder (docs/design.md, Interfaces: Files). Abstract names are per network namespace:
//! two instances in different network namespaces sharing one folder are not caught by the
//! name, only by the `flock`.
//!
//! On Windows (docs/platforms.md): the folder is `%LOCALAPPDATA%\stallwatch`, the folder and
//! token get a protected user-only DACL instead of modes, and the lock is `LockFileEx` (std's
//! `File::try_lock`) on `lock`, released by the kernel when the process dies.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
#[cfg(unix)]
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
#[cfg(unix)]
use rustix::fs::{flock, FlockOperation};

/// Size of `<data_dir>/reserve`, space kept aside for a start on a full disk: SQLite cannot
/// even open its database without room for the `-shm` file, so a disk found full at start
/// releases the reserve, and stallwatch starts degraded (telemetry refused with 503,
/// runners watched and stopped, control records written into the freed space or held).
pub const RESERVE_BYTES: u64 = 8 * 1024 * 1024;

/// How a full-disk refusal ends, for its reason text (`/readyz`, the 503's body): the
/// reserve is made again, and telemetry let in, once twice [`RESERVE_BYTES`] are free
/// ([`reserve_at`]), so that the reserve is back and as much is left for the data.
pub const UNTIL_SPACE_RETURNS: &str = "telemetry is refused until 16 MiB are free on the data folder's filesystem (the 8 MiB reserve is made again first)";

const _: () = assert!(
    2 * RESERVE_BYTES == 16 * 1024 * 1024,
    "UNTIL_SPACE_RETURNS says 16 MiB"
);

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
/// A relative `XDG_DATA_HOME` is ignored, as the XDG Base Directory Specification says (it
/// put the data folder under whatever folder stallwatch was started from).
#[cfg(unix)]
pub fn default_data_dir() -> Result<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty() && std::path::Path::new(v).is_absolute())
    {
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
    #[cfg(target_os = "linux")]
    _lock: (File, File, std::os::unix::net::UnixListener),
    #[cfg(not(target_os = "linux"))]
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
        #[cfg(target_os = "linux")]
        let lock = {
            let name_lock = take_name_lock(&path)?;
            let (dir_lock, file_lock) = take_lock(&path, &path.join("lock"))?;
            (dir_lock, file_lock, name_lock)
        };
        #[cfg(not(target_os = "linux"))]
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

    /// Bytes free for us on the data folder's filesystem (`statvfs` `f_bavail`).
    pub fn free_bytes(&self) -> Option<u64> {
        free_bytes_at(&self.path)
    }

    /// True when the filesystem has less than [`RESERVE_BYTES`] free: the disk is full.
    pub fn disk_full(&self) -> bool {
        disk_full_at(&self.path)
    }

    /// Deletes `<data_dir>/reserve`, answering true when there was one to free.
    pub fn release_reserve(&self) -> bool {
        release_reserve_at(&self.path)
    }

    /// [`reserve_at`] of this folder.
    pub fn ensure_reserve(&self) -> bool {
        reserve_at(&self.path)
    }
}

/// Bytes free for us on `dir`'s filesystem (`statvfs` `f_bavail`).
#[cfg(unix)]
pub fn free_bytes_at(dir: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// True when `dir`'s filesystem has less than [`RESERVE_BYTES`] free: the disk is full
/// (false when free space is unknown).
pub fn disk_full_at(dir: &Path) -> bool {
    free_bytes_at(dir).is_some_and(|f| f < RESERVE_BYTES)
}

/// Deletes `<dir>/reserve`, answering true when there was one to free.
pub fn release_reserve_at(dir: &Path) -> bool {
    fs::remove_file(dir.join("reserve")).is_ok()
}

/// Writes `<dir>/reserve` ([`RESERVE_BYTES`] of zeros, mode 0600, synced) when it is
/// missing and at least twice its size is free; answers true when it exists after.
#[cfg(unix)]
pub fn reserve_at(dir: &Path) -> bool {
    let path = dir.join("reserve");
    if fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() >= RESERVE_BYTES) {
        return true;
    }
    if free_bytes_at(dir).is_none_or(|f| f < 2 * RESERVE_BYTES) {
        return false;
    }
    let wrote = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&path)
        .and_then(|mut f| {
            let block = vec![0u8; 1 << 20];
            for _ in 0..RESERVE_BYTES / block.len() as u64 {
                f.write_all(&block)?;
            }
            f.sync_all()
        });
    if let Err(e) = wrote {
        let _ = fs::remove_file(&path);
        tracing::warn!(path = %path.display(), "cannot write the disk-space reserve: {e}");
        return false;
    }
    true
}

/// Windows: free space is not checked yet (docs/platforms.md); `None` means unknown, so a
/// start is never held up by it.
#[cfg(windows)]
pub fn free_bytes_at(_dir: &Path) -> Option<u64> {
    None
}

/// Windows: no disk-space reserve yet (docs/platforms.md).
#[cfg(windows)]
pub fn reserve_at(_dir: &Path) -> bool {
    false
}

/// Takes the instance lock: an `flock` on the data folder itself (which survives someone
/// deleting the `lock` file) and on `lock`, which also records our pid for the message a
/// second instance prints.
#[cfg(unix)]
fn take_lock(dir: &Path, path: &Path) -> Result<(File, File)> {
    use std::io::Read;
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
    // The pid is only for the message a second instance prints: a full disk must not stop
    // the start (issue 17 #13), so a failed write is a warning.
    let wrote = f
        .set_len(0)
        .and_then(|_| f.seek(SeekFrom::Start(0)))
        .and_then(|_| writeln!(f, "{}", std::process::id()))
        .and_then(|_| f.sync_all());
    if let Err(e) = wrote {
        tracing::warn!(path = %path.display(), "cannot write our pid into the lock file: {e}");
    }
    Ok((dir_handle, f))
}

/// The abstract socket name of the instance lock of `dir` (canonical path) for this user.
#[cfg(target_os = "linux")]
pub fn lock_name(dir: &Path) -> String {
    use sha2::{Digest, Sha256};
    use std::os::unix::ffi::OsStrExt;
    let digest = Sha256::digest(dir.as_os_str().as_bytes());
    format!(
        "stallwatch/v1/{}/{}",
        rustix::process::getuid().as_raw(),
        hex::encode(digest)
    )
}

/// Binds the abstract socket [`lock_name`] of `dir`, or says who holds it.
#[cfg(target_os = "linux")]
fn take_name_lock(dir: &Path) -> Result<std::os::unix::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
    let name = lock_name(dir);
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .context("cannot build the instance lock's socket name")?;
    match UnixListener::bind_addr(&addr) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let who = UnixStream::connect_addr(&addr)
                .ok()
                .and_then(|s| rustix::net::sockopt::socket_peercred(&s).ok())
                .map(|c| format!("stallwatch pid {}", c.pid.as_raw_nonzero()))
                .unwrap_or_else(|| "another process".to_string());
            bail!(
                "data folder {} is in use by {who} (it holds the instance lock {name:?}, even if the folder was deleted and re-created); stop it or pass another --data-dir",
                dir.display()
            )
        }
        Err(e) => Err(e).with_context(|| format!("cannot take the instance lock {name:?}")),
    }
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
    // Left alone when already 0700: on a read-only filesystem the chmod itself fails, and
    // that error would hide the one that matters (nothing can be written there).
    if fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o700) {
        return Ok(());
    }
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
    #[cfg(target_os = "linux")]
    fn a_deleted_and_recreated_folder_is_still_locked() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let _a = DataDir::open(&data).unwrap();
        fs::remove_dir_all(&data).unwrap();
        fs::create_dir_all(&data).unwrap();
        let err = DataDir::open(&data).unwrap_err().to_string();
        assert!(err.contains("in use"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(_a);
        DataDir::open(&data).expect("free again once the holder is gone");
    }

    #[test]
    fn malformed_token_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("token"), "short").unwrap();
        let err = DataDir::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("64 hex"), "{err}");
    }
}
