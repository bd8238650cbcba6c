//! The forwarder's counters for `GET /metrics` (`stallwatch_forward_*`, Prometheus text).
//! Counters count since this process started; lifetime totals live in `forward_cursor`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use stallwatch_storage::forward::Signal;
use stallwatch_storage::prometheus::{counter, family, gauge, Kind};
use stallwatch_storage::MetricsSource;

/// Why items were given up on; the `reason` label of `stallwatch_forward_dropped_items_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The backlog passed `max_queue_bytes`; the oldest rows were skipped.
    QueueFull,
    /// The upstream refused them for good (HTTP 4xx other than 429, a non-retryable gRPC
    /// code, or `partial_success` rejections).
    Refused,
    /// Their stored form could not be decoded.
    Undecodable,
}

impl DropReason {
    /// Every reason, in label order.
    pub const ALL: [DropReason; 3] = [
        DropReason::QueueFull,
        DropReason::Refused,
        DropReason::Undecodable,
    ];

    /// The label value.
    pub fn as_str(&self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::Refused => "refused",
            DropReason::Undecodable => "undecodable",
        }
    }
}

fn ri(r: DropReason) -> usize {
    match r {
        DropReason::QueueFull => 0,
        DropReason::Refused => 1,
        DropReason::Undecodable => 2,
    }
}

/// Counters of the forwarder; a [`MetricsSource`].
#[derive(Debug, Default)]
pub struct ForwardStats {
    sent: [AtomicU64; 3],
    requests: [AtomicU64; 3],
    dropped: [[AtomicU64; 3]; 3],
    lost_rows: [AtomicU64; 3],
    backlog_rows: [AtomicU64; 3],
    backlog_items: [AtomicU64; 3],
    backlog_bytes: [AtomicU64; 3],
    retries: AtomicU64,
    last_error_unix_s: AtomicU64,
    last_error: Mutex<String>,
}

impl ForwardStats {
    /// Items (spans, log records, metric points) the upstream acknowledged, and one request.
    pub fn sent(&self, s: Signal, items: u64) {
        self.sent[s.index()].fetch_add(items, Ordering::Relaxed);
        self.requests[s.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Items given up on.
    pub fn dropped(&self, s: Signal, r: DropReason, items: u64) {
        self.dropped[s.index()][ri(r)].fetch_add(items, Ordering::Relaxed);
    }

    /// Rows deleted by retention before they were forwarded.
    pub fn lost_rows(&self, s: Signal, rows: u64) {
        self.lost_rows[s.index()].fetch_add(rows, Ordering::Relaxed);
    }

    /// Rows of `s` counted lost so far.
    #[cfg(test)]
    pub(crate) fn lost_rows_of(&self, s: Signal) -> u64 {
        self.lost_rows[s.index()].load(Ordering::Relaxed)
    }

    /// The measured backlog of one signal (gauges).
    pub fn backlog(&self, s: Signal, rows: u64, items: u64, bytes: u64) {
        self.backlog_rows[s.index()].store(rows, Ordering::Relaxed);
        self.backlog_items[s.index()].store(items, Ordering::Relaxed);
        self.backlog_bytes[s.index()].store(bytes, Ordering::Relaxed);
    }

    /// A retryable failure: one more retry, and the error text at `now_unix_s`.
    pub fn retry(&self, error: &str, now_unix_s: u64) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        self.error(error, now_unix_s);
    }

    /// Records the last error text.
    pub fn error(&self, error: &str, now_unix_s: u64) {
        self.last_error_unix_s.store(now_unix_s, Ordering::Relaxed);
        if let Ok(mut e) = self.last_error.lock() {
            *e = error.chars().take(200).collect();
        }
    }

    /// Items acknowledged for a signal (since start).
    pub fn sent_items(&self, s: Signal) -> u64 {
        self.sent[s.index()].load(Ordering::Relaxed)
    }

    /// Items dropped for a signal, every reason (since start).
    pub fn dropped_items(&self, s: Signal) -> u64 {
        self.dropped[s.index()]
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum()
    }

    /// Retryable failures (since start).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
}

impl MetricsSource for ForwardStats {
    fn render_prometheus(&self, out: &mut String) {
        let per_signal =
            |out: &mut String, name: &str, kind: Kind, help: &str, v: &[AtomicU64; 3]| {
                let mut f = family(out, name, kind, help);
                for s in Signal::ALL {
                    f.sample(
                        &[("signal", s.as_str())],
                        v[s.index()].load(Ordering::Relaxed),
                    );
                }
            };
        per_signal(
            out,
            "stallwatch_forward_sent_items_total",
            Kind::Counter,
            "Spans, log records and metric points the upstream acknowledged.",
            &self.sent,
        );
        per_signal(
            out,
            "stallwatch_forward_requests_total",
            Kind::Counter,
            "Export requests the upstream acknowledged.",
            &self.requests,
        );
        per_signal(
            out,
            "stallwatch_forward_lost_rows_total",
            Kind::Counter,
            "Stored rows deleted by retention before they were forwarded.",
            &self.lost_rows,
        );
        per_signal(
            out,
            "stallwatch_forward_backlog_rows",
            Kind::Gauge,
            "Stored rows not yet acknowledged by the upstream.",
            &self.backlog_rows,
        );
        per_signal(
            out,
            "stallwatch_forward_backlog_items",
            Kind::Gauge,
            "Spans, log records and metric points not yet acknowledged by the upstream.",
            &self.backlog_items,
        );
        per_signal(
            out,
            "stallwatch_forward_backlog_bytes",
            Kind::Gauge,
            "Stored payload bytes not yet acknowledged by the upstream.",
            &self.backlog_bytes,
        );
        let mut f = family(
            out,
            "stallwatch_forward_dropped_items_total",
            Kind::Counter,
            "Items given up on, never sent upstream.",
        );
        for s in Signal::ALL {
            for r in DropReason::ALL {
                f.sample(
                    &[("signal", s.as_str()), ("reason", r.as_str())],
                    self.dropped[s.index()][ri(r)].load(Ordering::Relaxed),
                );
            }
        }
        counter(
            out,
            "stallwatch_forward_retries_total",
            "Retryable upstream failures.",
            self.retries(),
        );
        let at = self.last_error_unix_s.load(Ordering::Relaxed);
        gauge(
            out,
            "stallwatch_forward_last_error_timestamp_seconds",
            "When the last upstream error happened (0: none).",
            at,
        );
        if at != 0 {
            let text = self
                .last_error
                .lock()
                .map(|e| e.clone())
                .unwrap_or_default();
            family(
                out,
                "stallwatch_forward_last_error_info",
                Kind::Gauge,
                "The last upstream error.",
            )
            .sample(&[("error", &text)], 1);
        }
    }
}
