//! The HTTP application: [`app`] assembles every route with the safety layers (the `Host`
//! check against DNS rebinding, CORS for configured origins only, request counters), and
//! [`serve`] runs it on a listener until shutdown.
//!
//! `app` takes no socket, so tests drive it in-process as well as over a real listener.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use stallwatch_storage::listen::{self, ListenLimits, ListenerStats};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::config::DashboardConfig;
use crate::error::DashboardError;
use crate::metrics::HttpMetrics;
use crate::routes;
use crate::state::{AppState, Ctx, Shared, ShutdownSignal};

/// How long [`serve`] waits for open connections after shutdown before it stops anyway.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

/// The whole dashboard: web UI, JSON API, SSE, control endpoints, `/healthz`, `/readyz`,
/// `/metrics`. Every request first passes the `Host` check (421 for a name that is neither
/// loopback nor in `allowed_hosts`).
pub fn app(state: AppState) -> Router {
    let config = state.config.clone();
    let streams = crate::state::stream_cap(config.listen_limits.max_connections);
    let ctx: Shared = Arc::new(Ctx {
        app: state,
        http: Arc::new(HttpMetrics::default()),
        streams: Arc::new(tokio::sync::Semaphore::new(streams)),
    });
    let mut router = routes::router()
        .layer(axum::extract::DefaultBodyLimit::max(
            routes::MAX_CONTROL_BODY_BYTES,
        ))
        .route_layer(middleware::from_fn_with_state(ctx.clone(), count_requests))
        .fallback(not_found)
        .with_state(ctx);
    if let Some(cors) = cors_layer(&config) {
        router = router.layer(cors);
    }
    router
        .layer(middleware::from_fn(refuse_content_coding))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn_with_state(config, check_host))
}

/// Largest error body [`json_errors`] reads to wrap, bytes (axum's rejections are a line).
const MAX_WRAPPED_ERROR_BYTES: usize = 16 * 1024;

/// Every error answer in the documented shape, `{"error":{"code","message"}}`
/// (docs/design.md, "Read API JSON"), also those the routing layer writes itself: a path
/// segment that is not UTF-8 (axum's plain-text 400 `Invalid URL: …`, code `invalid_path`)
/// and a method a route does not take (an empty 405, code `method_not_allowed`, its
/// `Allow` header kept). Successes, and errors in any other media type, pass untouched.
async fn json_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let resp = next.run(req).await;
    let status = resp.status();
    // Only plain text or no body type: the routing layer's. (JSON is ours; the trace
    // import's OTLP refusals may be protobuf `google.rpc.Status`, kept as they are.)
    let plain = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_none_or(|v| v.as_bytes().starts_with(b"text/plain"));
    if !(status.is_client_error() || status.is_server_error()) || !plain {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, MAX_WRAPPED_ERROR_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let (code, message) = match status {
        axum::http::StatusCode::METHOD_NOT_ALLOWED => {
            let allow = parts
                .headers
                .get(axum::http::header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            (
                "method_not_allowed",
                format!("{method} is not allowed on {path}; allowed: {allow}"),
            )
        }
        axum::http::StatusCode::BAD_REQUEST if text.starts_with("Invalid URL") => {
            ("invalid_path", text)
        }
        s => (
            "error",
            if text.is_empty() {
                s.canonical_reason().unwrap_or("error").to_string()
            } else {
                text
            },
        ),
    };
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let body = crate::error::error_body(code, &message).to_string();
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// The framing faults hyper lets through ([`listen::framing_fault`]: 501
/// `unsupported_transfer_coding`, 400 `invalid_content_type`); then 415 for a request
/// body in a content coding other than `identity` on any route but the
/// trace import (which decodes gzip, deflate and zstd as OTLP/HTTP does): the control and
/// MCP routes read their JSON as sent, and a gzip body read as JSON was refused as
/// "expected value at line 1 column 1", naming the wrong fault (RFC 9110 §15.5.16: answer
/// 415 with the codings taken in `Accept-Encoding`).
async fn refuse_content_coding(req: Request, next: Next) -> Response {
    if let Some(fault) = listen::framing_fault(req.headers()) {
        return DashboardError::Framing(fault).into_response();
    }
    let coding = req
        .headers()
        .get_all(axum::http::header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"))
        .map(str::to_string);
    let Some(coding) = coding else {
        return next.run(req).await;
    };
    if req.uri().path() == "/api/v1/import/traces" {
        return next.run(req).await;
    }
    DashboardError::UnsupportedEncoding(coding).into_response()
}

/// Serves `app` on `listener` with the default connection limits; see [`serve_with`].
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_with(
        listener,
        app,
        ListenLimits::default(),
        ListenerStats::new("dashboard"),
        shutdown,
    )
    .await
}

/// Serves `app` on `listener` under `limits` (the shared connection loop,
/// `stallwatch_storage::listen`: SSE streams and `/mcp` count against `max_connections`)
/// until `shutdown` is cancelled, then waits at most [`SHUTDOWN_DEADLINE`] for open
/// connections (SSE streams end at once on `shutdown`).
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    limits: ListenLimits,
    stats: Arc<ListenerStats>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = app.layer(axum::Extension(ShutdownSignal(shutdown.clone())));
    let server = listen::serve(listener, app, limits, stats, shutdown.clone());
    tokio::select! {
        () = server => Ok(()),
        _ = async {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_DEADLINE).await;
        } => {
            tracing::warn!("dashboard connections still open after the shutdown deadline; closing");
            Ok(())
        }
    }
}

