//! The watchdog's counters, rendered for `GET /metrics` through
//! [`stallwatch_storage::MetricsSource`]. One place counts each thing (STYLE, internal
//! telemetry); names follow `stallwatch_<name>_<unit>_total` with closed label sets.

use std::sync::atomic::{AtomicU64, Ordering};

use stallwatch_storage::prometheus::{counter, family, gauge, Kind};
use stallwatch_storage::MetricsSource;

use crate::fusion::Verdict;
use crate::heartbeat::HeartbeatFailure;
use crate::ledger::UntrackedSource;
use crate::shapes::SkipReason;

/// Counters of one watchdog. All monotonic except the gauges (`ledger_open_spans`,
/// `ledger_capacity`, `runners`).
#[derive(Debug, Default)]
pub struct WatchdogStats {
    /// Pings sent (including HALF_OPEN probes).
    pub heartbeats_sent: AtomicU64,
    /// PONGs received.
    pub heartbeats_ok: AtomicU64,
    /// Failed pings by [`HeartbeatFailure::NAMES`] index.
    pub heartbeats_failed: [AtomicU64; 8],
    /// Breaker trips (CLOSED → OPEN).
    pub trips: AtomicU64,
    /// Verdict changes by [`Verdict::ALL`] index (counted when a runner enters it).
    pub verdicts: [AtomicU64; 7],
    /// Observations (export requests) read.
    pub observations: AtomicU64,
    /// Ledger records applied (open, refresh, end).
    pub ledger_records: AtomicU64,
    /// Ledger rows written to storage.
    pub ledger_rows_written: AtomicU64,
    /// Ledger batches that failed to write (retried with the next batch).
    pub ledger_write_errors: AtomicU64,
    /// Incidents that could not be recorded.
    pub incident_errors: AtomicU64,
    /// Gauge: entries in the open-span ledger.
    pub ledger_open_spans: AtomicU64,
    /// Gauge: the ledger's bound, `[watchdog] max_open_spans`.
    pub ledger_capacity: AtomicU64,
    /// Spans the ledger did not track at its bound, by
    /// [`crate::ledger::UntrackedSource::index`].
    pub ledger_untracked: [AtomicU64; 2],
    /// Gauge: registered runners.
    pub runners: AtomicU64,
    /// Open-span log records the ledger could not read, by [`SkipReason::ALL`] index.
    pub ledger_skipped: [AtomicU64; 6],
    /// `sidecar.degraded` episodes (stallwatch's own trouble hid a heartbeat).
    pub sidecar_degraded: AtomicU64,
    /// Runner evaluations (one runner's step) the loop ran: it grows with what is due,
    /// not with the number of runners times the wakes (issue 17 #10).
    pub evaluations: AtomicU64,
}

impl WatchdogStats {
    /// Counts one failed ping.
    pub fn heartbeat_failed(&self, f: &HeartbeatFailure) {
        self.heartbeats_failed[f.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one skipped open-span record.
    pub fn skipped(&self, r: SkipReason) {
        self.ledger_skipped[r.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a runner entering `v`.
    pub fn verdict(&self, v: Verdict) {
        self.verdicts[v.index()].fetch_add(1, Ordering::Relaxed);
    }
}

impl MetricsSource for WatchdogStats {
    fn render_prometheus(&self, out: &mut String) {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            out,
            "stallwatch_watchdog_heartbeats_sent_total",
            "Heartbeat pings sent.",
            g(&self.heartbeats_sent),
        );
        counter(
            out,
            "stallwatch_watchdog_heartbeats_ok_total",
            "Heartbeat PONGs received.",
            g(&self.heartbeats_ok),
        );
        let mut f = family(
            out,
            "stallwatch_watchdog_heartbeats_failed_total",
            Kind::Counter,
            "Heartbeat pings that failed, by reason.",
        );
        for (i, reason) in HeartbeatFailure::NAMES.iter().enumerate() {
            f.sample(
                &[("reason", reason.as_str())],
                g(&self.heartbeats_failed[i]),
            );
        }
        counter(
            out,
            "stallwatch_watchdog_trips_total",
            "Breaker trips (CLOSED to OPEN).",
            g(&self.trips),
        );
        let mut f = family(
            out,
            "stallwatch_watchdog_verdicts_total",
            Kind::Counter,
            "Runners entering a verdict.",
        );
        for v in Verdict::ALL {
            f.sample(&[("verdict", v.as_str())], g(&self.verdicts[v.index()]));
        }
        counter(
            out,
            "stallwatch_watchdog_observations_total",
            "Export requests read by the watchdog.",
            g(&self.observations),
        );
        counter(
            out,
            "stallwatch_watchdog_ledger_records_total",
            "Open-span records applied to the ledger.",
            g(&self.ledger_records),
        );
        counter(
            out,
            "stallwatch_watchdog_ledger_rows_written_total",
            "Ledger rows written to storage.",
            g(&self.ledger_rows_written),
        );
        counter(
            out,
            "stallwatch_watchdog_ledger_write_errors_total",
            "Ledger batches that failed to write.",
            g(&self.ledger_write_errors),
        );
        counter(
            out,
            "stallwatch_watchdog_incident_errors_total",
            "Incidents that could not be recorded.",
            g(&self.incident_errors),
        );
        let mut f = family(
            out,
            "stallwatch_ledger_records_skipped_total",
            Kind::Counter,
            "Open-span records (span.state log records) the ledger skipped, by reason.",
        );
        for r in SkipReason::ALL {
            f.sample(
                &[("reason", r.as_str())],
                g(&self.ledger_skipped[r.index()]),
            );
        }
        counter(
            out,
            "stallwatch_watchdog_sidecar_degraded_total",
            "Episodes in which stallwatch's own trouble (fd exhaustion, a starved task) hid a heartbeat.",
            g(&self.sidecar_degraded),
        );
        counter(
            out,
            "stallwatch_watchdog_evaluations_total",
            "Runner evaluations the watchdog ran (one per runner due at a wake).",
            g(&self.evaluations),
        );
        let mut f = family(
            out,
            "stallwatch_watchdog_ledger_untracked_total",
            Kind::Counter,
            "Spans the open-span ledger did not track because it was at its bound (max_open_spans), by whose they were.",
        );
        for s in UntrackedSource::ALL {
            f.sample(
                &[("source", s.as_str())],
                g(&self.ledger_untracked[s.index()]),
            );
        }
        gauge(
            out,
            "stallwatch_watchdog_ledger_open_spans",
            "Entries in the open-span ledger.",
            g(&self.ledger_open_spans),
        );
        gauge(
            out,
            "stallwatch_watchdog_ledger_capacity",
            "Most entries the open-span ledger holds (max_open_spans).",
            g(&self.ledger_capacity),
        );
        gauge(
            out,
            "stallwatch_watchdog_runners",
            "Runners watched.",
            g(&self.runners),
        );
    }
}
