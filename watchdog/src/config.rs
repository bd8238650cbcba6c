//! The watchdog's configuration: the raw `[watchdog]` TOML shape (edge names carry units,
//! `*_ms`) and the validated [`WatchdogConfig`] (durations inside) built from it by
//! `TryFrom`. Every default is a named constant beside its field; every error names the key
//! (and the rule) that was wrong. Defaults come from docs/design.md ("Defaults", "Interfaces:
//! Heartbeat details", "SLA and staleness").

use std::time::Duration;

use serde::Deserialize;

use crate::error::WatchdogError;
use crate::glob::{Glob, GlobSet};

/// Default heartbeat ping interval: 2000 ms (docs/design.md, Defaults).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(2000);
/// Default heartbeat timeout: no PONG for 5000 ms since the last one means *lost* (docs/design.md).
pub use stallwatch_storage::control::DEFAULT_HEARTBEAT_TIMEOUT;
/// Default start-up grace before a new runner's first PONG is due: 30000 ms (docs/design.md,
/// Interfaces: Heartbeat details, `startup_grace_ms`).
pub const DEFAULT_STARTUP_GRACE: Duration = Duration::from_millis(30_000);
/// Default staleness limit of a refreshed open span: 15000 ms (docs/design.md, `staleness_ms`).
pub const DEFAULT_STALENESS: Duration = Duration::from_millis(15_000);
/// Default breaker cooldown in OPEN before HALF_OPEN: 15000 ms (docs/design.md, Defaults).
pub const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_millis(15_000);
/// Default tool SLA: 60000 ms (docs/design.md, Defaults).
pub const DEFAULT_SLA: Duration = Duration::from_millis(60_000);
/// Hard cap of the rendering / I/O tool class: 30000 ms (docs/design.md, Defaults).
pub const DEFAULT_CLASS_CAP: Duration = Duration::from_millis(30_000);
/// Floor of a per-span `stallwatch.sla_ms` override: 1000 ms (docs/design.md, `min_sla_ms`).
pub const DEFAULT_MIN_SLA: Duration = Duration::from_millis(1000);
/// Ceiling of every SLA: 3600000 ms (one hour; docs/design.md names `max_sla_ms` without a value).
pub const DEFAULT_MAX_SLA: Duration = Duration::from_millis(3_600_000);
/// Longest a lost heartbeat with a fresh span within SLA stays *suspect* before it trips:
/// 30000 ms (docs/design.md, "trip after min(SLA, 30 s)").
pub const DEFAULT_SUSPECT_CAP: Duration = Duration::from_millis(30_000);
/// Default evaluation period after a change (new telemetry, a runner registered): 50 ms.
/// Thresholds themselves (SLA, staleness, heartbeat deadlines, cooldowns) are met by
/// exact wake-ups at their instants, not by this period.
pub const DEFAULT_TICK: Duration = Duration::from_millis(50);
/// Default period at which the runner board is republished when nothing changed: 1000 ms.
pub const DEFAULT_BOARD_INTERVAL: Duration = Duration::from_millis(1000);
/// Default limit for a runner that said goodbye (`BYE` on its heartbeat socket, or removed
/// its socket while no tool span was open) to exit: 30000 ms. While *stopping* it is never
/// tripped for the missing heartbeat; past this limit it is tripped as `unresponsive`
/// (`docs/design.md`, Runner lifecycle).
pub const DEFAULT_STOPPING_TIMEOUT: Duration = Duration::from_millis(30_000);
/// Default back-dating window: an open span's age counts from its own
/// `start_time_unix_nano` when that lies at most 10000 ms before its arrival (and not in the
/// future), else from its arrival (`docs/design.md`, Fusion and breakers: exporters on this
/// machine share stallwatch's wall clock).
pub const DEFAULT_MAX_BACKDATE: Duration = Duration::from_millis(10_000);
/// Default bound of the open-span ledger: at most 25,000 spans tracked at once (in memory,
/// and so in the durable copy, `open_spans`). Measured (`tests/ledger_memory.rs`, the ledger
/// filled to this bound under a counting allocator): ~430 B of heap per tracked span with
/// ordinary names (~10 MiB in all), ~1 KiB with every text at its clipped length
/// ([`crate::ledger::MAX_ENTRY_TEXT_BYTES`], ~24 MiB). A desktop's runners (at most 1,024
/// registered by default) keep a few open tool spans and parents each, far below it. Spans beyond the bound are not tracked, and counted (`docs/design.md`, "Open
/// spans": the bound).
pub const DEFAULT_MAX_OPEN_SPANS: usize = 25_000;
/// Smallest `max_open_spans` accepted: a quarter of the bound is kept for the spans of
/// registered runners, and below 16 that reserve would be a handful of spans.
pub const MIN_MAX_OPEN_SPANS: usize = 16;
/// Tool-name globs of the rendering / I/O class capped at [`DEFAULT_CLASS_CAP`].
pub const DEFAULT_CLASS_GLOBS: &[&str] = &[
    "*render*",
    "*plot*",
    "*draw*",
    "*screenshot*",
    "*image*",
    "*read_file*",
    "*write_file*",
    "*download*",
    "*upload*",
    "*fetch*",
    "*http*",
];

