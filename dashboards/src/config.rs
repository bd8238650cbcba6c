//! The dashboard's configuration: the raw TOML shapes (`[dashboard]`, `[[alerts.webhook]]`)
//! and the validated [`DashboardConfig`] they convert into with `TryFrom`.
//!
//! Edge names carry their units (`retry_initial_ms`); inside, durations are `Duration`.
//! Unknown keys are refused by name (`deny_unknown_fields`, docs/design.md "CLI").

use stallwatch_storage::listen::ListenLimits;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use stallwatch_storage::model::EventKind;

use crate::error::DashboardError;

/// Default dashboard + JSON API listen address (docs/design.md, Defaults).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4319";
/// Default first webhook retry delay: 1000 ms (docs/design.md, "retries from 1 s doubling").
pub const DEFAULT_RETRY_INITIAL_MS: u64 = 1_000;
/// Default cap of the webhook retry delay: 300000 ms (5 minutes).
pub const DEFAULT_RETRY_MAX_MS: u64 = 300_000;
/// Default attempts before a delivery is given up: 100 (about eight hours at the cap).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 100;
/// Default timeout of one webhook HTTP attempt: 10000 ms.
pub const DEFAULT_WEBHOOK_TIMEOUT_MS: u64 = 10_000;

/// Raw `[dashboard]` section as written in TOML.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDashboardConfig {
    /// Listen address; default [`DEFAULT_LISTEN`]. Port 0 picks a free port.
    #[serde(default)]
    pub listen: Option<String>,
    /// `Host` names accepted besides the loopback names (DNS-rebinding guard).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Origins allowed by CORS; an entry may end in `:*` for any port
    /// (e.g. `http://localhost:*`). Empty: no CORS headers at all.
    #[serde(default)]
    pub cors_allowed_origins: Vec<String>,
    /// Base URL used for links in webhook bodies; default `http://<listen>`.
    #[serde(default)]
    pub public_url: Option<String>,
    /// Longest time to receive a request's headers, ms (default 10000; docs/design.md,
    /// "Back-pressure and limits").
    #[serde(default)]
    pub header_read_timeout_ms: Option<u64>,
    /// A connection with no request in flight this long is closed, ms (default 60000).
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// HTTP/2 keepalive PING interval, ms (default 20000).
    #[serde(default)]
    pub keepalive_interval_ms: Option<u64>,
    /// An unanswered PING closes the connection after this, ms (default 10000).
    #[serde(default)]
    pub keepalive_timeout_ms: Option<u64>,
    /// Open connections per listener, SSE and long-polls included (default 512).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Longest life of one connection, ms (default 3600000).
    #[serde(default)]
    pub max_connection_age_ms: Option<u64>,
    /// Every request of a connection waiting this long for request body bytes drops it, ms
    /// (default 35000).
    #[serde(default)]
    pub body_read_timeout_ms: Option<u64>,
    /// Slowest average pace of a request body once `body_rate_grace_ms` of waiting for it
    /// has passed, bytes per second (default 16384; 0: no pace rule). A body behind it is
    /// answered 408 `body_too_slow`.
    #[serde(default)]
    pub body_min_bytes_per_s: Option<u64>,
    /// How long waiting for a request body is allowed before its pace counts, ms (default
    /// 10000).
    #[serde(default)]
    pub body_rate_grace_ms: Option<u64>,
}

