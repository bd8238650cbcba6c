//! The dashboard's own counters, rendered at `GET /metrics` after every other stage's
//! (Prometheus text format; names `stallwatch_<name>_<unit>_total`, STYLE point 10): HTTP
//! requests by route and status class, open SSE streams, and the webhook outbox counters.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use stallwatch_storage::prometheus::{family, gauge, Kind};
use stallwatch_storage::MetricsSource;

/// HTTP request counts by route template and status class, and open SSE streams.
#[derive(Default)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(String, &'static str), u64>>,
    sse_streams: AtomicI64,
}

/// The status class label of an HTTP status (`2xx` .. `5xx`).
fn class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

impl HttpMetrics {
    /// Counts one answered request. `route` is the matched route template (a closed set).
    pub fn count(&self, route: &str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route.to_string(), class(status))).or_insert(0) += 1;
        }
    }
    /// An SSE stream opened (`+1`) or closed (`-1`).
    pub fn sse(&self, delta: i64) {
        self.sse_streams.fetch_add(delta, Ordering::Relaxed);
    }
    /// Requests counted for `route` with status class `class` (tests, the UI).
    pub fn requests(&self, route: &str, class: &str) -> u64 {
        self.requests
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|((r, c), _)| r == route && *c == class)
                    .map(|(_, v)| *v)
                    .sum()
            })
            .unwrap_or(0)
    }
}

impl MetricsSource for HttpMetrics {
    fn render_prometheus(&self, out: &mut String) {
        let mut f = family(
            out,
            "stallwatch_dashboard_http_requests_total",
            Kind::Counter,
            "Dashboard HTTP requests answered, by route template and status class.",
        );
        if let Ok(m) = self.requests.lock() {
            for ((route, class), v) in m.iter() {
                f.sample(&[("route", route), ("code", class)], v);
            }
        }
        gauge(
            out,
            "stallwatch_dashboard_sse_streams",
            "Open server-sent event streams.",
            self.sse_streams.load(Ordering::Relaxed),
        );
        crate::webhooks::STATS.render(out);
    }
}
