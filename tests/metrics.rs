//! `GET /metrics` read by the reference parser: the whole exposition is parsed by Python's
//! `prometheus_client.parser` (the Prometheus project's own client library), so a malformed
//! line anywhere (a bad escape, a sample before its `# TYPE`, a histogram without `+Inf`)
//! fails here, and every family outside checks scrape keeps its name, type and labels.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

/// Every family `/metrics` has always had, with its `# TYPE` and its label names (sorted,
/// joined by `,`; `le` is the histogram's bucket label).
const FAMILIES: &[(&str, &str, &str)] = &[
    ("stallwatch_otlp_requests", "counter", "transport"),
    ("stallwatch_otlp_request_bytes", "counter", "transport"),
    ("stallwatch_otlp_spans_received", "counter", ""),
    ("stallwatch_otlp_log_records_received", "counter", ""),
    ("stallwatch_otlp_metric_points_received", "counter", ""),
    (
        "stallwatch_otlp_trace_exports_decoded_in_parts",
        "counter",
        "",
    ),
    ("stallwatch_otlp_requests_refused", "counter", "reason"),
    ("stallwatch_otlp_records_refused", "counter", "reason"),
    ("stallwatch_otlp_inflight_bytes", "gauge", ""),
    ("stallwatch_storage_spans_committed", "counter", ""),
    ("stallwatch_storage_spans_deduplicated", "counter", ""),
    ("stallwatch_storage_logs_committed", "counter", ""),
    ("stallwatch_storage_metric_points_committed", "counter", ""),
    ("stallwatch_storage_commits", "counter", ""),
    ("stallwatch_storage_led_commits", "counter", ""),
    ("stallwatch_storage_commit_failures", "counter", ""),
    (
        "stallwatch_storage_retention_batches_deleted",
        "counter",
        "",
    ),
    ("stallwatch_storage_wal_wait_seconds", "counter", ""),
    ("stallwatch_storage_wal_waits_timed_out", "counter", ""),
    ("stallwatch_storage_writes_refused", "counter", "reason"),
    ("stallwatch_storage_queue_depth_requests", "gauge", ""),
    ("stallwatch_storage_db_used_bytes", "gauge", ""),
    (
        "stallwatch_storage_commit_duration_seconds",
        "histogram",
        "le",
    ),
    ("stallwatch_watchdog_heartbeats_sent", "counter", ""),
    ("stallwatch_watchdog_heartbeats_ok", "counter", ""),
    ("stallwatch_watchdog_heartbeats_failed", "counter", "reason"),
    ("stallwatch_watchdog_trips", "counter", ""),
    ("stallwatch_watchdog_verdicts", "counter", "verdict"),
    ("stallwatch_watchdog_observations", "counter", ""),
    ("stallwatch_watchdog_ledger_records", "counter", ""),
    ("stallwatch_watchdog_ledger_rows_written", "counter", ""),
    ("stallwatch_watchdog_ledger_write_errors", "counter", ""),
    ("stallwatch_watchdog_incident_errors", "counter", ""),
    ("stallwatch_ledger_records_skipped", "counter", "reason"),
    ("stallwatch_watchdog_sidecar_degraded", "counter", ""),
    ("stallwatch_watchdog_evaluations", "counter", ""),
    ("stallwatch_watchdog_ledger_open_spans", "gauge", ""),
    ("stallwatch_watchdog_ledger_capacity", "gauge", ""),
    ("stallwatch_watchdog_ledger_untracked", "counter", "source"),
    ("stallwatch_watchdog_runners", "gauge", ""),
    ("stallwatch_reaper_runners_spawned", "counter", ""),
    ("stallwatch_reaper_runner_restarts", "counter", ""),
    ("stallwatch_reaper_terminations", "counter", ""),
    ("stallwatch_reaper_sigterm_signals", "counter", ""),
    ("stallwatch_reaper_sigkill_signals", "counter", ""),
    ("stallwatch_reaper_identity_mismatches", "counter", ""),
    ("stallwatch_reaper_zombies_reaped", "counter", ""),
    ("stallwatch_reaper_checkpoints_committed", "counter", ""),
    ("stallwatch_reaper_checkpoints_rolled_back", "counter", ""),
    ("stallwatch_reaper_orphaned_runners", "counter", ""),
    ("stallwatch_reaper_spans_closed", "counter", ""),
    (
        "stallwatch_dashboard_http_requests",
        "counter",
        "code,route",
    ),
    ("stallwatch_dashboard_sse_streams", "gauge", ""),
    ("stallwatch_webhook_deliveries_enqueued", "counter", ""),
    ("stallwatch_webhook_attempts", "counter", "outcome"),
    // Only with `[forward]`.
    ("stallwatch_forward_sent_items", "counter", "signal"),
    ("stallwatch_forward_requests", "counter", "signal"),
    ("stallwatch_forward_lost_rows", "counter", "signal"),
    ("stallwatch_forward_backlog_rows", "gauge", "signal"),
    ("stallwatch_forward_backlog_items", "gauge", "signal"),
    ("stallwatch_forward_backlog_bytes", "gauge", "signal"),
    (
        "stallwatch_forward_dropped_items",
        "counter",
        "reason,signal",
    ),
    ("stallwatch_forward_retries", "counter", ""),
    (
        "stallwatch_forward_last_error_timestamp_seconds",
        "gauge",
        "",
    ),
    // Only after an upstream error: its label carries free error text (quotes, colons).
    ("stallwatch_forward_last_error_info", "gauge", "error"),
    ("stallwatch_listener_connections", "gauge", "listener"),
    (
        "stallwatch_listener_connections_accepted",
        "counter",
        "listener",
    ),
    (
        "stallwatch_listener_connections_refused",
        "counter",
        "listener",
    ),
    (
        "stallwatch_listener_connections_closed",
        "counter",
        "listener,reason",
    ),
    (
        "stallwatch_listener_request_bodies_too_slow",
        "counter",
        "listener",
    ),
];

