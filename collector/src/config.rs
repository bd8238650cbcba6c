//! The collector's configuration, `[otlp]` in the TOML file: the raw shape
//! [`RawOtlpConfig`] (serde, unknown keys refused by name) and the validated
//! [`CollectorConfig`] it converts into with `TryFrom`, the one place `[otlp]` is checked.
//! `src/` only puts the CLI/env listen addresses over the file's before converting. Every
//! default is a named constant beside its field, with the docs/design.md "Interfaces"
//! section as the source.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use serde::Deserialize;
use stallwatch_storage::listen::ListenLimits;

use crate::error::CollectorError;

/// Default OTLP/gRPC listen address: `127.0.0.1:4317` (docs/design.md, Defaults).
pub const DEFAULT_GRPC_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4317));
/// Default OTLP/HTTP listen address: `127.0.0.1:4318` (docs/design.md, Defaults).
pub const DEFAULT_HTTP_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4318));
/// Default cap of one request body after decompression: 20 MiB (`[otlp] max_request_bytes
/// = 20971520`, docs/design.md "Back-pressure and limits"), on both transports.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 20 * 1024 * 1024;
/// Default cap of request bytes held at once across all requests: 64 MiB
/// (`max_inflight_bytes = 67108864`).
pub const DEFAULT_MAX_INFLIGHT_BYTES: usize = 64 * 1024 * 1024;
/// Default maximum nesting depth of attribute values (`arrayValue`/`kvlistValue`): 32.
pub const DEFAULT_MAX_NESTING_DEPTH: usize = 32;
/// Highest nesting depth that can be configured: deeper documents already hit prost's
/// recursion limit (100 messages, three per `kvlistValue`); the OTLP/JSON reader's bound
/// (`decode::json::MAX_JSON_DEPTH`, 192 levels) is set above what 40 levels take in JSON.
pub const MAX_NESTING_DEPTH_LIMIT: usize = 40;
/// Default time `run` waits for in-flight requests after shutdown is requested: 10 s.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Default longest wait for the next piece of a request body: 30 s. A client that stalls
/// longer gets a 400 / `INVALID_ARGUMENT` and releases its share of `max_inflight_bytes`.
pub const DEFAULT_BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default CORS allow-list: the Tauri web-view origins and any `http://localhost` or
/// `http://127.0.0.1` port (dev servers use both; issue 2, Collector; docs/design.md,
/// Security). `null` (file:// pages) is deliberately absent.
pub const DEFAULT_CORS_ALLOWED_ORIGINS: [&str; 5] = [
    "tauri://localhost",
    "http://tauri.localhost",
    "https://tauri.localhost",
    "http://localhost:*",
    "http://127.0.0.1:*",
];

