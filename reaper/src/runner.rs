//! Starting a spawned runner: spec checks, the heartbeat socket path, the injected
//! environment, the process itself (own process group, piped output), and the bounded tail
//! of its output kept for incidents.
//!
//! docs/design.md, Interfaces: Runners: environment precedence is inherited < injected < the
//! runner's own `env`; the socket goes under `<data_dir>/run/<id>.sock`, falling back to
//! `/tmp/stallwatch-$UID/<hash>.sock` when the path would pass 107 bytes (C29: the
//! `sun_path` limit is 108 bytes with the NUL).

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStderr, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use stallwatch_storage::control::{valid_runner_id, RegisterError, RunnerSpec, SpawnSpec};

use crate::config::ReaperConfig;
use crate::platform;

/// Longest usable UNIX socket path on Linux, bytes (`sun_path` is 108 with the NUL).
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// Checks a runner spec: id shape, exactly one of `spawn`/`attach`, non-empty argv, env
/// keys non-empty without `=` or NUL, an existing `cwd` folder, and a `heartbeat_socket`
/// that is an absolute path naming a socket or nothing yet.
/// Errors: [`RegisterError::Invalid`] naming what is wrong.
pub fn validate_spec(spec: &RunnerSpec) -> Result<(), RegisterError> {
    let bad = RegisterError::Invalid;
    if !valid_runner_id(&spec.id) {
        return Err(bad(format!(
            "runner id {:?} must match ^[a-z0-9][a-z0-9._-]{{0,62}}$",
            spec.id
        )));
    }
    if let Some(sock) = &spec.heartbeat_socket {
        if sock.as_os_str().is_empty() || !sock.is_absolute() {
            return Err(bad(format!(
                "runner {}: heartbeat_socket {:?} must be an absolute path",
                spec.id,
                sock.display().to_string()
            )));
        }
        if let Ok(m) = std::fs::symlink_metadata(sock) {
            if !m.file_type().is_socket() {
                return Err(bad(format!(
                    "runner {}: heartbeat_socket {} exists and is not a socket",
                    spec.id,
                    sock.display()
                )));
            }
        }
    }
    match (&spec.spawn, &spec.attach) {
        (Some(s), None) if s.argv.is_empty() || s.argv[0].is_empty() => {
            Err(bad(format!("runner {}: spawn.argv is empty", spec.id)))
        }
        (Some(s), None) => {
            if let Some(k) = s
                .env
                .keys()
                .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
            {
                return Err(bad(format!(
                    "runner {}: env key {k:?} must be non-empty, without '=' or NUL",
                    spec.id
                )));
            }
            if let Some(cwd) = &s.cwd {
                if !cwd.is_dir() {
                    return Err(bad(format!(
                        "runner {}: cwd {} is missing or not a folder",
                        spec.id,
                        cwd.display()
                    )));
                }
            }
            Ok(())
        }
        (None, Some(a)) if a.pid == 0 || a.pid > i32::MAX as u32 => Err(bad(format!(
            "runner {}: attach.pid {} is not a process id (1 to {})",
            spec.id,
            a.pid,
            i32::MAX
        ))),
        (None, Some(_)) => Ok(()),
        _ => Err(bad(format!(
            "runner {}: exactly one of spawn or attach is required",
            spec.id
        ))),
    }
}

/// Where a runner's heartbeat socket goes, and why it moved when it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketChoice {
    /// The path given to the runner.
    pub path: PathBuf,
    /// Set when the preferred path was too long and a short one was chosen instead.
    pub fallback_reason: Option<String>,
}

/// Chooses the socket path: `preferred` (or `<data_dir>/run/<id>.sock`), or, when that
/// would pass [`MAX_SOCKET_PATH_BYTES`], `/tmp/stallwatch-$UID/<hash>.sock` with the reason.
pub fn choose_socket_path(data_dir: &Path, id: &str, preferred: Option<&Path>) -> SocketChoice {
    let path = preferred
        .map(Path::to_path_buf)
        .unwrap_or_else(|| data_dir.join("run").join(format!("{id}.sock")));
    let len = path.as_os_str().as_bytes().len();
    if len <= MAX_SOCKET_PATH_BYTES {
        return SocketChoice {
            path,
            fallback_reason: None,
        };
    }
    let hash = hex::encode(&Sha256::digest(path.as_os_str().as_bytes())[..8]);
    let uid = rustix::process::getuid().as_raw();
    let short = PathBuf::from(format!("/tmp/stallwatch-{uid}/{hash}.sock"));
    let reason = format!(
        "heartbeat socket path {} is {len} bytes, over the {MAX_SOCKET_PATH_BYTES}-byte UNIX socket limit; using {}",
        path.display(),
        short.display()
    );
    SocketChoice {
        path: short,
        fallback_reason: Some(reason),
    }
}

