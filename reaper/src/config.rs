//! The reaper's configuration: the raw `[reaper]` TOML table (edge names carry units,
//! `*_ms`) and the validated [`ReaperConfig`] built from it by `TryFrom` (STYLE point 4).
//! Defaults come from docs/design.md (Defaults table; Interfaces: Runners).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use stallwatch_storage::control::RunnerSpec;

use crate::error::ReaperError;

/// Default budget for stall evidence before the first SIGTERM: 500 ms (issue 18).
pub const FORENSICS_DEFAULT_BUDGET: Duration = Duration::from_millis(500);
/// Default CPU sampling interval for stall evidence: 2000 ms, the heartbeat interval
/// (`docs/design.md`, Defaults).
pub const FORENSICS_DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_millis(2000);

/// Default grace between SIGTERM and SIGKILL: 3000 ms (docs/design.md, Defaults).
pub const DEFAULT_GRACE: Duration = Duration::from_millis(3000);
/// Default OTLP endpoint given to spawned runners (docs/design.md, Defaults: OTLP/HTTP listen).
pub const DEFAULT_OTLP_ENDPOINT: &str = "http://127.0.0.1:4318";
/// Restart policy default: at most 3 restarts ... (docs/design.md, Interfaces: Runners).
pub const DEFAULT_MAX_RESTARTS: u32 = 3;
/// ... in 60 s.
pub const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(60);
/// Rows handled per orphan-sweep batch (docs/design.md, Orphan sweep: capped batches).
pub const DEFAULT_SWEEP_BATCH: usize = 64;
/// Lines of stdout/stderr kept per runner for incidents.
pub const DEFAULT_TAIL_LINES: usize = 50;
/// How often zombie children nobody owns are looked for: 500 ms.
pub const DEFAULT_ZOMBIE_INTERVAL: Duration = Duration::from_millis(500);

/// Default cap on registered runners (issue 17 #10).
pub const DEFAULT_MAX_RUNNERS: usize = 1024;
/// Restart policy of spawned runners: on failure, at most `max_restarts` in `window`
/// (OTP-style intensity limit; docs/design.md, Fusion and breakers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Most restarts allowed inside `window` (default [`DEFAULT_MAX_RESTARTS`]); 0 = never.
    pub max_restarts: u32,
    /// The sliding window (default [`DEFAULT_RESTART_WINDOW`]).
    pub window: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            max_restarts: DEFAULT_MAX_RESTARTS,
            window: DEFAULT_RESTART_WINDOW,
        }
    }
}

/// The watchdog's heartbeat timeout in ms, given to spawned runners: the runner kits
/// answer `ERR export_stuck` instead of `PONG` once a span export has been stuck that long
/// (integrations/python and integrations/node READMEs).
pub const HEARTBEAT_TIMEOUT_ENV: &str = "STALLWATCH_HEARTBEAT_TIMEOUT_MS";