/// Raw `[otlp]` section as written in TOML; every field absent means its default.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtlpConfig {
    /// OTLP/gRPC listen address; default [`DEFAULT_GRPC_LISTEN`].
    #[serde(
        default,
        deserialize_with = "stallwatch_storage::listen::deserialize_listen_addr"
    )]
    pub grpc_listen: Option<SocketAddr>,
    /// OTLP/HTTP listen address; default [`DEFAULT_HTTP_LISTEN`].
    #[serde(
        default,
        deserialize_with = "stallwatch_storage::listen::deserialize_listen_addr"
    )]
    pub http_listen: Option<SocketAddr>,
    /// Largest request body after decompression, bytes; default
    /// [`DEFAULT_MAX_REQUEST_BYTES`].
    pub max_request_bytes: Option<usize>,
    /// Bytes of request bodies in flight across requests; default
    /// [`DEFAULT_MAX_INFLIGHT_BYTES`].
    pub max_inflight_bytes: Option<usize>,
    /// Deepest attribute nesting accepted; default [`DEFAULT_MAX_NESTING_DEPTH`].
    pub max_nesting_depth: Option<usize>,
    /// Origins allowed by CORS (`http://localhost:*` allows any port); default
    /// [`DEFAULT_CORS_ALLOWED_ORIGINS`].
    pub cors_allowed_origins: Option<Vec<String>>,
    /// When set, OTLP requests must carry `Authorization: Bearer <ingest_token>`.
    pub ingest_token: Option<String>,
    /// Longest time to receive a request's headers, ms; default
    /// `stallwatch_storage::listen::DEFAULT_HEADER_READ_TIMEOUT` (docs/design.md, Every
    /// HTTP listener; the same keys in `[dashboard]`).
    pub header_read_timeout_ms: Option<u64>,
    /// No request in flight this long closes a connection, ms; default
    /// `listen::DEFAULT_IDLE_TIMEOUT`.
    pub idle_timeout_ms: Option<u64>,
    /// HTTP/2 keepalive PING interval, ms; default `listen::DEFAULT_KEEPALIVE_INTERVAL`.
    pub keepalive_interval_ms: Option<u64>,
    /// An unanswered PING closes the connection after this, ms; default
    /// `listen::DEFAULT_KEEPALIVE_TIMEOUT`.
    pub keepalive_timeout_ms: Option<u64>,
    /// Open connections per OTLP listener (each of gRPC and HTTP); default
    /// `listen::DEFAULT_MAX_CONNECTIONS`.
    pub max_connections: Option<usize>,
    /// Longest life of one connection, ms; default `listen::DEFAULT_MAX_CONNECTION_AGE`.
    pub max_connection_age_ms: Option<u64>,
    /// Every request of a connection waiting this long for request body bytes drops it, ms;
    /// default `listen::DEFAULT_BODY_READ_TIMEOUT` (an export's own stall answer, 400 after
    /// 30 s, comes first at the default).
    pub body_read_timeout_ms: Option<u64>,
    /// Slowest average pace of a request body once `body_rate_grace_ms` of waiting for it
    /// has passed, bytes per second (0: no pace rule); default
    /// `listen::DEFAULT_BODY_MIN_RATE` (16384). A body behind it is answered 400 /
    /// `INVALID_ARGUMENT` and releases its share of `max_inflight_bytes`.
    pub body_min_bytes_per_s: Option<u64>,
    /// How long waiting for a request body is allowed before its pace counts, ms; default
    /// `listen::DEFAULT_BODY_RATE_GRACE` (10000).
    pub body_rate_grace_ms: Option<u64>,
}

impl RawOtlpConfig {
    /// The connection-limit keys of this section.
    pub fn listen_limits(&self) -> stallwatch_storage::listen::RawListenLimits {
        stallwatch_storage::listen::RawListenLimits {
            header_read_timeout_ms: self.header_read_timeout_ms,
            idle_timeout_ms: self.idle_timeout_ms,
            keepalive_interval_ms: self.keepalive_interval_ms,
            keepalive_timeout_ms: self.keepalive_timeout_ms,
            max_connections: self.max_connections,
            max_connection_age_ms: self.max_connection_age_ms,
            body_read_timeout_ms: self.body_read_timeout_ms,
            body_min_bytes_per_s: self.body_min_bytes_per_s,
            body_rate_grace_ms: self.body_rate_grace_ms,
        }
    }
}

impl TryFrom<RawOtlpConfig> for CollectorConfig {
    type Error = CollectorError;

    /// Fills the defaults and checks the result ([`CollectorConfig::validate`]).
    /// `allowed_hosts` stays empty: `src/` copies it from `[dashboard] allowed_hosts`.
    fn try_from(raw: RawOtlpConfig) -> Result<Self, Self::Error> {
        let d = CollectorConfig::default();
        let listen = ListenLimits::try_from(&raw.listen_limits())
            .map_err(|e| CollectorError::Config(format!("[otlp] {e}")))?;
        let c = CollectorConfig {
            grpc_listen: raw.grpc_listen.unwrap_or(d.grpc_listen),
            http_listen: raw.http_listen.unwrap_or(d.http_listen),
            max_request_bytes: raw.max_request_bytes.unwrap_or(d.max_request_bytes),
            max_inflight_bytes: raw.max_inflight_bytes.unwrap_or(d.max_inflight_bytes),
            max_nesting_depth: raw.max_nesting_depth.unwrap_or(d.max_nesting_depth),
            cors_allowed_origins: raw.cors_allowed_origins.unwrap_or(d.cors_allowed_origins),
            ingest_token: raw.ingest_token,
            listen,
            ..d
        };
        c.validate()?;
        Ok(c)
    }
}

