//! `POST /api/v1/import/traces`: an OTLP/JSON (or protobuf) `TracesData` file dropped on the
//! Traces page, stored through the very ingest path of `POST /v1/traces` (docs/design.md,
//! Read API, logs and metrics: the trace export is re-importable).
//!
//! The dashboard does not decode telemetry itself: `src/` hands it the collector's OTLP/HTTP
//! router as an [`OtlpImport`], and this handler replays the request on it as
//! `POST /v1/traces`. So the body limit (`[otlp] max_request_bytes`, 413), the in-flight
//! budget and storage faults (503 + `Retry-After`), decoding (400 naming the field), the
//! watchdog observation and the answer (`ExportTraceServiceResponse` with
//! `partialSuccess.rejectedSpans`) are those of `/v1/traces`, byte for byte.
//!
//! Who may import (docs/design.md, Security): a request with the dashboard's bearer token;
//! or, when no `[otlp] ingest_token` is set (so `/v1/traces` itself takes any loopback
//! client), the dashboard's own page: a browser request with `Sec-Fetch-Site: same-origin`
//! whose `Origin` is this `Host`. Browsers set both headers themselves, so a page of another
//! site cannot pass, and the collector's `Content-Type` rule (JSON or protobuf only) forces
//! a CORS preflight on any cross-origin script.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Uri};
use axum::response::Response;
use axum::Router;
use tower::ServiceExt;

use crate::error::DashboardError;
use crate::routes::control::constant_time_eq;
use crate::state::Shared;

/// The OTLP/HTTP ingest that `src/` lends the dashboard for imports.
#[derive(Clone)]
pub struct OtlpImport {
    /// The collector's OTLP/HTTP router (`stallwatch_collector::http_app`): it answers
    /// `POST /v1/traces`.
    pub router: Router,
    /// `[otlp] ingest_token`, sent on as `Authorization: Bearer` so the collector accepts
    /// what the dashboard has authorised; `None` when ingest is open.
    pub ingest_token: Option<String>,
}

/// True when the request carries the dashboard's bearer token.
fn has_token(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, t) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| t.trim())
        })
        .is_some_and(|t| !token.is_empty() && constant_time_eq(t.as_bytes(), token.as_bytes()))
}

/// True for the dashboard's own page: `Sec-Fetch-Site: same-origin` and an `Origin` whose
/// authority is the request's `Host` (Fetch Metadata, W3C; RFC 6454).
fn same_origin(headers: &HeaderMap) -> bool {
    let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    let (Some(site), Some(origin), Some(host)) =
        (get("sec-fetch-site"), get("origin"), get("host"))
    else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    site.eq_ignore_ascii_case("same-origin")
        && authority.is_some_and(|a| a.eq_ignore_ascii_case(host))
}

/// `POST /api/v1/import/traces` (see the module doc).
pub(crate) async fn traces(
    State(ctx): State<Shared>,
    _query: crate::params::NoQuery,
    req: Request,
) -> Result<Response, DashboardError> {
    let Some(import) = ctx.app.otlp_import.clone() else {
        return Err(DashboardError::NotFound(
            "trace import is not available: no OTLP ingest is wired to this dashboard".into(),
        ));
    };
    let (parts, body) = req.into_parts();
    let open_ingest = import.ingest_token.is_none();
    let allowed =
        has_token(&parts.headers, &ctx.app.token) || (open_ingest && same_origin(&parts.headers));
    if !allowed {
        tracing::warn!(
            "trace import refused: neither the bearer token nor (with open ingest) a same-origin page"
        );
        return Err(DashboardError::Unauthorized);
    }
    let mut fwd = Request::new(Body::new(body));
    *fwd.method_mut() = Method::POST;
    *fwd.uri_mut() = Uri::from_static("/v1/traces");
    // With its declared length, so a body too large is refused before it is read, as on
    // the OTLP listener.
    for name in [
        header::HOST,
        header::CONTENT_TYPE,
        header::CONTENT_ENCODING,
        header::CONTENT_LENGTH,
    ] {
        if let Some(v) = parts.headers.get(&name) {
            fwd.headers_mut().insert(name, v.clone());
        }
    }
    if let Some(t) = &import.ingest_token {
        let v = HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
            DashboardError::Config("[otlp] ingest_token is not a header value".into())
        })?;
        fwd.headers_mut().insert(header::AUTHORIZATION, v);
    }
    // `Router`'s error type is `Infallible`.
    let resp = match import.router.oneshot(fwd).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn same_origin_needs_fetch_metadata_and_a_matching_origin() {
        let ok = [
            ("sec-fetch-site", "same-origin"),
            ("origin", "http://127.0.0.1:4319"),
            ("host", "127.0.0.1:4319"),
        ];
        assert!(same_origin(&headers(&ok)));
        assert!(!same_origin(&headers(&ok[1..])), "no Sec-Fetch-Site");
        assert!(!same_origin(&headers(&[
            ("sec-fetch-site", "cross-site"),
            ok[1],
            ok[2]
        ])));
        assert!(!same_origin(&headers(&[
            ok[0],
            ("origin", "http://evil.example"),
            ok[2]
        ])));
        assert!(!same_origin(&headers(&[
            ok[0],
            ("origin", "http://127.0.0.1:4319.evil.example"),
            ok[2]
        ])));
        assert!(!same_origin(&headers(&[ok[0], ("origin", "null"), ok[2]])));
    }

    #[test]
    fn bearer_token_compared_whole() {
        let t = "ab".repeat(32);
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
        );
        assert!(has_token(&h, &t));
        assert!(!has_token(&h, &"cd".repeat(32)));
        assert!(!has_token(&HeaderMap::new(), &t));
        assert!(!has_token(&h, ""), "an empty token never matches");
    }
}