/// Raw `[watchdog]` TOML section. Unknown keys are refused with their name.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWatchdogConfig {
    /// Ping interval, ms (default [`DEFAULT_HEARTBEAT_INTERVAL`]).
    pub heartbeat_interval_ms: Option<u64>,
    /// Heartbeat timeout, ms (default [`DEFAULT_HEARTBEAT_TIMEOUT`]).
    pub heartbeat_timeout_ms: Option<u64>,
    /// Start-up grace, ms (default [`DEFAULT_STARTUP_GRACE`]).
    pub startup_grace_ms: Option<u64>,
    /// Staleness limit, ms (default [`DEFAULT_STALENESS`]).
    pub staleness_ms: Option<u64>,
    /// Breaker cooldown, ms (default [`DEFAULT_BREAKER_COOLDOWN`]).
    pub breaker_cooldown_ms: Option<u64>,
    /// Suspect cap, ms (default [`DEFAULT_SUSPECT_CAP`]).
    pub suspect_cap_ms: Option<u64>,
    /// Evaluation period, ms (default [`DEFAULT_TICK`]).
    pub tick_ms: Option<u64>,
    /// Board republish period, ms (default [`DEFAULT_BOARD_INTERVAL`]).
    pub board_interval_ms: Option<u64>,
    /// Limit for a runner that said goodbye to exit, ms (default
    /// [`DEFAULT_STOPPING_TIMEOUT`]).
    pub stopping_timeout_ms: Option<u64>,
    /// Back-dating window of a span's own start time, ms (default [`DEFAULT_MAX_BACKDATE`];
    /// 0 counts every span from its arrival).
    pub max_backdate_ms: Option<u64>,
    /// Most open spans tracked at once (default [`DEFAULT_MAX_OPEN_SPANS`], at least
    /// [`MIN_MAX_OPEN_SPANS`]).
    pub max_open_spans: Option<u64>,
    /// Default tool SLA, ms (default [`DEFAULT_SLA`]).
    pub default_sla_ms: Option<u64>,
    /// Floor of `stallwatch.sla_ms` overrides, ms (default [`DEFAULT_MIN_SLA`]).
    pub min_sla_ms: Option<u64>,
    /// Ceiling of every SLA, ms (default [`DEFAULT_MAX_SLA`]).
    pub max_sla_ms: Option<u64>,
    /// Hard cap of the rendering / I/O class, ms (default [`DEFAULT_CLASS_CAP`]).
    pub class_cap_ms: Option<u64>,
    /// Tool-name globs of the capped class (default [`DEFAULT_CLASS_GLOBS`]).
    pub class_tools: Option<Vec<String>>,
    /// Extra span-name globs that make a span a tool span.
    #[serde(default)]
    pub tool_name_patterns: Vec<String>,
    /// SLA rules by tool-name glob; the first match wins (`[[watchdog.sla_rule]]`).
    #[serde(default, rename = "sla_rule")]
    pub sla_rules: Vec<RawSlaRule>,
}

/// One raw `[[watchdog.sla_rule]]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSlaRule {
    /// Tool-name glob, e.g. `run_notebook*`.
    pub tool: String,
    /// SLA for matching tools, ms.
    pub sla_ms: u64,
}

/// One validated SLA rule.
#[derive(Clone, Debug)]
pub struct SlaRule {
    /// Its SLA.
    pub sla: Duration,
    matcher: Glob,
}

