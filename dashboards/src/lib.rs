//! stallwatch dashboards: the outward face. The web UI (embedded, no build step), the JSON
//! read API (docs/design.md, Read API JSON), the incident stream over Server-Sent Events, the
//! token-protected control endpoints, `/healthz`, `/readyz`, `/metrics`, and the alert
//! webhook outbox worker.
//!
//! Wiring (`src/`): build an [`AppState`], call [`app`] and [`serve`] it on the dashboard
//! listener; call [`start_webhooks`] once with the same storage and event bus.

mod app;
pub mod config;
pub mod error;
mod json;
pub mod metrics;
mod otlp;
mod params;
mod routes;
mod state;
pub mod webhooks;
mod wire;

pub use app::{app, host_allowed, origin_matches, serve, serve_with, SHUTDOWN_DEADLINE};
pub use config::{
    redact_url, DashboardConfig, RawAlertsConfig, RawDashboardConfig, RawWebhookConfig,
    WebhookConfig,
};
pub use error::DashboardError;
pub use routes::{OtlpImport, MAX_CONTROL_BODY_BYTES, ROUTES};
pub use state::AppState;
pub use webhooks::start_webhooks;
