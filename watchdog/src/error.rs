//! The watchdog's errors: what its configuration and its handle's operations can return,
//! each variant saying what the operator or caller should conclude.

use stallwatch_storage::StorageError;

/// Errors of the watchdog's configuration and handle.
#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    /// A `[watchdog]` key is invalid; `key` names it (and the rule index), e.g.
    /// `watchdog.sla_rule[2].tool`.
    #[error("invalid {key}: {message}")]
    Config {
        /// The offending key, dotted from the section.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// No runner with this id is registered with the watchdog (the API answers 404).
    #[error("unknown runner {0}")]
    UnknownRunner(String),
    /// The watchdog task has stopped (shutdown in progress); retry against a new instance.
    #[error("watchdog is stopped")]
    Stopped,
    /// Recording an incident or the ledger failed.
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
}
