//! `[forward]`: where and how to send every accepted span, log record and metric point
//! upstream over OTLP (docs/design.md, Beyond one machine).
//!
//! [`RawForwardConfig`] is the TOML table as written (`deny_unknown_fields`, units in the
//! key names); [`ForwardConfig`] is the validated form (`TryFrom`, errors name the key).
//! The section is optional; when present, `endpoint` is required.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use stallwatch_vocabulary::redact::redact_url;

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
    /// PEM file of CA certificates trusted for an `https://` upstream besides the built-in
    /// web PKI roots (`webpki-roots`).
    pub ca_file: Option<String>,
    /// Full URL for traces, used as is (default `endpoint` + `/v1/traces`; for `grpc`
    /// only its scheme, host and port count).
    pub traces_endpoint: Option<String>,
    /// Full URL for logs (default `endpoint` + `/v1/logs`).
    pub logs_endpoint: Option<String>,
    /// Full URL for metrics (default `endpoint` + `/v1/metrics`).
    pub metrics_endpoint: Option<String>,
    /// Keys [`RawForwardConfig::with_env`] filled, with the variable each came from, so an
    /// error in one names the variable the user set rather than a key they never wrote.
    #[serde(skip)]
    pub from_env: Vec<(&'static str, &'static str)>,
}

impl RawForwardConfig {
    /// Fills every key the section leaves unset from the standard OTLP exporter variables
    /// (OTLP exporter spec, "Configuration Options"), read through `var`:
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` → `endpoint`, `OTEL_EXPORTER_OTLP_{TRACES,LOGS,
    /// METRICS}_ENDPOINT` → `{traces,logs,metrics}_endpoint`, `OTEL_EXPORTER_OTLP_PROTOCOL`
    /// → `protocol`, `OTEL_EXPORTER_OTLP_HEADERS` (`k=v,k2=v2`, values percent-decoded) →
    /// `headers`, `OTEL_EXPORTER_OTLP_TIMEOUT` (ms) → `timeout_ms`,
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE` → `ca_file`. Forwarding itself is still turned on
    /// only by a `[forward]` section: stallwatch is often started with these variables
    /// pointing at itself. For the same reason an `endpoint` written in the section wins
    /// over the per-signal variables too: those are read only when `endpoint` is not in the
    /// file (a `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` meant for the user's own apps would
    /// otherwise send stallwatch's traces away from the upstream its config names).
    ///
    /// Errors: [`ForwardError::Config`] naming the variable when `OTEL_EXPORTER_OTLP_TIMEOUT`
    /// is not a number or `OTEL_EXPORTER_OTLP_HEADERS` has an entry without `=`.
    pub fn with_env(mut self, var: impl Fn(&str) -> Option<String>) -> Result<Self, ForwardError> {
        let get = |k: &str| {
            var(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let endpoint_in_file = self.endpoint.is_some();
        let mut from_env = std::mem::take(&mut self.from_env);
        let mut fill = |slot: &mut Option<String>, key: &'static str, name: &'static str| {
            if slot.is_none() {
                if let Some(v) = get(name) {
                    *slot = Some(v);
                    from_env.push((key, name));
                }
            }
        };
        fill(
            &mut self.endpoint,
            "endpoint",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        );
        if !endpoint_in_file {
            fill(
                &mut self.traces_endpoint,
                "traces_endpoint",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            );
            fill(
                &mut self.logs_endpoint,
                "logs_endpoint",
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            );
            fill(
                &mut self.metrics_endpoint,
                "metrics_endpoint",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            );
        }
        fill(
            &mut self.protocol,
            "protocol",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        );
        fill(
            &mut self.ca_file,
            "ca_file",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        );
        if self.timeout_ms.is_none() {
            if let Some(t) = get("OTEL_EXPORTER_OTLP_TIMEOUT") {
                from_env.push(("timeout_ms", "OTEL_EXPORTER_OTLP_TIMEOUT"));
                self.timeout_ms = Some(t.parse().map_err(|_| {
                    bad(
                        "timeout_ms",
                        format!("OTEL_EXPORTER_OTLP_TIMEOUT={t:?} is not a number of milliseconds"),
                    )
                })?);
            }
        }
        if self.headers.is_none() {
            if let Some(h) = get("OTEL_EXPORTER_OTLP_HEADERS") {
                let mut map = BTreeMap::new();
                for entry in h.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                    let (k, v) = entry.split_once('=').ok_or_else(|| {
                        bad(
                            "headers",
                            format!("OTEL_EXPORTER_OTLP_HEADERS entry {entry:?} has no '='"),
                        )
                    })?;
                    map.insert(percent_decode(k.trim()), percent_decode(v.trim()));
                }
                self.headers = Some(map);
                from_env.push(("headers", "OTEL_EXPORTER_OTLP_HEADERS"));
            }
        }
        self.from_env = from_env;
        Ok(self)
    }
}

/// Headers `[forward.headers]` may not set, because the forwarder sets them for each
/// request (the body's framing, type and coding, the connection's own headers, the host)
/// and a second value corrupts every export: a `content-length = "3"` cut each body to 3
/// bytes while the upstream still answered 200. Also refused: `grpc-*` and `*-bin`
/// (gRPC's own and binary metadata).
const RESERVED_HEADERS: [&str; 12] = [
    "accept-encoding",
    "connection",
    "content-encoding",
    "content-length",
    "content-type",
    "expect",
    "host",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
];

/// `%XX` escapes decoded (W3C Baggage value encoding, as the OTLP exporter spec asks for
/// `OTEL_EXPORTER_OTLP_HEADERS`); a malformed escape is kept as written.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(hex, 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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
    /// Extra trusted CA certificates (PEM) for `https://`.
    pub ca_file: Option<std::path::PathBuf>,
    /// Per-signal URLs (traces, logs, metrics), each `None` for `endpoint` + `/v1/<signal>`.
    pub signal_endpoints: [Option<String>; 3],
}

impl ForwardConfig {
    /// The URL `signal` is sent to: its own endpoint when set, else `endpoint` +
    /// `/v1/<signal>` (HTTP) or `endpoint` (gRPC).
    pub fn url(&self, signal: stallwatch_storage::forward::Signal) -> String {
        use stallwatch_storage::forward::Signal;
        let i = match signal {
            Signal::Traces => 0,
            Signal::Logs => 1,
            Signal::Metrics => 2,
        };
        match (&self.signal_endpoints[i], self.protocol) {
            (Some(u), _) => u.clone(),
            (None, Protocol::Grpc) => self.endpoint.clone(),
            (None, Protocol::HttpProtobuf) => format!("{}/v1/{}", self.endpoint, signal.as_str()),
        }
    }
}

/// Checks one upstream URL: `http://` or `https://` with a host.
fn check_url(key: &'static str, url: &str) -> Result<String, ForwardError> {
    let url = url.trim().trim_end_matches('/').to_string();
    let named = redact_url(&url);
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| {
            bad(
                key,
                format!("{named:?} must start with http:// or https://"),
            )
        })?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad(key, format!("{named:?} has no host")));
    }
    if http::Uri::try_from(url.as_str()).is_err() {
        return Err(bad(key, format!("{named:?} is not a valid URL")));
    }
    Ok(url)
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
    /// `http(s)://host[:port][/path]` (so are the per-signal endpoints), a `ca_file` that is
    /// not a file, an unknown `protocol` or
    /// `compression`, a header that is not a valid HTTP header / gRPC metadata entry, a zero
    /// size or duration, `retry_max_ms` below `retry_initial_ms`.
    fn try_from(raw: RawForwardConfig) -> Result<Self, Self::Error> {
        let from_env = raw.from_env.clone();
        checked(raw).map_err(|e| match e {
            ForwardError::Config { key, message } => {
                match from_env.iter().find(|(k, _)| *k == key) {
                    Some((_, var)) => ForwardError::Config {
                        key,
                        message: format!("{message} (from the variable {var}, not the file)"),
                    },
                    None => ForwardError::Config { key, message },
                }
            }
            e => e,
        })
    }
}

