//! The one `Host` rule every listener applies (OTLP/HTTP, OTLP/gRPC `:authority`, the
//! dashboard): a loopback name, or one of the configured `[dashboard] allowed_hosts`.
//!
//! Why: a web page on any site can rebind its DNS name to 127.0.0.1 and post to a loopback
//! port; the browser then sends the page's own name as `Host`. Refusing names that are not
//! loopback (any port) closes that door (docs/design.md, Security; the same check the
//! dashboard has always done). Lives here, the ground floor, so collector and dashboards
//! share one definition without depending on each other.

/// The one message every listener answers a refused `Host` with (HTTP 421 on OTLP/HTTP and
/// the dashboard, gRPC `PERMISSION_DENIED`), each in its own envelope: OTLP's
/// `google.rpc.Status` (OTLP/HTTP spec, "Failures") and the dashboard's `{"error":{...}}`.
pub fn refusal_message(host: &str) -> String {
    format!(
        "Host {host:?} is not a loopback name nor in [dashboard] allowed_hosts (DNS rebinding guard)"
    )
}

/// The host a request names, the one every listener checks with [`host_allowed`]: the
/// target's authority (HTTP/2 `:authority`, or an absolute-form HTTP/1.1 target, which
/// overrides `Host`: RFC 9112 §3.2.2), else its one `Host` header; `""` when it has none.
/// Several `Host` lines are answered joined (`"a, b"`), which no rule allows: RFC 9112 §3.2
/// refuses such a request, and a proxy and stallwatch could each read a different one. So
/// is an HTTP/2 `Host` that names another host than `:authority` (RFC 9113 §8.3.1: such a
/// request is malformed).
pub fn request_host(version: http::Version, uri: &http::Uri, headers: &http::HeaderMap) -> String {
    let mut all = headers.get_all(http::header::HOST).iter();
    if let Some(a) = uri.authority() {
        let mut host = a.as_str().to_string();
        if version == http::Version::HTTP_2 {
            for h in all {
                if !h.as_bytes().eq_ignore_ascii_case(host.as_bytes()) {
                    host.push_str(", ");
                    host.push_str(&String::from_utf8_lossy(h.as_bytes()));
                }
            }
        }
        return host;
    }
    let Some(first) = all.next() else {
        return String::new();
    };
    let mut host = String::from_utf8_lossy(first.as_bytes()).into_owned();
    for more in all {
        host.push_str(", ");
        host.push_str(&String::from_utf8_lossy(more.as_bytes()));
    }
    host
}

/// The host of a request the shared rule refuses ([`request_host`], [`host_allowed`]), or
/// `None` when it is served. An HTTP/1.0 request that names no host at all is served: the
/// protocol does not require `Host` (RFC 9112 §3.2 requires it of HTTP/1.1 only), and the
/// rule guards against browsers, which always send it.
pub fn refused_host(
    version: http::Version,
    uri: &http::Uri,
    headers: &http::HeaderMap,
    allowed: &[String],
) -> Option<String> {
    let host = request_host(version, uri, headers);
    let unnamed = host.is_empty() && version < http::Version::HTTP_11;
    (!unnamed && !host_allowed(&host, allowed)).then_some(host)
}

/// True for the port of a `Host` (RFC 3986 §3.2.3: `port = *DIGIT`, so it may be empty):
/// digits only, at most 65535.
fn port_ok(port: &str) -> bool {
    port.is_empty() || (port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok())
}

/// True for a `Host` / `:authority` naming a loopback host (`localhost`, `*.localhost`,
/// `127.0.0.0/8`, `[::1]`) or one of `allowed` (lowercase names, any port).
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let host = host.trim().to_ascii_lowercase();
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inner, port))
                if port.is_empty() || port.strip_prefix(':').is_some_and(port_ok) =>
            {
                return inner == "::1"
                    || allowed.iter().any(|a| a.trim_matches(['[', ']']) == inner);
            }
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port_ok(port) => name,
            Some(_) => return false,
            None => host.as_str(),
        }
    };
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    if let Ok(ip) = name.parse::<std::net::Ipv4Addr>() {
        if ip.is_loopback() {
            return true;
        }
    }
    allowed.iter().any(|a| a == name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http::{HeaderMap, HeaderValue, Uri, Version};

    fn hosts(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(http::header::HOST, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_rule_over_versions_targets_and_host_lines() {
        let path: Uri = "/v1/traces".parse().unwrap();
        let absolute: Uri = "http://127.0.0.1:4318/v1/traces".parse().unwrap();
        let refused = |v, u: &Uri, h: &[&str]| refused_host(v, u, &hosts(h), &[]);
        // Healthy: a loopback Host on HTTP/1.1; HTTP/2 whose Host repeats :authority (any
        // case); HTTP/1.0 naming no host at all.
        assert_eq!(refused(Version::HTTP_11, &path, &["127.0.0.1:4318"]), None);
        assert_eq!(
            refused(Version::HTTP_2, &absolute, &["127.0.0.1:4318"]),
            None
        );
        assert_eq!(refused(Version::HTTP_2, &absolute, &[]), None);
        assert_eq!(refused(Version::HTTP_10, &path, &[]), None);
        // An absolute-form HTTP/1.1 target overrides Host (RFC 9112 §3.2.2).
        assert_eq!(
            refused(Version::HTTP_11, &absolute, &["evil.example"]),
            None
        );
        // Refused: HTTP/1.1 without Host, HTTP/1.0 naming a foreign one, two Host lines,
        // and an HTTP/2 Host that differs from :authority (RFC 9113 §8.3.1).
        assert_eq!(refused(Version::HTTP_11, &path, &[]), Some(String::new()));
        assert_eq!(
            refused(Version::HTTP_10, &path, &["evil.example"]),
            Some("evil.example".into())
        );
        assert_eq!(
            refused(Version::HTTP_11, &path, &["127.0.0.1", "evil.example"]),
            Some("127.0.0.1, evil.example".into())
        );
        assert_eq!(
            refused(Version::HTTP_2, &absolute, &["evil.example"]),
            Some("127.0.0.1:4318, evil.example".into())
        );
        assert_eq!(
            request_host(Version::HTTP_2, &absolute, &hosts(&["127.0.0.1:4318"])),
            "127.0.0.1:4318"
        );
    }
}