/// Parses an exposition with `prometheus_client.parser`; answers one line per family:
/// `name type label,names samples`.
fn parse(text: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metrics.txt");
    std::fs::write(&file, text).unwrap();
    let script = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
for f in text_string_to_metric_families(open(sys.argv[1]).read()):
    labels = sorted({k for s in f.samples for k in s.labels})
    print(f.name, f.type, ",".join(labels), len(f.samples))
"#;
    let out = Command::new(python())
        .args(["-c", script])
        .arg(&file)
        .output()
        .expect("the test Python (STALLWATCH_TEST_PYTHON) must run");
    assert!(
        out.status.success(),
        "prometheus_client could not parse /metrics (is prometheus-client installed? \
         scripts/setup-test-env installs it): {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn the_whole_exposition_parses_and_keeps_every_family() {
    let dir = tempfile::tempdir().unwrap();
    // An upstream nobody listens on: the forwarder retries and records its error text.
    let server = Server::start_with(
        ServerOpts::new(&dir.path().join("data"))
            .config("[forward]\nendpoint = \"http://127.0.0.1:9\"\n"),
    );
    let body = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"6b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"s","startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}"#;
    let r = http_client()
        .post(server.otlp_http("/v1/traces"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let scrape = || {
        let r = http_client().get(server.api("/metrics")).send().unwrap();
        assert_eq!(r.status().as_u16(), 200);
        r.text().unwrap()
    };
    wait_until!(
        Duration::from_secs(30),
        "the forwarder's first upstream error",
        scrape().contains("stallwatch_forward_last_error_info{")
    );
    let text = scrape();
    let parsed = parse(&text);
    for (name, kind, labels) in FAMILIES {
        let line = parsed
            .iter()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("no family {name} in /metrics:\n{text}"));
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[1], *kind, "type of {name}");
        assert_eq!(f[2], *labels, "label names of {name}");
        assert!(f[3].parse::<usize>().unwrap() >= 1, "{name} has no sample");
    }
    assert_eq!(
        parsed.len(),
        FAMILIES.len(),
        "families besides the known ones: {parsed:#?}"
    );
    // The span was counted: values are read, not just names.
    assert!(
        text.contains("stallwatch_otlp_requests_total{transport=\"http\"} 1"),
        "{text}"
    );
    assert_eq!(server.stop(), Some(0));
}
