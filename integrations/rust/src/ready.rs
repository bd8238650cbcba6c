//! The `ready` line: when every listener is bound (port 0 allowed), `stallwatch serve`
//! prints one JSON line to stdout,
//! `{"event":"ready","otlp_grpc":ADDR,"otlp_http":ADDR,"dashboard":ADDR,"data_dir":PATH}`
//! (docs/design.md, Interfaces: CLI). It is how a client learns the ports and where the token is.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::error::{Error, Result};

/// The parsed `ready` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyLine {
    /// OTLP/gRPC listener (exporters: `OTEL_EXPORTER_OTLP_ENDPOINT=http://ADDR` with grpc).
    pub otlp_grpc: SocketAddr,
    /// OTLP/HTTP listener (`/v1/traces`, `/v1/logs`, `/v1/metrics`).
    pub otlp_http: SocketAddr,
    /// Dashboard, JSON API and control endpoints.
    pub dashboard: SocketAddr,
    /// The data folder (holds `token`).
    pub data_dir: PathBuf,
}

#[derive(Deserialize)]
struct Raw {
    event: String,
    otlp_grpc: String,
    otlp_http: String,
    dashboard: String,
    data_dir: PathBuf,
}

impl ReadyLine {
    /// Parses one stdout line. Errors with [`Error::BadReadyLine`] when it is not JSON, its
    /// `event` is not `ready`, a field is missing, or an address is not `IP:PORT`. Unknown
    /// extra fields are accepted (a newer binary may add some).
    pub fn parse(line: &str) -> Result<ReadyLine> {
        let bad = |reason: String| Error::BadReadyLine {
            line: line.to_string(),
            reason,
        };
        let raw: Raw = serde_json::from_str(line.trim()).map_err(|e| bad(e.to_string()))?;
        if raw.event != "ready" {
            return Err(bad(format!("event is {:?}, not \"ready\"", raw.event)));
        }
        let addr = |name: &str, v: &str| -> Result<SocketAddr> {
            v.parse()
                .map_err(|e| bad(format!("{name} {v:?} is not IP:PORT ({e})")))
        };
        Ok(ReadyLine {
            otlp_grpc: addr("otlp_grpc", &raw.otlp_grpc)?,
            otlp_http: addr("otlp_http", &raw.otlp_http)?,
            dashboard: addr("dashboard", &raw.dashboard)?,
            data_dir: raw.data_dir,
        })
    }

    /// `<data_dir>/token`.
    pub fn token_path(&self) -> PathBuf {
        self.data_dir.join("token")
    }

    /// `http://<otlp_http>`: the value of `OTEL_EXPORTER_OTLP_ENDPOINT` for exporters using
    /// `http/protobuf`.
    pub fn otlp_http_endpoint(&self) -> String {
        format!("http://{}", self.otlp_http)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"event":"ready","otlp_grpc":"127.0.0.1:40001","otlp_http":"127.0.0.1:40002","dashboard":"127.0.0.1:40003","data_dir":"/tmp/sw data"}"#;

    #[test]
    fn parses_the_documented_line() {
        let r = ReadyLine::parse(LINE).unwrap();
        assert_eq!(r.otlp_grpc, "127.0.0.1:40001".parse().unwrap());
        assert_eq!(r.otlp_http, "127.0.0.1:40002".parse().unwrap());
        assert_eq!(r.dashboard, "127.0.0.1:40003".parse().unwrap());
        assert_eq!(r.data_dir, PathBuf::from("/tmp/sw data"));
        assert_eq!(r.token_path(), PathBuf::from("/tmp/sw data/token"));
        assert_eq!(r.otlp_http_endpoint(), "http://127.0.0.1:40002");
    }

    #[test]
    fn accepts_trailing_newline_extra_fields_and_ipv6() {
        let line = r#"{"event":"ready","otlp_grpc":"[::1]:1","otlp_http":"[::1]:2","dashboard":"[::1]:3","data_dir":"/d","version":"9"}"#;
        let r = ReadyLine::parse(&format!("{line}\r\n")).unwrap();
        assert_eq!(r.dashboard, "[::1]:3".parse().unwrap());
    }

    #[test]
    fn refuses_what_is_not_a_ready_line() {
        let cases = [
            ("", "EOF"),
            ("stallwatch starting", "expected"),
            (
                r#"{"event":"stopping","otlp_grpc":"127.0.0.1:1","otlp_http":"127.0.0.1:2","dashboard":"127.0.0.1:3","data_dir":"/d"}"#,
                "not \"ready\"",
            ),
            (
                r#"{"event":"ready","otlp_grpc":"127.0.0.1:1","otlp_http":"127.0.0.1:2","data_dir":"/d"}"#,
                "missing field `dashboard`",
            ),
            (
                r#"{"event":"ready","otlp_grpc":"127.0.0.1:1","otlp_http":"localhost:2","dashboard":"127.0.0.1:3","data_dir":"/d"}"#,
                "otlp_http \"localhost:2\" is not IP:PORT",
            ),
        ];
        for (line, want) in cases {
            match ReadyLine::parse(line) {
                Err(Error::BadReadyLine { line: l, reason }) => {
                    assert_eq!(l, line);
                    assert!(reason.contains(want), "{reason:?} lacks {want:?}");
                }
                other => panic!("{line:?}: {other:?}"),
            }
        }
    }
}
