//! The spine: OTLP in over HTTP and gRPC, kept in SQLite, read back through the API.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::{
    trace_service_client::TraceServiceClient, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{
    any_value::Value, AnyValue, ArrayValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span::{Event, Link},
    ResourceSpans, ScopeSpans, Span, Status,
};
use prost::Message;

use crate::support::*;

pub fn kv(key: &str, v: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

pub fn s(v: &str) -> Value {
    Value::StringValue(v.into())
}

/// A request with one trace: a root span and a tool span (child) with every kind of field.
pub fn rich_request(trace_id: [u8; 16], service: &str) -> ExportTraceServiceRequest {
    let root = Span {
        trace_id: trace_id.to_vec(),
        span_id: vec![1, 1, 1, 1, 1, 1, 1, 1],
        name: "invoke agent_turn".into(),
        kind: 2,
        start_time_unix_nano: 1_700_000_000_000_000_000,
        end_time_unix_nano: 1_700_000_002_000_000_000,
        ..Default::default()
    };
    let tool = Span {
        trace_id: trace_id.to_vec(),
        span_id: vec![2, 2, 2, 2, 2, 2, 2, 2],
        parent_span_id: vec![1, 1, 1, 1, 1, 1, 1, 1],
        trace_state: "vendor=a".into(),
        flags: 0x301,
        name: "execute_tool run_notebook".into(),
        kind: 1,
        start_time_unix_nano: 1_700_000_000_123_456_789,
        end_time_unix_nano: 1_700_000_001_000_000_000,
        attributes: vec![
            kv("gen_ai.operation.name", s("execute_tool")),
            kv("gen_ai.tool.name", s("run_notebook")),
            kv("tokens.max", Value::IntValue(i64::MAX)),
            kv("ratio", Value::DoubleValue(0.25)),
            kv("cached", Value::BoolValue(true)),
            kv(
                "cells",
                Value::ArrayValue(ArrayValue {
                    values: vec![
                        AnyValue {
                            value: Some(s("a")),
                        },
                        AnyValue {
                            value: Some(s("b")),
                        },
                    ],
                }),
            ),
        ],
        dropped_attributes_count: 3,
        events: vec![Event {
            time_unix_nano: 1_700_000_000_500_000_000,
            name: "cell.done".into(),
            attributes: vec![kv("cell", Value::IntValue(4))],
            dropped_attributes_count: 1,
        }],
        dropped_events_count: 2,
        links: vec![Link {
            trace_id: vec![9; 16],
            span_id: vec![8; 8],
            trace_state: "k=v".into(),
            attributes: vec![kv("link.kind", s("follows"))],
            dropped_attributes_count: 0,
            flags: 1,
        }],
        dropped_links_count: 5,
        status: Some(Status {
            code: 2,
            message: "cell 4 raised".into(),
        }),
    };
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", s(service)),
                    kv("process.pid", Value::IntValue(4242)),
                ],
                dropped_attributes_count: 0,
                entity_refs: vec![],
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "e2e.scope".into(),
                    version: "1.2.3".into(),
                    attributes: vec![],
                    dropped_attributes_count: 0,
                }),
                spans: vec![root, tool],
                schema_url: "https://opentelemetry.io/schemas/1.26.0".into(),
            }],
            schema_url: "https://opentelemetry.io/schemas/1.27.0".into(),
        }],
    }
}

pub fn post_protobuf(server: &Server, path: &str, body: Vec<u8>) -> reqwest::blocking::Response {
    http_client()
        .post(server.otlp_http(path))
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .unwrap()
}

