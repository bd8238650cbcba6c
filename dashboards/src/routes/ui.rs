//! The embedded web UI (plain HTML, CSS and JS from `dashboards/ui/`, compiled into the
//! binary with `include_str!`: no Node build) and the OpenAPI document.

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::DashboardError;

/// The OpenAPI 3 document of the JSON API (hand-maintained; a test checks every routed
/// path appears in it).
pub const OPENAPI: &str = include_str!("../openapi.json");

const INDEX_HTML: &str = include_str!("../../ui/index.html");
const APP_JS: &str = include_str!("../../ui/app.js");
const APP_CSS: &str = include_str!("../../ui/app.css");
const FORENSICS_JS: &str = include_str!("../../ui/forensics.js");
const TRACEVIEW_JS: &str = include_str!("../../ui/traceview.js");
const READBACK_JS: &str = include_str!("../../ui/readback.js");
/// uPlot 1.6.32 (<https://github.com/leeoniya/uPlot>, MIT), vendored unchanged from the npm
/// package's `dist/`: the Metrics page's charts. No CDN: the CSP stays `'self'`.
const UPLOT_JS: &str = include_str!("../../ui/vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../ui/vendor/uPlot.min.css");
/// uPlot's MIT licence, served beside it as its terms ask.
const UPLOT_LICENSE: &str = include_str!("../../ui/vendor/uPlot.LICENSE");

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'";

fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

/// `GET /` → the single-page UI.
pub(crate) async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /ui/{file}` → `app.js`, `traceview.js`, `readback.js`, `forensics.js` (the
/// stall-forensics panel), `app.css`, or the vendored uPlot (`uPlot.iife.min.js`,
/// `uPlot.min.css`, `uPlot.LICENSE`).
pub(crate) async fn asset(Path(file): Path<String>) -> Result<Response, DashboardError> {
    match file.as_str() {
        "app.js" => Ok(page("text/javascript; charset=utf-8", APP_JS)),
        "app.css" => Ok(page("text/css; charset=utf-8", APP_CSS)),
        "forensics.js" => Ok(page("text/javascript; charset=utf-8", FORENSICS_JS)),
        "traceview.js" => Ok(page("text/javascript; charset=utf-8", TRACEVIEW_JS)),
        "readback.js" => Ok(page("text/javascript; charset=utf-8", READBACK_JS)),
        "uPlot.iife.min.js" => Ok(page("text/javascript; charset=utf-8", UPLOT_JS)),
        "uPlot.min.css" => Ok(page("text/css; charset=utf-8", UPLOT_CSS)),
        "uPlot.LICENSE" => Ok(page("text/plain; charset=utf-8", UPLOT_LICENSE)),
        _ => Err(DashboardError::NotFound(format!("no UI file {file:?}"))),
    }
}

/// `GET /api/v1/openapi.json`.
pub(crate) async fn openapi() -> Response {
    page("application/json", OPENAPI)
}
