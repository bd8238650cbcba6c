//! The TOML config file and its merge with CLI flags and `STALLWATCH_*` variables.
//!
//! One section per crate (`[otlp]`, `[storage]`, `[watchdog]`, `[reaper]`, `[dashboard]`,
//! `[[runner]]`, `[[alerts.webhook]]`), plus top-level `data_dir` and `log_format`. Every
//! table refuses unknown keys with their name. Precedence: CLI > env > TOML > default
//! (docs/design.md, Interfaces: CLI). Sections owned by a crate are handed to that crate's raw
//! config type, which validates them (`TryFrom`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

use stallwatch_collector::RawOtlpConfig;
use stallwatch_dashboards::{RawAlertsConfig, RawDashboardConfig};
use stallwatch_forward::RawForwardConfig;
use stallwatch_reaper::RawReaperConfig;
use stallwatch_storage::control::RunnerSpec;
use stallwatch_storage::RawStorageConfig;
use stallwatch_watchdog::RawWatchdogConfig;

use crate::cli::{LogFormat, ServeArgs};

/// The whole file. `[otlp]` and `[storage]` are typed here; the other sections are kept
/// as tables and deserialized by [`section`] so their errors name the section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Data folder.
    pub data_dir: Option<PathBuf>,
    /// Log format on stderr.
    pub log_format: Option<LogFormat>,
    /// `[otlp]` (validated by the collector crate).
    #[serde(default)]
    pub otlp: RawOtlpConfig,
    /// `[storage]` (validated by the storage crate).
    #[serde(default)]
    pub storage: RawStorageConfig,
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

impl FileConfig {
    /// Reads and parses `path`. Errors name the file and, from toml, the key and line.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
    }
}

/// Deserializes an optional crate-owned section into its raw config type, naming the
/// section and the key in errors (`[reaper] grace_ms: invalid value: integer `-1`,
/// expected u64`; a section read as a value has no line numbers left to give).
pub fn section<T: serde::de::DeserializeOwned + Default>(
    name: &str,
    table: &Option<toml::Table>,
) -> Result<T> {
    match table {
        None => Ok(T::default()),
        Some(t) => serde_path_to_error::deserialize(toml::Value::Table(t.clone())).map_err(|e| {
            let path = e.path().to_string();
            let why = e.into_inner();
            if path == "." {
                anyhow::anyhow!("[{name}] {}", why.message())
            } else {
                anyhow::anyhow!("[{name}] {path}: {}", why.message())
            }
        }),
    }
}

/// The merged settings of `serve`: each crate's raw section with the CLI/env values put
/// over the file's. Defaults and range checks are the crates' own (`TryFrom` on each raw
/// type, called by `serve`); nothing here knows a default value.
#[derive(Debug)]
pub struct Settings {
    /// Data folder.
    pub data_dir: PathBuf,
    /// Log format.
    pub log_format: LogFormat,
    /// `[otlp]`, listen addresses merged.
    pub otlp: RawOtlpConfig,
    /// `[storage]`.
    pub storage: RawStorageConfig,
    /// `[watchdog]`.
    pub watchdog: RawWatchdogConfig,
    /// `[reaper]`.
    pub reaper: RawReaperConfig,
    /// `[dashboard]`, listen address merged.
    pub dashboard: RawDashboardConfig,
    /// `[alerts]`.
    pub alerts: RawAlertsConfig,
    /// `[forward]`; `None` when the section is absent (no forwarding).
    pub forward: Option<RawForwardConfig>,
    /// `[[runner]]`.
    pub runners: Vec<RunnerSpec>,
}

/// Merges CLI/env (already merged by clap) over the file; defaults come later, from each
/// crate's `TryFrom`.
pub fn merge(args: &ServeArgs) -> Result<Settings> {
    let file = match &args.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let data_dir = match args.data_dir.clone().or_else(|| file.data_dir.clone()) {
        Some(d) => d,
        None => crate::datadir::default_data_dir()?,
    };
    let mut otlp = file.otlp;
    otlp.grpc_listen = args.otlp_grpc_listen.or(otlp.grpc_listen);
    otlp.http_listen = args.otlp_http_listen.or(otlp.http_listen);
    let mut dashboard: RawDashboardConfig = section("dashboard", &file.dashboard)?;
    if let Some(addr) = args.dashboard_listen {
        dashboard.listen = Some(addr.to_string());
    }
    let forward = match &file.forward {
        None => None,
        Some(_) => Some(section("forward", &file.forward)?),
    };
    Ok(Settings {
        data_dir,
        log_format: args
            .log_format
            .or(file.log_format)
            .unwrap_or(LogFormat::Text),
        otlp,
        storage: file.storage,
        watchdog: section("watchdog", &file.watchdog)?,
        reaper: section("reaper", &file.reaper)?,
        dashboard,
        alerts: section("alerts", &file.alerts)?,
        forward,
        runners: file.runner,
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
        use stallwatch_storage::{StorageConfig, Synchronous};
        use std::time::Duration;
        let s: FileConfig = toml::from_str("[storage]\nsynchronous = \"sometimes\"\n").unwrap();
        let err = StorageConfig::try_from((s.storage, "x.db".into()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("synchronous"), "{err}");
        let s: FileConfig =
            toml::from_str("[storage]\nsynchronous = \"full\"\nretention_hours = 2\n").unwrap();
        let c = StorageConfig::try_from((s.storage, "x.db".into())).unwrap();
        assert_eq!(c.telemetry_synchronous, Synchronous::Full);
        assert_eq!(c.retention, Duration::from_secs(7200));
    }

    /// A wrong value in a crate's section names the section and the key (toml's own error
    /// is lost when the section is read as a value), nested keys by their path.
    #[test]
    fn a_bad_value_in_a_section_names_its_key() {
        let s: FileConfig = toml::from_str("[reaper]\ngrace_ms = -1\n").unwrap();
        let err = section::<stallwatch_reaper::RawReaperConfig>("reaper", &s.reaper)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("[reaper] grace_ms: "), "{err}");
        assert!(err.contains("-1"), "{err}");
        let s: FileConfig = toml::from_str("[watchdog]\nmax_open_spans = \"many\"\n").unwrap();
        let err = section::<stallwatch_watchdog::RawWatchdogConfig>("watchdog", &s.watchdog)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("[watchdog] max_open_spans: "), "{err}");
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
