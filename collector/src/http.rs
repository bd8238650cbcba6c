//! OTLP/HTTP: `POST /v1/traces`, `/v1/logs`, `/v1/metrics` (OTLP spec, "OTLP/HTTP").
//!
//! `application/x-protobuf` and `application/json` bodies; `Content-Encoding` gzip, x-gzip,
//! deflate, zstd or identity; the answer in the request's encoding (export response with
//! `partial_success`, or a `google.rpc.Status`); 400 / 401 / 403 / 405 / 413 / 415 / 503 as
//! the spec and docs/design.md say. CORS is a middleware around every route, so errors carry the
//! same CORS headers as successes.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::any;
use axum::Router;
use bytes::{Bytes, BytesMut};

use crate::decode::Format;
use crate::decompress::{parse_content_encoding, Coding};
use crate::ingest::{Accepted, IngestState, Refusal, Signal};
use crate::rpc;
use crate::stats::RefuseReason;

/// How long browsers may cache a preflight answer, seconds.
const PREFLIGHT_MAX_AGE_S: u32 = 7200;

/// The OTLP/HTTP router (no socket), for [`crate::Collector`] and in-process tests.
pub fn http_app(state: IngestState) -> Router {
    Router::new()
        .route("/v1/traces", any(traces))
        .route("/v1/logs", any(logs))
        .route("/v1/metrics", any(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), cors))
        .layer(middleware::from_fn_with_state(state.clone(), check_host))
        .with_state(state)
}

/// 421 Misdirected Request for a `Host` that is neither loopback nor configured (DNS
/// rebinding: a page on another site posting spans that could trip a runner), before CORS
/// and before the body is read; then the framing faults hyper lets through
/// ([`stallwatch_storage::listen::framing_fault`]: 501 for a transfer coding, 400 for
/// several content types).
async fn check_host(
    State(s): State<IngestState>,
    req: Request,
    next: middleware::Next,
) -> Response {
    match s.foreign_host(req.version(), req.uri(), req.headers()) {
        None => match stallwatch_storage::listen::framing_fault(req.headers()) {
            None => next.run(req).await,
            Some(fault) => {
                use stallwatch_storage::listen::FramingFault;
                s.inner.stats.refuse_request(RefuseReason::BadRequest);
                // gRPC codes in the OTLP Status: UNIMPLEMENTED, INVALID_ARGUMENT
                let (status, code) = match fault {
                    FramingFault::TransferCoding(_) => (StatusCode::NOT_IMPLEMENTED, 12),
                    FramingFault::ContentTypes(_) => (StatusCode::BAD_REQUEST, 3),
                };
                status_response(status, Format::Json, code, &fault.to_string(), None)
            }
        },
        Some(host) => {
            let format = media_format(req.headers()).unwrap_or(Format::Json);
            status_response(
                StatusCode::MISDIRECTED_REQUEST,
                format,
                7,
                &stallwatch_storage::hosts::refusal_message(&host),
                None,
            )
        }
    }
}

async fn traces(State(s): State<IngestState>, req: Request) -> Response {
    export(s, Signal::Traces, req).await
}
async fn logs(State(s): State<IngestState>, req: Request) -> Response {
    export(s, Signal::Logs, req).await
}
async fn metrics(State(s): State<IngestState>, req: Request) -> Response {
    export(s, Signal::Metrics, req).await
}

async fn not_found(State(s): State<IngestState>, req: Request) -> Response {
    s.inner.stats.refuse_request(RefuseReason::NotFound);
    let format = media_format(req.headers()).unwrap_or(Format::Json);
    status_response(
        StatusCode::NOT_FOUND,
        format,
        5,
        &format!(
            "no OTLP endpoint at {}: use /v1/traces, /v1/logs or /v1/metrics",
            req.uri().path()
        ),
        None,
    )
}