/// Whether a process accepts connections on the UNIX socket at `path`: a non-blocking
/// connect that is accepted or queued (or would wait for room in the backlog) means yes;
/// refused (no listener: a socket file left by a process that ended) or no file means
/// no. Any other answer counts as in use: the file is then never removed.
pub fn socket_in_use(path: &Path) -> bool {
    use rustix::net::{
        connect, socket_with, AddressFamily, SocketAddrUnix, SocketFlags, SocketType,
    };
    let Ok(addr) = SocketAddrUnix::new(path) else {
        return true;
    };
    let Ok(fd) = socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    ) else {
        return true;
    };
    !matches!(
        connect(&fd, &addr),
        Err(rustix::io::Errno::CONNREFUSED | rustix::io::Errno::NOENT)
    )
}

/// Creates the socket's folder (mode 0700) and removes a stale socket file left there
/// (one no process accepts connections on, [`socket_in_use`]); a live one is an error and
/// stays: removing it cut a healthy runner, or any other program, off its heartbeat.
/// Only stallwatch's own fallback folder, `/tmp/stallwatch-$UID`, has its mode forced to
/// 0700; a folder the path names that exists already is left as it is (it may be `/tmp`).
pub fn prepare_socket_dir(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let uid = rustix::process::getuid().as_raw();
        if dir == Path::new(&format!("/tmp/stallwatch-{uid}")) {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.file_type().is_socket() {
            if socket_in_use(path) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!(
                        "a process accepts connections on {}: not removed (another runner's heartbeat socket?)",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        }
    }
    Ok(())
}

/// What the reaper injects into a spawned runner's environment, with the runner's own
/// `env` applied last (docs/design.md, Interfaces: Runners).
pub fn runner_env(
    config: &ReaperConfig,
    id: &str,
    spawn: &SpawnSpec,
    socket: &Path,
    checkpoint: Option<(&Path, &str)>,
    instance_id: &str,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    set("STALLWATCH_RUNNER_ID", id.into());
    // The per-spawn mark that proves a descendant belongs to this instance (issue 17 #8).
    set(crate::platform::INSTANCE_ENV, instance_id.into());
    set(
        "STALLWATCH_HEARTBEAT_SOCKET",
        socket.to_string_lossy().into_owned(),
    );
    set(
        crate::config::HEARTBEAT_TIMEOUT_ENV,
        config.heartbeat_timeout.as_millis().to_string(),
    );
    if let Some((dir, cid)) = checkpoint {
        set(
            "STALLWATCH_CHECKPOINT_DIR",
            dir.to_string_lossy().into_owned(),
        );
        set("STALLWATCH_CHECKPOINT_ID", cid.into());
    }
    set("OTEL_EXPORTER_OTLP_ENDPOINT", config.otlp_endpoint.clone());
    set("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".into());
    if let Some(h) = &config.otlp_headers {
        set("OTEL_EXPORTER_OTLP_HEADERS", h.clone());
    }
    set("OTEL_SERVICE_NAME", id.into());
    set("MPLBACKEND", "Agg".into());
    set("PYTHONUNBUFFERED", "1".into());
    if !config.forensics_budget.is_zero() {
        set(
            crate::forensics::STACKS_FILE_ENV,
            crate::forensics::stacks_path(&config.data_dir, id, instance_id)
                .to_string_lossy()
                .into_owned(),
        );
    }
    crate::env::layer_spec_env(&mut env, &spawn.env, id);
    // Merged, never replaced: the runner's own resource attributes are kept, ours are
    // always present (spans are tied to the runner by `stallwatch.runner.id`).
    let theirs = spawn
        .env
        .get("OTEL_RESOURCE_ATTRIBUTES")
        .map(String::as_str)
        .unwrap_or("");
    env.insert(
        "OTEL_RESOURCE_ATTRIBUTES".into(),
        merge_resource_attributes(theirs, id, instance_id),
    );
    env
}

pub use crate::env::SCRUBBED_OTEL_VARIABLES;

pub use crate::env::merge_resource_attributes;

/// A freshly spawned runner process.
pub struct SpawnedProcess {
    /// Its pid (also its process group id).
    pub pid: u32,
    /// A pidfd opened while it was an unreaped child (identity pinned).
    pub pidfd: OwnedFd,
    /// Its start time, clock ticks since boot.
    pub start_time_ticks: u64,
    /// Its stdout pipe.
    pub stdout: ChildStdout,
    /// Its stderr pipe.
    pub stderr: ChildStderr,
}

/// Spawns `argv` in its own session, and so its own process group (`setsid`), with `env`
/// layered over the inherited environment, stdin from `/dev/null`, stdout and stderr
/// piped. The `Child` is dropped without waiting: the reaper reaps by pid with `waitid`.
///
/// Why a session, not only a group: `setpgid` may move a process into any group of its own
/// session, so with runners in stallwatch's session any process started beside stallwatch
/// (same terminal, same desktop app) could join a runner's group and receive the group's
/// SIGTERM without being its descendant. Only processes of the runner's own session, its
/// descendants, can join a group led by a session leader.
pub fn spawn_process(
    spawn: &SpawnSpec,
    env: &BTreeMap<String, String>,
) -> std::io::Result<SpawnedProcess> {
    let mut cmd = Command::new(&spawn.argv[0]);
    for k in crate::env::scrubbed_names(crate::env::inherited_names(), env) {
        cmd.env_remove(k);
    }
    cmd.args(&spawn.argv[1..])
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    {
        #[allow(unsafe_code)]
        // SAFETY: the closure runs in the child between fork and exec and only makes the
        // setsid system call, which is async-signal-safe (POSIX) and allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                rustix::process::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
    }
    if let Some(cwd) = &spawn.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let pidfd = platform::pidfd_open(pid)?;
    let start_time_ticks = platform::proc_stat(pid)?.start_time_ticks;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("stdout not piped"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| std::io::Error::other("stderr not piped"))?;
    drop(child);
    Ok(SpawnedProcess {
        pid,
        pidfd,
        start_time_ticks,
        stdout,
        stderr,
    })
}

/// The last lines a runner wrote, bounded. Shared between the reader tasks and incidents.
#[derive(Clone, Debug, Default)]
pub struct OutputTail {
    inner: Arc<Mutex<VecDeque<(&'static str, String)>>>,
    cap: usize,
}

impl OutputTail {
    /// A tail keeping at most `cap` lines.
    pub fn new(cap: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(VecDeque::with_capacity(cap))),
            cap: cap.max(1),
        }
    }
    /// Adds a line from `stream` (`stdout` or `stderr`).
    pub fn push(&self, stream: &'static str, line: String) {
        if let Ok(mut q) = self.inner.lock() {
            if q.len() == self.cap {
                q.pop_front();
            }
            q.push_back((stream, line));
        }
    }
    /// The kept lines of one stream, oldest first.
    pub fn lines(&self, stream: &str) -> Vec<String> {
        self.inner
            .lock()
            .map(|q| {
                q.iter()
                    .filter(|(s, _)| *s == stream)
                    .map(|(_, l)| l.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runner leads its own session: its group is its pid, and a process outside it (here
    /// the test itself, in stallwatch's place) cannot move into its group, so a group
    /// signal reaches only the runner's own tree.
    #[test]
    fn a_spawned_runner_leads_its_own_session_so_no_outsider_joins_its_group() {
        let spawn = SpawnSpec {
            argv: vec!["sleep".into(), "30".into()],
            cwd: None,
            env: BTreeMap::new(),
            workspace: None,
        };
        let p = spawn_process(&spawn, &BTreeMap::new()).unwrap();
        let pid = rustix::process::Pid::from_raw(p.pid as i32).unwrap();
        assert_eq!(rustix::process::getsid(Some(pid)).unwrap(), pid);
        assert_eq!(rustix::process::getpgid(Some(pid)).unwrap(), pid);
        // an outsider (a child of this test, in this test's session, as a process started
        // beside stallwatch would be) asks to move itself into the runner's group
        let out = Command::new("python3")
            .args([
                "-c",
                "import os, sys\ntry:\n    os.setpgid(0, int(sys.argv[1]))\n    print('joined')\nexcept OSError as e:\n    print(e.errno)",
                &p.pid.to_string(),
            ])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            said.trim(),
            rustix::io::Errno::PERM.raw_os_error().to_string(),
            "an outsider joined the group: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = Command::new("kill")
            .args(["-KILL", &p.pid.to_string()])
            .status();
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(p.pid as i32), None);
    }

    /// A socket file no process listens on is stale and removed; one a process accepts
    /// connections on (another runner's, another program's) stays and is an error; the
    /// folder a given path names keeps its mode.
    #[test]
    fn only_a_stale_socket_is_removed_and_existing_folders_keep_their_mode() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let live = dir.path().join("live.sock");
        let listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
        let err = prepare_socket_dir(&live).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
        assert!(live.exists(), "a live socket was removed");
        assert!(socket_in_use(&live));
        // the same file once its listener is gone: stale. A child another test forks
        // holds a copy of the listener until its exec closes it (CLOEXEC), so the socket
        // may accept for a moment after the drop.
        drop(listener);
        let gone = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while socket_in_use(&live) && std::time::Instant::now() < gone {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!socket_in_use(&live));
        prepare_socket_dir(&live).unwrap();
        assert!(!live.exists(), "a stale socket was kept");
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "an existing folder's mode was changed");
        // a folder it creates is the runner's own: 0700
        let fresh = dir.path().join("sub").join("r.sock");
        prepare_socket_dir(&fresh).unwrap();
        let mode = std::fs::metadata(dir.path().join("sub"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn long_socket_paths_fall_back_with_a_reason() {
        let short = choose_socket_path(Path::new("/d"), "r1", None);
        assert_eq!(short.path, PathBuf::from("/d/run/r1.sock"));
        assert!(short.fallback_reason.is_none());
        let deep = format!("/tmp/{}", "d".repeat(120));
        let c = choose_socket_path(Path::new(&deep), "r1", None);
        assert!(c.path.as_os_str().len() <= MAX_SOCKET_PATH_BYTES);
        assert!(c.fallback_reason.unwrap().contains("107-byte"));
    }

    #[test]
    fn env_precedence_injected_then_spec() {
        let cfg = ReaperConfig::new("/d");
        let mut spec = SpawnSpec {
            argv: vec!["x".into()],
            cwd: None,
            env: BTreeMap::new(),
            workspace: None,
        };
        spec.env.insert("MPLBACKEND".into(), "TkAgg".into());
        let env = runner_env(&cfg, "r1", &spec, Path::new("/s"), None, "u");
        assert_eq!(env["MPLBACKEND"], "TkAgg");
        assert_eq!(env["PYTHONUNBUFFERED"], "1");
        assert_eq!(
            env["OTEL_RESOURCE_ATTRIBUTES"],
            "stallwatch.runner.id=r1,service.instance.id=u"
        );
        assert!(!env.contains_key("STALLWATCH_CHECKPOINT_DIR"));
    }

    /// A spec cannot set stallwatch's own variables: the instance mark, the heartbeat
    /// socket and the runner id stay stallwatch's (a sub-runner registered with its
    /// parent's environment carried the parent's mark and died with it). Other
    /// `STALLWATCH_*` names pass through.
    #[test]
    fn a_spec_cannot_take_another_runners_mark() {
        let cfg = ReaperConfig::new("/d");
        let mut spec = SpawnSpec {
            argv: vec!["x".into()],
            cwd: None,
            env: BTreeMap::new(),
            workspace: None,
        };
        for (k, v) in [
            ("STALLWATCH_RUNNER_INSTANCE", "parents-mark"),
            ("STALLWATCH_HEARTBEAT_SOCKET", "/elsewhere"),
            ("STALLWATCH_RUNNER_ID", "parent"),
            ("STALLWATCH_OWN_SETTING", "kept"),
        ] {
            spec.env.insert(k.into(), v.into());
        }
        let env = runner_env(&cfg, "r2", &spec, Path::new("/s"), None, "u2");
        assert_eq!(env["STALLWATCH_RUNNER_INSTANCE"], "u2");
        assert_eq!(env["STALLWATCH_HEARTBEAT_SOCKET"], "/s");
        assert_eq!(env["STALLWATCH_RUNNER_ID"], "r2");
        assert_eq!(env["STALLWATCH_OWN_SETTING"], "kept");
    }

    /// The kits read the watchdog's heartbeat timeout from the environment; without it
    /// they assume the default 5000 ms, and a PONG could vouch for a span export stuck
    /// longer than a shorter configured timeout.
    #[test]
    fn spawned_runners_are_told_the_heartbeat_timeout() {
        let mut cfg = ReaperConfig::new("/d");
        cfg.heartbeat_timeout = std::time::Duration::from_millis(2000);
        let spec = SpawnSpec {
            argv: vec!["x".into()],
            cwd: None,
            env: BTreeMap::new(),
            workspace: None,
        };
        let env = runner_env(&cfg, "r1", &spec, Path::new("/s"), None, "u");
        assert_eq!(env["STALLWATCH_HEARTBEAT_TIMEOUT_MS"], "2000");
        let env = runner_env(
            &ReaperConfig::new("/d"),
            "r1",
            &spec,
            Path::new("/s"),
            None,
            "u",
        );
        assert_eq!(env["STALLWATCH_HEARTBEAT_TIMEOUT_MS"], "5000");
    }

    #[test]
    fn own_resource_attributes_are_merged_with_ours() {
        let cfg = ReaperConfig::new("/d");
        let mut spec = SpawnSpec {
            argv: vec!["x".into()],
            cwd: None,
            env: BTreeMap::new(),
            workspace: None,
        };
        spec.env.insert(
            "OTEL_RESOURCE_ATTRIBUTES".into(),
            "team=lab, stallwatch.runner.id=spoof,deployment.environment=dev".into(),
        );
        let env = runner_env(&cfg, "r1", &spec, Path::new("/s"), None, "u");
        assert_eq!(
            env["OTEL_RESOURCE_ATTRIBUTES"],
            "stallwatch.runner.id=r1,service.instance.id=u,team=lab,deployment.environment=dev"
        );
    }
}
