//! What `mcp wrap` can fail with before or instead of relaying.

/// Errors of the wrapper; each says what an operator should conclude.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The options are unusable (empty server command, bad runner id, ...).
    #[error("invalid option: {0}")]
    Config(String),
    /// The server command could not be started (not found, not executable).
    #[error("cannot start the MCP server {program:?}: {source}")]
    Spawn {
        /// `argv[0]`.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Standard input or output of the wrapper failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server kept failing: more restarts than the policy allows.
    #[error("the MCP server failed {restarts} times within {window_s} s; giving up")]
    GaveUp {
        /// Restarts counted in the window.
        restarts: usize,
        /// The window, seconds.
        window_s: u64,
        /// The server's last exit code (128 + signal when it was killed): the wrapper
        /// leaves with it.
        code: i32,
    },
}
