//! The `RUST_LOG` filter of `stallwatch serve` (docs/design.md, Interfaces: CLI).
//!
//! `RUST_LOG` takes comma-separated directives, each `target=level`, a bare `level` (the
//! default for every other target) or a bare `target` (every level of it), as `env_logger`
//! and `tracing-subscriber`'s `Targets` read them: `info`, `stallwatch_storage=debug`,
//! `h2=warn,debug`. A target covers every target that starts with it (`stallwatch` covers
//! `stallwatch_storage::db`), and the longest matching one decides.
//!
//! `EnvFilter`'s span and field directives (`target[span{field=value}]=level`) are not
//! taken: `EnvFilter` needs a regex engine (with `globset`'s, ~0.7 MB of a binary held to
//! 12 MB, issue 16), and stallwatch's events are filtered by target and level only. Such a
//! directive is refused as invalid, naming the reason.
//!
//! Two things are added to reading the value as it is:
//!
//! - Release and dist builds compile out events above `debug` (`release_max_level_debug`,
//!   issue 16). A directive asking for more (`trace`, or a bare target name, which means
//!   every level of it) is capped at the compiled-in level, which is what it gets anyway.
//! - A `RUST_LOG` that does not parse is reported as a log event naming the error, and the
//!   default filter (`info`) is used.

use std::str::FromStr;

use tracing_subscriber::filter::{LevelFilter, Targets};

/// The level of every target when `RUST_LOG` is unset or invalid.
pub const DEFAULT_LEVEL: LevelFilter = LevelFilter::INFO;

/// Why `RUST_LOG` was not used: the value and what is wrong with it.
#[derive(Debug)]
pub struct InvalidFilter {
    /// `RUST_LOG` as set (lossily decoded when it is not UTF-8).
    pub value: String,
    /// What is wrong, naming the directive.
    pub error: String,
}

/// The default filter: [`DEFAULT_LEVEL`] for every target.
pub fn default_filter() -> Targets {
    Targets::new().with_default(DEFAULT_LEVEL)
}

/// The filter from `rust_log` (the value of `RUST_LOG`, `None` when unset), with every
/// directive's level capped at `max` (in builds, `tracing`'s `STATIC_MAX_LEVEL`).
///
/// Errors: [`InvalidFilter`] when a directive does not parse (or the value is not UTF-8);
/// the caller then uses [`default_filter`] and logs the error.
pub fn env_filter(
    rust_log: Option<std::ffi::OsString>,
    max: LevelFilter,
) -> Result<Targets, InvalidFilter> {
    let Some(raw) = rust_log else {
        return Ok(default_filter());
    };
    let value = raw.to_str().ok_or_else(|| InvalidFilter {
        value: raw.to_string_lossy().into_owned(),
        error: "not valid UTF-8".into(),
    })?;
    capped_targets(value, max).map_err(|error| InvalidFilter {
        value: value.to_string(),
        error,
    })
}

