//! The control endpoints (docs/design.md, Control endpoints; Security): each needs
//! `Authorization: Bearer <token>` (compared in constant time), validates its input, sends
//! one [`ControlRequest`] to the reaper or watchdog, and answers from its reply. A missing or
//! wrong token answers 401 before anything is parsed or sent.

use std::path::PathBuf;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde::Serialize;
use serde_json::json;
use stallwatch_storage::control::{valid_runner_id, ControlRequest, Reply, RunnerSpec};
use tokio::sync::oneshot;

use crate::error::DashboardError;
use crate::params::NoQuery;
use crate::state::Shared;

/// Compares two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Proof that the request carried the right bearer token. Put it first among a handler's
/// extractors so a bad token is answered before the body is read.
pub(crate) struct Authorized;

impl FromRequestParts<Shared> for Authorized {
    type Rejection = DashboardError;

    async fn from_request_parts(parts: &mut Parts, ctx: &Shared) -> Result<Self, Self::Rejection> {
        let given = parts
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            });
        let expected = ctx.app.token.as_bytes();
        match given {
            Some(t) if !expected.is_empty() && constant_time_eq(t.as_bytes(), expected) => {
                Ok(Authorized)
            }
            _ => {
                tracing::warn!(path = %parts.uri.path(), "control request refused: missing or wrong bearer token");
                Err(DashboardError::Unauthorized)
            }
        }
    }
}

/// Largest control request body, bytes: 2 MiB (axum's default body limit, named here so
/// the 413 answer can say it). Applied to the whole router in [`crate::app()`].
pub const MAX_CONTROL_BODY_BYTES: usize = 2 * 1024 * 1024;

/// The body as `T`. Over [`MAX_CONTROL_BODY_BYTES`]: 413 naming the limit. Cut by the
/// listener's minimum body rate: 408 `body_too_slow` naming the rule. Not a JSON
/// object: 400 saying what object was expected (`expected`, e.g. `a runner {"id", ...}`),
/// not serde's Rust type name. Otherwise serde's message after the field's path
/// (`attach.pid: ...`), its Rust type names said in JSON's words ([`plain_serde_message`]).
fn json_body<T: serde::de::DeserializeOwned>(
    body: Result<Json<serde_json::Value>, JsonRejection>,
    expected: &str,
) -> Result<T, DashboardError> {
    let bad = |message: String| DashboardError::BadRequest {
        code: "invalid_body",
        message,
    };
    let value = match body {
        Ok(Json(v)) => v,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(DashboardError::BodyTooLarge {
                limit: MAX_CONTROL_BODY_BYTES,
            })
        }
        Err(e) => {
            return Err(match stallwatch_storage::listen::too_slow(&e) {
                Some(t) => DashboardError::BodyTooSlow(t.clone()),
                None => bad(e.body_text()),
            })
        }
    };
    let kind = match &value {
        serde_json::Value::Object(_) => {
            return serde_path_to_error::deserialize(value).map_err(|e| {
                let path = e.path().to_string();
                let why = plain_serde_message(&e.into_inner().to_string());
                bad(if path == "." {
                    why
                } else {
                    format!("{path}: {why}")
                })
            })
        }
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Null => "null",
    };
    Err(bad(format!(
        "the body must be a JSON object, {expected}; got {kind}"
    )))
}