impl RawDashboardConfig {
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

/// Raw `[[alerts.webhook]]` entry as written in TOML.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWebhookConfig {
    /// Receiver URL, `http://` or `https://`.
    pub url: String,
    /// HMAC-SHA256 key: `whsec_<base64>` (the Standard Webhooks secret format: the key is the
    /// decoded base64) or any other string (the key is its raw bytes); signs
    /// `webhook-signature` and the compatibility `X-Stallwatch-Signature`.
    pub secret: String,
    /// Event names to send (docs/design.md "One event vocabulary"); empty or absent: all.
    #[serde(default)]
    pub events: Vec<String>,
    /// First retry delay, ms; default [`DEFAULT_RETRY_INITIAL_MS`].
    #[serde(default)]
    pub retry_initial_ms: Option<u64>,
    /// Retry delay cap, ms; default [`DEFAULT_RETRY_MAX_MS`].
    #[serde(default)]
    pub retry_max_ms: Option<u64>,
    /// Attempts before giving up; default [`DEFAULT_MAX_ATTEMPTS`].
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// Timeout of one attempt, ms; default [`DEFAULT_WEBHOOK_TIMEOUT_MS`].
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Raw `[alerts]` section: `[[alerts.webhook]]` entries.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlertsConfig {
    /// The webhooks.
    #[serde(default)]
    pub webhook: Vec<RawWebhookConfig>,
}

/// One validated webhook. Its `Debug` shows the URL through [`redact_url`] and no secret.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Receiver URL (also the webhook's identity in the outbox), as configured: deliveries
    /// go to it, credentials included; shown anywhere only through [`redact_url`].
    pub url: String,
    /// HMAC-SHA256 key of the body signature.
    pub secret: String,
    /// Events it receives; empty: every event.
    pub events: Vec<EventKind>,
    /// First retry delay (default 1 s); doubles each attempt.
    pub retry_initial: Duration,
    /// Retry delay cap (default 300 s).
    pub retry_max: Duration,
    /// Attempts before the delivery is marked failed (default 100).
    pub max_attempts: u32,
    /// Timeout of one attempt (default 10 s).
    pub timeout: Duration,
}

impl WebhookConfig {
    /// True when this webhook wants `kind`.
    pub fn wants(&self, kind: EventKind) -> bool {
        self.events.is_empty() || self.events.contains(&kind)
    }

    /// The URL as logs and API answers show it: [`redact_url`].
    pub fn shown_url(&self) -> String {
        redact_url(&self.url)
    }
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &self.shown_url())
            .field("secret", &"***")
            .field("events", &self.events)
            .field("retry_initial", &self.retry_initial)
            .field("retry_max", &self.retry_max)
            .field("max_attempts", &self.max_attempts)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A URL as logs and API answers show it (its password as `***`): the one rule every
/// crate uses, `stallwatch_vocabulary::redact::redact_url`.
pub use stallwatch_vocabulary::redact::redact_url;

impl TryFrom<RawWebhookConfig> for WebhookConfig {
    type Error = DashboardError;

    fn try_from(raw: RawWebhookConfig) -> Result<Self, Self::Error> {
        check_url("alerts.webhook url", &raw.url)?;
        let shown = redact_url(&raw.url);
        if raw.secret.is_empty() {
            return Err(DashboardError::Config(format!(
                "alerts.webhook {shown:?}: secret must not be empty"
            )));
        }
        // A `whsec_` secret is the Standard Webhooks format: its receivers decode the
        // base64 after the prefix and take that as the key, so one that is not base64
        // would sign every delivery with a key no receiver uses.
        if let Some(b64) = raw.secret.strip_prefix("whsec_") {
            use base64::Engine as _;
            match base64::engine::general_purpose::STANDARD.decode(b64) {
                Ok(k) if !k.is_empty() => {}
                Ok(_) => {
                    return Err(DashboardError::Config(format!(
                        "alerts.webhook {shown:?}: secret \"whsec_\" has no key after its prefix"
                    )))
                }
                Err(e) => {
                    return Err(DashboardError::Config(format!(
                        "alerts.webhook {shown:?}: secret starts with \"whsec_\" (the Standard Webhooks format) but what follows is not base64 ({e}); give the secret as the receiver shows it, or a plain secret without the prefix"
                    )))
                }
            }
        }
        let mut events = Vec::new();
        for name in &raw.events {
            let kind = EventKind::parse(name).ok_or_else(|| {
                DashboardError::Config(format!(
                    "alerts.webhook {shown:?}: unknown event {name:?} (known: {})",
                    EventKind::ALL.map(|k| k.as_str()).join(", ")
                ))
            })?;
            if !events.contains(&kind) {
                events.push(kind);
            }
        }
        let retry_initial_ms = raw.retry_initial_ms.unwrap_or(DEFAULT_RETRY_INITIAL_MS);
        let retry_max_ms = raw.retry_max_ms.unwrap_or(DEFAULT_RETRY_MAX_MS);
        if retry_initial_ms == 0 || retry_max_ms < retry_initial_ms {
            return Err(DashboardError::Config(format!(
                "alerts.webhook {shown:?}: need 0 < retry_initial_ms <= retry_max_ms"
            )));
        }
        let max_attempts = raw.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        if max_attempts == 0 {
            return Err(DashboardError::Config(format!(
                "alerts.webhook {shown:?}: max_attempts must be at least 1"
            )));
        }
        let timeout_ms = raw.timeout_ms.unwrap_or(DEFAULT_WEBHOOK_TIMEOUT_MS);
        if timeout_ms == 0 {
            return Err(DashboardError::Config(format!(
                "alerts.webhook {shown:?}: timeout_ms must be at least 1"
            )));
        }
        Ok(Self {
            url: raw.url,
            secret: raw.secret,
            events,
            retry_initial: Duration::from_millis(retry_initial_ms),
            retry_max: Duration::from_millis(retry_max_ms),
            max_attempts,
            timeout: Duration::from_millis(timeout_ms),
        })
    }
}

