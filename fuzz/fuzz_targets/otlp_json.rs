//! Fuzz target: arbitrary bytes as an OTLP/JSON export body (traces, logs and metrics)
//! through the collector's own OTLP/JSON layer and validation. Must never panic; errors
//! are fine (they are HTTP 400 answers).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stallwatch_collector::config::DEFAULT_MAX_NESTING_DEPTH;
use stallwatch_collector::decode::{decode_logs, decode_metrics, decode_traces, Format, Limits};

const LIMITS: Limits = Limits {
    max_nesting_depth: DEFAULT_MAX_NESTING_DEPTH,
};

fuzz_target!(|data: &[u8]| {
    let _ = decode_traces(data, Format::Json, &LIMITS);
    let _ = decode_logs(data, Format::Json, &LIMITS);
    let _ = decode_metrics(data, Format::Json, &LIMITS);
});
