//! The environment pieces a spawned runner gets on every platform (docs/design.md,
//! Interfaces: Runners).

/// `theirs` (`k=v,k=v`, W3C Baggage-like as in the SDK environment specification) with
/// `stallwatch.runner.id` and `service.instance.id` set to ours (theirs for those two keys
/// is dropped; every other key is kept in order).
pub fn merge_resource_attributes(theirs: &str, id: &str, instance_id: &str) -> String {
    let mut out = vec![
        format!("stallwatch.runner.id={id}"),
        format!("service.instance.id={instance_id}"),
    ];
    for pair in theirs.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let key = pair.split_once('=').map(|(k, _)| k.trim()).unwrap_or(pair);
        if key != "stallwatch.runner.id" && key != "service.instance.id" {
            out.push(pair.to_string());
        }
    }
    out.join(",")
}

/// Inherited variables that would override the injected OTLP endpoint (the OpenTelemetry
/// SDK environment specification: a signal-specific `OTEL_EXPORTER_OTLP_{TRACES,LOGS,
/// METRICS}_*` beats the generic one) or send the sidecar's own headers: removed from a
/// spawned runner's environment unless `env` sets them (then the runner's value is used).
pub const SCRUBBED_OTLP_VARIABLES: [&str; 10] = [
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
];
