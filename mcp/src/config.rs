//! Options of `stallwatch mcp wrap` and their defaults.

use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// The `_meta` key of a tool in a `tools/list` result that carries its SLA in milliseconds,
/// e.g. `"_meta": {"dev.stallwatch/sla_ms": 120000}`. MCP reserves `_meta` keys with a
/// reverse-DNS prefix for implementations (MCP spec, Basic: `_meta`). Copied to the tool
/// span's `stallwatch.sla_ms` attribute; stallwatch applies its floor and caps.
pub const SLA_META_KEY: &str = "dev.stallwatch/sla_ms";

/// How often the wrapper sends its own MCP `ping` to the server: 1000 ms.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_millis(1000);
/// How long the server may leave the wrapper's pings unanswered before the heartbeat socket
/// stops answering `PONG`: 3000 ms (below the watchdog's 5000 ms heartbeat timeout, so a
/// blocked event loop is seen within one watchdog timeout).
pub const DEFAULT_PING_TIMEOUT: Duration = Duration::from_millis(3000);
/// Restart policy: at most this many restarts ...
pub const DEFAULT_MAX_RESTARTS: usize = 3;
/// ... within this window (docs/design.md, Interfaces: Runners: "at most 3 in 60 s").
pub const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(60);
/// How long the server may take to exit after its stdin closes before the wrapper has it
/// terminated: 2000 ms (MCP spec, Lifecycle: Shutdown).
pub const DEFAULT_EXIT_WAIT: Duration = Duration::from_millis(2000);

/// How long the server may leave an `initialize` unanswered (the client's, or the
/// wrapper's replay after a restart) before the heartbeat socket stops vouching for it and
/// a replay is given up: 60000 ms. Generous: a server's first start may fetch a package or
/// load a model before it reads its stdin.
pub const DEFAULT_INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
/// Validated options of one wrapper run.
#[derive(Clone, Debug)]
pub struct WrapConfig {
    /// The server command: program and arguments.
    pub argv: Vec<String>,
    /// Runner id, `^[a-z0-9][a-z0-9._-]{0,62}$` (default [`default_runner_id`]).
    pub runner_id: String,
    /// The sidecar's data folder (holds `ready.json` and `token`); `None`: no sidecar.
    pub data_dir: Option<PathBuf>,
    /// Period of the wrapper's own `ping`.
    pub ping_interval: Duration,
    /// Unanswered-ping limit before the heartbeat socket stops answering `PONG`.
    pub ping_timeout: Duration,
    /// Restart policy: restarts allowed in `restart_window`.
    pub max_restarts: usize,
    /// Restart policy window.
    pub restart_window: Duration,
    /// Wait for the server's own exit after its stdin closes.
    pub exit_wait: Duration,
    /// Longest wait for the server's answer to an `initialize`.
    pub initialize_timeout: Duration,
}

impl WrapConfig {
    /// Options with the defaults above for `argv`, the runner id derived from it when
    /// `runner_id` is `None`. Errors: empty `argv`, invalid runner id.
    pub fn new(
        argv: Vec<String>,
        runner_id: Option<String>,
        data_dir: Option<PathBuf>,
    ) -> Result<Self, crate::Error> {
        if argv.is_empty() || argv[0].is_empty() {
            return Err(crate::Error::Config(
                "no server command: give it after `--`".into(),
            ));
        }
        let runner_id = runner_id.unwrap_or_else(|| default_runner_id(&argv));
        if !stallwatch_client::valid_runner_id(&runner_id) {
            return Err(crate::Error::Config(format!(
                "runner id {runner_id:?} does not match ^[a-z0-9][a-z0-9._-]{{0,62}}$"
            )));
        }
        Ok(Self {
            argv,
            runner_id,
            data_dir,
            ping_interval: DEFAULT_PING_INTERVAL,
            ping_timeout: DEFAULT_PING_TIMEOUT,
            max_restarts: DEFAULT_MAX_RESTARTS,
            restart_window: DEFAULT_RESTART_WINDOW,
            exit_wait: DEFAULT_EXIT_WAIT,
            initialize_timeout: DEFAULT_INITIALIZE_TIMEOUT,
        })
    }
}

/// `mcp-<first 12 hex digits of sha256(argv joined by NUL)>`: stable for one command line,
/// so the same server keeps its runner id (and its history) across wrapper runs.
pub fn default_runner_id(argv: &[String]) -> String {
    let digest = Sha256::digest(argv.join("\0").as_bytes());
    format!("mcp-{}", &hex::encode(digest)[..12])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runner_id_is_stable_and_valid() {
        let argv = vec!["python".to_string(), "server.py".to_string()];
        let id = default_runner_id(&argv);
        assert_eq!(id, default_runner_id(&argv));
        assert_eq!(id.len(), 16);
        assert!(stallwatch_client::valid_runner_id(&id));
        // NUL-joined: ["ab"] and ["a", "b"] differ.
        assert_ne!(
            default_runner_id(&["ab".into()]),
            default_runner_id(&["a".into(), "b".into()])
        );
    }

    #[test]
    fn refuses_empty_command_and_bad_id() {
        assert!(matches!(
            WrapConfig::new(vec![], None, None),
            Err(crate::Error::Config(_))
        ));
        let e = WrapConfig::new(vec!["x".into()], Some("Bad Id".into()), None).unwrap_err();
        assert!(e.to_string().contains("Bad Id"), "{e}");
    }
}
