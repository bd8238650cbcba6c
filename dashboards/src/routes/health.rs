//! `/healthz` (200 while serving), `/readyz` (200 once ready, else 503) and `/metrics`
//! (Prometheus text: every stage's counters, then the dashboard's own).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use stallwatch_storage::MetricsSource;

use crate::state::Shared;

/// `GET /healthz` → 200 `{"status":"ok"}`.
pub(crate) async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz` → 200 `{"ready":true,"degraded":null,"held_records":0}` or 503
/// `{"ready":false,...}`.
///
/// `degraded` is `{"condition": "busy"|"locked"|"io"|"full"|"gone", "detail": "..."}` while
/// storage is in a transient condition: stallwatch still watches and stops runners (so it
/// stays ready, 200) but refuses telemetry with 503 / `UNAVAILABLE`; `held_records` counts
/// control records waiting in memory for storage (docs/design.md, Durability levels).
pub(crate) async fn readyz(State(ctx): State<Shared>) -> Response {
    let ready = *ctx.app.ready.borrow();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let degraded = ctx
        .app
        .storage
        .condition()
        .map(|d| json!({"condition": d.kind.as_str(), "detail": d.detail}));
    let held = ctx.app.storage.held_len();
    (
        status,
        Json(json!({"ready": ready, "degraded": degraded, "held_records": held})),
    )
        .into_response()
}

/// `GET /metrics` → `text/plain; version=0.0.4`.
pub(crate) async fn metrics(State(ctx): State<Shared>) -> Response {
    let mut out = String::new();
    for m in &ctx.app.metrics {
        m.render_prometheus(&mut out);
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
    }
    ctx.http.render_prometheus(&mut out);
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}
