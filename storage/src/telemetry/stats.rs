//! Counters of the telemetry writer for `GET /metrics` (Prometheus text format).
//!
//! One place counts each thing (STYLE, internal telemetry): the writer thread counts what
//! it committed, the async entry points count what they refused. Names follow
//! `stallwatch_<name>_<unit>_total`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::prometheus::{counter, family, gauge, Kind};
use crate::MetricsSource;

/// Upper bounds of the commit latency histogram buckets, seconds.
pub const COMMIT_BUCKETS_SECONDS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Why a write was refused (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusedReason {
    /// The bounded write queue was full.
    QueueFull,
    /// The disk, or telemetry's share of `max_db_bytes`, was full.
    StorageFull,
    /// Storage was shutting down.
    Closed,
    /// Another connection held the write lock past the busy timeout (`SQLITE_BUSY`).
    StorageBusy,
    /// `SQLITE_LOCKED`.
    StorageLocked,
    /// An I/O error that may pass (`SQLITE_IOERR`, `SQLITE_CANTOPEN`).
    StorageIo,
    /// The database file was deleted or replaced while running.
    StorageGone,
}

impl RefusedReason {
    /// Every reason, in label order.
    pub const ALL: [RefusedReason; 7] = [
        RefusedReason::QueueFull,
        RefusedReason::StorageFull,
        RefusedReason::Closed,
        RefusedReason::StorageBusy,
        RefusedReason::StorageLocked,
        RefusedReason::StorageIo,
        RefusedReason::StorageGone,
    ];
}

impl From<crate::error::Transient> for RefusedReason {
    fn from(t: crate::error::Transient) -> Self {
        use crate::error::Transient as T;
        match t {
            T::Busy => RefusedReason::StorageBusy,
            T::Locked => RefusedReason::StorageLocked,
            T::Io => RefusedReason::StorageIo,
            T::Full => RefusedReason::StorageFull,
            T::Gone => RefusedReason::StorageGone,
        }
    }
}

impl RefusedReason {
    /// The label value.
    pub fn as_str(&self) -> &'static str {
        match self {
            RefusedReason::QueueFull => "queue_full",
            RefusedReason::StorageFull => "storage_full",
            RefusedReason::Closed => "closed",
            RefusedReason::StorageBusy => "storage_busy",
            RefusedReason::StorageLocked => "storage_locked",
            RefusedReason::StorageIo => "storage_io",
            RefusedReason::StorageGone => "storage_gone",
        }
    }
}

/// Telemetry writer counters. Shared (`Arc`) between the writer thread, the async entry
/// points and `/metrics`; every field is an atomic.
#[derive(Debug, Default)]
pub struct TelemetryStats {
    pub(crate) spans_committed: AtomicU64,
    pub(crate) spans_deduplicated: AtomicU64,
    pub(crate) logs_committed: AtomicU64,
    pub(crate) points_committed: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) commit_failures: AtomicU64,
    pub(crate) refused: [AtomicU64; 7],
    pub(crate) queue_depth: AtomicUsize,
    /// Commits made by an export on its own thread, as leader (`writer/mod.rs`).
    pub(crate) led_commits: AtomicU64,
    pub(crate) commit_buckets: [AtomicU64; COMMIT_BUCKETS_SECONDS.len()],
    pub(crate) commit_seconds_sum_ns: AtomicU64,
    pub(crate) retention_batches_deleted: AtomicU64,
    pub(crate) db_used_bytes: AtomicU64,
    /// Time the writer waited for the WAL to be checkpointed past its bound, ns.
    pub(crate) wal_wait_ns: AtomicU64,
    /// Such waits that ended at their deadline with the WAL still past its bound.
    pub(crate) wal_waits_timed_out: AtomicU64,
}