impl SlaRule {
    /// Builds a rule; errors name `sla_rule[index].tool` when the glob is invalid.
    pub fn new(index: usize, glob: &str, sla: Duration) -> Result<Self, WatchdogError> {
        let matcher = Glob::new(glob).map_err(|e| WatchdogError::Config {
            key: format!("watchdog.sla_rule[{index}].tool"),
            message: format!("glob {}: {e}", shown(glob)),
        })?;
        Ok(Self { sla, matcher })
    }

    /// The glob as written.
    pub fn glob(&self) -> &str {
        self.matcher.as_str()
    }

    /// True when `tool` matches the rule's glob.
    pub fn matches(&self, tool: &str) -> bool {
        self.matcher.is_match(tool)
    }
}

/// The SLA policy (docs/design.md, Interfaces: SLA and staleness). See [`SlaPolicy::resolve`].
#[derive(Clone, Debug)]
pub struct SlaPolicy {
    /// SLA when no override and no rule applies.
    pub default_sla: Duration,
    /// Rules by tool-name glob, first match wins.
    pub rules: Vec<SlaRule>,
    /// Globs of the rendering / I/O class, as written.
    pub class_globs: Vec<String>,
    /// Hard cap of that class.
    pub class_cap: Duration,
    /// Floor of per-span overrides.
    pub min_sla: Duration,
    /// Ceiling of every SLA.
    pub max_sla: Duration,
    class_set: GlobSet,
}

impl SlaPolicy {
    /// Builds a policy; errors name `watchdog.class_tools[i]` for a bad class glob.
    pub fn new(
        default_sla: Duration,
        rules: Vec<SlaRule>,
        class_globs: Vec<String>,
        class_cap: Duration,
        min_sla: Duration,
        max_sla: Duration,
    ) -> Result<Self, WatchdogError> {
        let class_set = glob_set("watchdog.class_tools", &class_globs)?;
        if min_sla > max_sla {
            return Err(WatchdogError::Config {
                key: "watchdog.min_sla_ms".into(),
                message: format!(
                    "min_sla_ms ({} ms) is above max_sla_ms ({} ms)",
                    min_sla.as_millis(),
                    max_sla.as_millis()
                ),
            });
        }
        // Every SLA is capped at max_sla_ms: a default above it would be silently cut.
        if default_sla > max_sla {
            return Err(WatchdogError::Config {
                key: "watchdog.default_sla_ms".into(),
                message: format!(
                    "default_sla_ms ({} ms) is above max_sla_ms ({} ms), which caps every SLA",
                    default_sla.as_millis(),
                    max_sla.as_millis()
                ),
            });
        }
        Ok(Self {
            default_sla,
            rules,
            class_globs,
            class_cap,
            min_sla,
            max_sla,
            class_set,
        })
    }

    /// True when `tool` belongs to the capped rendering / I/O class.
    pub fn in_capped_class(&self, tool: &str) -> bool {
        self.class_set.is_match(tool)
    }
}

impl Default for SlaPolicy {
    fn default() -> Self {
        let class_globs: Vec<String> = DEFAULT_CLASS_GLOBS.iter().map(|s| s.to_string()).collect();
        // The defaults are constants known to be valid globs; fall back to an empty set
        // rather than panic if that ever changes.
        let class_set =
            glob_set("watchdog.class_tools", &class_globs).unwrap_or_else(|_| GlobSet::empty());
        Self {
            default_sla: DEFAULT_SLA,
            rules: Vec::new(),
            class_globs,
            class_cap: DEFAULT_CLASS_CAP,
            min_sla: DEFAULT_MIN_SLA,
            max_sla: DEFAULT_MAX_SLA,
            class_set,
        }
    }
}

/// A glob quoted for an error message: at most its first 64 characters.
fn shown(glob: &str) -> String {
    match glob.char_indices().nth(64) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &glob[..cut], glob.len()),
        None => format!("{glob:?}"),
    }
}

fn glob_set(key: &str, globs: &[String]) -> Result<GlobSet, WatchdogError> {
    globs
        .iter()
        .enumerate()
        .map(|(i, g)| {
            Glob::new(g).map_err(|e| WatchdogError::Config {
                key: format!("{key}[{i}]"),
                message: format!("glob {}: {e}", shown(g)),
            })
        })
        .collect()
}