/// The validated dashboard configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DashboardConfig {
    /// Listen address (default `127.0.0.1:4319`).
    pub listen: SocketAddr,
    /// Lowercase `Host` names accepted besides loopback names (`localhost`, `127.0.0.1`,
    /// `[::1]`), without port.
    pub allowed_hosts: Vec<String>,
    /// CORS origins; an entry ending in `:*` allows any port. Empty: no CORS.
    pub cors_allowed_origins: Vec<String>,
    /// Base URL for links in webhook bodies, without trailing `/`; `None`: `http://<listen>`.
    pub public_url: Option<String>,
    /// Alert webhooks.
    pub webhooks: Vec<WebhookConfig>,
    /// Connection limits of the dashboard listener (SSE streams and `/mcp` count).
    pub listen_limits: ListenLimits,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 4319)),
            allowed_hosts: Vec::new(),
            cors_allowed_origins: Vec::new(),
            public_url: None,
            webhooks: Vec::new(),
            listen_limits: ListenLimits::default(),
        }
    }
}

impl DashboardConfig {
    /// The base URL links point to: `public_url`, else `http://<listen>`.
    pub fn base_url(&self) -> String {
        self.public_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", self.listen))
    }
}

/// Checks one `allowed_hosts` entry (lowercased) against what the Host check matches
/// (`stallwatch_storage::hosts::host_allowed`: a name or IP address, any port), so an
/// entry that could never match is refused at start instead of failing every request
/// with 421. Errors: why, as text (a port given, a wildcard, not a host name).
fn allowed_host_entry(h: &str) -> Result<(), &'static str> {
    if h.trim_matches(['[', ']'])
        .parse::<std::net::Ipv6Addr>()
        .is_ok()
    {
        return Ok(());
    }
    if h.contains('*') {
        return Err("is a wildcard, which is not supported: list each host name (localhost and *.localhost are always allowed)");
    }
    if h.contains('/') {
        return Err("is not a host name (a URL? list the host alone)");
    }
    if h.contains(':') {
        return Err("names a port: list the host alone (every port of it is allowed)");
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if h.len() > 253 || !h.split('.').all(label_ok) {
        return Err("is not a host name (letters, digits, '-' and '.'; an international name in its xn-- form)");
    }
    Ok(())
}

impl TryFrom<(RawDashboardConfig, RawAlertsConfig)> for DashboardConfig {
    type Error = DashboardError;