/// The collector's validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectorConfig {
    /// OTLP/gRPC listen address; port 0 picks a free port. Default [`DEFAULT_GRPC_LISTEN`].
    pub grpc_listen: SocketAddr,
    /// OTLP/HTTP listen address; port 0 picks a free port. Default [`DEFAULT_HTTP_LISTEN`].
    pub http_listen: SocketAddr,
    /// Largest request body in bytes, measured after decompression (and also applied to
    /// the compressed body). Over it: HTTP 413 / gRPC `RESOURCE_EXHAUSTED`. Default
    /// [`DEFAULT_MAX_REQUEST_BYTES`].
    pub max_request_bytes: usize,
    /// Request bytes (compressed plus decompressed) held at once across all requests.
    /// Over it: HTTP 503 + `Retry-After` / gRPC `UNAVAILABLE` + RetryInfo. Must be at least
    /// `max_request_bytes`. Default [`DEFAULT_MAX_INFLIGHT_BYTES`].
    pub max_inflight_bytes: usize,
    /// Deepest attribute value nesting accepted (a plain attribute value is depth 1; each
    /// `arrayValue`/`kvlistValue` level adds 1). Deeper: HTTP 400 / gRPC
    /// `INVALID_ARGUMENT`. Range 1..=[`MAX_NESTING_DEPTH_LIMIT`]. Default
    /// [`DEFAULT_MAX_NESTING_DEPTH`].
    pub max_nesting_depth: usize,
    /// Origins allowed to call the OTLP/HTTP endpoints from a browser. Exact origins
    /// (`scheme://host[:port]`), or `scheme://host:*` for any port of that host; `null` only
    /// when listed. Default [`DEFAULT_CORS_ALLOWED_ORIGINS`].
    pub cors_allowed_origins: Vec<String>,
    /// When set, every export must carry `Authorization: Bearer <token>` (HTTP 401 / gRPC
    /// `UNAUTHENTICATED` otherwise). Default `None` (docs/design.md, Security: optional ingest token).
    pub ingest_token: Option<String>,
    /// How long [`crate::Collector::run`] waits for in-flight requests once shutdown is
    /// requested. Default [`DEFAULT_DRAIN_TIMEOUT`].
    pub drain_timeout: Duration,
    /// Longest wait for the next piece of a request body, so stalled uploads cannot pin
    /// the in-flight budget. Default [`DEFAULT_BODY_IDLE_TIMEOUT`].
    pub body_idle_timeout: Duration,
    /// Host names (lowercase, no port) accepted in `Host` / `:authority` besides loopback
    /// names; anything else gets HTTP 421 / gRPC `PERMISSION_DENIED` (DNS rebinding).
    /// `src/` fills it from `[dashboard] allowed_hosts`, the one place every listener's
    /// rule is configured (`stallwatch_storage::hosts`). Default empty.
    pub allowed_hosts: Vec<String>,
    /// Connection limits of both OTLP listeners (`[otlp] header_read_timeout_ms`,
    /// `idle_timeout_ms`, `keepalive_interval_ms`, `keepalive_timeout_ms`, `max_connections`
    /// per listener, `max_connection_age_ms`, `body_read_timeout_ms`,
    /// `body_min_bytes_per_s`, `body_rate_grace_ms`). The minimum body rate is what frees
    /// the budget a slow client holds: an export's share of `max_inflight_bytes` is
    /// reserved from its declared length (`Content-Length`, the gRPC message prefix) before
    /// its body is read, so a client that declares 100 KB and sends a byte a second holds
    /// that share (and its decode-time share) until its body is cut, after
    /// `body_rate_grace_ms` plus one second per `body_min_bytes_per_s` bytes it sent.
    /// Default [`ListenLimits::default`].
    pub listen: ListenLimits,
}

impl Default for CollectorConfig {
    fn default() -> Self {
        Self {
            grpc_listen: DEFAULT_GRPC_LISTEN,
            http_listen: DEFAULT_HTTP_LISTEN,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            max_nesting_depth: DEFAULT_MAX_NESTING_DEPTH,
            cors_allowed_origins: DEFAULT_CORS_ALLOWED_ORIGINS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ingest_token: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            body_idle_timeout: DEFAULT_BODY_IDLE_TIMEOUT,
            allowed_hosts: Vec::new(),
            listen: ListenLimits::default(),
        }
    }
}