/// `spec` (comma-separated directives) as a filter with each directive's level capped at
/// `max`; empty directives are dropped. A value of only empty directives (`RUST_LOG=`)
/// counts as unset: [`default_filter`].
///
/// Errors: the first directive that does not parse, quoted, with the reason.
pub fn capped_targets(spec: &str, max: LevelFilter) -> Result<Targets, String> {
    let mut out = Targets::new();
    let mut any = false;
    for d in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        any = true;
        let bad = |why: &str| format!("directive {d:?}: {why}");
        if d.contains(['[', ']', '{', '}']) {
            return Err(bad(
                "span and field filters are not supported; use target=level",
            ));
        }
        let (target, level) = match d.split_once('=') {
            Some((t, l)) => {
                // (`tracing` reads an empty level as `error`: refused instead, a typo)
                let l = Some(l.trim())
                    .filter(|l| !l.is_empty())
                    .and_then(|l| LevelFilter::from_str(l).ok())
                    .ok_or_else(|| {
                        bad("the level must be one of off, error, warn, info, debug, trace (or 0 to 5)")
                    })?;
                (Some(t.trim()), l)
            }
            // A bare level, else a bare target (every level of it).
            None => match LevelFilter::from_str(d) {
                Ok(l) => (None, l),
                Err(_) => (Some(d), LevelFilter::TRACE),
            },
        };
        let level = level.min(max);
        out = match target {
            Some(t) if t.is_empty() || t.contains(char::is_whitespace) => {
                return Err(bad("a target is a module path such as stallwatch_storage"))
            }
            Some(t) => out.with_target(t, level),
            None => out.with_default(level),
        };
    }
    if !any {
        return Ok(default_filter());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    fn capped(s: &str) -> Targets {
        capped_targets(s, LevelFilter::DEBUG).unwrap()
    }

    #[test]
    fn levels_above_the_compiled_in_one_are_capped() {
        let f = capped("trace");
        assert_eq!(f.default_level(), Some(LevelFilter::DEBUG));
        assert_eq!(capped("TRACE").default_level(), Some(LevelFilter::DEBUG));
        // a bare target means every level of it, capped
        let f = capped("stallwatch_storage");
        assert!(f.would_enable("stallwatch_storage::db", &Level::DEBUG));
        assert!(!f.would_enable("stallwatch_storage::db", &Level::TRACE));
        assert!(!f.would_enable("h2", &Level::ERROR));
        let f = capped(" info , ,h2=trace,");
        assert_eq!(f.default_level(), Some(LevelFilter::INFO));
        assert!(f.would_enable("h2::proto", &Level::DEBUG));
        assert!(!f.would_enable("h2::proto", &Level::TRACE));
        assert!(!f.would_enable("hyper", &Level::DEBUG));
        // at or below the cap: unchanged
        let f = capped("warn,stallwatch_collector=debug");
        assert!(f.would_enable("stallwatch_collector", &Level::DEBUG));
        assert!(f.would_enable("tokio", &Level::WARN));
        assert!(!f.would_enable("tokio", &Level::INFO));
        let f = capped("off");
        assert!(!f.would_enable("stallwatch", &Level::ERROR));
        // only empty directives: as if unset (info)
        for empty in ["", " , ", ",,,"] {
            let f = capped(empty);
            assert!(f.would_enable("stallwatch", &Level::INFO), "{empty:?}");
            assert!(!f.would_enable("stallwatch", &Level::DEBUG), "{empty:?}");
        }
        // where every level is compiled in (debug builds), nothing is capped
        let f = capped_targets("trace", LevelFilter::TRACE).unwrap();
        assert_eq!(f.default_level(), Some(LevelFilter::TRACE));
    }

    #[test]
    fn an_invalid_filter_is_an_error_naming_the_directive() {
        for (spec, names) in [
            ("debug,foo[", "foo["),
            ("h2[conn]=trace", "h2[conn]=trace"),
            ("info,h2={x}", "h2={x}"),
            ("h2=loud", "h2=loud"),
            ("=debug", "=debug"),
            ("a b=info", "a b=info"),
            ("a=b=c", "a=b=c"),
            ("stallwatch=", "stallwatch="),
        ] {
            let e = capped_targets(spec, LevelFilter::DEBUG).unwrap_err();
            assert!(e.contains(&format!("{names:?}")), "{spec}: {e}");
        }
        let e = capped_targets("h2[conn]=trace", LevelFilter::DEBUG).unwrap_err();
        assert!(
            e.contains("span and field filters are not supported"),
            "{e}"
        );
        let e = env_filter(Some("debug,foo[".into()), LevelFilter::DEBUG).unwrap_err();
        assert_eq!(e.value, "debug,foo[");
        assert!(env_filter(Some("info,h2=trace".into()), LevelFilter::DEBUG).is_ok());
        let f = env_filter(None, LevelFilter::DEBUG).unwrap();
        assert_eq!(f.default_level(), Some(LevelFilter::INFO));
    }

    #[cfg(unix)]
    #[test]
    fn a_value_that_is_not_utf8_is_refused() {
        use std::os::unix::ffi::OsStringExt;
        let e = env_filter(
            Some(std::ffi::OsString::from_vec(vec![0x66, 0xff])),
            LevelFilter::DEBUG,
        )
        .unwrap_err();
        assert_eq!(e.error, "not valid UTF-8");
    }
}