async fn not_found() -> DashboardError {
    DashboardError::NotFound("no such route".into())
}

async fn count_requests(State(ctx): State<Shared>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let resp = next.run(req).await;
    ctx.http.count(&route, resp.status().as_u16());
    resp
}

/// True for a `Host` header naming a loopback host or one of `allowed` (any port): the one
/// rule every listener shares.
pub use stallwatch_storage::hosts::host_allowed;

async fn check_host(
    State(config): State<Arc<DashboardConfig>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(host) = stallwatch_storage::hosts::refused_host(
        req.version(),
        req.uri(),
        req.headers(),
        &config.allowed_hosts,
    ) else {
        return next.run(req).await;
    };
    if !host.is_empty() {
        tracing::warn!(host = %host, "refused a request for a foreign Host (DNS rebinding guard)");
    }
    DashboardError::ForbiddenHost(host).into_response()
}

/// True when `origin` matches `pattern` exactly, or `pattern` ends in `:*` and `origin` is
/// the same scheme and host with any port (or none).
pub fn origin_matches(pattern: &str, origin: &str) -> bool {
    if pattern.eq_ignore_ascii_case(origin) {
        return true;
    }
    if let Some(base) = pattern.strip_suffix(":*") {
        if origin.len() >= base.len() && origin[..base.len()].eq_ignore_ascii_case(base) {
            let rest = &origin[base.len()..];
            return rest.is_empty()
                || (rest.len() > 1
                    && rest.starts_with(':')
                    && rest[1..].bytes().all(|b| b.is_ascii_digit()));
        }
    }
    false
}

fn cors_layer(config: &DashboardConfig) -> Option<CorsLayer> {
    if config.cors_allowed_origins.is_empty() {
        return None;
    }
    let patterns = config.cors_allowed_origins.clone();
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::predicate(
                move |origin: &HeaderValue, _parts| {
                    origin
                        .to_str()
                        .map(|o| patterns.iter().any(|p| origin_matches(p, o)))
                        .unwrap_or(false)
                },
            ))
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([
                http::header::AUTHORIZATION,
                http::header::CONTENT_TYPE,
                http::header::HeaderName::from_static("last-event-id"),
                // MCP Streamable HTTP: clients send it on every request after
                // `initialize` (MCP, Transports: Protocol Version Header)
                http::header::HeaderName::from_static("mcp-protocol-version"),
            ])
            .expose_headers([http::header::RETRY_AFTER])
            .max_age(Duration::from_secs(600)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_with_any_port() {
        for h in [
            "localhost",
            "localhost:4319",
            "127.0.0.1",
            "127.0.0.1:1",
            "[::1]",
            "[::1]:4319",
            "[::1]:65535",
            "LOCALHOST:80",
            "tauri.localhost",
        ] {
            assert!(host_allowed(h, &[]), "{h}");
        }
        for h in [
            "evil.com",
            "evil.com:4319",
            "127.0.0.1.evil.com",
            "[::2]:1",
            "localhost:x",
            "[::1]:evil",
            "[::1]:65536",
            "127.0.0.1:99999999999",
            "localhost:-1",
            "10.0.0.1",
            "",
        ] {
            assert!(!host_allowed(h, &[]), "{h}");
        }
        assert!(host_allowed("box.lan:4319", &["box.lan".into()]));
    }

    #[test]
    fn origin_port_wildcard() {
        assert!(origin_matches(
            "http://localhost:*",
            "http://localhost:1420"
        ));
        assert!(origin_matches("http://localhost:*", "http://localhost"));
        assert!(!origin_matches(
            "http://localhost:*",
            "http://localhost.evil.com"
        ));
        assert!(!origin_matches("http://localhost:*", "http://localhost:1x"));
        assert!(origin_matches("tauri://localhost", "tauri://localhost"));
    }
}
