//! Errors of `[forward]`: a config key that is wrong, or the storage under the queue.

use stallwatch_storage::StorageError;

/// What starting or running the forwarder can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// A `[forward]` key is missing or invalid; the operator fixes the config file.
    #[error("[forward] {key}: {message}")]
    Config {
        /// The key, e.g. `endpoint`.
        key: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The HTTP client could not be built (TLS or resolver set-up).
    #[error("cannot build the upstream client: {0}")]
    Client(String),
    /// Reading the queue or moving the cursor failed.
    #[error("forward queue: {0}")]
    Storage(#[from] StorageError),
}