/// [`ForwardConfig::try_from`] without naming the variables.
fn checked(raw: RawForwardConfig) -> Result<ForwardConfig, ForwardError> {
    let endpoint = raw
        .endpoint
        .ok_or_else(|| bad("endpoint", "required (e.g. \"http://127.0.0.1:4318\")"))?;
    let endpoint = check_url("endpoint", &endpoint)?;
    let signal_endpoints = [
        ("traces_endpoint", raw.traces_endpoint),
        ("logs_endpoint", raw.logs_endpoint),
        ("metrics_endpoint", raw.metrics_endpoint),
    ]
    .map(|(key, v)| v.map(|u| check_url(key, &u)).transpose());
    let [t, l, m] = signal_endpoints;
    let signal_endpoints = [t?, l?, m?];
    let ca_file = match raw.ca_file {
        None => None,
        Some(f) => {
            let path = std::path::PathBuf::from(f.trim());
            if !path.is_file() {
                return Err(bad(
                    "ca_file",
                    format!("{} is not a readable file", path.display()),
                ));
            }
            Some(path)
        }
    };
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
        if RESERVED_HEADERS.contains(&k.as_str()) {
            return Err(bad(
                "headers",
                format!("{k:?} is set by the forwarder for each request and cannot be configured"),
            ));
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
        ca_file,
        signal_endpoints,
    })
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
            ("endpoint = \"ftp://h\"", "endpoint"),
            (
                "endpoint = \"https://h\"\ntraces_endpoint = \"h\"",
                "traces_endpoint",
            ),
            (
                "endpoint = \"https://h\"\nca_file = \"/no/such.pem\"",
                "ca_file",
            ),
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

    #[test]
    fn standard_variables_fill_only_what_the_section_leaves_unset() {
        let env = |k: &str| {
            Some(
                match k {
                    "OTEL_EXPORTER_OTLP_ENDPOINT" => "https://up.example:4318/",
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" => "https://t.example/custom/traces",
                    "OTEL_EXPORTER_OTLP_PROTOCOL" => "grpc",
                    "OTEL_EXPORTER_OTLP_HEADERS" => "api-key=a%20b, x-team = blue",
                    "OTEL_EXPORTER_OTLP_TIMEOUT" => "2500",
                    _ => return None,
                }
                .to_string(),
            )
        };
        let raw = RawForwardConfig::default().with_env(env).unwrap();
        let c = ForwardConfig::try_from(raw).unwrap();
        assert_eq!(c.endpoint, "https://up.example:4318");
        assert_eq!(c.protocol, Protocol::Grpc);
        assert_eq!(
            c.headers,
            vec![
                ("api-key".into(), "a b".into()),
                ("x-team".into(), "blue".into())
            ]
        );
        assert_eq!(c.timeout, Duration::from_millis(2500));
        use stallwatch_storage::forward::Signal;
        assert_eq!(c.url(Signal::Traces), "https://t.example/custom/traces");
        assert_eq!(c.url(Signal::Logs), "https://up.example:4318");
        // The section wins over the variables.
        let raw: RawForwardConfig =
            toml::from_str("endpoint = \"http://mine:4318\"\ntimeout_ms = 7").unwrap();
        let c = ForwardConfig::try_from(raw.with_env(env).unwrap()).unwrap();
        assert_eq!(c.endpoint, "http://mine:4318");
        assert_eq!(c.timeout, Duration::from_millis(7));
        assert_eq!(c.url(Signal::Metrics), "http://mine:4318");
        // ... and so does its `endpoint` over a per-signal variable, which is often set for
        // the user's own apps (and may point at stallwatch itself).
        assert_eq!(
            c.url(Signal::Traces),
            "http://mine:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT won over the file's endpoint"
        );
        let bad_timeout = |k: &str| (k == "OTEL_EXPORTER_OTLP_TIMEOUT").then(|| "10s".to_string());
        let e = RawForwardConfig::default()
            .with_env(bad_timeout)
            .unwrap_err()
            .to_string();
        assert!(e.contains("OTEL_EXPORTER_OTLP_TIMEOUT"), "{e}");
    }

    /// A bad value from a variable is reported with the variable's name: the user never
    /// wrote the key the error would otherwise name.
    #[test]
    fn an_error_in_a_variable_names_the_variable() {
        let env = |k: &str| {
            Some(
                match k {
                    "OTEL_EXPORTER_OTLP_ENDPOINT" => "http://up:4318",
                    "OTEL_EXPORTER_OTLP_PROTOCOL" => "http/json",
                    _ => return None,
                }
                .to_string(),
            )
        };
        let e = ForwardConfig::try_from(RawForwardConfig::default().with_env(env).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[forward] protocol:")
                && e.contains("from the variable OTEL_EXPORTER_OTLP_PROTOCOL"),
            "{e}"
        );
        let raw: RawForwardConfig = toml::from_str("protocol = \"thrift\"").unwrap();
        let e = ForwardConfig::try_from(raw.with_env(env).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains("variable"),
            "the file's own key blamed on a variable: {e}"
        );
    }

    /// Headers that frame or route each request are refused: a `content-length` cut every
    /// body short while the upstream still answered 200.
    #[test]
    fn headers_the_forwarder_sets_itself_are_refused() {
        for name in [
            "content-length",
            "Content-Type",
            "content-encoding",
            "host",
            "transfer-encoding",
            "te",
            "connection",
        ] {
            let e = parse(&format!(
                "endpoint = \"http://h\"\n[headers]\n\"{name}\" = \"3\""
            ))
            .unwrap_err();
            assert!(
                e.contains("[forward] headers:") && e.contains("set by the forwarder"),
                "{name} → {e}"
            );
        }
        assert!(parse("endpoint = \"http://h\"\n[headers]\nauthorization = \"Bearer k\"").is_ok());
    }

    /// A password in an endpoint is never shown in a config error.
    #[test]
    fn a_password_in_a_url_is_shown_as_stars() {
        let e = parse("endpoint = \"ftp://u:secret@h\"").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
    }
}
