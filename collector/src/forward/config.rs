//! `[forward]`: where and how to send every accepted span, log record and metric point
//! upstream over OTLP (docs/design.md, Beyond one machine).
//!
//! [`RawForwardConfig`] is the TOML table as written (`deny_unknown_fields`, units in the
//! key names); [`ForwardConfig`] is the validated form (`TryFrom`, errors name the key).
//! The section is optional; when present, `endpoint` is required.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::error::ForwardError;

/// Default `protocol`: OTLP/HTTP with protobuf bodies.
pub const DEFAULT_PROTOCOL: Protocol = Protocol::HttpProtobuf;
/// Default `batch_max_spans`: spans (and log records, metric points) per upstream request.
pub const DEFAULT_BATCH_MAX_SPANS: usize = 4096;
/// Default `max_queue_bytes`: un-forwarded stored payload kept before the oldest is dropped
/// (256 MiB).
pub const DEFAULT_MAX_QUEUE_BYTES: u64 = 256 * 1024 * 1024;
/// Default `retry_initial_ms`: first back-off after a retryable failure.
pub const DEFAULT_RETRY_INITIAL_MS: u64 = 1_000;
/// Default `retry_max_ms`: largest back-off (also caps a server's `Retry-After`/RetryInfo).
pub const DEFAULT_RETRY_MAX_MS: u64 = 60_000;
/// Default `timeout_ms`: one upstream request, connect included.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Default `poll_interval_ms`: how often to look for new rows when the queue is empty.
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 200;
/// How often the backlog is measured and the queue cap enforced, ms.
pub const BACKLOG_CHECK_MS: u64 = 1_000;

/// The wire protocol to the upstream (OTLP exporter spec `OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `grpc`: OTLP/gRPC to `endpoint` (e.g. `http://collector:4317`).
    Grpc,
    /// `http/protobuf`: POST to `endpoint` + `/v1/traces`, `/v1/logs`, `/v1/metrics`.
    HttpProtobuf,
}

/// Request body compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// `none`.
    None,
    /// `gzip` (`Content-Encoding: gzip` / `grpc-encoding: gzip`).
    Gzip,
}

/// `[forward]` as written in the TOML file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawForwardConfig {
    /// Upstream base URL, `http://host:port` (required).
    pub endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (default [`DEFAULT_PROTOCOL`]).
    pub protocol: Option<String>,
    /// Extra headers (gRPC metadata) on every request, e.g. an API key.
    pub headers: Option<BTreeMap<String, String>>,
    /// `gzip` or `none` (default `none`).
    pub compression: Option<String>,
    /// Items per request (default [`DEFAULT_BATCH_MAX_SPANS`]).
    pub batch_max_spans: Option<usize>,
    /// Backlog cap, bytes (default [`DEFAULT_MAX_QUEUE_BYTES`]).
    pub max_queue_bytes: Option<u64>,
    /// First back-off, ms (default [`DEFAULT_RETRY_INITIAL_MS`]).
    pub retry_initial_ms: Option<u64>,
    /// Largest back-off, ms (default [`DEFAULT_RETRY_MAX_MS`]).
    pub retry_max_ms: Option<u64>,
    /// Per-request timeout, ms (default [`DEFAULT_TIMEOUT_MS`]).
    pub timeout_ms: Option<u64>,
    /// Idle poll interval, ms (default [`DEFAULT_POLL_INTERVAL_MS`]).
    pub poll_interval_ms: Option<u64>,
}

/// The validated `[forward]` section.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardConfig {
    /// Upstream base URL without a trailing `/`.
    pub endpoint: String,
    /// Wire protocol.
    pub protocol: Protocol,
    /// Headers, names lowercased (valid HTTP header names and gRPC metadata keys).
    pub headers: Vec<(String, String)>,
    /// Body compression.
    pub compression: Compression,
    /// Spans (or log records, or metric points) per request, at least 1.
    pub batch_max_spans: usize,
    /// Backlog cap over all signals, bytes of stored payload.
    pub max_queue_bytes: u64,
    /// First back-off.
    pub retry_initial: Duration,
    /// Largest back-off.
    pub retry_max: Duration,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Idle poll interval.
    pub poll_interval: Duration,
}

fn bad(key: &'static str, message: impl Into<String>) -> ForwardError {
    ForwardError::Config {
        key,
        message: message.into(),
    }
}

fn ms(key: &'static str, v: Option<u64>, default: u64) -> Result<Duration, ForwardError> {
    match v.unwrap_or(default) {
        0 => Err(bad(key, "must be at least 1")),
        n => Ok(Duration::from_millis(n)),
    }
}

impl TryFrom<RawForwardConfig> for ForwardConfig {
    type Error = ForwardError;

