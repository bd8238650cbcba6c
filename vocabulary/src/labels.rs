//! Closed sets of label values that the board, the JSON API and `GET /metrics` share, as
//! enums instead of strings (issue 10: typed vocabulary). Each `as_str()` is the exact
//! string on the wire, and serde writes the same string, so JSON keys and metric label
//! values do not change.

use serde::{Deserialize, Serialize};

/// A runner's heartbeat as the board shows it (`heartbeat` in `GET /api/v1/runners`): a
/// state of the heartbeat rule, or the named reason the latest ping failed
/// (`docs/design.md`, Fusion and breakers; Interfaces: Heartbeat details). The failure
/// labels are also the `reason` label of `stallwatch_watchdog_heartbeats_failed_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeartbeatLabel {
    /// No heartbeat socket registered.
    NotConfigured,
    /// Registered recently; the first PONG is not due yet (start-up grace).
    Starting,
    /// A PONG arrived within the heartbeat timeout.
    Ok,
    /// No PONG for the heartbeat timeout.
    Lost,
    /// stallwatch's own fault hid the heartbeat: nothing is known, nothing trips.
    Unknown,
    /// The runner's process is gone.
    NotRunning,
    /// The socket path is over the 107 bytes a UNIX socket path holds: never connectable.
    PathTooLong,
    /// No socket file at the path.
    SocketMissing,
    /// A socket file nobody accepts on.
    ConnectionRefused,
    /// An answer other than `PONG` (`ERR export_stuck`, ...).
    BadAnswer,
    /// No complete answer within the heartbeat timeout.
    Timeout,
    /// Any other I/O error on the socket.
    IoError,
    /// The runner answered `BYE`: it is exiting on purpose.
    Goodbye,
    /// The ping could not be sent for a reason of stallwatch's own (`EMFILE`, ...).
    SidecarFault,
}

impl HeartbeatLabel {
    /// The failure labels, in the order of the `reason` label of
    /// `stallwatch_watchdog_heartbeats_failed_total`.
    pub const FAILURES: [HeartbeatLabel; 8] = [
        HeartbeatLabel::PathTooLong,
        HeartbeatLabel::SocketMissing,
        HeartbeatLabel::ConnectionRefused,
        HeartbeatLabel::BadAnswer,
        HeartbeatLabel::Timeout,
        HeartbeatLabel::IoError,
        HeartbeatLabel::Goodbye,
        HeartbeatLabel::SidecarFault,
    ];

    /// The wire string: `not_configured`, `starting`, `ok`, `lost`, `unknown`,
    /// `not_running`, `path_too_long`, `socket_missing`, `connection_refused`,
    /// `bad_answer`, `timeout`, `io_error`, `goodbye` or `sidecar_fault`.
    pub fn as_str(&self) -> &'static str {
        match self {
            HeartbeatLabel::NotConfigured => "not_configured",
            HeartbeatLabel::Starting => "starting",
            HeartbeatLabel::Ok => "ok",
            HeartbeatLabel::Lost => "lost",
            HeartbeatLabel::Unknown => "unknown",
            HeartbeatLabel::NotRunning => "not_running",
            HeartbeatLabel::PathTooLong => "path_too_long",
            HeartbeatLabel::SocketMissing => "socket_missing",
            HeartbeatLabel::ConnectionRefused => "connection_refused",
            HeartbeatLabel::BadAnswer => "bad_answer",
            HeartbeatLabel::Timeout => "timeout",
            HeartbeatLabel::IoError => "io_error",
            HeartbeatLabel::Goodbye => "goodbye",
            HeartbeatLabel::SidecarFault => "sidecar_fault",
        }
    }
}

/// Compares with a wire string, so code and tests written against the strings keep
/// reading `label == "ok"`.
impl PartialEq<&str> for HeartbeatLabel {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for HeartbeatLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [HeartbeatLabel; 14] = [
        HeartbeatLabel::NotConfigured,
        HeartbeatLabel::Starting,
        HeartbeatLabel::Ok,
        HeartbeatLabel::Lost,
        HeartbeatLabel::Unknown,
        HeartbeatLabel::NotRunning,
        HeartbeatLabel::PathTooLong,
        HeartbeatLabel::SocketMissing,
        HeartbeatLabel::ConnectionRefused,
        HeartbeatLabel::BadAnswer,
        HeartbeatLabel::Timeout,
        HeartbeatLabel::IoError,
        HeartbeatLabel::Goodbye,
        HeartbeatLabel::SidecarFault,
    ];

    /// The strings are the ones the board, the API and `/metrics` carried as raw strings
    /// before the enum; serde writes exactly `as_str()` and reads it back.
    #[test]
    fn heartbeat_labels_keep_their_wire_strings() {
        let want = [
            "not_configured",
            "starting",
            "ok",
            "lost",
            "unknown",
            "not_running",
            "path_too_long",
            "socket_missing",
            "connection_refused",
            "bad_answer",
            "timeout",
            "io_error",
            "goodbye",
            "sidecar_fault",
        ];
        for (l, w) in ALL.iter().zip(want) {
            assert_eq!(l.as_str(), w);
            assert!(*l == w);
            let json = serde_json::to_string(l).expect("serializes");
            assert_eq!(json, format!("\"{w}\""));
            let back: HeartbeatLabel = serde_json::from_str(&json).expect("deserializes");
            assert_eq!(back, *l);
        }
    }
}