/// serde's message with its Rust type names in JSON's words: `expected u32` → `expected
/// an integer from 0 to 4294967295`, `expected struct AttachSpec` → `expected an object`,
/// `expected enum X` → `expected one of its documented values`.
fn plain_serde_message(msg: &str) -> String {
    const INTS: [(&str, &str); 10] = [
        ("u8", "an integer from 0 to 255"),
        ("u16", "an integer from 0 to 65535"),
        ("u32", "an integer from 0 to 4294967295"),
        ("u64", "an integer from 0 to 18446744073709551615"),
        ("usize", "a non-negative integer"),
        ("i32", "an integer from -2147483648 to 2147483647"),
        (
            "i64",
            "an integer from -9223372036854775808 to 9223372036854775807",
        ),
        ("isize", "an integer"),
        ("f64", "a number"),
        ("f32", "a number"),
    ];
    let mut out = msg.to_string();
    for (rust, json) in INTS {
        let from = format!("expected {rust}");
        // only the whole word (`expected u32`, not `expected u32s`)
        let mut at = 0;
        while let Some(i) = out[at..].find(&from).map(|i| i + at) {
            let end = i + from.len();
            if out[end..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                at = end;
                continue;
            }
            out.replace_range(i..end, &format!("expected {json}"));
            at = i;
        }
    }
    for (kw, json) in [
        ("expected struct ", "expected an object"),
        ("expected enum ", "expected one of its documented values"),
    ] {
        while let Some(i) = out.find(kw) {
            let name_end = out[i + kw.len()..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(out.len(), |j| i + kw.len() + j);
            out.replace_range(i..name_end, json);
        }
    }
    out
}

fn check_runner_id(id: &str) -> Result<(), DashboardError> {
    if valid_runner_id(id) {
        Ok(())
    } else {
        Err(DashboardError::BadRequest {
            code: "invalid_runner_id",
            message: format!("runner id {id:?} must match ^[a-z0-9][a-z0-9._-]{{0,62}}$"),
        })
    }
}

fn check_checkpoint_id(id: &str) -> Result<(), DashboardError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(DashboardError::BadRequest {
            code: "invalid_checkpoint_id",
            message: format!(
                "checkpoint id {id:?} must be 1 to 128 of [A-Za-z0-9._-], not starting with '.'"
            ),
        })
    }
}

/// Sends a request built around a fresh reply channel and answers from the reply.
async fn ask<T: Serialize, E: Into<DashboardError>>(
    ctx: &Shared,
    ok_status: StatusCode,
    build: impl FnOnce(Reply<T, E>) -> ControlRequest,
) -> Result<Response, DashboardError> {
    let (tx, rx) = oneshot::channel();
    ctx.app
        .control
        .send(build(tx))
        .await
        .map_err(|_| DashboardError::ControlUnavailable)?;
    match rx.await {
        Ok(Ok(body)) => Ok((ok_status, Json(body)).into_response()),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(DashboardError::ControlUnavailable),
    }
}

