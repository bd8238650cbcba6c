//! The collector's own counters, rendered for `GET /metrics` (Prometheus text format,
//! `stallwatch_<name>_<unit>_total`, closed label sets). One place counts each thing.

use std::sync::atomic::{AtomicU64, Ordering};

use stallwatch_storage::prometheus::{counter, family, gauge, Kind};
use stallwatch_storage::MetricsSource;

/// Why a request (or record) was refused; the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefuseReason {
    /// Malformed or invalid body (HTTP 400 / `INVALID_ARGUMENT`).
    BadRequest,
    /// Over `max_request_bytes` (HTTP 413 / `RESOURCE_EXHAUSTED`).
    TooLarge,
    /// Unknown `Content-Type` (HTTP 415).
    UnsupportedMediaType,
    /// Unknown `Content-Encoding` / `grpc-encoding` (HTTP 415 / `UNIMPLEMENTED`).
    UnsupportedEncoding,
    /// Missing or wrong ingest token (HTTP 401 / `UNAUTHENTICATED`).
    Unauthenticated,
    /// Browser origin not on the CORS allow-list (HTTP 403).
    ForbiddenOrigin,
    /// Not POST, or an unknown path/method (HTTP 404/405, gRPC `UNIMPLEMENTED`).
    NotFound,
    /// `max_inflight_bytes` reached (HTTP 503 / `UNAVAILABLE`).
    InflightFull,
    /// Storage write queue full (HTTP 503 / `UNAVAILABLE`).
    QueueFull,
    /// Disk or `max_db_bytes` full (HTTP 503 / `UNAVAILABLE`).
    StorageFull,
    /// Storage shutting down (HTTP 503 / `UNAVAILABLE`).
    ShuttingDown,
    /// Internal failure (HTTP 500 / `INTERNAL`).
    Internal,
    /// A record with an empty or all-zero id (partial success).
    InvalidId,
    /// A span whose end time is before its start time (partial success).
    EndBeforeStart,
    /// Another process held the SQLite write lock (HTTP 503 / `UNAVAILABLE`).
    StorageBusy,
    /// `SQLITE_LOCKED` (HTTP 503 / `UNAVAILABLE`).
    StorageLocked,
    /// An I/O error that may pass (HTTP 503 / `UNAVAILABLE`).
    StorageIo,
    /// The database file was deleted or replaced while running (HTTP 503 / `UNAVAILABLE`).
    StorageGone,
    /// A `Host` / `:authority` that is not a loopback name nor a configured host (HTTP 421 /
    /// `PERMISSION_DENIED`): DNS rebinding.
    ForbiddenHost,
    /// A request body cut for arriving slower than `body_min_bytes_per_s` after
    /// `body_rate_grace_ms` (HTTP 400 / `INVALID_ARGUMENT`): its share of
    /// `max_inflight_bytes` was released.
    BodyTooSlow,
}

/// Number of [`RefuseReason`] values.
const REASONS: usize = RefuseReason::ALL.len();

impl RefuseReason {
    /// Every reason, in label order.
    pub const ALL: [RefuseReason; 20] = [
        RefuseReason::BadRequest,
        RefuseReason::TooLarge,
        RefuseReason::UnsupportedMediaType,
        RefuseReason::UnsupportedEncoding,
        RefuseReason::Unauthenticated,
        RefuseReason::ForbiddenOrigin,
        RefuseReason::NotFound,
        RefuseReason::InflightFull,
        RefuseReason::QueueFull,
        RefuseReason::StorageFull,
        RefuseReason::ShuttingDown,
        RefuseReason::Internal,
        RefuseReason::InvalidId,
        RefuseReason::EndBeforeStart,
        RefuseReason::StorageBusy,
        RefuseReason::StorageLocked,
        RefuseReason::StorageIo,
        RefuseReason::StorageGone,
        RefuseReason::ForbiddenHost,
        RefuseReason::BodyTooSlow,
    ];

