//! Options of the sidecar launcher and the HTTP client, each default a named constant
//! documented beside its field. These are Rust values given by the embedding app (no TOML
//! edge), so durations are [`Duration`]s.

use std::path::PathBuf;
use std::time::Duration;

/// How long [`crate::Sidecar::spawn`] waits for the `ready` line by default: 30 s (a cold
/// start opens SQLite, runs migrations and starts the orphan sweep; a loaded 2-core box needs
/// slack).
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`crate::Sidecar::shutdown`] waits for the process to exit after
/// `POST /api/v1/shutdown` before it falls back to SIGKILL by default: 30 s (the ordered
/// shutdown stops spawned runners with their SIGTERM → 3 s grace → SIGKILL sequence first).
pub const DEFAULT_SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);

/// Deadline of one control or read call by default: 60 s (`DELETE /api/v1/runners/{id}`
/// answers only when termination is done).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Deadline to open a TCP connection to the loopback dashboard by default: 5 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start `stallwatch serve` as a sidecar. The three listeners are always bound on
/// `127.0.0.1:0`; the `ready` line says where they are (docs/design.md, Interfaces: CLI).
#[derive(Clone, Debug)]
pub struct SidecarOptions {
    /// The `stallwatch` executable.
    pub binary: PathBuf,
    /// `--data-dir`; `None` uses stallwatch's default (`$XDG_DATA_HOME/stallwatch`).
    pub data_dir: Option<PathBuf>,
    /// `--config` TOML file.
    pub config: Option<PathBuf>,
    /// More arguments after `serve` and the options above (e.g. `--log-format json`).
    pub extra_args: Vec<String>,
    /// Extra environment for the sidecar (e.g. `RUST_LOG`), over the inherited one.
    pub env: Vec<(String, String)>,
    /// Pass `--exit-with-parent`: stallwatch shuts down in order when this process dies,
    /// even by SIGKILL. A Tauri app wants this.
    pub exit_with_parent: bool,
    /// Write the sidecar's stderr (its log) to this file instead of inheriting ours; its
    /// tail is then quoted in [`crate::Error::SidecarExited`].
    pub stderr_file: Option<PathBuf>,
    /// Wait this long for the ready line; default [`DEFAULT_READY_TIMEOUT`].
    pub ready_timeout: Duration,
    /// Wait this long for exit after asking for shutdown; default
    /// [`DEFAULT_SHUTDOWN_DEADLINE`].
    pub shutdown_deadline: Duration,
    /// Options of the [`crate::Client`] built from the ready line.
    pub client: ClientOptions,
}

impl SidecarOptions {
    /// Options for `binary` with every other field at its default (no data dir, no config,
    /// no extra args or env, `exit_with_parent = false`, stderr inherited).
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            data_dir: None,
            config: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            exit_with_parent: false,
            stderr_file: None,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            shutdown_deadline: DEFAULT_SHUTDOWN_DEADLINE,
            client: ClientOptions::default(),
        }
    }
}

/// Timeouts of the HTTP client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// Deadline of one call (not of an event stream); default [`DEFAULT_REQUEST_TIMEOUT`].
    pub request_timeout: Duration,
    /// Deadline to connect; default [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}