impl CollectorConfig {
    /// Checks the limits and the CORS patterns.
    ///
    /// Errors: [`CollectorError::Config`] naming the field: `max_request_bytes` below 1024,
    /// `max_inflight_bytes` below `max_request_bytes`, `max_nesting_depth` outside
    /// 1..=[`MAX_NESTING_DEPTH_LIMIT`], an origin that is not `scheme://host[:port|:*]` or
    /// `null`, an empty ingest token or one with whitespace.
    pub fn validate(&self) -> Result<(), CollectorError> {
        if self.max_request_bytes < 1024 {
            return Err(CollectorError::Config(format!(
                "max_request_bytes must be at least 1024, got {}",
                self.max_request_bytes
            )));
        }
        if self.max_inflight_bytes < self.max_request_bytes {
            return Err(CollectorError::Config(format!(
                "max_inflight_bytes ({}) must be at least max_request_bytes ({})",
                self.max_inflight_bytes, self.max_request_bytes
            )));
        }
        if self.max_nesting_depth == 0 || self.max_nesting_depth > MAX_NESTING_DEPTH_LIMIT {
            return Err(CollectorError::Config(format!(
                "max_nesting_depth must be within 1..={MAX_NESTING_DEPTH_LIMIT}, got {}",
                self.max_nesting_depth
            )));
        }
        for origin in &self.cors_allowed_origins {
            crate::cors::OriginPattern::parse(origin).map_err(CollectorError::Config)?;
        }
        if let Some(token) = &self.ingest_token {
            if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(CollectorError::Config(
                    "ingest_token must be non-empty and contain no whitespace".into(),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_design_and_validate() {
        let c = CollectorConfig::default();
        assert_eq!(c.grpc_listen.to_string(), "127.0.0.1:4317");
        assert_eq!(c.http_listen.to_string(), "127.0.0.1:4318");
        assert_eq!(c.max_request_bytes, 20_971_520);
        assert_eq!(c.max_inflight_bytes, 67_108_864);
        assert_eq!(c.max_nesting_depth, 32);
        assert!(c
            .cors_allowed_origins
            .contains(&"http://localhost:*".to_string()));
        c.validate().unwrap();
    }

    #[test]
    fn invalid_values_are_refused_naming_the_field() {
        type Mutate = fn(&mut CollectorConfig);
        let bad: [(Mutate, &str); 5] = [
            (|c| c.max_request_bytes = 10, "max_request_bytes"),
            (
                |c| c.max_inflight_bytes = c.max_request_bytes - 1,
                "max_inflight_bytes",
            ),
            (|c| c.max_nesting_depth = 0, "max_nesting_depth"),
            (
                |c| c.cors_allowed_origins = vec!["localhost".into()],
                "cors_allowed_origins",
            ),
            (|c| c.ingest_token = Some("a b".into()), "ingest_token"),
        ];
        for (f, field) in bad {
            let mut c = CollectorConfig::default();
            f(&mut c);
            let raw = RawOtlpConfig {
                max_request_bytes: Some(c.max_request_bytes),
                max_inflight_bytes: Some(c.max_inflight_bytes),
                max_nesting_depth: Some(c.max_nesting_depth),
                cors_allowed_origins: Some(c.cors_allowed_origins.clone()),
                ingest_token: c.ingest_token.clone(),
                ..RawOtlpConfig::default()
            };
            let err = CollectorConfig::try_from(raw).unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
            let mut c = CollectorConfig::default();
            f(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
    }

    #[test]
    fn raw_toml_converts_and_refuses_unknown_keys_by_name() {
        let raw: RawOtlpConfig =
            toml::from_str("grpc_listen = \"127.0.0.1:0\"\nmax_request_bytes = 2048\n").unwrap();
        let c = CollectorConfig::try_from(raw).unwrap();
        assert_eq!(c.grpc_listen.port(), 0);
        assert_eq!(c.http_listen, DEFAULT_HTTP_LISTEN);
        assert_eq!(c.max_request_bytes, 2048);
        let err = toml::from_str::<RawOtlpConfig>("max_requst_bytes = 10\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_requst_bytes"), "{err}");
    }
}