/// The validated watchdog configuration.
#[derive(Clone, Debug)]
pub struct WatchdogConfig {
    /// Ping interval ([`DEFAULT_HEARTBEAT_INTERVAL`]).
    pub heartbeat_interval: Duration,
    /// No PONG for this long since the last one means the heartbeat is lost; also the
    /// timeout of each ping and of the HALF_OPEN probe ([`DEFAULT_HEARTBEAT_TIMEOUT`]).
    pub heartbeat_timeout: Duration,
    /// Grace after (re-)registration before the first PONG is due ([`DEFAULT_STARTUP_GRACE`]).
    pub startup_grace: Duration,
    /// Staleness limit of refreshed open spans ([`DEFAULT_STALENESS`]).
    pub staleness: Duration,
    /// Time in OPEN before HALF_OPEN ([`DEFAULT_BREAKER_COOLDOWN`]).
    pub breaker_cooldown: Duration,
    /// Cap of the lost-heartbeat *suspect* period ([`DEFAULT_SUSPECT_CAP`]).
    pub suspect_cap: Duration,
    /// The SLA policy.
    pub sla: SlaPolicy,
    /// Compiled extra span-name globs that make a span a tool span.
    pub tool_name_patterns: Vec<String>,
    /// Longest delay before a change is evaluated ([`DEFAULT_TICK`]); thresholds are met
    /// by exact wake-ups.
    pub tick: Duration,
    /// Board republish period when nothing changed ([`DEFAULT_BOARD_INTERVAL`]).
    pub board_interval: Duration,
    /// Limit for a *stopping* runner to exit ([`DEFAULT_STOPPING_TIMEOUT`]).
    pub stopping_timeout: Duration,
    /// Back-dating window of a span's own start time ([`DEFAULT_MAX_BACKDATE`]).
    pub max_backdate: Duration,
    /// Most entries (open and inferred spans) the open-span ledger holds
    /// ([`DEFAULT_MAX_OPEN_SPANS`]). Spans that would open an entry beyond it are not
    /// tracked; the last quarter of it is kept for spans of registered runners
    /// ([`crate::ledger::Ledger::has_room`]).
    pub max_open_spans: usize,
    tool_set: GlobSet,
}

impl WatchdogConfig {
    /// Sets the tool-name patterns; errors name `watchdog.tool_name_patterns[i]`.
    pub fn with_tool_name_patterns(mut self, patterns: Vec<String>) -> Result<Self, WatchdogError> {
        self.tool_set = glob_set("watchdog.tool_name_patterns", &patterns)?;
        self.tool_name_patterns = patterns;
        Ok(self)
    }

    /// True when a span named `name` matches a configured tool-name pattern.
    pub fn name_is_tool(&self, name: &str) -> bool {
        !self.tool_name_patterns.is_empty() && self.tool_set.is_match(name)
    }

    fn validate(&self) -> Result<(), WatchdogError> {
        let positive = [
            ("watchdog.heartbeat_interval_ms", self.heartbeat_interval),
            ("watchdog.heartbeat_timeout_ms", self.heartbeat_timeout),
            ("watchdog.tick_ms", self.tick),
            ("watchdog.default_sla_ms", self.sla.default_sla),
            // a zero floor let a span's `stallwatch.sla_ms = 0` trip its runner at once
            ("watchdog.min_sla_ms", self.sla.min_sla),
            ("watchdog.board_interval_ms", self.board_interval),
            ("watchdog.stopping_timeout_ms", self.stopping_timeout),
            // zero sent a tripped runner through HALF_OPEN and back to OPEN (two incidents
            // and their webhooks) as fast as the probe failed: thousands a second
            ("watchdog.breaker_cooldown_ms", self.breaker_cooldown),
        ];
        for (key, d) in positive {
            if d.is_zero() {
                return Err(WatchdogError::Config {
                    key: key.into(),
                    message: "must be greater than 0".into(),
                });
            }
        }
        // "Lost" means no PONG for the timeout since the last one; with pings further apart
        // than the timeout, a healthy runner would be declared lost between two pings.
        if self.heartbeat_timeout <= self.heartbeat_interval {
            return Err(WatchdogError::Config {
                key: "watchdog.heartbeat_timeout_ms".into(),
                message: format!(
                    "must be greater than heartbeat_interval_ms ({} ms), or a healthy runner is lost between pings",
                    self.heartbeat_interval.as_millis()
                ),
            });
        }
        if self.max_open_spans < MIN_MAX_OPEN_SPANS {
            return Err(WatchdogError::Config {
                key: "watchdog.max_open_spans".into(),
                message: format!(
                    "must be at least {MIN_MAX_OPEN_SPANS}, got {}",
                    self.max_open_spans
                ),
            });
        }
        for (i, r) in self.sla.rules.iter().enumerate() {
            if r.sla.is_zero() {
                return Err(WatchdogError::Config {
                    key: format!("watchdog.sla_rule[{i}].sla_ms"),
                    message: format!("rule {:?} has an SLA of 0 ms", r.glob()),
                });
            }
        }
        Ok(())
    }
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            startup_grace: DEFAULT_STARTUP_GRACE,
            staleness: DEFAULT_STALENESS,
            breaker_cooldown: DEFAULT_BREAKER_COOLDOWN,
            suspect_cap: DEFAULT_SUSPECT_CAP,
            sla: SlaPolicy::default(),
            tool_name_patterns: Vec::new(),
            tick: DEFAULT_TICK,
            board_interval: DEFAULT_BOARD_INTERVAL,
            stopping_timeout: DEFAULT_STOPPING_TIMEOUT,
            max_backdate: DEFAULT_MAX_BACKDATE,
            max_open_spans: DEFAULT_MAX_OPEN_SPANS,
            tool_set: GlobSet::empty(),
        }
    }
}

