//! The open-span wire shapes 2 and 3 (docs/design.md, "Open spans"), sent by the real Python
//! OpenTelemetry SDK to a running stallwatch: each opens an entry in the open-span ledger
//! for a registered runner, and the end closes it. (Shape 1, the running snapshot, is what
//! the project's runner kit sends; the chain tests cover it.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::chain::{chain_config, post_json};
use crate::support::*;

fn open_span_ids(server: &Server, runner: &str) -> Vec<serde_json::Value> {
    let (st, page) = server.get_json(&format!("/api/v1/open-spans?runner_id={runner}"));
    assert_eq!(st, 200, "{page}");
    page["items"].as_array().cloned().unwrap_or_default()
}

fn check_shape(mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(ServerOpts::new(&dir.path().join("data")).config(&chain_config("")));
    // A registered runner the spans are tied to by `stallwatch.runner.id`.
    let mut sleeper = Command::new("sleep").arg("120").spawn().unwrap();
    let runner = format!("shape-{mode}");
    let (st, body) = post_json(
        &server,
        "/api/v1/runners",
        &serde_json::json!({"id": runner, "attach": {"pid": sleeper.id()}}),
    );
    assert!(st == 200 || st == 201, "{st} {body}");

    let mut py = Command::new(python())
        .arg(test_data("python/open_span_shapes.py"))
        .arg(mode)
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{}", server.http),
        )
        .env("OTEL_SERVICE_NAME", "shapes")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            format!("stallwatch.runner.id={runner}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(py.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ids: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));

    // The running span is in the ledger, tied to the runner, with its tool name.
    let mut row;
    wait_until!(
        Duration::from_secs(20),
        format!("the {mode}-shape span in /api/v1/open-spans"),
        {
            row = open_span_ids(&server, &runner)
                .into_iter()
                .find(|r| r["span_id"] == ids["span_id"])
                .unwrap_or_default();
            !row.is_null()
        }
    );
    assert_eq!(row["trace_id"], ids["trace_id"]);
    assert_eq!(row["tool_name"], "fit_model", "{row:#}");
    assert_eq!(row["runner_id"], runner.as_str());
    // The runner's board shows it as its worst open tool span.
    let (_, r) = server.get_json(&format!("/api/v1/runners/{runner}"));
    assert_eq!(r["worst_span"]["span_id"], ids["span_id"], "{r:#}");

    // The end closes it.
    py.stdin.as_mut().unwrap().write_all(b"end\n").unwrap();
    assert!(py.wait().unwrap().success());
    wait_until!(
        Duration::from_secs(20),
        "the ended span to leave the ledger",
        {
            !open_span_ids(&server, &runner)
                .iter()
                .any(|r| r["span_id"] == ids["span_id"])
        }
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn log_record_shape_opens_and_closes_a_ledger_entry() {
    check_shape("log");
}

#[test]
fn logfire_pending_twin_opens_the_real_span_and_its_end_closes_it() {
    check_shape("pending");
}
