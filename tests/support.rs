//! Helpers of the whole-system tests: the names every module has always used, now written
//! once in the dev-only `stallwatch-testkit` crate (server on port 0 and its ready line,
//! runner set-up, waits, JSON helpers, the WebDriver harness) and re-exported here.

use std::path::{Path, PathBuf};

#[allow(unused_imports)] // every helper is offered; not every module uses each one
pub use stallwatch_testkit::{
    attr, count_files, http_client, incidents, nanos, post_json, process_alive, read_ready_line,
    require, runner, span_named, spawn_runner, stage_files, unix_nanos, wait_incident,
    wait_lifecycle, Server, ServerOpts,
};

/// Polls `cond` every 50 ms until it is true or `timeout` passes; panics with `what`.
macro_rules! wait_until {
    ($($t:tt)*) => { stallwatch_testkit::wait_until!($($t)*) };
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_stallwatch")
}

/// The Python interpreter with the OpenTelemetry SDK: `STALLWATCH_TEST_PYTHON`, else the
/// project venv, else `python3`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("STALLWATCH_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("python3")
}

pub fn test_data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(rel)
}

/// Runs `tests/node/<script>` with Node.js and the Node kit's OpenTelemetry packages
/// (`integrations/node/node_modules` on `NODE_PATH`), exporting to `server`'s OTLP/HTTP
/// listener (`OTEL_EXPORTER_OTLP_ENDPOINT`) with `env` besides; panics when the packages
/// are missing or the script fails, and answers its stdout.
pub fn run_node_script(server: &Server, script: &str, env: &[(&str, &str)]) -> String {
    let modules = Path::new(env!("CARGO_MANIFEST_DIR")).join("integrations/node/node_modules");
    assert!(
        modules.join("@opentelemetry/otlp-transformer").exists(),
        "integrations/node/node_modules is missing: run scripts/setup-test-env (npm ci)"
    );
    let out = std::process::Command::new("node")
        .arg(test_data(&format!("node/{script}")))
        .env("NODE_PATH", &modules)
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{}", server.http),
        )
        .envs(env.iter().copied())
        .output()
        .expect("run node (is Node.js installed?)");
    assert!(
        out.status.success(),
        "node {script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
