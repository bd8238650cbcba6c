//! The runner's heartbeat socket, served by the wrapper: stallwatch writes `PING\n` and
//! reads one line (docs/design.md, Interfaces: Heartbeat details). The answer is `PONG` only
//! while the server answers the wrapper's own MCP `ping` requests (MCP spec, Basic
//! Utilities: Ping) within the ping timeout, so a server whose event loop is blocked loses
//! its heartbeat, while one running a tool on a worker thread keeps it and is judged by the
//! tool's SLA. Other answers: `BYE` while the wrapper is deliberately stopping the server
//! (the watchdog marks it `stopping`), `ERR mcp_ping_timeout`, `ERR mcp_not_ready` (any
//! non-`PONG` answer counts as a lost heartbeat).
//!
//! Before the session is initialized the server cannot be pinged (MCP, Lifecycle), so
//! nothing says its loop is stuck: a server that starts slowly (`npx` fetching a package, a
//! model loading) or that a host initializes lazily is healthy. The socket then answers
//! `PONG`, unless an `initialize` (the client's or the wrapper's replay after a restart)
//! has waited longer than the initialize timeout: `ERR mcp_not_ready`, and the watchdog
//! judges it. Answering `ERR mcp_not_ready` from the start had the sidecar stop idle and
//! slowly starting servers at the end of its start-up grace, again after each restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Longest UNIX socket path the kernel takes (`sun_path` is 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;
/// Deadline for a peer to send its `PING` line.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);

/// What the socket answers, updated by the relay.
#[derive(Debug)]
pub struct HealthView {
    /// Last time the server answered one of the wrapper's pings (or became ready).
    pub last_answer: Option<Instant>,
    /// True while the server session can be pinged (initialized, process running).
    pub ready: bool,
    /// True once the wrapper is stopping the server on purpose.
    pub bye: bool,
    /// The ping timeout.
    pub timeout: Duration,
    /// When the pending `initialize` was sent to the server, while it is unanswered.
    pub init_sent: Option<Instant>,
    /// How long an `initialize` may go unanswered before the socket stops vouching.
    pub init_timeout: Duration,
}

impl HealthView {
    /// The answer line for a `PING` at `now`.
    pub fn answer(&self, now: Instant) -> &'static str {
        if self.bye {
            return "BYE";
        }
        if !self.ready {
            return match self.init_sent {
                Some(t) if now.saturating_duration_since(t) >= self.init_timeout => {
                    "ERR mcp_not_ready"
                }
                _ => "PONG",
            };
        }
        match self.last_answer {
            Some(t) if now.saturating_duration_since(t) < self.timeout => "PONG",
            _ => "ERR mcp_ping_timeout",
        }
    }
}

/// Shared health, read by the socket task and written by the relay.
pub type Health = Arc<Mutex<HealthView>>;

/// Picks the socket path: `<data_dir>/run/<runner_id>.mcp.sock`, or
/// `/tmp/stallwatch-<uid>/<hash>.sock` when that passes [`MAX_SOCKET_PATH`] bytes
/// (docs/design.md, Interfaces: Files). On Windows always the named pipe
/// `\\.\pipe\stallwatch-<hash>` (docs/platforms.md, heartbeat transport).
pub fn socket_path(data_dir: &Path, runner_id: &str) -> PathBuf {
    let p = data_dir.join("run").join(format!("{runner_id}.mcp.sock"));
    if cfg!(unix) && p.as_os_str().len() <= MAX_SOCKET_PATH {
        return p;
    }
    use sha2::{Digest, Sha256};
    let h = hex::encode(Sha256::digest(p.as_os_str().as_encoded_bytes()));
    fallback_path(&h[..16])
}

#[cfg(unix)]
fn fallback_path(hash: &str) -> PathBuf {
    let uid = rustix::process::getuid().as_raw();
    PathBuf::from(format!("/tmp/stallwatch-{uid}/{hash}.sock"))
}

#[cfg(windows)]
fn fallback_path(hash: &str) -> PathBuf {
    PathBuf::from(format!(r"\\.\pipe\stallwatch-{hash}"))
}

/// Binds `path` (removing a stale socket file first; the parent folder is created 0700) and
/// serves it until the task is dropped.
#[cfg(unix)]
pub fn serve(path: &Path, health: Health) -> std::io::Result<tokio::task::JoinHandle<()>> {
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    Ok(stallwatch_vocabulary::task::spawn_boxed(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            stallwatch_vocabulary::task::spawn_boxed(answer_one(stream, health.clone()));
        }
    }))
}

