//! The collector's one error enum: what `bind` and `run` can return. Per-request failures
//! are answered on the wire (HTTP status / gRPC code) and never surface here.

use std::net::SocketAddr;

/// Errors of configuring, binding and serving the OTLP listeners.
#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    /// The configuration is invalid; the message names the field.
    #[error("invalid [otlp] config: {0}")]
    Config(String),
    /// A listener could not be bound (address in use, permission, bad address).
    #[error("cannot bind OTLP/{transport} listener on {addr}: {source}")]
    Bind {
        /// `grpc` or `http`.
        transport: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// A server stopped with an error while serving.
    #[error("OTLP/{transport} server failed: {message}")]
    Serve {
        /// `grpc` or `http`.
        transport: &'static str,
        /// What failed.
        message: String,
    },
}