/// Validated reaper configuration.
#[derive(Clone, Debug)]
pub struct ReaperConfig {
    /// Grace between SIGTERM and SIGKILL (default [`DEFAULT_GRACE`]).
    pub grace: Duration,
    /// The data folder; heartbeat sockets go in `<data_dir>/run/`.
    pub data_dir: PathBuf,
    /// Given to spawned runners as `OTEL_EXPORTER_OTLP_ENDPOINT` (default
    /// [`DEFAULT_OTLP_ENDPOINT`]).
    pub otlp_endpoint: String,
    /// Given to spawned runners as `OTEL_EXPORTER_OTLP_HEADERS` when set (`src/` sets it
    /// to `authorization=Bearer%20<token>` when `[otlp] ingest_token` is configured, so the
    /// runners' exporters are accepted). Default `None`.
    pub otlp_headers: Option<String>,
    /// The watchdog's heartbeat timeout (`[watchdog] heartbeat_timeout_ms`), given to
    /// spawned runners as `STALLWATCH_HEARTBEAT_TIMEOUT_MS`: the runner kits answer
    /// `ERR export_stuck` instead of `PONG` once a span export has been stuck that long.
    /// `src/` sets it from the watchdog's config; default
    /// [`stallwatch_vocabulary::control::DEFAULT_HEARTBEAT_TIMEOUT`].
    pub heartbeat_timeout: Duration,
    /// Restart policy of spawned runners.
    pub restart: RestartPolicy,
    /// Runners from the config file's `[[runner]]` tables, started at [`crate::Reaper::start`].
    pub runners: Vec<RunnerSpec>,
    /// Rows per orphan-sweep batch (default [`DEFAULT_SWEEP_BATCH`]).
    pub sweep_batch: usize,
    /// Lines of output kept per runner (default [`DEFAULT_TAIL_LINES`]).
    pub tail_lines: usize,
    /// Interval of the unowned-zombie reaper (default [`DEFAULT_ZOMBIE_INTERVAL`]).
    pub zombie_interval: Duration,
    /// Most live runners registered at once; more are refused with `too_many_runners`
    /// (default [`DEFAULT_MAX_RUNNERS`]).
    pub max_runners: usize,
    /// Most time spent on stall forensics before the first SIGTERM, counted from the trip
    /// (default [`FORENSICS_DEFAULT_BUDGET`]); zero turns forensics off.
    pub forensics_budget: Duration,
    /// CPU sampling interval of the forensics history (default
    /// [`FORENSICS_DEFAULT_SAMPLE_INTERVAL`]).
    pub forensics_sample: Duration,
}

impl ReaperConfig {
    /// Defaults for a data folder.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            grace: DEFAULT_GRACE,
            data_dir: data_dir.into(),
            otlp_endpoint: DEFAULT_OTLP_ENDPOINT.into(),
            otlp_headers: None,
            heartbeat_timeout: stallwatch_vocabulary::control::DEFAULT_HEARTBEAT_TIMEOUT,
            restart: RestartPolicy::default(),
            runners: Vec::new(),
            sweep_batch: DEFAULT_SWEEP_BATCH,
            tail_lines: DEFAULT_TAIL_LINES,
            zombie_interval: DEFAULT_ZOMBIE_INTERVAL,
            max_runners: DEFAULT_MAX_RUNNERS,
            forensics_budget: FORENSICS_DEFAULT_BUDGET,
            forensics_sample: FORENSICS_DEFAULT_SAMPLE_INTERVAL,
        }
    }
}

/// The raw `[reaper]` TOML table. Unknown keys are refused with their name.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReaperConfig {
    /// Grace between SIGTERM and SIGKILL, ms (default 3000).
    pub grace_ms: Option<u64>,
    /// OTLP endpoint for spawned runners (default `http://127.0.0.1:4318`).
    pub otlp_endpoint: Option<String>,
    /// Restarts allowed per window (default 3).
    pub max_restarts: Option<u32>,
    /// Restart window, ms (default 60000).
    pub restart_window_ms: Option<u64>,
    /// Orphan-sweep batch size, rows (default 64).
    pub sweep_batch: Option<usize>,
    /// Output lines kept per runner (default 50).
    pub tail_lines: Option<usize>,
    /// Most runners registered at once, count (default 1024).
    pub max_runners: Option<usize>,
    /// Stall forensics budget before the first SIGTERM, ms (default 500; 0 = off).
    pub forensics_budget_ms: Option<u64>,
    /// CPU sampling interval for stall forensics, ms (default 2000, at least 10).
    pub forensics_sample_ms: Option<u64>,
}

/// Input of the `TryFrom`: the raw table plus what `src/` knows (data folder, `[[runner]]`).
#[derive(Clone, Debug)]
pub struct ReaperConfigInput {
    /// The `[reaper]` table.
    pub raw: RawReaperConfig,
    /// The data folder.
    pub data_dir: PathBuf,
    /// `[[runner]]` tables.
    pub runners: Vec<RunnerSpec>,
}