/// Creates the named pipe `path` (the first instance, so a pipe of the same name owned by
/// another process is refused) and serves it until the task is dropped: one pipe instance
/// per connection, a fresh one created before the connected one is handed off.
#[cfg(windows)]
pub fn serve(path: &Path, health: Health) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::net::windows::named_pipe::ServerOptions;
    let path = path.to_path_buf();
    let mut server = ServerOptions::new()
        .first_pipe_instance(true)
        .reject_remote_clients(true)
        .create(&path)?;
    Ok(stallwatch_vocabulary::task::spawn_boxed(async move {
        loop {
            if server.connect().await.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let next = match ServerOptions::new()
                .reject_remote_clients(true)
                .create(&path)
            {
                Ok(n) => n,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let connected = std::mem::replace(&mut server, next);
            stallwatch_vocabulary::task::spawn_boxed(answer_one(connected, health.clone()));
        }
    }))
}

/// Reads one `PING` line (at most 64 bytes, within [`READ_DEADLINE`]) and writes the answer.
async fn answer_one<S>(stream: S, health: Health)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (r, mut w) = tokio::io::split(stream);
    let mut line = String::new();
    let mut r = BufReader::new(r).take(64);
    let read = tokio::time::timeout(READ_DEADLINE, r.read_line(&mut line)).await;
    if !matches!(read, Ok(Ok(n)) if n > 0) || line.trim_end() != "PING" {
        return;
    }
    let answer = match health.lock() {
        Ok(h) => h.answer(Instant::now()),
        Err(_) => "ERR wrapper_poisoned",
    };
    let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
}

use tokio::io::AsyncReadExt as _;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_follow_the_pings() {
        let t0 = Instant::now();
        let mut h = HealthView {
            last_answer: None,
            ready: false,
            bye: false,
            timeout: Duration::from_millis(3000),
            init_sent: None,
            init_timeout: Duration::from_millis(60_000),
        };
        // not initialized: starting, or a host that initializes lazily; nothing to judge
        assert_eq!(h.answer(t0 + Duration::from_secs(600)), "PONG");
        // an `initialize` pending: vouched for until the initialize timeout
        h.init_sent = Some(t0);
        assert_eq!(h.answer(t0 + Duration::from_millis(59_999)), "PONG");
        assert_eq!(
            h.answer(t0 + Duration::from_millis(60_000)),
            "ERR mcp_not_ready"
        );
        h.ready = true;
        assert_eq!(h.answer(t0), "ERR mcp_ping_timeout");
        h.last_answer = Some(t0);
        assert_eq!(h.answer(t0 + Duration::from_millis(2999)), "PONG");
        assert_eq!(
            h.answer(t0 + Duration::from_millis(3000)),
            "ERR mcp_ping_timeout"
        );
        h.bye = true;
        assert_eq!(h.answer(t0), "BYE");
    }

    #[test]
    fn long_paths_fall_back_to_tmp() {
        let short = socket_path(Path::new("/d"), "mcp-abc");
        assert_eq!(short, PathBuf::from("/d/run/mcp-abc.mcp.sock"));
        let long = socket_path(Path::new(&"/x".repeat(60)), "mcp-abc");
        assert!(long.starts_with("/tmp/"), "{}", long.display());
        assert!(long.as_os_str().len() <= MAX_SOCKET_PATH);
    }

    #[tokio::test]
    async fn serves_ping_pong_over_a_real_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hb.sock");
        let health: Health = Arc::new(Mutex::new(HealthView {
            last_answer: Some(Instant::now()),
            ready: true,
            bye: false,
            timeout: Duration::from_secs(60),
            init_sent: None,
            init_timeout: Duration::from_secs(60),
        }));
        let _task = serve(&path, health.clone()).unwrap();
        let ask = || async {
            let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
            s.write_all(b"PING\n").await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert_eq!(ask().await, "PONG\n");
        {
            let mut h = health.lock().unwrap();
            h.ready = false;
            h.init_sent = Some(Instant::now() - Duration::from_secs(61));
        }
        assert_eq!(ask().await, "ERR mcp_not_ready\n");
    }
}