/// `POST /api/v1/runners` (token), body = `RunnerSpec` JSON → 201 with the reaper's answer;
/// 409 when the same id is alive (from the reaper).
pub(crate) async fn register_runner(
    _auth: Authorized,
    _query: NoQuery,
    State(ctx): State<Shared>,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Response, DashboardError> {
    let spec: RunnerSpec = json_body(
        body,
        r#"a runner {"id": "...", "spawn": {"argv": [...]}} or {"id": "...", "attach": {"pid": N}}"#,
    )?;
    check_runner_id(&spec.id)?;
    match (&spec.spawn, &spec.attach) {
        (Some(s), None) if s.argv.is_empty() || s.argv[0].is_empty() => {
            return Err(DashboardError::BadRequest {
                code: "invalid_runner",
                message: "spawn.argv must name a program".into(),
            })
        }
        (Some(_), None) => {}
        (None, Some(a)) if a.pid <= 1 => {
            return Err(DashboardError::BadRequest {
                code: "invalid_runner",
                message: format!("attach.pid {} cannot be watched", a.pid),
            })
        }
        (None, Some(_)) => {}
        _ => {
            return Err(DashboardError::BadRequest {
                code: "invalid_runner",
                message: "give exactly one of spawn and attach".into(),
            })
        }
    }
    let id = spec.id.clone();
    let resp = ask(&ctx, StatusCode::CREATED, |reply| {
        ControlRequest::RegisterRunner { spec, reply }
    })
    .await?;
    if resp.status().is_success() {
        // Read-your-writes: the reaper answers once the runner is registered and the
        // watchdog told, but the watchdog adds it to the board on its own task. Wait (at
        // most BOARD_SETTLE) until the board shows it, so a `GET /api/v1/runners/{id}` right
        // after this 201 finds the runner instead of a 404.
        let mut board = ctx.app.board.clone();
        let _ = tokio::time::timeout(BOARD_SETTLE, board.wait_for(|b| b.contains_key(&id))).await;
    }
    Ok(resp)
}

/// Longest a registration waits for the watchdog's board to show the new runner.
const BOARD_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// `DELETE /api/v1/runners/{id}` (token) → answers when termination is done.
pub(crate) async fn delete_runner(
    _auth: Authorized,
    _query: NoQuery,
    State(ctx): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DashboardError> {
    check_runner_id(&id)?;
    ask(&ctx, StatusCode::OK, |reply| ControlRequest::DeleteRunner {
        id,
        reply,
    })
    .await
}

/// `POST /api/v1/runners/{id}/breaker/reset` (token).
pub(crate) async fn reset_breaker(
    _auth: Authorized,
    _query: NoQuery,
    State(ctx): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DashboardError> {
    check_runner_id(&id)?;
    ask(&ctx, StatusCode::OK, |reply| ControlRequest::ResetBreaker {
        id,
        reply,
    })
    .await
}

/// Body of `POST /api/v1/checkpoints`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewCheckpoint {
    runner_id: String,
    workspace: PathBuf,
}

/// `POST /api/v1/checkpoints` (token), body `{"runner_id","workspace"}` → 201 `{"id","path"}`.
pub(crate) async fn create_checkpoint(
    _auth: Authorized,
    _query: NoQuery,
    State(ctx): State<Shared>,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Response, DashboardError> {
    let NewCheckpoint {
        runner_id,
        workspace,
    } = json_body(
        body,
        r#"a checkpoint request {"runner_id": "...", "workspace": "/absolute/path"}"#,
    )?;
    check_runner_id(&runner_id)?;
    if !workspace.is_absolute() {
        return Err(DashboardError::BadRequest {
            code: "invalid_workspace",
            message: format!("workspace {} must be an absolute path", workspace.display()),
        });
    }
    ask(&ctx, StatusCode::CREATED, |reply| {
        ControlRequest::CreateCheckpoint {
            runner_id,
            workspace,
            reply,
        }
    })
    .await
}

/// `POST /api/v1/checkpoints/{id}/commit` (token).
pub(crate) async fn commit_checkpoint(
    _auth: Authorized,
    _query: NoQuery,
    State(ctx): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DashboardError> {
    check_checkpoint_id(&id)?;
    ask(&ctx, StatusCode::OK, |reply| {
        ControlRequest::CommitCheckpoint { id, reply }
    })
    .await
}

/// `POST /api/v1/checkpoints/{id}/rollback` (token).
pub(crate) async fn rollback_checkpoint(
    _auth: Authorized,
    _query: NoQuery,
    State(ctx): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, DashboardError> {
    check_checkpoint_id(&id)?;
    ask(&ctx, StatusCode::OK, |reply| {
        ControlRequest::RollbackCheckpoint { id, reply }
    })
    .await
}

/// `POST /api/v1/shutdown` (token) → 202 `{"shutting_down":true}`; the ordered shutdown
/// follows.
pub(crate) async fn shutdown(
    _auth: Authorized,
    _query: NoQuery,
    State(ctx): State<Shared>,
) -> Result<Response, DashboardError> {
    ctx.app
        .control
        .send(ControlRequest::Shutdown)
        .await
        .map_err(|_| DashboardError::ControlUnavailable)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"shutting_down": true}))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_whole_strings() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn body_errors_name_the_field_in_json_words() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct AttachSpec {
            pid: u32,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Spec {
            attach: AttachSpec,
        }
        let err = |v: serde_json::Value| match json_body::<Spec>(Ok(Json(v)), "a spec") {
            Err(DashboardError::BadRequest { message, .. }) => message,
            other => panic!("{other:?}"),
        };
        let m = err(serde_json::json!({"attach": {"pid": -5}}));
        assert_eq!(
            m,
            "attach.pid: invalid value: integer `-5`, expected an integer from 0 to 4294967295"
        );
        let m = err(serde_json::json!({"attach": 5}));
        assert_eq!(m, "attach: invalid type: integer `5`, expected an object");
        let m = err(serde_json::json!({"attach": {"pid": 1, "uid": 2}}));
        assert_eq!(m, "attach.uid: unknown field `uid`, expected `pid`");
        assert_eq!(
            plain_serde_message("expected u32s, expected u8 or expected enum Mode"),
            "expected u32s, expected an integer from 0 to 255 or expected one of its documented values"
        );
    }
}
