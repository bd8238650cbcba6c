//! The TOML config file and its merge with CLI flags and `STALLWATCH_*` variables.
//!
//! One section per crate (`[otlp]`, `[storage]`, `[watchdog]`, `[reaper]`, `[dashboard]`,
//! `[[runner]]`, `[[alerts.webhook]]`), plus top-level `data_dir` and `log_format`. Every
//! table refuses unknown keys with their name. Precedence: CLI > env > TOML > default
//! (docs/design.md, Interfaces: CLI). Sections owned by a crate are handed to that crate's raw
//! config type, which validates them (`TryFrom`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;

use stallwatch_storage::control::RunnerSpec;
use stallwatch_storage::{StorageConfig, Synchronous};

use crate::cli::{LogFormat, ServeArgs};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Data folder.
    pub data_dir: Option<PathBuf>,
    /// Log format on stderr.
    pub log_format: Option<LogFormat>,
    /// `[otlp]`.
    #[serde(default)]
    pub otlp: OtlpSection,
    /// `[storage]`.
    #[serde(default)]
    pub storage: StorageSection,
    /// `[watchdog]` (validated by the watchdog crate).
    #[serde(default)]
    pub watchdog: Option<toml::Table>,
    /// `[reaper]` (validated by the reaper crate).
    #[serde(default)]
    pub reaper: Option<toml::Table>,
    /// `[dashboard]` (validated by the dashboards crate).
    #[serde(default)]
    pub dashboard: Option<toml::Table>,
    /// `[[runner]]`: runners to spawn or attach at start.
    #[serde(default)]
    pub runner: Vec<RunnerSpec>,
    /// `[alerts]` with `[[alerts.webhook]]`.
    #[serde(default)]
    pub alerts: Option<toml::Table>,
    /// `[forward]`: send everything accepted upstream over OTLP (validated by the
    /// collector crate); absent means no forwarding.
    #[serde(default)]
    pub forward: Option<toml::Table>,
}

/// `[otlp]`: the collector's listeners and limits.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpSection {
    /// gRPC listen address (default 127.0.0.1:4317).
    pub grpc_listen: Option<SocketAddr>,
    /// HTTP listen address (default 127.0.0.1:4318).
    pub http_listen: Option<SocketAddr>,
    /// Largest request body after decompression, bytes (default 20971520).
    pub max_request_bytes: Option<usize>,
    /// Bytes of request bodies in flight across requests (default 67108864).
    pub max_inflight_bytes: Option<usize>,
    /// Deepest attribute nesting accepted (default 32).
    pub max_nesting_depth: Option<usize>,
    /// Origins allowed by CORS (`http://localhost:*` allows any port).
    pub cors_allowed_origins: Option<Vec<String>>,
    /// When set, OTLP requests must carry `Authorization: Bearer <ingest_token>`.
    pub ingest_token: Option<String>,
    /// Longest time to receive a request's headers, ms (default 10000; docs/design.md,
    /// "Back-pressure and limits").
    pub header_read_timeout_ms: Option<u64>,
    /// A connection with no request in flight this long is closed, ms (default 60000).
    pub idle_timeout_ms: Option<u64>,
    /// HTTP/2 keepalive PING interval, ms (default 20000).
    pub keepalive_interval_ms: Option<u64>,
    /// An unanswered PING closes the connection after this, ms (default 10000).
    pub keepalive_timeout_ms: Option<u64>,
    /// Open connections per listener (each of gRPC and HTTP), SSE and long-polls included (default 512).
    pub max_connections: Option<usize>,
    /// Longest life of one connection, ms (default 3600000).
    pub max_connection_age_ms: Option<u64>,
}

impl OtlpSection {
    /// The connection-limit keys of this section.
    pub fn listen_limits(&self) -> stallwatch_storage::listen::RawListenLimits {
        stallwatch_storage::listen::RawListenLimits {
            header_read_timeout_ms: self.header_read_timeout_ms,
            idle_timeout_ms: self.idle_timeout_ms,
            keepalive_interval_ms: self.keepalive_interval_ms,
            keepalive_timeout_ms: self.keepalive_timeout_ms,
            max_connections: self.max_connections,
            max_connection_age_ms: self.max_connection_age_ms,
        }
    }
}

/// `[storage]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSection {
    /// `off`, `normal` (default) or `full`: `synchronous` for telemetry commits.
    pub synchronous: Option<String>,
    /// Write queue bound, export requests (default 1024).
    pub queue_capacity: Option<usize>,
    /// Retention by age, hours (default 168).
    pub retention_hours: Option<u64>,
    /// Database size cap, bytes (default 2147483648).
    pub max_db_bytes: Option<u64>,
    /// SQLite busy timeout, ms (default 5000).
    pub busy_timeout_ms: Option<u64>,
    /// Interval of the retention pass, ms (default 60000).
    pub retention_interval_ms: Option<u64>,
}

impl FileConfig {
    /// Reads and parses `path`. Errors name the file and, from toml, the key and line.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
    }
}

