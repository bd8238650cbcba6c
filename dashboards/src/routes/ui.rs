//! The embedded web UI (plain HTML, CSS and JS from `dashboards/ui/`: no Node build) and
//! the OpenAPI document (`src/openapi.json`, hand-maintained; a test checks every routed
//! path appears in it).
//!
//! `build.rs` compresses each file with gzip and the binary holds only that (56 KB against
//! 192 KB of text; issue 16, binary size). A client whose `Accept-Encoding` takes gzip
//! (every browser) gets those bytes with `Content-Encoding: gzip`; any other gets them
//! inflated (RFC 9110 §12.5.3, §8.4).

use std::io::Read;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::error::DashboardError;

/// One embedded file: its media type and its gzip bytes (from `build.rs`).
struct Asset {
    content_type: &'static str,
    gzip: &'static [u8],
}

macro_rules! asset {
    ($content_type:expr, $file:literal) => {
        Asset {
            content_type: $content_type,
            gzip: include_bytes!(concat!(env!("OUT_DIR"), "/", $file, ".gz")),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

const OPENAPI: Asset = asset!("application/json", "openapi.json");
const INDEX_HTML: Asset = asset!("text/html; charset=utf-8", "index.html");
const APP_JS: Asset = asset!(JS, "app.js");
const APP_CSS: Asset = asset!(CSS, "app.css");
const FORENSICS_JS: Asset = asset!(JS, "forensics.js");
const TRACEVIEW_JS: Asset = asset!(JS, "traceview.js");
const READBACK_JS: Asset = asset!(JS, "readback.js");
/// uPlot 1.6.32 (<https://github.com/leeoniya/uPlot>, MIT), vendored unchanged from the npm
/// package's `dist/`: the Metrics page's charts. No CDN: the CSP stays `'self'`.
const UPLOT_JS: Asset = asset!(JS, "uPlot.iife.min.js");
const UPLOT_CSS: Asset = asset!(CSS, "uPlot.min.css");
/// uPlot's MIT licence, served beside it as its terms ask.
const UPLOT_LICENSE: Asset = asset!("text/plain; charset=utf-8", "uPlot.LICENSE");

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'";

/// True when `Accept-Encoding` takes gzip: a `gzip` (or `x-gzip`) entry with a non-zero
/// `q`, else a `*` entry with a non-zero `q` (RFC 9110 §12.5.3). No header, or one naming
/// neither, means only the identity coding.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    let mut star = false;
    for value in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else { continue };
        for entry in value.split(',') {
            let mut parts = entry.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let q_zero = parts.any(|p| {
                let p = p.trim();
                p.get(..2).is_some_and(|k| k.eq_ignore_ascii_case("q="))
                    && p[2..].trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
            });
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                return !q_zero;
            }
            if coding == "*" {
                star = !q_zero;
            }
        }
    }
    star
}

/// `asset` for this request: its gzip bytes when the client takes gzip, else inflated.
///
/// Errors: [`DashboardError::Io`] (HTTP 500) if the embedded bytes do not inflate, a build
/// defect: a test inflates every file.
fn serve(headers: &HeaderMap, asset: &Asset) -> Result<Response, DashboardError> {
    if accepts_gzip(headers) {
        let mut r = page(asset.content_type, asset.gzip);
        r.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        return Ok(r);
    }
    Ok(page(asset.content_type, inflate(asset.gzip)?))
}

fn inflate(gzip: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut text = Vec::with_capacity(gzip.len() * 4);
    flate2::read::GzDecoder::new(gzip).read_to_end(&mut text)?;
    Ok(text)
}

fn page(content_type: &'static str, body: impl Into<axum::body::Body>) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::VARY, "accept-encoding"),
        ],
        body.into(),
    )
        .into_response()
}

/// `GET /` → the single-page UI.
pub(crate) async fn index(headers: HeaderMap) -> Result<Response, DashboardError> {
    serve(&headers, &INDEX_HTML)
}

/// `GET /ui/{file}` → `app.js`, `traceview.js`, `readback.js`, `forensics.js` (the
/// stall-forensics panel), `app.css`, or the vendored uPlot (`uPlot.iife.min.js`,
/// `uPlot.min.css`, `uPlot.LICENSE`).
pub(crate) async fn asset(
    Path(file): Path<String>,
    headers: HeaderMap,
) -> Result<Response, DashboardError> {
    let asset = match file.as_str() {
        "app.js" => &APP_JS,
        "app.css" => &APP_CSS,
        "forensics.js" => &FORENSICS_JS,
        "traceview.js" => &TRACEVIEW_JS,
        "readback.js" => &READBACK_JS,
        "uPlot.iife.min.js" => &UPLOT_JS,
        "uPlot.min.css" => &UPLOT_CSS,
        "uPlot.LICENSE" => &UPLOT_LICENSE,
        _ => return Err(DashboardError::NotFound(format!("no UI file {file:?}"))),
    };
    serve(&headers, asset)
}

/// `GET /api/v1/openapi.json`.
pub(crate) async fn openapi(
    _: crate::params::NoQuery,
    headers: HeaderMap,
) -> Result<Response, DashboardError> {
    serve(&headers, &OPENAPI)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(values: &[&str]) -> bool {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        accepts_gzip(&h)
    }

    #[test]
    fn gzip_is_sent_only_to_a_client_that_takes_it() {
        assert!(accepts(&["gzip, deflate, br, zstd"]));
        assert!(accepts(&["br", "GZIP;q=0.5"]));
        assert!(accepts(&["x-gzip"]));
        assert!(accepts(&["*"]));
        assert!(accepts(&["identity;q=1, *;q=0.1"]));
        assert!(!accepts(&[]));
        assert!(!accepts(&["identity"]));
        assert!(!accepts(&["br, deflate"]));
        assert!(!accepts(&["gzip;q=0"]));
        assert!(!accepts(&["gzip; q=0.000, *"]));
        assert!(!accepts(&["*;q=0"]));
        assert!(!accepts(&["gzipped"]));
    }

    #[test]
    fn every_embedded_file_inflates_to_its_source() {
        let ui = concat!(env!("CARGO_MANIFEST_DIR"), "/ui/");
        for (asset, source) in [
            (
                &OPENAPI,
                concat!(env!("CARGO_MANIFEST_DIR"), "/src/openapi.json").to_string(),
            ),
            (&INDEX_HTML, format!("{ui}index.html")),
            (&APP_JS, format!("{ui}app.js")),
            (&APP_CSS, format!("{ui}app.css")),
            (&FORENSICS_JS, format!("{ui}forensics.js")),
            (&TRACEVIEW_JS, format!("{ui}traceview.js")),
            (&READBACK_JS, format!("{ui}readback.js")),
            (&UPLOT_JS, format!("{ui}vendor/uPlot.iife.min.js")),
            (&UPLOT_CSS, format!("{ui}vendor/uPlot.min.css")),
            (&UPLOT_LICENSE, format!("{ui}vendor/uPlot.LICENSE")),
        ] {
            let text = std::fs::read(&source).unwrap();
            assert_eq!(inflate(asset.gzip).unwrap(), text, "{source}");
            assert!(asset.gzip.len() < text.len(), "{source}");
        }
    }
}