fn ms(v: Option<u64>, default: Duration) -> Duration {
    v.map(Duration::from_millis).unwrap_or(default)
}

impl TryFrom<RawWatchdogConfig> for WatchdogConfig {
    type Error = WatchdogError;

    /// Validates the raw section. Errors: [`WatchdogError::Config`] naming the key (and the
    /// rule index for `sla_rule`), e.g. `invalid watchdog.sla_rule[1].tool: glob "[x": unclosed character class ...`.
    fn try_from(raw: RawWatchdogConfig) -> Result<Self, Self::Error> {
        let mut rules = Vec::with_capacity(raw.sla_rules.len());
        for (i, r) in raw.sla_rules.iter().enumerate() {
            rules.push(SlaRule::new(i, &r.tool, Duration::from_millis(r.sla_ms))?);
        }
        let class_globs = raw
            .class_tools
            .unwrap_or_else(|| DEFAULT_CLASS_GLOBS.iter().map(|s| s.to_string()).collect());
        let sla = SlaPolicy::new(
            ms(raw.default_sla_ms, DEFAULT_SLA),
            rules,
            class_globs,
            ms(raw.class_cap_ms, DEFAULT_CLASS_CAP),
            ms(raw.min_sla_ms, DEFAULT_MIN_SLA),
            ms(raw.max_sla_ms, DEFAULT_MAX_SLA),
        )?;
        let cfg = WatchdogConfig {
            heartbeat_interval: ms(raw.heartbeat_interval_ms, DEFAULT_HEARTBEAT_INTERVAL),
            heartbeat_timeout: ms(raw.heartbeat_timeout_ms, DEFAULT_HEARTBEAT_TIMEOUT),
            startup_grace: ms(raw.startup_grace_ms, DEFAULT_STARTUP_GRACE),
            staleness: ms(raw.staleness_ms, DEFAULT_STALENESS),
            breaker_cooldown: ms(raw.breaker_cooldown_ms, DEFAULT_BREAKER_COOLDOWN),
            suspect_cap: ms(raw.suspect_cap_ms, DEFAULT_SUSPECT_CAP),
            sla,
            tool_name_patterns: Vec::new(),
            tick: ms(raw.tick_ms, DEFAULT_TICK),
            board_interval: ms(raw.board_interval_ms, DEFAULT_BOARD_INTERVAL),
            stopping_timeout: ms(raw.stopping_timeout_ms, DEFAULT_STOPPING_TIMEOUT),
            max_backdate: ms(raw.max_backdate_ms, DEFAULT_MAX_BACKDATE),
            // a value past usize (32-bit targets) is as good as unbounded: clamp it
            max_open_spans: raw.max_open_spans.map_or(DEFAULT_MAX_OPEN_SPANS, |v| {
                usize::try_from(v).unwrap_or(usize::MAX)
            }),
            tool_set: GlobSet::empty(),
        }
        .with_tool_name_patterns(raw.tool_name_patterns)?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<WatchdogConfig, String> {
        let raw: RawWatchdogConfig = toml::from_str(s).map_err(|e| e.to_string())?;
        WatchdogConfig::try_from(raw).map_err(|e| e.to_string())
    }

    #[test]
    fn toml_section_with_units_in_names() {
        let c = parse(
            r#"
            heartbeat_interval_ms = 500
            heartbeat_timeout_ms = 1500
            default_sla_ms = 20000
            tool_name_patterns = ["tool.*"]
            [[sla_rule]]
            tool = "train_*"
            sla_ms = 600000
            "#,
        )
        .unwrap();
        assert_eq!(c.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(c.heartbeat_timeout, Duration::from_millis(1500));
        assert_eq!(c.startup_grace, DEFAULT_STARTUP_GRACE);
        assert_eq!(c.sla.resolve("train_big", None).0, Duration::from_secs(600));
        assert!(c.name_is_tool("tool.run"));
        assert!(!c.name_is_tool("http get"));
    }

    #[test]
    fn errors_name_the_rule_and_the_key() {
        let e = parse(
            "[[sla_rule]]\ntool = \"ok*\"\nsla_ms = 5\n[[sla_rule]]\ntool = \"[bad\"\nsla_ms = 5\n",
        )
        .unwrap_err();
        assert!(e.contains("watchdog.sla_rule[1].tool"), "{e}");
        let e = parse("[[sla_rule]]\ntool = \"x\"\nsla_ms = 0\n").unwrap_err();
        assert!(e.contains("watchdog.sla_rule[0].sla_ms"), "{e}");
        let e = parse("heartbeat_timeout_ms = 0").unwrap_err();
        assert!(e.contains("watchdog.heartbeat_timeout_ms"), "{e}");
        let e = parse("breaker_cooldown_ms = 0").unwrap_err();
        assert!(e.contains("watchdog.breaker_cooldown_ms"), "{e}");
        assert!(parse("breaker_cooldown_ms = 1").is_ok());
        let e = parse("heartbeat_interval_ms = 5000\nheartbeat_timeout_ms = 300").unwrap_err();
        assert!(
            e.contains("watchdog.heartbeat_timeout_ms") && e.contains("5000"),
            "{e}"
        );
        let e = parse("min_sla_ms = 5000\nmax_sla_ms = 10").unwrap_err();
        assert!(e.contains("watchdog.min_sla_ms"), "{e}");
        let e = parse("min_sla_ms = 0").unwrap_err();
        assert!(e.contains("watchdog.min_sla_ms"), "{e}");
        let e = parse("default_sla_ms = 999999999999").unwrap_err();
        assert!(
            e.contains("watchdog.default_sla_ms") && e.contains("max_sla_ms"),
            "{e}"
        );
        assert!(parse("default_sla_ms = 7200000\nmax_sla_ms = 7200000").is_ok());
        let e = parse("class_tools = [\"{a\"]").unwrap_err();
        assert!(e.contains("watchdog.class_tools[0]"), "{e}");
        assert!(!e.contains("invalid glob"), "{e}");
        // a long glob is quoted by its start only
        let e = parse(&format!("class_tools = [\"{}\"]", "a".repeat(5000))).unwrap_err();
        assert!(e.contains("over the limit of 4096") && e.len() < 300, "{e}");
        assert!(e.contains("(5000 bytes)"), "{e}");
        // the open-span bound: a tiny one is refused by name, the default and a large one pass
        let e = parse("max_open_spans = 3").unwrap_err();
        assert!(
            e.contains("watchdog.max_open_spans") && e.contains("at least 16"),
            "{e}"
        );
        assert_eq!(parse("").unwrap().max_open_spans, DEFAULT_MAX_OPEN_SPANS);
        assert_eq!(
            parse("max_open_spans = 16").unwrap().max_open_spans,
            MIN_MAX_OPEN_SPANS
        );
        assert_eq!(
            parse("max_open_spans = 1000000").unwrap().max_open_spans,
            1_000_000
        );
        let e = parse("heartbeat_timeout = 5").unwrap_err();
        assert!(
            e.contains("unknown field") && e.contains("heartbeat_timeout"),
            "{e}"
        );
        let e = parse("[[sla_rule]]\ntool = \"x\"\nsla = 5\n").unwrap_err();
        assert!(e.contains("unknown field") && e.contains("sla"), "{e}");
    }
}