impl TryFrom<ReaperConfigInput> for ReaperConfig {
    type Error = ReaperError;

    /// Errors: [`ReaperError::Config`] for a zero grace, a zero window with restarts, a zero
    /// batch, an invalid or duplicated runner id, or a runner without exactly one of
    /// `spawn`/`attach`.
    fn try_from(input: ReaperConfigInput) -> Result<Self, Self::Error> {
        let raw = input.raw;
        let mut c = ReaperConfig::new(input.data_dir);
        if let Some(ms) = raw.grace_ms {
            if ms == 0 {
                return Err(ReaperError::Config("reaper.grace_ms must be > 0".into()));
            }
            c.grace = Duration::from_millis(ms);
        }
        if let Some(e) = raw.otlp_endpoint {
            c.otlp_endpoint = e;
        }
        if let Some(n) = raw.max_restarts {
            c.restart.max_restarts = n;
        }
        if let Some(ms) = raw.restart_window_ms {
            if ms == 0 && c.restart.max_restarts > 0 {
                return Err(ReaperError::Config(
                    "reaper.restart_window_ms must be > 0".into(),
                ));
            }
            c.restart.window = Duration::from_millis(ms);
        }
        if let Some(b) = raw.sweep_batch {
            if b == 0 {
                return Err(ReaperError::Config("reaper.sweep_batch must be > 0".into()));
            }
            c.sweep_batch = b;
        }
        if let Some(m) = raw.max_runners {
            if m == 0 {
                return Err(ReaperError::Config("reaper.max_runners must be > 0".into()));
            }
            c.max_runners = m;
        }
        if let Some(t) = raw.tail_lines {
            c.tail_lines = t.max(1);
        }
        if let Some(ms) = raw.forensics_budget_ms {
            if ms > 10_000 {
                return Err(ReaperError::Config(format!(
                    "reaper.forensics_budget_ms = {ms} is over 10000: it delays every kill"
                )));
            }
            c.forensics_budget = Duration::from_millis(ms);
        }
        if let Some(ms) = raw.forensics_sample_ms {
            if ms < 10 {
                return Err(ReaperError::Config(
                    "reaper.forensics_sample_ms must be at least 10".into(),
                ));
            }
            c.forensics_sample = Duration::from_millis(ms);
        }
        let mut seen = std::collections::HashSet::new();
        for r in &input.runners {
            // On Windows the reaper refuses config runners at start (docs/platforms.md).
            #[cfg(unix)]
            crate::runner::validate_spec(r).map_err(|e| ReaperError::Config(e.to_string()))?;
            if !seen.insert(r.id.clone()) {
                return Err(ReaperError::Config(format!(
                    "runner id {} is listed twice",
                    r.id
                )));
            }
        }
        c.runners = input.runners;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_table_refuses_unknown_keys_and_converts_units() {
        let err = toml::from_str::<RawReaperConfig>("grace_ms = 10\nbogus = 1").unwrap_err();
        assert!(err.to_string().contains("bogus"));
        let raw: RawReaperConfig = toml::from_str("grace_ms = 250\nmax_restarts = 1").unwrap();
        let c = ReaperConfig::try_from(ReaperConfigInput {
            raw,
            data_dir: "/d".into(),
            runners: vec![],
        })
        .unwrap();
        assert_eq!(c.grace, Duration::from_millis(250));
        assert_eq!(c.restart.max_restarts, 1);
        assert_eq!(c.restart.window, DEFAULT_RESTART_WINDOW);
        let zero = RawReaperConfig {
            grace_ms: Some(0),
            ..Default::default()
        };
        assert!(ReaperConfig::try_from(ReaperConfigInput {
            raw: zero,
            data_dir: "/d".into(),
            runners: vec![],
        })
        .is_err());
    }
}
