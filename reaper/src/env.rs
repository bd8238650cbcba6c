//! The environment pieces a spawned runner gets on every platform (docs/design.md,
//! Interfaces: Runners).

/// Layers a runner spec's own `env` over the injected variables (`env`): the spec wins,
/// except for the `STALLWATCH_*` variables stallwatch injected, which it keeps (a warning
/// names each one the spec tried to set). The instance mark proves which processes belong
/// to a spawn: a runner given another's mark (a sub-runner registered with its parent's
/// whole environment) was counted as that runner's descendant and killed by its trip. The
/// heartbeat socket and the checkpoint folder are where stallwatch listens and stages.
pub fn layer_spec_env(
    env: &mut std::collections::BTreeMap<String, String>,
    spec_env: &std::collections::BTreeMap<String, String>,
    id: &str,
) {
    for (k, v) in spec_env {
        if k.starts_with("STALLWATCH_") && env.contains_key(k) {
            tracing::warn!(
                runner = id,
                key = %k,
                "runner env sets a variable stallwatch sets for each runner; stallwatch's value is kept"
            );
            continue;
        }
        if (k.starts_with("OTEL_EXPORTER_OTLP_") && k != "OTEL_EXPORTER_OTLP_TIMEOUT")
            || SCRUBBED_OTEL_VARIABLES.contains(&k.as_str())
        {
            tracing::warn!(
                runner = id,
                key = %k,
                "runner env overrides stallwatch's OTLP export setting on purpose; its spans may not reach the watchdog"
            );
        }
        env.insert(k.clone(), v.clone());
    }
}

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

/// The inherited variables to remove from a spawned runner's environment: those of
/// [`SCRUBBED_OTEL_VARIABLES`], and every other `OTEL_EXPORTER_OTLP_*` variable set around
/// stallwatch (`_TIMEOUT`, `_CERTIFICATE`, `_COMPRESSION`, the client key and certificate,
/// and their per-signal forms), which were set for stallwatch's own `[forward]` or for
/// the user's apps: a runner exports to stallwatch with the endpoint, protocol and headers
/// stallwatch gives it, and nothing else of stallwatch's exporter settings (README,
/// "Forwarding": "runners stallwatch spawns never inherit them"). A name `env` (what the
/// runner is given: stallwatch's values and its spec's own) sets is kept. `inherited` is
/// the names of stallwatch's environment (`std::env::vars_os`).
pub fn scrubbed_names(
    inherited: impl Iterator<Item = String>,
    env: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    let mut out: Vec<String> = SCRUBBED_OTEL_VARIABLES
        .iter()
        .map(|k| (*k).to_string())
        .chain(inherited.filter(|k| k.starts_with("OTEL_EXPORTER_OTLP_")))
        .filter(|k| !env.contains_key(k))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The names of stallwatch's own environment (those that are valid UTF-8).
pub fn inherited_names() -> impl Iterator<Item = String> {
    std::env::vars_os().filter_map(|(k, _)| k.into_string().ok())
}

/// Inherited variables that would override the injected OTLP endpoint (the OpenTelemetry
/// SDK environment specification: a signal-specific `OTEL_EXPORTER_OTLP_{TRACES,LOGS,
/// METRICS}_*` beats the generic one), send the sidecar's own headers, or keep the runner's
/// spans from being exported at all (`OTEL_SDK_DISABLED`, a sampler such as `always_off`,
/// a traces exporter such as `none`), strip the attributes that make a span a tool span
/// (attribute count or length limits of 0), or hold ended spans back (the batch span
/// processor's delay and sizes, which make healthy spans look open): removed from a spawned
/// runner's environment unless `env` sets them (then the runner's value is used, with a
/// warning). Any of them set around stallwatch silently turned its watchdog off, or made it
/// trip healthy runners, for every runner it spawned.
pub const SCRUBBED_OTEL_VARIABLES: [&str; 22] = [
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_TRACES_EXPORTER",
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_EXPORT_TIMEOUT",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Every inherited OTLP exporter variable goes, not only the listed ones; what the
    /// runner is given stays.
    #[test]
    fn every_inherited_otlp_exporter_variable_is_scrubbed() {
        let inherited = [
            "PATH",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_SERVICE_NAME",
        ]
        .map(String::from);
        let mut env = BTreeMap::new();
        env.insert("OTEL_EXPORTER_OTLP_ENDPOINT".to_string(), "x".to_string());
        env.insert("OTEL_TRACES_SAMPLER".to_string(), "always_on".to_string());
        let out = scrubbed_names(inherited.into_iter(), &env);
        for k in [
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_SDK_DISABLED",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ] {
            assert!(out.iter().any(|o| o == k), "{k} kept: {out:?}");
        }
        for k in [
            "PATH",
            "OTEL_SERVICE_NAME",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_TRACES_SAMPLER",
        ] {
            assert!(!out.iter().any(|o| o == k), "{k} scrubbed: {out:?}");
        }
    }
}
