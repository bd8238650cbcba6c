//! The `RUST_LOG` filter of `stallwatch serve` (docs/design.md, Interfaces: CLI).
//!
//! `RUST_LOG` takes `tracing-subscriber`'s `EnvFilter` directives, separated by commas
//! (`info`, `stallwatch_storage=debug`, `h2=warn,debug`). Two things are added to reading
//! it as `EnvFilter::try_from_default_env` does:
//!
//! - Release and dist builds compile out events above `debug` (`release_max_level_debug`,
//!   issue 16). A directive asking for more (`trace`, or a bare target name, which means
//!   every level of it) is capped at the compiled-in level, which is what it gets anyway;
//!   left as written, `EnvFilter` printed a multi-line, coloured warning straight to stderr,
//!   outside the configured log format (a JSON log got non-JSON lines).
//! - A `RUST_LOG` that does not parse is reported as a log event naming the error, and the
//!   default filter (`info`) is used; it was replaced by `info` silently.

use std::str::FromStr;

use tracing_subscriber::filter::{Directive, EnvFilter, LevelFilter, ParseError};

/// The filter when `RUST_LOG` is unset or invalid.
pub const DEFAULT_FILTER: &str = "info";

/// Why `RUST_LOG` was not used: the value and what is wrong with it.
#[derive(Debug)]
pub struct InvalidFilter {
    /// `RUST_LOG` as set (lossily decoded when it is not UTF-8).
    pub value: String,
    /// The parse error, in `tracing-subscriber`'s words.
    pub error: String,
}

/// The filter from `rust_log` (the value of `RUST_LOG`, `None` when unset), with every
/// directive's level capped at `max` (in builds, `tracing`'s `STATIC_MAX_LEVEL`).
///
/// Errors: [`InvalidFilter`] when a directive does not parse (or the value is not UTF-8);
/// the caller then uses [`DEFAULT_FILTER`] and logs the error.
pub fn env_filter(
    rust_log: Option<std::ffi::OsString>,
    max: LevelFilter,
) -> Result<EnvFilter, InvalidFilter> {
    let Some(raw) = rust_log else {
        return Ok(EnvFilter::new(DEFAULT_FILTER));
    };
    let value = raw.to_str().ok_or_else(|| InvalidFilter {
        value: raw.to_string_lossy().into_owned(),
        error: "not valid UTF-8".into(),
    })?;
    let invalid = |e: ParseError| InvalidFilter {
        value: value.to_string(),
        error: e.to_string(),
    };
    let capped = cap_directives(value, max).map_err(invalid)?;
    EnvFilter::builder().parse(capped).map_err(invalid)
}

/// `spec` (comma-separated `EnvFilter` directives) rewritten with each directive's level
/// capped at `max`; empty directives are dropped, as `EnvFilter` drops them.
///
/// Errors: the first directive that does not parse.
pub fn cap_directives(spec: &str, max: LevelFilter) -> Result<String, ParseError> {
    let mut out = Vec::new();
    for d in spec.split(',').filter(|s| !s.trim().is_empty()) {
        // A directive's text form ends in its level: `[target][[span]{fields}]=level`, or
        // `level` alone (tracing-subscriber's `Display for Directive`).
        let text = Directive::from_str(d.trim())?.to_string();
        let (head, level) = match text.rsplit_once('=') {
            Some((head, level)) => (Some(head), level),
            None => (None, text.as_str()),
        };
        let capped = match LevelFilter::from_str(level) {
            Ok(l) if l > max => max.to_string(),
            _ => level.to_string(),
        };
        out.push(match head {
            Some(head) => format!("{head}={capped}"),
            None => capped,
        });
    }
    Ok(out.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_above_the_compiled_in_one_are_capped() {
        let cap = |s: &str| cap_directives(s, LevelFilter::DEBUG).unwrap();
        assert_eq!(cap("trace"), "debug");
        assert_eq!(cap("TRACE"), "debug");
        // a bare target means every level of it
        assert_eq!(cap("stallwatch_storage"), "stallwatch_storage=debug");
        assert_eq!(cap("info,h2=trace"), "info,h2=debug");
        assert_eq!(cap("h2[conn]=trace"), "h2[conn]=debug");
        // at or below the cap: unchanged
        assert_eq!(cap("debug"), "debug");
        assert_eq!(
            cap("warn,stallwatch_collector=debug"),
            "warn,stallwatch_collector=debug"
        );
        assert_eq!(cap("off"), "off");
        assert_eq!(cap(" info , ,h2=warn,"), "info,h2=warn");
        assert_eq!(cap(""), "");
        // where every level is compiled in (debug builds), nothing changes
        assert_eq!(
            cap_directives("trace", LevelFilter::TRACE).unwrap(),
            "trace"
        );
    }

    #[test]
    fn an_invalid_filter_is_an_error_naming_the_value() {
        assert!(cap_directives("debug,foo[", LevelFilter::DEBUG).is_err());
        let e = env_filter(Some("debug,foo[".into()), LevelFilter::DEBUG).unwrap_err();
        assert_eq!(e.value, "debug,foo[");
        assert!(!e.error.is_empty());
        assert!(env_filter(Some("info,h2=trace".into()), LevelFilter::DEBUG).is_ok());
        assert!(env_filter(None, LevelFilter::DEBUG).is_ok());
    }

    #[test]
    fn the_capped_filter_enables_what_was_asked_for_up_to_the_cap() {
        let f = env_filter(
            Some("warn,stallwatch_storage=trace".into()),
            LevelFilter::DEBUG,
        )
        .unwrap();
        assert_eq!(f.max_level_hint(), Some(LevelFilter::DEBUG));
        let f = env_filter(Some("warn".into()), LevelFilter::DEBUG).unwrap();
        assert_eq!(f.max_level_hint(), Some(LevelFilter::WARN));
    }
}