fn assert_rich_trace(server: &Server, trace_hex: &str, service: &str) {
    let (status, trace) = server.get_json(&format!("/api/v1/traces/{trace_hex}"));
    assert_eq!(status, 200, "{trace}");
    assert_eq!(trace["trace_id"], trace_hex);
    assert_eq!(trace["spans"].as_array().unwrap().len(), 2, "{trace:#}");
    let tool = span_named(&trace, "execute_tool run_notebook");
    assert_eq!(tool["span_id"], "0202020202020202");
    assert_eq!(tool["parent_span_id"], "0101010101010101");
    assert_eq!(tool["trace_state"], "vendor=a");
    assert_eq!(tool["flags"], 0x301);
    assert_eq!(tool["start_time_unix_nano"], "1700000000123456789");
    assert_eq!(tool["end_time_unix_nano"], "1700000001000000000");
    assert_eq!(tool["state"], "ended");
    assert_eq!(tool["dropped_attributes_count"], 3);
    assert_eq!(tool["dropped_events_count"], 2);
    assert_eq!(tool["dropped_links_count"], 5);
    assert_eq!(tool["status"]["code"], 2);
    assert_eq!(tool["status"]["message"], "cell 4 raised");
    let attrs = &tool["attributes"];
    assert_eq!(
        attr(attrs, "gen_ai.tool.name")["stringValue"],
        "run_notebook"
    );
    assert_eq!(attr(attrs, "tokens.max")["intValue"], "9223372036854775807");
    assert_eq!(attr(attrs, "ratio")["doubleValue"], 0.25);
    assert_eq!(attr(attrs, "cached")["boolValue"], true);
    assert_eq!(
        attr(attrs, "cells")["arrayValue"]["values"][1]["stringValue"],
        "b"
    );
    assert_eq!(tool["events"][0]["name"], "cell.done");
    assert_eq!(tool["events"][0]["time_unix_nano"], "1700000000500000000");
    assert_eq!(
        attr(&tool["events"][0]["attributes"], "cell")["intValue"],
        "4"
    );
    assert_eq!(tool["links"][0]["trace_id"], "09".repeat(16));
    assert_eq!(tool["links"][0]["span_id"], "08".repeat(8));
    assert_eq!(
        attr(&tool["links"][0]["attributes"], "link.kind")["stringValue"],
        "follows"
    );
    assert_eq!(
        attr(
            &trace["resources"][tool["resource_index"].as_u64().unwrap() as usize]["attributes"],
            "service.name"
        )["stringValue"],
        service
    );
    assert_eq!(
        trace["scopes"][tool["scope_index"].as_u64().unwrap() as usize]["name"],
        "e2e.scope"
    );
    assert_eq!(
        trace["scopes"][tool["scope_index"].as_u64().unwrap() as usize]["version"],
        "1.2.3"
    );
    let root = span_named(&trace, "invoke agent_turn");
    assert!(
        root["parent_span_id"].is_null() || root["parent_span_id"] == "",
        "{root}"
    );
}

#[test]
fn ready_line_names_every_listener_and_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    for k in ["otlp_grpc", "otlp_http", "dashboard"] {
        let addr: std::net::SocketAddr = server.ready[k].as_str().unwrap().parse().unwrap();
        assert!(addr.ip().is_loopback(), "{k} not on loopback: {addr}");
        assert_ne!(addr.port(), 0);
    }
    let dd = std::path::PathBuf::from(server.ready["data_dir"].as_str().unwrap());
    assert_eq!(dd, dir.path().join("data").canonicalize().unwrap());
    assert!(dd.join("stallwatch.db").exists());
    assert!(dd.join("token").exists());
    let (st, _) = server.get_json("/healthz");
    assert_eq!(st, 200);
    let (st, _) = server.get_json("/readyz");
    assert_eq!(st, 200);
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn otlp_http_protobuf_is_stored_and_read_back_field_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let tid = [0xab; 16];
    let resp = post_protobuf(
        &server,
        "/v1/traces",
        rich_request(tid, "http-svc").encode_to_vec(),
    );
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-protobuf");
    let body = resp.bytes().unwrap();
    let decoded = ExportTraceServiceResponse::decode(body.as_ref()).unwrap();
    assert!(decoded
        .partial_success
        .is_none_or(|p| p.rejected_spans == 0));
    assert_rich_trace(&server, &"ab".repeat(16), "http-svc");

    // Search finds it by service and by tool name, and not by a service that is absent.
    let (st, page) = server.get_json("/api/v1/traces?service=http-svc");
    assert_eq!(st, 200, "{page}");
    assert!(
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["trace_id"] == "ab".repeat(16)),
        "{page}"
    );
    let (_, page) = server.get_json("/api/v1/traces?tool_name=run_notebook");
    assert_eq!(page["items"].as_array().unwrap().len(), 1, "{page}");
    let (_, page) = server.get_json("/api/v1/traces?service=nobody");
    assert_eq!(page["items"].as_array().unwrap().len(), 0, "{page}");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn otlp_grpc_is_stored_and_resending_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tid = [0xcd; 16];
    rt.block_on(async {
        let mut client = TraceServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        for _ in 0..3 {
            let resp = client
                .export(rich_request(tid, "grpc-svc"))
                .await
                .unwrap()
                .into_inner();
            assert!(resp.partial_success.is_none_or(|p| p.rejected_spans == 0));
        }
    });
    assert_rich_trace(&server, &"cd".repeat(16), "grpc-svc");
    let (_, page) = server.get_json("/api/v1/traces?service=grpc-svc");
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{page}");
    assert_eq!(
        items[0]["span_count"], 2,
        "re-sent spans were stored twice: {page}"
    );
}

