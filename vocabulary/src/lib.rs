//! stallwatch's vocabulary: the words every stage shares, and nothing that touches a disk,
//! a socket or SQL.
//!
//! - [`model`]: the records (spans, logs, metric points mirroring the OTLP data model;
//!   incidents and their event names);
//! - [`control`]: the messages between stages (observations, trips, runner lifecycle
//!   notices, control requests with their typed replies and errors, the runner board).
//! - [`keys`]: why a runner is stopped ([`keys::StopCause`]) and the one constructor of
//!   each incident idempotency key;
//! - [`labels`]: closed sets of label values (heartbeat labels) as enums whose `as_str()`
//!   is the wire string.
//! - [`MetricsSource`]: how a stage exposes its counters to `GET /metrics`.
//! - [`redact`]: text made safe to show ([`redact::redact_url`]: a URL without its
//!   password).
//! - [`task`]: spawning background tasks boxed ([`task::spawn_boxed`], binary size).
//!
//! `storage/` (the only crate that knows SQL) re-exports these modules under their old
//! paths (`stallwatch_storage::model`, `::control`), so the crate graph is
//! `vocabulary ← storage ← {collector, watchdog, reaper, dashboards} ← src`. The Rust client
//! (`stallwatch-client`) depends on this crate alone, which keeps SQLite out of apps.
//! Nothing here knows an HTTP status: the wire mapping lives in `dashboards/src/error.rs`.

pub mod control;
pub mod keys;
pub mod labels;
pub mod model;
pub mod prometheus;
pub mod redact;
pub mod task;

/// Something that renders its counters in the Prometheus text format for `GET /metrics`.
/// Metric names follow `stallwatch_<name>_<unit>_total` (STYLE, internal telemetry).
pub trait MetricsSource: Send + Sync {
    /// Appends `# HELP`/`# TYPE` lines and samples to `out`, written with [`prometheus`]
    /// (the one text-format writer).
    fn render_prometheus(&self, out: &mut String);
}
