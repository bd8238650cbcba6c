//! The route catalogue: every path the dashboard answers, in one flat list, so the OpenAPI
//! document can be checked against it ([`ROUTES`]). Handlers live in one module per
//! resource.

use axum::routing::{any, get, post};
use axum::Router;

use crate::state::Shared;

mod checkpoints;
mod control;
mod events;
mod health;
mod import;
mod incidents;
mod logs;
mod mcp;
mod metrics;
mod runners;
mod traces;
mod ui;

pub use control::MAX_CONTROL_BODY_BYTES;
pub use import::OtlpImport;

/// Every routed path under `/api/v1` (axum syntax), for the OpenAPI completeness test.
pub const ROUTES: &[&str] = &[
    "/api/v1/traces",
    "/api/v1/traces/{trace_id}",
    "/api/v1/traces/{trace_id}/spans/{span_id}",
    "/api/v1/traces/{trace_id}/otlp",
    "/api/v1/import/traces",
    "/api/v1/logs",
    "/api/v1/logs/stream",
    "/api/v1/metrics",
    "/api/v1/metrics/{name}/points",
    "/api/v1/open-spans",
    "/api/v1/services",
    "/api/v1/span-names",
    "/api/v1/runners",
    "/api/v1/runners/{id}",
    "/api/v1/runners/{id}/admit",
    "/api/v1/runners/{id}/breaker/reset",
    "/api/v1/breakers",
    "/api/v1/incidents",
    "/api/v1/incidents/{id}",
    "/api/v1/events",
    "/api/v1/checkpoints",
    "/api/v1/checkpoints/{id}/commit",
    "/api/v1/checkpoints/{id}/rollback",
    "/api/v1/webhooks/deliveries",
    "/api/v1/shutdown",
    "/api/v1/openapi.json",
];

/// The routes, without state or layers.
pub(crate) fn router() -> Router<Shared> {
    Router::new()
        .route("/", get(ui::index))
        .route("/ui/{file}", get(ui::asset))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/api/v1/openapi.json", get(ui::openapi))
        .route("/api/v1/traces", get(traces::search))
        .route("/api/v1/traces/{trace_id}", get(traces::trace))
        .route(
            "/api/v1/traces/{trace_id}/spans/{span_id}",
            get(traces::span),
        )
        .route("/api/v1/traces/{trace_id}/otlp", get(traces::otlp))
        .route("/api/v1/import/traces", post(import::traces))
        .route("/api/v1/logs", get(logs::search))
        .route("/api/v1/logs/stream", get(logs::stream))
        .route("/api/v1/metrics", get(metrics::list))
        .route("/api/v1/metrics/{name}/points", get(metrics::points))
        .route("/api/v1/open-spans", get(traces::open_spans))
        .route("/api/v1/services", get(traces::services))
        .route("/api/v1/span-names", get(traces::span_names))
        .route(
            "/api/v1/runners",
            get(runners::list).post(control::register_runner),
        )
        .route(
            "/api/v1/runners/{id}",
            get(runners::one).delete(control::delete_runner),
        )
        .route("/api/v1/runners/{id}/admit", get(runners::admit))
        .route(
            "/api/v1/runners/{id}/breaker/reset",
            post(control::reset_breaker),
        )
        .route("/api/v1/breakers", get(runners::breakers))
        .route("/api/v1/incidents", get(incidents::list))
        .route("/api/v1/incidents/{id}", get(incidents::one))
        .route("/api/v1/webhooks/deliveries", get(incidents::deliveries))
        .route("/api/v1/events", get(events::stream))
        .route(
            "/api/v1/checkpoints",
            get(checkpoints::list).post(control::create_checkpoint),
        )
        .route(
            "/api/v1/checkpoints/{id}/commit",
            post(control::commit_checkpoint),
        )
        .route(
            "/api/v1/checkpoints/{id}/rollback",
            post(control::rollback_checkpoint),
        )
        .route("/api/v1/shutdown", post(control::shutdown))
        .route("/mcp", any(mcp::handle))
}