/// The body format named by `Content-Type`, or `None` for an absent or unknown type.
fn media_format(headers: &HeaderMap) -> Option<Format> {
    let ct = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = ct.split(';').next()?.trim().to_ascii_lowercase();
    match essence.as_str() {
        "application/x-protobuf" | "application/protobuf" => Some(Format::Protobuf),
        "application/json" => Some(Format::Json),
        _ => None,
    }
}

fn content_type(format: Format) -> HeaderValue {
    HeaderValue::from_static(match format {
        Format::Protobuf => "application/x-protobuf",
        Format::Json => "application/json",
    })
}

fn status_response(
    status: StatusCode,
    format: Format,
    code: i32,
    message: &str,
    retry_after_s: Option<u64>,
) -> Response {
    let body = rpc::encode_status(format, code, message, retry_after_s);
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, content_type(format));
    if let Some(s) = retry_after_s {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s.max(1)));
    }
    resp
}

/// The HTTP answer for a refusal: status, `google.rpc.Status` body in `format`, and
/// `Retry-After` (whole seconds, at least 1) for retryable ones.
pub(crate) fn refusal_response(format: Format, r: &Refusal) -> Response {
    let msg = r.message();
    let (status, code, retry) = match r {
        Refusal::BadRequest(_) | Refusal::TooSlow(_) => (StatusCode::BAD_REQUEST, 3, None),
        Refusal::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, 8, None),
        Refusal::UnsupportedMediaType(_) | Refusal::UnsupportedEncoding(_) => {
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, 3, None)
        }
        Refusal::Unauthenticated => (StatusCode::UNAUTHORIZED, 16, None),
        Refusal::Busy { retry_after_s, .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            14,
            Some((*retry_after_s).max(1)),
        ),
        Refusal::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, 13, None),
    };
    let mut resp = status_response(status, format, code, &msg, retry);
    if matches!(r, Refusal::Unauthenticated) {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if matches!(r, Refusal::UnsupportedEncoding(_)) {
        resp.headers_mut().insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip, x-gzip, deflate, zstd, identity"),
        );
    }
    resp
}

fn success_response(format: Format, signal: Signal, a: &Accepted) -> Response {
    let body = rpc::encode_export_response(format, signal, a.rejected, &a.message);
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, content_type(format));
    resp
}

async fn export(state: IngestState, signal: Signal, req: Request) -> Response {
    let received = Instant::now();
    let format = media_format(req.headers());
    let reply_format = format.unwrap_or(Format::Json);
    let refuse = |r: Refusal| {
        state.refused(&r);
        refusal_response(reply_format, &r)
    };
    if req.method() != Method::POST {
        state.inner.stats.refuse_request(RefuseReason::NotFound);
        let mut resp = status_response(
            StatusCode::METHOD_NOT_ALLOWED,
            reply_format,
            12,
            &format!(
                "method {} not allowed: OTLP/HTTP exports are POST",
                req.method()
            ),
            None,
        );
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return resp;
    }
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if !state.authorized(auth) {
        return refuse(Refusal::Unauthenticated);
    }
    let Some(format) = format else {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_else(|| "(none)".into());
        return refuse(Refusal::UnsupportedMediaType(format!(
            "unsupported Content-Type {ct}: use application/x-protobuf or application/json"
        )));
    };
    let codings: Vec<Coding> = match req.headers().get(header::CONTENT_ENCODING) {
        None => Vec::new(),
        Some(v) => match v
            .to_str()
            .map_err(|_| "(not text)".to_string())
            .and_then(parse_content_encoding)
        {
            Ok(c) => c,
            Err(name) => {
                return refuse(Refusal::UnsupportedEncoding(format!(
                    "unsupported Content-Encoding {name:?}: use gzip, deflate, zstd or identity"
                )))
            }
        },
    };
    let limit = state.inner.max_request_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared {
        if n > limit as u64 {
            return refuse(Refusal::TooLarge(format!(
                "request body of {n} bytes exceeds max_request_bytes ({limit})"
            )));
        }
    }
    let mut charge = state.inner.budget.charge();
    // Counted from here, body reading included: decoding in parts waits for free cores.
    let _in_pipeline = state.inner.decode_threads.enter();
    let reserved = declared.unwrap_or(0) as usize;
    if let Err(r) = charge.grow(reserved) {
        return refuse(r);
    }
    // An identity-coded body of a declared length: its decode-time memory is known now, so
    // a concurrent export that cannot be decoded is refused before its body is read.
    if codings.is_empty() && reserved > 0 {
        if let Err(r) = charge.grow_for_decode(reserved, signal, format) {
            return refuse(r);
        }
    }
    // Size-capped read of the (possibly compressed) body.
    let mut body = req.into_body();
    let mut buf = BytesMut::with_capacity(reserved.min(limit));
    loop {
        let next = match state.next_frame(&mut body).await {
            Ok(n) => n,
            Err(r) => return refuse(r),
        };
        match next {
            None => break,
            Some(Err(e)) => return refuse(Refusal::body_error("request body", &e)),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if buf.len() + data.len() > limit {
                    return refuse(Refusal::TooLarge(format!(
                        "request body exceeds max_request_bytes ({limit})"
                    )));
                }
                buf.extend_from_slice(&data);
                if buf.len() > charge.body_bytes() {
                    if let Err(r) = charge.grow(buf.len() - charge.body_bytes()) {
                        return refuse(r);
                    }
                }
            }
        }
    }
    let raw: Bytes = buf.freeze();
    state.inner.stats.request(false, raw.len());
    match state
        .process(signal, format, codings, raw, charge, received)
        .await
    {
        Ok(a) => success_response(format, signal, &a),
        Err(r) => refusal_response(format, &r),
    }
}