    /// Errors: [`ForwardError::Config`] naming the key: `endpoint` missing or not
    /// `http://host[:port][/path]` (TLS is not built in), an unknown `protocol` or
    /// `compression`, a header that is not a valid HTTP header / gRPC metadata entry, a zero
    /// size or duration, `retry_max_ms` below `retry_initial_ms`.
    fn try_from(raw: RawForwardConfig) -> Result<Self, Self::Error> {
        let endpoint = raw
            .endpoint
            .ok_or_else(|| bad("endpoint", "required (e.g. \"http://127.0.0.1:4318\")"))?;
        let endpoint = endpoint.trim().trim_end_matches('/').to_string();
        let rest = endpoint
            .strip_prefix("http://")
            .ok_or_else(|| bad("endpoint", format!("{endpoint:?} must start with http://")))?;
        if rest.is_empty() || rest.starts_with('/') {
            return Err(bad("endpoint", format!("{endpoint:?} has no host")));
        }
        if http::Uri::try_from(endpoint.as_str()).is_err() {
            return Err(bad("endpoint", format!("{endpoint:?} is not a valid URL")));
        }
        let protocol = match raw.protocol.as_deref().map(str::trim) {
            None => DEFAULT_PROTOCOL,
            Some("grpc") => Protocol::Grpc,
            Some("http/protobuf") => Protocol::HttpProtobuf,
            Some(other) => {
                return Err(bad(
                    "protocol",
                    format!("{other:?}: expected \"grpc\" or \"http/protobuf\""),
                ))
            }
        };
        let compression = match raw.compression.as_deref().map(str::trim) {
            None | Some("none") => Compression::None,
            Some("gzip") => Compression::Gzip,
            Some(other) => {
                return Err(bad(
                    "compression",
                    format!("{other:?}: expected \"gzip\" or \"none\""),
                ))
            }
        };
        let mut headers = Vec::new();
        for (k, v) in raw.headers.unwrap_or_default() {
            let k = k.trim().to_ascii_lowercase();
            if http::HeaderName::try_from(k.as_str()).is_err()
                || k.ends_with("-bin")
                || k.starts_with("grpc-")
            {
                return Err(bad("headers", format!("{k:?} is not a usable header name")));
            }
            if http::HeaderValue::try_from(v.as_str()).is_err() {
                return Err(bad(
                    "headers",
                    format!("the value of {k:?} is not a valid header value"),
                ));
            }
            headers.push((k, v));
        }
        let batch_max_spans = raw.batch_max_spans.unwrap_or(DEFAULT_BATCH_MAX_SPANS);
        if batch_max_spans == 0 {
            return Err(bad("batch_max_spans", "must be at least 1"));
        }
        let max_queue_bytes = raw.max_queue_bytes.unwrap_or(DEFAULT_MAX_QUEUE_BYTES);
        if max_queue_bytes == 0 {
            return Err(bad("max_queue_bytes", "must be at least 1"));
        }
        let retry_initial = ms(
            "retry_initial_ms",
            raw.retry_initial_ms,
            DEFAULT_RETRY_INITIAL_MS,
        )?;
        let retry_max = ms("retry_max_ms", raw.retry_max_ms, DEFAULT_RETRY_MAX_MS)?;
        if retry_max < retry_initial {
            return Err(bad("retry_max_ms", "must be at least retry_initial_ms"));
        }
        Ok(ForwardConfig {
            endpoint,
            protocol,
            headers,
            compression,
            batch_max_spans,
            max_queue_bytes,
            retry_initial,
            retry_max,
            timeout: ms("timeout_ms", raw.timeout_ms, DEFAULT_TIMEOUT_MS)?,
            poll_interval: ms(
                "poll_interval_ms",
                raw.poll_interval_ms,
                DEFAULT_POLL_INTERVAL_MS,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(toml_text: &str) -> Result<ForwardConfig, String> {
        let raw: RawForwardConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        ForwardConfig::try_from(raw).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_errors_name_the_key() {
        let c = parse("endpoint = \"http://127.0.0.1:4318/\"").unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:4318");
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        assert_eq!(c.batch_max_spans, DEFAULT_BATCH_MAX_SPANS);
        assert_eq!(c.poll_interval, Duration::from_millis(200));
        let c = parse(
            "endpoint = \"http://h:4317\"\nprotocol = \"grpc\"\ncompression = \"gzip\"\n[headers]\nX-Api-Key = \"k\"",
        )
        .unwrap();
        assert_eq!(c.protocol, Protocol::Grpc);
        assert_eq!(c.compression, Compression::Gzip);
        assert_eq!(c.headers, vec![("x-api-key".into(), "k".into())]);
        for (text, key) in [
            ("protocol = \"grpc\"", "endpoint"),
            ("endpoint = \"https://h\"", "endpoint"),
            ("endpoint = \"http://h\"\nprotocol = \"thrift\"", "protocol"),
            (
                "endpoint = \"http://h\"\ncompression = \"zstd\"",
                "compression",
            ),
            (
                "endpoint = \"http://h\"\nbatch_max_spans = 0",
                "batch_max_spans",
            ),
            (
                "endpoint = \"http://h\"\nretry_initial_ms = 5000\nretry_max_ms = 10",
                "retry_max_ms",
            ),
            (
                "endpoint = \"http://h\"\n[headers]\n\"bad key\" = \"v\"",
                "headers",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(&format!("[forward] {key}:")), "{text} → {e}");
        }
        let e = parse("endpoint = \"http://h\"\nendpont = 1").unwrap_err();
        assert!(e.contains("endpont"), "{e}");
    }
}