    /// The label value.
    pub fn as_str(&self) -> &'static str {
        match self {
            RefuseReason::BadRequest => "bad_request",
            RefuseReason::TooLarge => "too_large",
            RefuseReason::UnsupportedMediaType => "unsupported_media_type",
            RefuseReason::UnsupportedEncoding => "unsupported_encoding",
            RefuseReason::Unauthenticated => "unauthenticated",
            RefuseReason::ForbiddenOrigin => "forbidden_origin",
            RefuseReason::NotFound => "not_found",
            RefuseReason::InflightFull => "inflight_full",
            RefuseReason::QueueFull => "queue_full",
            RefuseReason::StorageFull => "storage_full",
            RefuseReason::ShuttingDown => "shutting_down",
            RefuseReason::Internal => "internal",
            RefuseReason::InvalidId => "invalid_id",
            RefuseReason::EndBeforeStart => "end_before_start",
            RefuseReason::StorageBusy => "storage_busy",
            RefuseReason::StorageLocked => "storage_locked",
            RefuseReason::StorageIo => "storage_io",
            RefuseReason::StorageGone => "storage_gone",
            RefuseReason::ForbiddenHost => "forbidden_host",
            RefuseReason::BodyTooSlow => "body_too_slow",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// Ingest counters. Cheap to update from any request (relaxed atomics).
#[derive(Debug, Default)]
pub struct IngestStats {
    requests_grpc: AtomicU64,
    requests_http: AtomicU64,
    request_bytes_grpc: AtomicU64,
    request_bytes_http: AtomicU64,
    spans: AtomicU64,
    log_records: AtomicU64,
    metric_points: AtomicU64,
    refused_requests: [AtomicU64; REASONS],
    refused_records: [AtomicU64; REASONS],
    inflight_bytes: AtomicU64,
    decoded_in_parts: AtomicU64,
}

impl IngestStats {
    pub(crate) fn request(&self, grpc: bool, wire_bytes: usize) {
        let (r, b) = if grpc {
            (&self.requests_grpc, &self.request_bytes_grpc)
        } else {
            (&self.requests_http, &self.request_bytes_http)
        };
        r.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(wire_bytes as u64, Ordering::Relaxed);
    }
    pub(crate) fn committed(&self, spans: usize, logs: usize, points: usize) {
        self.spans.fetch_add(spans as u64, Ordering::Relaxed);
        self.log_records.fetch_add(logs as u64, Ordering::Relaxed);
        self.metric_points
            .fetch_add(points as u64, Ordering::Relaxed);
    }
    pub(crate) fn refuse_request(&self, reason: RefuseReason) {
        self.refused_requests[reason.index()].fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn refuse_records(&self, reason: RefuseReason, n: u64) {
        self.refused_records[reason.index()].fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn decoded_in_parts(&self) {
        self.decoded_in_parts.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn inflight_add(&self, n: usize) {
        self.inflight_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn inflight_sub(&self, n: usize) {
        self.inflight_bytes.fetch_sub(n as u64, Ordering::Relaxed);
    }

    /// Protobuf trace exports decoded in parts side by side (issue 16; a lone export of
    /// 64 KiB–4 MiB while cores are free).
    pub fn trace_exports_decoded_in_parts(&self) -> u64 {
        self.decoded_in_parts.load(Ordering::Relaxed)
    }
    /// Spans committed to storage.
    pub fn spans_received(&self) -> u64 {
        self.spans.load(Ordering::Relaxed)
    }
    /// Log records committed to storage.
    pub fn log_records_received(&self) -> u64 {
        self.log_records.load(Ordering::Relaxed)
    }
    /// Metric data points committed to storage.
    pub fn metric_points_received(&self) -> u64 {
        self.metric_points.load(Ordering::Relaxed)
    }
    /// Whole requests refused for `reason`.
    pub fn requests_refused(&self, reason: RefuseReason) -> u64 {
        self.refused_requests[reason.index()].load(Ordering::Relaxed)
    }
    /// Records (spans, log records, points) refused for `reason`.
    pub fn records_refused(&self, reason: RefuseReason) -> u64 {
        self.refused_records[reason.index()].load(Ordering::Relaxed)
    }
    /// Request bytes held right now (compressed plus decompressed), bytes.
    pub fn inflight_bytes(&self) -> u64 {
        self.inflight_bytes.load(Ordering::Relaxed)
    }
}

impl MetricsSource for IngestStats {
    fn render_prometheus(&self, out: &mut String) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        family(
            out,
            "stallwatch_otlp_requests_total",
            Kind::Counter,
            "OTLP export requests received, by transport.",
        )
        .sample(&[("transport", "grpc")], l(&self.requests_grpc))
        .sample(&[("transport", "http")], l(&self.requests_http));
        family(
            out,
            "stallwatch_otlp_request_bytes_total",
            Kind::Counter,
            "OTLP request body bytes on the wire (before decompression).",
        )
        .sample(&[("transport", "grpc")], l(&self.request_bytes_grpc))
        .sample(&[("transport", "http")], l(&self.request_bytes_http));
        for (name, help, v) in [
            (
                "stallwatch_otlp_spans_received_total",
                "Spans committed to storage.",
                &self.spans,
            ),
            (
                "stallwatch_otlp_log_records_received_total",
                "Log records committed to storage.",
                &self.log_records,
            ),
            (
                "stallwatch_otlp_metric_points_received_total",
                "Metric data points committed to storage.",
                &self.metric_points,
            ),
            (
                "stallwatch_otlp_trace_exports_decoded_in_parts_total",
                "Protobuf trace exports decoded in parts on more than one core (a lone export of 64 KiB to 4 MiB while cores are free).",
                &self.decoded_in_parts,
            ),
        ] {
            counter(out, name, help, l(v));
        }
        let mut f = family(
            out,
            "stallwatch_otlp_requests_refused_total",
            Kind::Counter,
            "OTLP requests refused as a whole, by reason.",
        );
        for r in RefuseReason::ALL {
            f.sample(
                &[("reason", r.as_str())],
                l(&self.refused_requests[r.index()]),
            );
        }
        let mut f = family(
            out,
            "stallwatch_otlp_records_refused_total",
            Kind::Counter,
            "Spans, log records and points refused, by reason.",
        );
        for r in RefuseReason::ALL {
            f.sample(
                &[("reason", r.as_str())],
                l(&self.refused_records[r.index()]),
            );
        }
        gauge(
            out,
            "stallwatch_otlp_inflight_bytes",
            "Request bytes held in memory right now.",
            l(&self.inflight_bytes),
        );
    }
}