/// CORS (issue 2, Collector): preflights from allowed origins are answered here with the
/// requested headers allowed; other responses to allowed origins get the same headers;
/// requests from other origins get no CORS headers (preflight 403, request 403).
async fn cors(State(s): State<IngestState>, req: Request, next: Next) -> Response {
    let Some(origin) = req.headers().get(header::ORIGIN).cloned() else {
        return next.run(req).await;
    };
    let allowed = origin.to_str().ok().is_some_and(|o| s.inner.cors.allows(o));
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut resp = if !allowed {
        s.inner.stats.refuse_request(RefuseReason::ForbiddenOrigin);
        let format = media_format(req.headers()).unwrap_or(Format::Json);
        let mut r = status_response(
            StatusCode::FORBIDDEN,
            format,
            7,
            "origin not allowed by cors_allowed_origins",
            None,
        );
        r.headers_mut()
            .append(header::VARY, HeaderValue::from_static("Origin"));
        return r;
    } else if preflight {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NO_CONTENT;
        let h = r.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("POST, OPTIONS"),
        );
        if let Some(asked) = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
            if valid_header_list(asked) {
                h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
            }
        }
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from(PREFLIGHT_MAX_AGE_S),
        );
        // Private Network Access (WICG "Private Network Access", CORS-preflight section): a
        // public page's preflight to a loopback address asks for this; only allowed origins
        // get the yes.
        let pna = req
            .headers()
            .get("access-control-request-private-network")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        if pna {
            h.insert(
                "access-control-allow-private-network",
                HeaderValue::from_static("true"),
            );
        }
        h.append(
            header::VARY,
            HeaderValue::from_static(
                "Access-Control-Request-Method, Access-Control-Request-Headers, Access-Control-Request-Private-Network",
            ),
        );
        r
    } else {
        let mut r = next.run(req).await;
        r.headers_mut().insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("Retry-After"),
        );
        r
    };
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    resp
}

/// True when `v` is a comma-separated list of header names (what a preflight may ask for).
fn valid_header_list(v: &HeaderValue) -> bool {
    v.to_str().is_ok_and(|s| {
        s.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .all(|n| header::HeaderName::from_bytes(n.as_bytes()).is_ok())
    })
}