impl StorageSection {
    /// The validated storage config for a database at `path`.
    pub fn to_config(&self, path: PathBuf) -> Result<StorageConfig> {
        let mut c = StorageConfig::new(path);
        if let Some(s) = &self.synchronous {
            c.telemetry_synchronous = match s.to_ascii_lowercase().as_str() {
                "off" => Synchronous::Off,
                "normal" => Synchronous::Normal,
                "full" => Synchronous::Full,
                other => anyhow::bail!(
                    "[storage] synchronous = {other:?}: expected \"off\", \"normal\" or \"full\""
                ),
            };
        }
        if let Some(q) = self.queue_capacity {
            anyhow::ensure!(q > 0, "[storage] queue_capacity must be at least 1");
            c.queue_capacity = q;
        }
        if let Some(h) = self.retention_hours {
            anyhow::ensure!(h > 0, "[storage] retention_hours must be at least 1");
            c.retention = Duration::from_secs(h * 3600);
        }
        if let Some(b) = self.max_db_bytes {
            anyhow::ensure!(
                b >= 64 * 1024 * 1024,
                "[storage] max_db_bytes must be at least 67108864 (64 MiB)"
            );
            c.max_db_bytes = b;
        }
        if let Some(ms) = self.busy_timeout_ms {
            c.busy_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.retention_interval_ms {
            anyhow::ensure!(
                ms >= 100,
                "[storage] retention_interval_ms must be at least 100"
            );
            c.retention_interval = Duration::from_millis(ms);
        }
        Ok(c)
    }
}

/// Deserializes an optional crate-owned section into its raw config type, naming the
/// section in errors.
pub fn section<T: serde::de::DeserializeOwned + Default>(
    name: &str,
    table: &Option<toml::Table>,
) -> Result<T> {
    match table {
        None => Ok(T::default()),
        Some(t) => T::deserialize(toml::Value::Table(t.clone()))
            .map_err(|e| anyhow::anyhow!("[{name}] {}", e.message())),
    }
}

/// The merged top-level settings of `serve`.
#[derive(Debug)]
pub struct Settings {
    /// Data folder.
    pub data_dir: PathBuf,
    /// Log format.
    pub log_format: LogFormat,
    /// gRPC listen address.
    pub grpc_listen: SocketAddr,
    /// HTTP listen address.
    pub http_listen: SocketAddr,
    /// Dashboard listen address.
    pub dashboard_listen: SocketAddr,
    /// The parsed file (defaults when none was given).
    pub file: FileConfig,
}

/// Default OTLP/gRPC listen address.
pub const DEFAULT_GRPC_LISTEN: SocketAddr = SocketAddr::new(LOOPBACK, 4317);
/// Default OTLP/HTTP listen address.
pub const DEFAULT_HTTP_LISTEN: SocketAddr = SocketAddr::new(LOOPBACK, 4318);
/// Default dashboard listen address.
pub const DEFAULT_DASHBOARD_LISTEN: SocketAddr = SocketAddr::new(LOOPBACK, 4319);
const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// Merges CLI/env (already merged by clap) over the file over the defaults.
pub fn merge(args: &ServeArgs) -> Result<Settings> {
    let file = match &args.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let data_dir = match args.data_dir.clone().or_else(|| file.data_dir.clone()) {
        Some(d) => d,
        None => crate::datadir::default_data_dir()?,
    };
    Ok(Settings {
        data_dir,
        log_format: args
            .log_format
            .or(file.log_format)
            .unwrap_or(LogFormat::Text),
        grpc_listen: args
            .otlp_grpc_listen
            .or(file.otlp.grpc_listen)
            .unwrap_or(DEFAULT_GRPC_LISTEN),
        http_listen: args
            .otlp_http_listen
            .or(file.otlp.http_listen)
            .unwrap_or(DEFAULT_HTTP_LISTEN),
        dashboard_listen: args
            .dashboard_listen
            .or_else(|| {
                file.dashboard
                    .as_ref()
                    .and_then(|t| t.get("listen"))
                    .and_then(|v| v.as_str())
                    .and_then(|s| s.parse().ok())
            })
            .unwrap_or(DEFAULT_DASHBOARD_LISTEN),
        file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_is_refused_with_its_name() {
        let err = toml::from_str::<FileConfig>("[otlp]\ngrpc_listn = \"127.0.0.1:1\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("grpc_listn"), "{err}");
    }

    #[test]
    fn unknown_section_is_refused() {
        let err = toml::from_str::<FileConfig>("[colector]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("colector"), "{err}");
    }

    #[test]
    fn storage_section_validates() {
        let s: FileConfig = toml::from_str("[storage]\nsynchronous = \"sometimes\"\n").unwrap();
        let err = s.storage.to_config("x.db".into()).unwrap_err().to_string();
        assert!(err.contains("synchronous"), "{err}");
        let s: FileConfig =
            toml::from_str("[storage]\nsynchronous = \"full\"\nretention_hours = 2\n").unwrap();
        let c = s.storage.to_config("x.db".into()).unwrap();
        assert_eq!(c.telemetry_synchronous, Synchronous::Full);
        assert_eq!(c.retention, Duration::from_secs(7200));
    }

    #[test]
    fn runner_table_uses_the_shared_shape() {
        let s: FileConfig = toml::from_str(
            "[[runner]]\nid = \"py-1\"\nspawn = { argv = [\"python3\", \"r.py\"] }\n",
        )
        .unwrap();
        assert_eq!(s.runner[0].id, "py-1");
        assert_eq!(s.runner[0].spawn.as_ref().unwrap().argv[0], "python3");
        let err = toml::from_str::<FileConfig>("[[runner]]\nid = \"x\"\nspwn = {}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("spwn"), "{err}");
    }
}