#[test]
fn logs_are_stored_and_linked_to_their_trace() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let tid = [0x5a; 16];
    assert_eq!(
        post_protobuf(
            &server,
            "/v1/traces",
            rich_request(tid, "logs-svc").encode_to_vec()
        )
        .status(),
        200
    );
    let logs = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![kv("service.name", s("logs-svc"))],
                dropped_attributes_count: 0,
                entity_refs: vec![],
            }),
            scope_logs: vec![ScopeLogs {
                scope: None,
                log_records: vec![LogRecord {
                    time_unix_nano: 1_700_000_000_600_000_000,
                    severity_number: 17,
                    severity_text: "ERROR".into(),
                    body: Some(AnyValue {
                        value: Some(s("cell 4 raised ValueError")),
                    }),
                    trace_id: tid.to_vec(),
                    span_id: vec![2; 8],
                    ..Default::default()
                }],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    assert_eq!(
        post_protobuf(&server, "/v1/logs", logs.encode_to_vec()).status(),
        200
    );
    let (_, trace) = server.get_json(&format!("/api/v1/traces/{}", "5a".repeat(16)));
    let logs = trace["logs"].as_array().unwrap();
    assert_eq!(logs.len(), 1, "{trace:#}");
    assert_eq!(logs[0]["span_id"], "02".repeat(8));
    assert_eq!(logs[0]["severity_text"], "ERROR");
    assert_eq!(logs[0]["body"]["stringValue"], "cell 4 raised ValueError");
}

#[test]
fn metrics_endpoint_counts_what_was_received() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let tid = [0x77; 16];
    assert_eq!(
        post_protobuf(
            &server,
            "/v1/traces",
            rich_request(tid, "m").encode_to_vec()
        )
        .status(),
        200
    );
    let text = http_client()
        .get(server.api("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let mut samples = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some((k, v)) = line.rsplit_once(' ') {
            samples.insert(k.to_string(), v.to_string());
        }
    }
    let received: f64 = samples
        .iter()
        .filter(|(k, _)| {
            k.starts_with("stallwatch_") && k.contains("spans") && k.contains("received")
        })
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .sum();
    assert!(
        received >= 2.0,
        "no received-spans counter >= 2 in /metrics:\n{text}"
    );
}

#[test]
fn bad_input_is_refused_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let bad = post_protobuf(&server, "/v1/traces", vec![0xff, 0xff, 0xff, 0x0f, 0x01]);
    assert_eq!(bad.status(), 400);
    let bad = http_client()
        .post(server.otlp_http("/v1/traces"))
        .header("content-type", "application/json")
        .body("{\"resourceSpans\": [")
        .send()
        .unwrap();
    assert_eq!(bad.status(), 400);
    let good = post_protobuf(
        &server,
        "/v1/traces",
        rich_request([0x42; 16], "ok").encode_to_vec(),
    );
    assert_eq!(good.status(), 200);
    assert_eq!(server.stop(), Some(0));
}
