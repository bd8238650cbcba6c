//! Command-line interface. Each flag of `serve` has its own `STALLWATCH_*` variable
//! (clap's `env =`, no prefix scan); precedence is CLI > env > TOML > default
//! (docs/design.md, Interfaces: CLI).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// `stallwatch`: an embedded OpenTelemetry collector with a stall watchdog.
#[derive(Debug, Parser)]
#[command(name = "stallwatch", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the sidecar: OTLP in, SQLite, watchdog, reaper, dashboard.
    Serve(ServeArgs),
    /// Start a throw-away sidecar and six real Python runners (one healthy, five that
    /// hang inside a tool span), print the timeline as they are stopped, check the
    /// workspace is byte-for-byte as before. Needs the Python runner kit.
    Demo(DemoArgs),
    /// MCP helpers: `stallwatch mcp wrap -- <server command>` guards a stdio MCP server.
    #[command(subcommand)]
    Mcp(McpCommand),
}

/// `stallwatch mcp ...` subcommands.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Run in place of a stdio MCP server command: spawn the server, relay JSON-RPC both
    /// ways byte for byte, register it with the running sidecar, trace every request, and
    /// answer the client at once when stallwatch stops a stuck server (it is restarted and
    /// the session goes on). Without a running sidecar it still relays.
    Wrap(McpWrapArgs),
}

/// Flags of `stallwatch mcp wrap`.
#[derive(Debug, Clone, clap::Args)]
pub struct McpWrapArgs {
    /// Runner id of the server (default `mcp-` + the first 12 hex digits of the SHA-256 of
    /// the server command's arguments joined by NUL).
    #[arg(long, env = "STALLWATCH_MCP_RUNNER_ID", value_name = "ID")]
    pub runner_id: Option<String>,
    /// The sidecar's data folder, as `serve` chooses it (default: $XDG_DATA_HOME/stallwatch,
    /// else ~/.local/share/stallwatch); its `ready.json` says where the sidecar listens.
    #[arg(long, env = "STALLWATCH_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// How long the server may leave an `initialize` unanswered, ms (1000..=3600000): until
    /// then the heartbeat vouches for a server that is still starting, and a restarted one
    /// that never answers the replayed `initialize` is stopped after it.
    #[arg(
        long,
        env = "STALLWATCH_MCP_INITIALIZE_TIMEOUT_MS",
        value_name = "MS",
        default_value_t = 60_000,
        value_parser = clap::value_parser!(u64).range(1000..=3_600_000)
    )]
    pub initialize_timeout_ms: u64,
    /// The MCP server command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "SERVER_COMMAND")]
    pub server: Vec<String>,
}

/// Log line format on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Flags of `stallwatch serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// TOML config file (sections `[otlp]`, `[storage]`, `[watchdog]`, `[reaper]`, `[dashboard]`,
    /// `[forward]`, `[[runner]]`, `[[alerts.webhook]]`; unknown keys are refused).
    #[arg(long, env = "STALLWATCH_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data folder (database, token, lock, run/). Default: $XDG_DATA_HOME/stallwatch, else
    /// ~/.local/share/stallwatch.
    #[arg(long, env = "STALLWATCH_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// OTLP/gRPC listen address (default 127.0.0.1:4317; port 0 picks one).
    #[arg(long, env = "STALLWATCH_OTLP_GRPC_LISTEN", value_name = "ADDR", value_parser = stallwatch_storage::listen::parse_listen_addr)]
    pub otlp_grpc_listen: Option<SocketAddr>,
    /// OTLP/HTTP listen address (default 127.0.0.1:4318; port 0 picks one).
    #[arg(long, env = "STALLWATCH_OTLP_HTTP_LISTEN", value_name = "ADDR", value_parser = stallwatch_storage::listen::parse_listen_addr)]
    pub otlp_http_listen: Option<SocketAddr>,
    /// Dashboard, JSON API, /healthz, /readyz and /metrics (default 127.0.0.1:4319).
    #[arg(long, env = "STALLWATCH_DASHBOARD_LISTEN", value_name = "ADDR", value_parser = stallwatch_storage::listen::parse_listen_addr)]
    pub dashboard_listen: Option<SocketAddr>,
    /// Log format on stderr.
    #[arg(long, env = "STALLWATCH_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Shut down in order (stopping spawned runners) as soon as the parent process dies.
    #[arg(long, env = "STALLWATCH_EXIT_WITH_PARENT", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    pub exit_with_parent: bool,
    /// Store stallwatch's own spans (ingest batches, verdicts, terminations) as traces of
    /// `service.name = "stallwatch"`, shown in its own dashboard.
    #[arg(long, env = "STALLWATCH_SELF_TRACES", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    pub self_traces: bool,
}

/// Flags of `stallwatch demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Python interpreter that can `import stallwatch_runner` (default: ./.venv/bin/python
    /// when it exists, else python3).
    #[arg(long, env = "STALLWATCH_DEMO_PYTHON", value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Keep the sidecar and its dashboard running after the demo, until Ctrl-C.
    #[arg(long)]
    pub keep: bool,
    /// Tool SLA given to the demo's runners, ms (1000 to 600000).
    #[arg(long, value_name = "N", default_value_t = 3000, value_parser = clap::value_parser!(u64).range(1000..=600_000))]
    pub sla_ms: u64,
}
/// The environment variable a refused value came from, when it came from one: clap names
/// the flag (`invalid value 'localhost:0' for '--dashboard-listen <ADDR>'`) even when the
/// user never typed it but set `STALLWATCH_DASHBOARD_LISTEN`. `Some` for an invalid-value
/// error whose flag has a variable that is set while the flag is not on the command line.
pub fn value_from_env(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::CommandFactory;
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let ContextValue::String(arg) = e.get(ContextKind::InvalidArg)? else {
        return None;
    };
    // "--dashboard-listen <ADDR>" → "dashboard-listen"
    let long = arg.strip_prefix("--")?.split([' ', '=']).next()?;
    let on_command_line = std::env::args().any(|a| {
        a.strip_prefix("--")
            .and_then(|a| a.split('=').next())
            .is_some_and(|a| a == long)
    });
    if on_command_line {
        return None;
    }
    let cmd = Cli::command();
    let mut stack = vec![&cmd];
    while let Some(c) = stack.pop() {
        if let Some(a) = c.get_arguments().find(|a| a.get_long() == Some(long)) {
            let var = a.get_env()?.to_str()?;
            return std::env::var_os(var).map(|_| var.to_string());
        }
        stack.extend(c.get_subcommands());
    }
    None
}
