//! The client's one error type: each variant names what an operator (or the Tauri backend)
//! should conclude, and [`error_from_answer`] maps stallwatch's HTTP error answers
//! (`{"error": {"code", "message"}}`, docs/design.md, Read API JSON) onto it.

use std::path::PathBuf;

/// Everything a client call or the sidecar launcher can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// stallwatch answered with an error status; `code` and `message` come from its
    /// `{"error":{"code","message"}}` body (`code` is `unknown` when the body had none).
    #[error("stallwatch answered {status} {code}: {message}")]
    Http {
        /// HTTP status.
        status: u16,
        /// Machine-readable code, e.g. `invalid_runner`, `storage_full`.
        code: String,
        /// Human message.
        message: String,
    },
    /// HTTP 401: the bearer token is missing or wrong; nothing was done. Read the token
    /// again from `<data_dir>/token` (docs/design.md, Security).
    #[error("stallwatch refused the bearer token (read it again from <data_dir>/token)")]
    Unauthorized,
    /// HTTP 409: a runner with this id is registered and alive; delete it first or pick
    /// another id (docs/design.md, Interfaces: Runners).
    #[error("conflict: {message}")]
    Conflict {
        /// Machine-readable code, e.g. `runner_exists`.
        code: String,
        /// Human message.
        message: String,
    },
    /// HTTP 404 for a runner-addressed call: stallwatch does not know this runner id;
    /// register it first.
    #[error("stallwatch does not know runner {0:?}")]
    UnknownRunner(String),
    /// A local I/O operation failed (starting the binary, reading the token file or
    /// `/proc/PID/stat`); `what` says which.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// stallwatch could not be reached (connection refused or reset): it is not running
    /// at that address, or it is shutting down.
    #[error("cannot reach stallwatch: {0}")]
    Transport(#[source] reqwest::Error),
    /// Something did not happen within its deadline; `what` says what and for how long.
    #[error("timed out: {what}")]
    Timeout {
        /// What was awaited, with the deadline.
        what: String,
    },
    /// The sidecar's stdout line is not the `ready` JSON line of docs/design.md, Interfaces: CLI.
    #[error("bad ready line ({reason}): {line}")]
    BadReadyLine {
        /// The line as read.
        line: String,
        /// What was wrong.
        reason: String,
    },
    /// The token file is not 64 hex characters (docs/design.md, Interfaces: Files).
    #[error("token file {0} is not 64 hex characters")]
    BadToken(PathBuf),
    /// An answer of stallwatch did not have the documented shape (a version mismatch
    /// between this client and the binary, most likely).
    #[error("cannot decode {what}: {reason}")]
    Decode {
        /// What was being decoded.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// The sidecar exited before printing its ready line; `stderr_tail` holds its last
    /// stderr lines when they were captured to a file.
    #[error("stallwatch exited before it was ready ({status}){stderr_tail}")]
    SidecarExited {
        /// Its exit status, as text.
        status: String,
        /// `":\n"` and the last stderr lines, or empty.
        stderr_tail: String,
    },
    /// A runner id does not match `^[a-z0-9][a-z0-9._-]{0,62}$`; nothing was sent.
    #[error("runner id {0:?} must match ^[a-z0-9][a-z0-9._-]{{0,62}}$")]
    InvalidRunnerId(String),
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn decode(what: impl Into<String>, reason: impl ToString) -> Self {
        Error::Decode {
            what: what.into(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn from_reqwest(e: reqwest::Error, what: &str) -> Self {
        if e.is_timeout() {
            Error::Timeout {
                what: format!("{what}: {e}"),
            }
        } else if e.is_decode() {
            Error::decode(what, e)
        } else {
            Error::Transport(e)
        }
    }
}

/// Maps an error answer to an [`Error`]. `status` is the HTTP status (≥ 400), `body` the
/// answer text, `runner` the runner id when the call addresses one (then 404 means
/// [`Error::UnknownRunner`]). Pure; used by every call of [`crate::Client`].
///
/// 401 → `Unauthorized`, 409 → `Conflict`, 404 with a runner → `UnknownRunner`, anything
/// else → `Http` with the body's code and message (`unknown` and the raw text when the body
/// is not the API error shape).
pub fn error_from_answer(status: u16, body: &str, runner: Option<&str>) -> Error {
    let (code, message) = match serde_json::from_str::<serde_json::Value>(body) {
        Ok(v) => {
            let e = &v["error"];
            match (e["code"].as_str(), e["message"].as_str()) {
                (Some(c), m) => (c.to_string(), m.unwrap_or_default().to_string()),
                (None, Some(m)) => ("unknown".to_string(), m.to_string()),
                (None, None) => ("unknown".to_string(), body.trim().to_string()),
            }
        }
        Err(_) => ("unknown".to_string(), body.trim().to_string()),
    };
    match (status, runner) {
        (401, _) => Error::Unauthorized,
        (409, _) => Error::Conflict { code, message },
        (404, Some(id)) => Error::UnknownRunner(id.to_string()),
        _ => Error::Http {
            status,
            code,
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_error_body_gives_code_and_message() {
        let body = r#"{"error":{"code":"invalid_runner","message":"give exactly one of spawn and attach"}}"#;
        match error_from_answer(400, body, None) {
            Error::Http {
                status,
                code,
                message,
            } => {
                assert_eq!(status, 400);
                assert_eq!(code, "invalid_runner");
                assert_eq!(message, "give exactly one of spawn and attach");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn statuses_with_a_meaning_get_their_variant() {
        let body = r#"{"error":{"code":"unauthorized","message":"missing or wrong bearer token"}}"#;
        assert!(matches!(
            error_from_answer(401, body, Some("r1")),
            Error::Unauthorized
        ));
        let body = r#"{"error":{"code":"runner_exists","message":"runner r1 is alive"}}"#;
        match error_from_answer(409, body, Some("r1")) {
            Error::Conflict { code, message } => {
                assert_eq!(code, "runner_exists");
                assert_eq!(message, "runner r1 is alive");
            }
            other => panic!("{other:?}"),
        }
        let body = r#"{"error":{"code":"not_found","message":"runner \"r1\" not found"}}"#;
        match error_from_answer(404, body, Some("r1")) {
            Error::UnknownRunner(id) => assert_eq!(id, "r1"),
            other => panic!("{other:?}"),
        }
        // A 404 of a call that does not address a runner stays generic.
        assert!(matches!(
            error_from_answer(404, body, None),
            Error::Http { status: 404, .. }
        ));
    }

    #[test]
    fn a_body_that_is_not_the_api_shape_is_kept_as_the_message() {
        match error_from_answer(502, "bad gateway\n", None) {
            Error::Http {
                status,
                code,
                message,
            } => {
                assert_eq!(
                    (status, code.as_str(), message.as_str()),
                    (502, "unknown", "bad gateway")
                );
            }
            other => panic!("{other:?}"),
        }
        match error_from_answer(500, r#"{"message":"boom"}"#, None) {
            Error::Http { code, message, .. } => {
                assert_eq!(
                    (code.as_str(), message.as_str()),
                    ("unknown", r#"{"message":"boom"}"#)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn messages_are_lowercase_without_trailing_period() {
        let all = [
            Error::Unauthorized,
            Error::UnknownRunner("x".into()),
            Error::Timeout { what: "x".into() },
            Error::BadToken("/t".into()),
            Error::InvalidRunnerId("X".into()),
        ];
        for e in all {
            let s = e.to_string();
            assert!(s.starts_with(|c: char| c.is_lowercase()), "{s}");
            assert!(!s.ends_with('.'), "{s}");
        }
    }
}