impl TelemetryStats {
    /// Distinct spans stored (copies dropped as duplicates are not counted).
    pub fn spans_committed(&self) -> u64 {
        self.spans_committed.load(Ordering::Relaxed)
    }
    /// Span copies dropped because an equal or better copy was already stored.
    pub fn spans_deduplicated(&self) -> u64 {
        self.spans_deduplicated.load(Ordering::Relaxed)
    }
    /// Log records committed.
    pub fn logs_committed(&self) -> u64 {
        self.logs_committed.load(Ordering::Relaxed)
    }
    /// Metric data points committed.
    pub fn points_committed(&self) -> u64 {
        self.points_committed.load(Ordering::Relaxed)
    }
    /// Group commits done.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }
    /// Group commits an export made on its own thread as leader, the writer being idle
    /// (a subset of [`Self::commits`]).
    pub fn led_commits(&self) -> u64 {
        self.led_commits.load(Ordering::Relaxed)
    }
    /// Writes refused for `reason`.
    pub fn refused(&self, reason: RefusedReason) -> u64 {
        self.refused[reason as usize].load(Ordering::Relaxed)
    }
    /// Export requests waiting for the writer.
    pub fn queue_depth(&self) -> usize {
        self.queue_depth.load(Ordering::Relaxed)
    }
    /// Database bytes in use (pages minus free pages) after the last commit.
    pub fn db_used_bytes(&self) -> u64 {
        self.db_used_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn count_refused(&self, reason: RefusedReason, n: u64) {
        self.refused[reason as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn observe_commit(&self, took: Duration) {
        let s = took.as_secs_f64();
        for (i, b) in COMMIT_BUCKETS_SECONDS.iter().enumerate() {
            if s <= *b {
                self.commit_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.commit_seconds_sum_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
    }
}

impl MetricsSource for TelemetryStats {
    fn render_prometheus(&self, out: &mut String) {
        counter(
            out,
            "stallwatch_storage_spans_committed_total",
            "Distinct spans committed to SQLite.",
            self.spans_committed(),
        );
        counter(
            out,
            "stallwatch_storage_spans_deduplicated_total",
            "Span copies dropped as duplicates of a stored span.",
            self.spans_deduplicated(),
        );
        counter(
            out,
            "stallwatch_storage_logs_committed_total",
            "Log records committed to SQLite.",
            self.logs_committed(),
        );
        counter(
            out,
            "stallwatch_storage_metric_points_committed_total",
            "Metric data points committed to SQLite.",
            self.points_committed(),
        );
        counter(
            out,
            "stallwatch_storage_commits_total",
            "Telemetry group commits.",
            self.commits(),
        );
        counter(
            out,
            "stallwatch_storage_led_commits_total",
            "Telemetry commits an export made on its own thread while the writer was idle (leader commits, part of stallwatch_storage_commits_total).",
            self.led_commits(),
        );
        counter(
            out,
            "stallwatch_storage_commit_failures_total",
            "Telemetry group commits that failed and were rolled back.",
            self.commit_failures.load(Ordering::Relaxed),
        );
        family(
            out,
            "stallwatch_storage_wal_wait_seconds_total",
            Kind::Counter,
            "Time group commits waited for the WAL to be checkpointed while it was past its bound (the disk slower than ingest).",
        )
        .sample(&[], self.wal_wait_ns.load(Ordering::Relaxed) as f64 / 1e9);
        counter(
            out,
            "stallwatch_storage_wal_waits_timed_out_total",
            "Waits for the WAL that ended at their 2 s deadline with the WAL still past its bound (a reader kept old frames).",
            self.wal_waits_timed_out.load(Ordering::Relaxed),
        );
        counter(
            out,
            "stallwatch_storage_retention_batches_deleted_total",
            "Span batches deleted by retention.",
            self.retention_batches_deleted.load(Ordering::Relaxed),
        );
        let mut f = family(
            out,
            "stallwatch_storage_writes_refused_total",
            Kind::Counter,
            "Telemetry export requests refused, by reason.",
        );
        for r in RefusedReason::ALL {
            f.sample(&[("reason", r.as_str())], self.refused(r));
        }
        gauge(
            out,
            "stallwatch_storage_queue_depth_requests",
            "Export requests waiting for the telemetry writer.",
            self.queue_depth(),
        );
        gauge(
            out,
            "stallwatch_storage_db_used_bytes",
            "Database bytes in use after the last commit.",
            self.db_used_bytes(),
        );
        let mut f = family(
            out,
            "stallwatch_storage_commit_duration_seconds",
            Kind::Histogram,
            "Time from BEGIN IMMEDIATE to the end of COMMIT of a group commit.",
        );
        for (i, b) in COMMIT_BUCKETS_SECONDS.iter().enumerate() {
            f.suffixed(
                "_bucket",
                &[("le", &b.to_string())],
                self.commit_buckets[i].load(Ordering::Relaxed),
            );
        }
        let count = self.commits();
        let sum = self.commit_seconds_sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        f.suffixed("_bucket", &[("le", "+Inf")], count)
            .suffixed("_sum", &[], sum)
            .suffixed("_count", &[], count);
    }
}
