//! The dashboard's one error type, and how it is answered over HTTP.
//!
//! Every handler returns [`DashboardError`]; its `IntoResponse` renders the API error shape
//! `{"error": {"code", "message"}}` (docs/design.md, Read API JSON) with the matching status. Storage
//! failures are logged once here and shown to clients only as `internal`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use stallwatch_storage::control::{CheckpointError, RegisterError, RunnerError};
use stallwatch_storage::telemetry::{LogQueryError, QueryError};
use stallwatch_storage::StorageError;

/// What a dashboard operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The configuration is invalid; the message names the key.
    #[error("invalid dashboard config: {0}")]
    Config(String),
    /// A request parameter or body is invalid (HTTP 400); `code` is machine-readable.
    #[error("{message}")]
    BadRequest {
        /// Machine-readable code, e.g. `invalid_parameter`.
        code: &'static str,
        /// What was wrong, naming the parameter.
        message: String,
    },
    /// The thing asked for does not exist (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// The bearer token is missing or wrong (HTTP 401); nothing was done.
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// The `Host` header is not a loopback or configured name (HTTP 421, DNS rebinding).
    #[error("{}", stallwatch_storage::hosts::refusal_message(.0))]
    ForbiddenHost(String),
    /// A request body is over its endpoint's limit (HTTP 413); the message names the limit.
    #[error("request body is over the {limit}-byte limit of this endpoint")]
    BodyTooLarge {
        /// The limit, bytes ([`crate::MAX_CONTROL_BODY_BYTES`] for control requests,
        /// `MAX_MCP_BODY_BYTES` for `/mcp`).
        limit: usize,
    },
    /// A request body arrived slower than the listener's `body_min_bytes_per_s` and was
    /// cut (HTTP 408, code `body_too_slow`); the message names the rule
    /// (`stallwatch_storage::listen`, "Minimum body rate").
    #[error("{0}")]
    BodyTooSlow(stallwatch_storage::listen::TooSlow),
    /// Request framing hyper lets through ([`stallwatch_storage::listen::FramingFault`]):
    /// a transfer coding other than chunked (HTTP 501, code `unsupported_transfer_coding`)
    /// or several content types (HTTP 400, code `invalid_content_type`).
    #[error("{0}")]
    Framing(stallwatch_storage::listen::FramingFault),
    /// A request body in a content coding (the coding) on a route that reads its body as
    /// sent: HTTP 415, code `unsupported_encoding`, `Accept-Encoding: identity`
    /// (RFC 9110 §15.5.16).
    #[error("Content-Encoding {0:?} is not taken here: send the JSON body uncompressed")]
    UnsupportedEncoding(String),
    /// The reaper refused to register a runner.
    #[error("{0}")]
    Register(#[from] RegisterError),
    /// A request about one runner failed (it is not registered).
    #[error("{0}")]
    Runner(#[from] RunnerError),
    /// A checkpoint request failed.
    #[error("{0}")]
    Checkpoint(#[from] CheckpointError),
    /// Nothing is listening for control requests (stallwatch is shutting down): HTTP 503.
    #[error("control channel closed")]
    ControlUnavailable,
    /// Every event-stream permit is taken (HTTP 503 + `Retry-After`; code
    /// `too_many_streams`).
    #[error("{limit} event streams are open, the most this listener serves at once (three quarters of its max_connections): close one, or retry later")]
    TooManyStreams {
        /// The cap: three quarters of the listener's `max_connections`.
        limit: usize,
    },
    /// The storage failed (HTTP 500; 503 when full).
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// A socket failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl From<QueryError> for DashboardError {
    fn from(e: QueryError) -> Self {
        match e {
            QueryError::BadCursor => DashboardError::BadRequest {
                code: "invalid_cursor",
                message: "invalid cursor".into(),
            },
            QueryError::NeedsTimeRange(key) => DashboardError::BadRequest {
                code: "needs_time_range",
                message: format!(
                    "attribute key {key:?} is not indexed: give start_unix_nano and end_unix_nano"
                ),
            },
            QueryError::Storage(s) => DashboardError::Storage(s),
        }
    }
}

impl From<LogQueryError> for DashboardError {
    fn from(e: LogQueryError) -> Self {
        match e {
            LogQueryError::BadCursor => DashboardError::BadRequest {
                code: "invalid_cursor",
                message: "invalid cursor".into(),
            },
            LogQueryError::Storage(s) => DashboardError::Storage(s),
        }
    }
}

impl DashboardError {
    /// Shorthand for an `invalid_parameter` 400.
    pub fn bad_param(message: impl Into<String>) -> Self {
        DashboardError::BadRequest {
            code: "invalid_parameter",
            message: message.into(),
        }
    }
}

// The one table from domain errors to the wire: HTTP status and machine code. No crate
// below dashboards knows an HTTP status (ARCHITECTURE.md); the message is the error's own
// `Display`, which names the runner, path or field.

/// `POST /api/v1/runners` refusals.
fn register_wire(e: &RegisterError) -> (StatusCode, &'static str) {
    match e {
        RegisterError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_runner"),
        RegisterError::IdInUse(_) => (StatusCode::CONFLICT, "runner_exists"),
        RegisterError::Gone(_) => (StatusCode::CONFLICT, "runner_gone"),
        RegisterError::SpawnFailed(_) => (StatusCode::BAD_REQUEST, "spawn_failed"),
        RegisterError::TooMany(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_runners"),
        RegisterError::SocketDir(_) => (StatusCode::INTERNAL_SERVER_ERROR, "socket_dir"),
        RegisterError::Checkpoint(c) => checkpoint_wire(c),
        RegisterError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        RegisterError::Unsupported(_) => (StatusCode::NOT_IMPLEMENTED, "unsupported_platform"),
    }
}

/// `DELETE /api/v1/runners/{id}` and breaker reset refusals.
fn runner_wire(e: &RunnerError) -> (StatusCode, &'static str) {
    match e {
        RunnerError::NotFound(_) => (StatusCode::NOT_FOUND, "runner_not_found"),
    }
}

/// Checkpoint refusals (`docs/design.md`, Checkpoints): 422 only for a staged file that
/// fails its format check, 409 for state conflicts.
fn checkpoint_wire(e: &CheckpointError) -> (StatusCode, &'static str) {
    match e {
        CheckpointError::InvalidWorkspace(_) => (StatusCode::BAD_REQUEST, "invalid_workspace"),
        CheckpointError::PathEscape(_) => (StatusCode::BAD_REQUEST, "path_escape"),
        CheckpointError::NotAFile(_) => (StatusCode::BAD_REQUEST, "invalid_file"),
        CheckpointError::Validation { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_file"),
        CheckpointError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
        CheckpointError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        CheckpointError::NotOpen(_) => (StatusCode::CONFLICT, "not_open"),
        CheckpointError::NotCommitting(_) => (StatusCode::CONFLICT, "not_committing"),
        CheckpointError::RunnerNotFound(_) => (StatusCode::NOT_FOUND, "runner_not_found"),
        CheckpointError::Io(_) => (StatusCode::SERVICE_UNAVAILABLE, "io"),
        CheckpointError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

/// Renders `{"error":{"code","message"}}`.
pub(crate) fn error_body(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"error": {"code": code, "message": message}})
}

impl IntoResponse for DashboardError {
    fn into_response(self) -> Response {
        let (status, code, message) = match &self {
            DashboardError::BadRequest { code, message } => (
                StatusCode::BAD_REQUEST,
                (*code).to_string(),
                message.clone(),
            ),
            DashboardError::NotFound(m) => (StatusCode::NOT_FOUND, "not_found".into(), m.clone()),
            DashboardError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized".into(),
                self.to_string(),
            ),
            DashboardError::ForbiddenHost(_) => (
                StatusCode::MISDIRECTED_REQUEST,
                "host_not_allowed".into(),
                self.to_string(),
            ),
            DashboardError::BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large".into(),
                self.to_string(),
            ),
            DashboardError::Framing(f) => {
                use stallwatch_storage::listen::FramingFault;
                let (status, code) = match f {
                    FramingFault::TransferCoding(_) => {
                        (StatusCode::NOT_IMPLEMENTED, "unsupported_transfer_coding")
                    }
                    FramingFault::ContentTypes(_) => {
                        (StatusCode::BAD_REQUEST, "invalid_content_type")
                    }
                };
                (status, code.into(), self.to_string())
            }
            DashboardError::UnsupportedEncoding(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_encoding".into(),
                self.to_string(),
            ),
            DashboardError::BodyTooSlow(_) => (
                StatusCode::REQUEST_TIMEOUT,
                "body_too_slow".into(),
                self.to_string(),
            ),
            DashboardError::Register(e) => {
                let (status, code) = register_wire(e);
                (status, code.into(), e.to_string())
            }
            DashboardError::Runner(e) => {
                let (status, code) = runner_wire(e);
                (status, code.into(), e.to_string())
            }
            DashboardError::Checkpoint(e) => {
                let (status, code) = checkpoint_wire(e);
                (status, code.into(), e.to_string())
            }
            DashboardError::TooManyStreams { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_streams".into(),
                self.to_string(),
            ),
            DashboardError::ControlUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "control_unavailable".into(),
                self.to_string(),
            ),
            DashboardError::Storage(e) if e.is_full() => {
                tracing::warn!("dashboard request failed: {e}");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage_full".into(),
                    "storage is full".into(),
                )
            }
            DashboardError::Storage(_) | DashboardError::Io(_) | DashboardError::Config(_) => {
                tracing::error!("dashboard request failed: {self}");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal".into(),
                    "internal error (see stallwatch's log)".into(),
                )
            }
        };
        let mut resp = (status, axum::Json(error_body(&code, &message))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
            resp.headers_mut().insert(
                http::header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
        resp
    }
}
