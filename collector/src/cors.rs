//! CORS for browser and web-view exporters: an allow-list of origins, with a `:*` port
//! wildcard (`http://localhost:*`). Issue 2 (Collector) and docs/design.md (Security): preflights
//! from allowed origins are answered with the request's headers allowed; every response to
//! an allowed origin carries the same headers, errors included; other origins get no CORS
//! headers at all.

/// The port part of an origin pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum PortRule {
    /// No port in the origin (the scheme's default).
    None,
    /// Exactly this port.
    Exact(u16),
    /// `:*`: any port, or none.
    Any,
}

/// One allowed origin: `scheme://host[:port]`, `scheme://host:*`, or `null`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OriginPattern {
    scheme: String,
    host: String,
    port: PortRule,
}

/// Splits `scheme://host[:port]` into lowercase parts; the port is returned raw.
fn split_origin(s: &str) -> Option<(String, String, Option<&str>)> {
    let (scheme, rest) = s.split_once("://")?;
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        || rest.is_empty()
        || rest.contains(['/', '?', '#', '@'])
    {
        return None;
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (inner, after) = v6.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{inner}]"), port)
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (rest.to_string(), None),
        }
    };
    if host.is_empty() {
        return None;
    }
    Some((scheme.to_ascii_lowercase(), host.to_ascii_lowercase(), port))
}

impl OriginPattern {
    /// Parses a configured origin. Errors name the bad entry.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let bad = || format!("cors_allowed_origins: {s:?} is not scheme://host[:port|:*] or null");
        if s == "null" {
            return Ok(Self {
                scheme: "null".into(),
                host: String::new(),
                port: PortRule::None,
            });
        }
        let (scheme, host, port) = split_origin(s).ok_or_else(bad)?;
        let port = match port {
            None => PortRule::None,
            Some("*") => PortRule::Any,
            Some(p) => PortRule::Exact(p.parse().map_err(|_| bad())?),
        };
        Ok(Self { scheme, host, port })
    }

    fn matches(&self, origin: &str) -> bool {
        if self.scheme == "null" {
            return origin == "null";
        }
        let Some((scheme, host, port)) = split_origin(origin) else {
            return false;
        };
        if scheme != self.scheme || host != self.host {
            return false;
        }
        let port = match port {
            None => None,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                match p.parse::<u16>() {
                    Ok(n) => Some(n),
                    Err(_) => return false,
                }
            }
            Some(_) => return false,
        };
        match (&self.port, port) {
            (PortRule::Any, _) => true,
            (PortRule::None, None) => true,
            (PortRule::Exact(want), Some(got)) => *want == got,
            _ => false,
        }
    }
}

/// The configured allow-list.
#[derive(Clone, Debug, Default)]
pub(crate) struct CorsPolicy {
    patterns: Vec<OriginPattern>,
}

impl CorsPolicy {
    /// Builds the policy from `cors_allowed_origins`.
    pub(crate) fn new(origins: &[String]) -> Result<Self, String> {
        Ok(Self {
            patterns: origins
                .iter()
                .map(|o| OriginPattern::parse(o))
                .collect::<Result<_, _>>()?,
        })
    }

    /// True when `origin` (the request's `Origin` header) is allowed.
    pub(crate) fn allows(&self, origin: &str) -> bool {
        self.patterns.iter().any(|p| p.matches(origin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_policy() -> CorsPolicy {
        let list: Vec<String> = crate::config::DEFAULT_CORS_ALLOWED_ORIGINS
            .iter()
            .map(|s| s.to_string())
            .collect();
        CorsPolicy::new(&list).unwrap()
    }

    #[test]
    fn default_list_allows_tauri_and_any_localhost_port() {
        let p = default_policy();
        for ok in [
            "tauri://localhost",
            "http://tauri.localhost",
            "https://tauri.localhost",
            "http://localhost:5173",
            "http://localhost",
            "HTTP://LocalHost:8080",
            "http://127.0.0.1:5173",
            "http://127.0.0.1",
        ] {
            assert!(p.allows(ok), "{ok} should be allowed");
        }
    }

    #[test]
    fn default_list_refuses_foreign_null_and_lookalikes() {
        let p = default_policy();
        for bad in [
            "null",
            "https://evil.example",
            "vscode-webview://0a1b2c3d",
            "https://localhost:5173",
            "http://localhost.evil.example",
            "http://evil.localhost:80",
            "http://localhost:99999",
            "http://localhost:",
            "http://localhost:5173/path",
            "tauri://localhost:1",
            "http://127.0.0.2:5173",
            "https://127.0.0.1:5173",
            "http://127.0.0.1.evil.example",
            "",
        ] {
            assert!(!p.allows(bad), "{bad} should be refused");
        }
    }

    #[test]
    fn exact_port_and_null_when_configured() {
        let p = CorsPolicy::new(&["http://127.0.0.1:3000".into(), "null".into()]).unwrap();
        assert!(p.allows("http://127.0.0.1:3000"));
        assert!(!p.allows("http://127.0.0.1:3001"));
        assert!(!p.allows("http://127.0.0.1"));
        assert!(p.allows("null"));
    }

    #[test]
    fn bad_patterns_are_refused_with_their_name() {
        for bad in [
            "localhost",
            "http://",
            "http://a/b",
            "http://a:port",
            "://x",
        ] {
            let err = OriginPattern::parse(bad).unwrap_err();
            assert!(err.contains(bad), "{err}");
        }
    }
}