    fn try_from((raw, alerts): (RawDashboardConfig, RawAlertsConfig)) -> Result<Self, Self::Error> {
        let listen_limits = ListenLimits::try_from(&raw.listen_limits())
            .map_err(|e| DashboardError::Config(format!("dashboard.{e}")))?;
        let listen = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let listen: SocketAddr = stallwatch_storage::listen::parse_listen_addr(listen)
            .map_err(|e| DashboardError::Config(format!("dashboard.listen {listen:?}: {e}")))?;
        let mut allowed_hosts = Vec::new();
        for h in raw.allowed_hosts {
            let h = h.trim().to_ascii_lowercase();
            allowed_host_entry(&h).map_err(|why| {
                DashboardError::Config(format!("dashboard.allowed_hosts: {h:?} {why}"))
            })?;
            allowed_hosts.push(h);
        }
        for o in &raw.cors_allowed_origins {
            if !(o.starts_with("http://") || o.starts_with("https://") || o.contains("://")) {
                return Err(DashboardError::Config(format!(
                    "dashboard.cors_allowed_origins: {o:?} is not an origin (scheme://host[:port])"
                )));
            }
        }
        let public_url = match raw.public_url {
            Some(u) => {
                check_url("dashboard.public_url", &u)?;
                Some(u.trim_end_matches('/').to_string())
            }
            None => None,
        };
        let webhooks = alerts
            .webhook
            .into_iter()
            .map(WebhookConfig::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        refuse_repeated_urls(&webhooks)?;
        Ok(Self {
            listen,
            allowed_hosts,
            cors_allowed_origins: raw.cors_allowed_origins,
            public_url,
            webhooks,
            listen_limits,
        })
    }
}

/// Refuses two webhooks with the same URL as `url` reads it (host case, default port and
/// empty path do not make another receiver): the outbox keys deliveries by URL, so the
/// second entry's secret and events would be mixed with the first's.
///
/// Errors: [`DashboardError::Config`] naming both entries by position (1-based).
fn refuse_repeated_urls(webhooks: &[WebhookConfig]) -> Result<(), DashboardError> {
    let mut seen: Vec<reqwest::Url> = Vec::with_capacity(webhooks.len());
    for (i, w) in webhooks.iter().enumerate() {
        let url = reqwest::Url::parse(&w.url).map_err(|e| {
            DashboardError::Config(format!("alerts.webhook url {:?}: {e}", w.shown_url()))
        })?;
        if let Some(first) = seen.iter().position(|u| *u == url) {
            return Err(DashboardError::Config(format!(
                "[[alerts.webhook]] #{} repeats the url of #{} ({:?}); list the events of \
                 both in one entry",
                i + 1,
                first + 1,
                w.shown_url()
            )));
        }
        seen.push(url);
    }
    Ok(())
}

/// Checks that `raw` is an `http` or `https` URL, for the config key `key`.
///
/// International host names are not taken: the binary carries no IDNA tables
/// (`idna_adapter` 1.0, root Cargo.toml), so a host that is not ASCII, or that is
/// percent-encoded, is refused naming its `xn--` form before `url` reads it (its ASCII-only
/// back end also asserts, in debug builds, on a host mixing capitals with non-ASCII).
///
/// Errors: [`DashboardError::Config`] naming the key, the value and what is wrong.
fn check_url(key: &str, raw: &str) -> Result<(), DashboardError> {
    let bad = |why: &dyn std::fmt::Display| {
        DashboardError::Config(format!("{key} {:?}: {why}", redact_url(raw)))
    };
    // the URL standard drops tabs and newlines anywhere and reads `\` as `/` in http(s)
    // URLs; it also takes `https:host` without the slashes: refused here, so the host is
    // always what follows `://`
    let cleaned: String = raw
        .trim()
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    let Some((_, rest)) = cleaned.split_once(':') else {
        return reqwest::Url::parse(raw).map(drop).map_err(|e| bad(&e));
    };
    let Some(rest) = rest.strip_prefix("//") else {
        return Err(bad(&"write it as scheme://host/path"));
    };
    let authority = rest.split(['/', '\\', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    if !host.is_ascii() || host.contains('%') {
        return Err(bad(
            &"the host must be written in ASCII: write an international name in its xn-- \
              form (e.g. xn--bcher-kva.example for bücher.example)",
        ));
    }
    let url = reqwest::Url::parse(raw).map_err(|e| bad(&e))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(&"scheme must be http or https"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_event_is_refused_by_name() {
        let raw = RawWebhookConfig {
            url: "http://127.0.0.1:9/hook".into(),
            secret: "s".into(),
            events: vec!["breaker.opened".into(), "breaker.exploded".into()],
            retry_initial_ms: None,
            retry_max_ms: None,
            max_attempts: None,
            timeout_ms: None,
        };
        let err = WebhookConfig::try_from(raw).unwrap_err().to_string();
        assert!(err.contains("breaker.exploded"), "{err}");
    }

    #[test]
    fn allowed_hosts_entries_that_could_never_match_are_refused() {
        let with = |hosts: &[&str]| {
            let raw: RawDashboardConfig =
                toml_like(&serde_json::json!({ "allowed_hosts": hosts }).to_string());
            DashboardConfig::try_from((raw, RawAlertsConfig::default()))
        };
        for (entry, why) in [
            ("good.example:8080", "names a port"),
            ("*", "wildcard"),
            ("*.example", "wildcard"),
            ("", "not a host name"),
            ("http://box.lan", "not a host name"),
            ("a b", "not a host name"),
            ("bücher.example", "xn--"),
            ("box..lan", "not a host name"),
        ] {
            let err = with(&[entry]).unwrap_err().to_string();
            assert!(
                err.contains("dashboard.allowed_hosts") && err.contains(why),
                "{entry}: {err}"
            );
        }
        let ok = with(&[
            "box.lan",
            "Box.LAN",
            "10.0.0.7",
            "fe80::1",
            "[fe80::2]",
            "my_host",
        ])
        .unwrap();
        assert_eq!(ok.allowed_hosts.len(), 6);
        for (host, allowed) in [
            ("box.lan:4319", true),
            ("10.0.0.7", true),
            ("[fe80::1]:4319", true),
            ("[fe80::2]", true),
            ("other.lan", false),
        ] {
            assert_eq!(
                stallwatch_storage::hosts::host_allowed(host, &ok.allowed_hosts),
                allowed,
                "{host}"
            );
        }
    }

    #[test]
    fn an_international_host_name_is_refused_naming_its_ascii_form() {
        let raw = |url: &str| RawWebhookConfig {
            url: url.into(),
            secret: "s".into(),
            events: vec![],
            retry_initial_ms: None,
            retry_max_ms: None,
            max_attempts: None,
            timeout_ms: None,
        };
        for url in [
            "https://bücher.example/hook",
            // capitals beside non-ASCII: url's ASCII-only IDNA asserts on these in debug
            "https://BÜCHER.example/hook",
            "https://Bücher.example/hook",
            "https://B%C3%BCcher.example/hook",
            "https://user@b%c3%bccher.example:8443/hook",
        ] {
            let err = WebhookConfig::try_from(raw(url)).unwrap_err().to_string();
            assert!(err.contains("xn-- form"), "{url}: {err}");
            assert!(err.contains("alerts.webhook url"), "{url}: {err}");
        }
        let public: RawDashboardConfig = toml_like(r#"{"public_url":"https://BÜCHER.example"}"#);
        let err = DashboardConfig::try_from((public, RawAlertsConfig::default()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("dashboard.public_url") && err.contains("xn-- form"),
            "{err}"
        );
        // the URL standard's other spellings of the same host
        for url in [
            "https:BÜCHER.example/hook",
            "https:/BÜCHER.example/hook",
            "https:\\\\BÜCHER.example/hook",
            "https:/\t/BÜCHER.example/hook",
            "https:\n//Bücher.example/hook",
            "https:B%C3%9CCHER.example/hook",
            "https://BÜ\tCHER.example/hook",
        ] {
            let err = WebhookConfig::try_from(raw(url)).unwrap_err().to_string();
            assert!(err.contains("alerts.webhook url"), "{url:?}: {err}");
        }
        // `\` ends the host as `/` does
        WebhookConfig::try_from(raw("https://hooks.example\\ö")).unwrap();
        // non-ASCII outside the host is fine
        WebhookConfig::try_from(raw("https://hooks.example/ö?q=ü")).unwrap();
        // a bad ASCII host gets url's own message, no hint
        let err = WebhookConfig::try_from(raw("https://exa mple.com/ö"))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("xn--"), "{err}");
        let ok = WebhookConfig::try_from(raw("https://xn--bcher-kva.example/hook")).unwrap();
        assert!(ok.url.contains("xn--bcher-kva.example"), "{}", ok.url);
        // An ASCII host with capitals is taken as before.
        let ok = WebhookConfig::try_from(raw("http://Hooks.Example:9/x")).unwrap();
        assert!(
            ok.url.contains("Hooks.Example") || ok.url.contains("hooks.example"),
            "{}",
            ok.url
        );
    }

    #[test]
    fn defaults_and_unknown_keys() {
        let raw: RawDashboardConfig = toml_like(r#"{"allowed_hosts":["Stall.Local"]}"#);
        let cfg = DashboardConfig::try_from((raw, RawAlertsConfig::default())).unwrap();
        assert_eq!(cfg.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(cfg.allowed_hosts, vec!["stall.local".to_string()]);
        let bad = serde_json::from_str::<RawDashboardConfig>(r#"{"listen_addr":"x"}"#);
        assert!(bad.unwrap_err().to_string().contains("listen_addr"));
    }

    fn hook(url: &str, events: &[&str]) -> RawWebhookConfig {
        RawWebhookConfig {
            url: url.into(),
            secret: "s".into(),
            events: events.iter().map(|e| e.to_string()).collect(),
            retry_initial_ms: None,
            retry_max_ms: None,
            max_attempts: None,
            timeout_ms: None,
        }
    }

    fn with_hooks(hooks: Vec<RawWebhookConfig>) -> Result<DashboardConfig, DashboardError> {
        DashboardConfig::try_from((
            RawDashboardConfig::default(),
            RawAlertsConfig { webhook: hooks },
        ))
    }

    #[test]
    fn a_webhook_url_given_twice_is_refused_naming_both_entries() {
        let err = with_hooks(vec![
            hook("http://127.0.0.1:9/dup", &["runner.started"]),
            hook("http://127.0.0.1:9/other", &[]),
            hook(
                "http://127.0.0.1:9/dup",
                &["runner.started", "runner.terminated"],
            ),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("[[alerts.webhook]] #3 repeats the url of #1")
                && err.contains("list the events of both in one entry"),
            "{err}"
        );
        // the same URL as `url` reads it: host case, default port, empty path
        let err = with_hooks(vec![
            hook("http://Hooks.Example:80", &[]),
            hook("http://hooks.example/", &[]),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("#2 repeats the url of #1"), "{err}");
        // different paths, ports or schemes are different receivers
        let ok = with_hooks(vec![
            hook("http://hooks.example/a", &[]),
            hook("http://hooks.example/b", &[]),
            hook("http://hooks.example:8080/a", &[]),
            hook("https://hooks.example/a", &[]),
        ])
        .unwrap();
        assert_eq!(ok.webhooks.len(), 4);
    }

    #[test]
    fn timeout_ms_zero_is_refused_naming_the_key() {
        let mut raw = hook("http://127.0.0.1:9/hook", &[]);
        raw.timeout_ms = Some(0);
        let err = WebhookConfig::try_from(raw).unwrap_err().to_string();
        assert!(err.contains("timeout_ms"), "{err}");
        let mut raw = hook("http://127.0.0.1:9/hook", &[]);
        raw.timeout_ms = Some(1);
        assert_eq!(
            WebhookConfig::try_from(raw).unwrap().timeout,
            Duration::from_millis(1)
        );
    }

    #[test]
    fn a_whsec_secret_must_be_base64() {
        for (secret, ok) in [
            ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true),
            ("plain secret !!!", true),
            ("whsec_!!!", false),
            ("whsec_", false),
        ] {
            let mut raw = hook("http://127.0.0.1:9/hook", &[]);
            raw.secret = secret.into();
            let got = WebhookConfig::try_from(raw);
            assert_eq!(got.is_ok(), ok, "{secret}: {got:?}");
            if let Err(e) = got {
                let e = e.to_string();
                assert!(e.contains("whsec_") && !e.contains("!!!"), "{e}");
            }
        }
    }

    #[test]
    fn config_errors_show_a_webhook_url_without_its_password() {
        let mut raw = hook("http://hookuser:hookpass@127.0.0.1:9/hook", &[]);
        raw.secret = String::new();
        let err = WebhookConfig::try_from(raw).unwrap_err().to_string();
        assert!(err.contains("hookuser:***@127.0.0.1:9"), "{err}");
        assert!(!err.contains("hookpass"), "{err}");
        let err = with_hooks(vec![
            hook("http://u:hookpass@hooks.example/a", &[]),
            hook("http://u:hookpass@hooks.example/a", &[]),
        ])
        .unwrap_err()
        .to_string();
        assert!(!err.contains("hookpass"), "{err}");
        let err = WebhookConfig::try_from(hook("ftp://u:hookpass@hooks.example/a", &[]))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hookpass"), "{err}");
    }

    #[test]
    fn redact_url_hides_the_password_and_keeps_the_rest() {
        assert_eq!(
            redact_url("http://user:pass@host/hook"),
            "http://user:***@host/hook"
        );
        let hook = WebhookConfig::try_from(hook("http://user:pass@host/hook", &[])).unwrap();
        assert_eq!(
            hook.url, "http://user:pass@host/hook",
            "sent to the real URL"
        );
        assert_eq!(hook.shown_url(), "http://user:***@host/hook");
        let debug = format!("{hook:?}");
        assert!(!debug.contains("pass@"), "{debug}");
    }

    fn toml_like(json: &str) -> RawDashboardConfig {
        serde_json::from_str(json).unwrap()
    }
}
