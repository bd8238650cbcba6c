//! Real OpenTelemetry SDK exporters (Python `opentelemetry-sdk` with the OTLP gRPC and
//! HTTP/protobuf exporters) send spans with attributes, events, links and a log record to a
//! running stallwatch; the test reads everything back through the API.

use std::process::Command;

use crate::support::*;

fn run_python_exporter(server: &Server, protocol: &str) -> serde_json::Value {
    let endpoint = match protocol {
        "grpc" => format!("http://{}", server.grpc),
        _ => format!("http://{}", server.http),
    };
    let out = Command::new(python())
        .arg(test_data("python/export_spans.py"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        .env("OTEL_SERVICE_NAME", format!("py-{protocol}"))
        .output()
        .expect("run python exporter");
    assert!(
        out.status.success(),
        "python exporter failed (is the venv installed? see README):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn check_protocol(protocol: &str) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let ids = run_python_exporter(&server, protocol);
    let trace_id = ids["trace_id"].as_str().unwrap();
    let mut trace;
    wait_until!(std::time::Duration::from_secs(20), "the python spans", {
        let (st, t) = server.get_json(&format!("/api/v1/traces/{trace_id}"));
        trace = t;
        st == 200
            && trace["spans"].as_array().map(|a| a.len()) == Some(2)
            && trace["logs"].as_array().map(|a| !a.is_empty()) == Some(true)
    });
    let root = span_named(&trace, "invoke_agent");
    let tool = span_named(&trace, "execute_tool read_file");
    assert_eq!(root["span_id"], ids["root_span_id"]);
    assert_eq!(tool["span_id"], ids["tool_span_id"]);
    assert_eq!(tool["parent_span_id"], ids["root_span_id"]);
    assert_eq!(tool["kind"], 3, "SpanKind.CLIENT is 3 on the wire");
    assert_eq!(tool["state"], "ended");
    let attrs = &tool["attributes"];
    assert_eq!(
        attr(attrs, "gen_ai.operation.name")["stringValue"],
        "execute_tool"
    );
    assert_eq!(attr(attrs, "gen_ai.tool.name")["stringValue"], "read_file");
    assert_eq!(attr(attrs, "file.bytes")["intValue"], "9007199254740993");
    assert_eq!(attr(attrs, "score")["doubleValue"], 0.5);
    assert_eq!(attr(attrs, "cached")["boolValue"], false);
    assert_eq!(
        attr(attrs, "paths")["arrayValue"]["values"][0]["stringValue"],
        "a.csv"
    );
    assert_eq!(tool["status"]["code"], 2);
    assert_eq!(tool["status"]["message"], "file vanished");
    assert_eq!(tool["events"][0]["name"], "retry");
    assert_eq!(
        attr(&tool["events"][0]["attributes"], "attempt")["intValue"],
        "2"
    );
    assert_eq!(tool["links"][0]["trace_id"], ids["link_trace_id"]);
    assert_eq!(tool["links"][0]["span_id"], ids["link_span_id"]);
    assert_eq!(
        attr(&tool["links"][0]["attributes"], "link.reason")["stringValue"],
        "batch"
    );
    assert_eq!(
        attr(
            &trace["resources"][tool["resource_index"].as_u64().unwrap() as usize]["attributes"],
            "service.name"
        )["stringValue"],
        format!("py-{protocol}")
    );
    assert_eq!(
        attr(
            &trace["resources"][tool["resource_index"].as_u64().unwrap() as usize]["attributes"],
            "deployment.environment"
        )["stringValue"],
        "test"
    );
    assert_eq!(
        trace["scopes"][tool["scope_index"].as_u64().unwrap() as usize]["name"],
        "stallwatch.e2e"
    );
    assert_eq!(
        trace["scopes"][tool["scope_index"].as_u64().unwrap() as usize]["version"],
        "0.1"
    );
    let log = trace["logs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["body"]["stringValue"] == "reading a.csv")
        .unwrap_or_else(|| panic!("log missing: {trace:#}"));
    assert_eq!(log["span_id"], ids["tool_span_id"]);
    assert_eq!(log["severity_number"], 13, "WARN is 13");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn python_sdk_over_grpc() {
    check_protocol("grpc");
}

#[test]
fn python_sdk_over_http_protobuf() {
    check_protocol("http/protobuf");
}
