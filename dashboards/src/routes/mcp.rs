//! `/mcp`: stallwatch's own MCP endpoint over Streamable HTTP (MCP spec, Transports:
//! Streamable HTTP), served by the official Rust SDK `rmcp`, so an agent in the workbench
//! can ask why a tool was stopped (docs/design.md, Interfaces: MCP).
//!
//! Read-only tools with JSON results, each the same answer as a read API route:
//! `search_traces` (`GET /api/v1/traces`), `get_trace` (`GET /api/v1/traces/{trace_id}`),
//! `list_open_spans` (`GET /api/v1/open-spans`), `list_runners` (`GET /api/v1/runners`),
//! `list_incidents` (`GET /api/v1/incidents`), and `search_logs` (the logs of one trace,
//! filtered by a substring, until a logs search API exists). Arguments are the routes' query
//! parameters and are validated the same way (an unknown one is refused by name).
//!
//! Stateless mode with JSON responses: every POST is answered on its own, nothing is kept
//! between requests. The dashboard's Host check applies (it wraps every route); like the
//! read API these tools need no token, since they change nothing.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::response::{IntoResponse, Response};
use rmcp::model::{CallToolRequestParams, CallToolResult, ListToolsResult, ServerInfo};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};

use crate::state::Shared;

/// Largest `/mcp` request body: 1 MiB (the tools take a few short arguments).
pub const MAX_MCP_BODY_BYTES: usize = 1 << 20;
/// Largest route answer a tool hands back: 16 MiB.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The MCP server for one request.
#[derive(Clone)]
struct StallwatchMcp {
    ctx: Shared,
}

/// `POST|GET|DELETE /mcp`: hands the request to rmcp's Streamable HTTP service.
pub(crate) async fn handle(State(ctx): State<Shared>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_MCP_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return crate::error::DashboardError::BodyTooLarge {
                limit: MAX_MCP_BODY_BYTES,
            }
            .into_response()
        }
    };
    let json_post = parts.method == http::Method::POST
        && parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                ct.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("application/json")
            });
    if json_post {
        if let Err((code, message)) = check_jsonrpc(&bytes) {
            return jsonrpc_error(code, message);
        }
    }
    let config = StreamableHttpServerConfig::default()
        .with_stateful_mode(false)
        .with_json_response(true)
        // The dashboard's own Host check (loopback + configured hosts) already ran.
        .disable_allowed_hosts();
    let service = StreamableHttpService::new(
        move || Ok(StallwatchMcp { ctx: ctx.clone() }),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let req = http::Request::from_parts(parts, Body::from(bytes));
    service.handle(req).await.map(Body::new)
}

/// A JSON-RPC error answer with HTTP 400 (JSON-RPC 2.0 §5.1 codes; MCP Streamable HTTP:
/// a POST body that is not a JSON-RPC message gets an HTTP error status, and the body may be
/// a JSON-RPC error response with no `id`).
fn jsonrpc_error(code: i64, message: String) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    let mut resp = (http::StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
    resp.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    resp
}

/// Refuses, before rmcp sees it, a POST body that is not one JSON-RPC 2.0 message: not JSON
/// (-32700 parse error), a batch or anything but an object with `"jsonrpc": "2.0"` and a
/// `method`, `result` or `error` (-32600 invalid request). rmcp answered those 415 with
/// its Rust type names. Errors: (JSON-RPC code, message).
fn check_jsonrpc(body: &[u8]) -> Result<(), (i64, String)> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| (-32700, format!("Parse error: the body is not JSON: {e}")))?;
    let invalid = |why: &str| (-32600, format!("Invalid Request: {why}"));
    let Some(o) = v.as_object() else {
        return Err(invalid(if v.is_array() {
            "JSON-RPC batches are not supported (MCP 2025-06-18 removed them); send one message per request"
        } else {
            "a JSON-RPC message is an object"
        }));
    };
    if o.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid("\"jsonrpc\" must be \"2.0\""));
    }
    if !(o.contains_key("method") || o.contains_key("result") || o.contains_key("error")) {
        return Err(invalid(
            "a message needs a \"method\" (request, notification) or a \"result\" or \"error\" (response)",
        ));
    }
    Ok(())
}

fn tool(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "name": name,
        "description": description,
        "inputSchema": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        },
        "annotations": {"readOnlyHint": true, "openWorldHint": false},
    })
}

fn tools() -> Value {
    let s = |d: &str| json!({"type": "string", "description": d});
    let n = |d: &str| json!({"type": "integer", "minimum": 0, "description": d});
    // what the read API takes: 1 to 1,000 (MAX_SEARCH_LIMIT, incidents::MAX_PAGE)
    let page =
        || json!({"type": "integer", "minimum": 1, "maximum": 1000, "description": "page size"});
    json!({ "tools": [
        tool("search_traces", "Search stored traces, newest first. Answers {\"items\":[trace summary],\"next_cursor\"}.", json!({
            "service": s("service.name"),
            "span_name": s("span name"),
            "tool_name": s("gen_ai.tool.name"),
            "status": s("unset, ok or error"),
            "min_duration_ms": json!({"type": "number", "minimum": 0}),
            "attr": s("key=value on an indexed attribute (gen_ai.tool.name, service.name, error.type, process.pid, stallwatch.runner.id)"),
            "start_unix_nano": n("earliest start, ns since the Unix epoch"),
            "end_unix_nano": n("latest start, ns since the Unix epoch"),
            "limit": page(),
            "cursor": s("next_cursor of the previous page"),
        }), &[]),
        tool("get_trace", "One trace: {\"trace_id\",\"spans\",\"logs\"} (spans with attributes as OTLP KeyValue lists, state open | ended | inferred).", json!({
            "trace_id": s("32 lowercase hex digits"),
        }), &["trace_id"]),
        tool("list_open_spans", "Tool spans still open, with their age and SLA.", json!({
            "runner_id": s("only this runner's"),
        }), &[]),
        tool("list_runners", "Every runner as the watchdog sees it: breaker (CLOSED | OPEN | HALF_OPEN), verdict, heartbeat, lifecycle, worst open span.", json!({}), &[]),
        tool("list_incidents", "Incidents newest first (breaker.opened, runner.terminated, ...) with reason and evidence: why a tool was stopped.", json!({
            "runner_id": s("only this runner's"),
            "event": s("only this event name"),
            "before_id": n("page before this incident id"),
            "limit": page(),
        }), &[]),
        tool("search_logs", "Log records of one trace, optionally only those whose body contains a text.", json!({
            "trace_id": s("32 lowercase hex digits"),
            "contains": s("substring of the body"),
        }), &["trace_id"]),
    ]})
}

/// The tool's arguments as query pairs (strings, numbers and booleans; anything else is
/// refused by name).
fn pairs(args: &Map<String, Value>) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (k, v) in args {
        let v = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => continue,
            _ => return Err(format!("argument {k:?} must be a string or a number")),
        };
        out.push((k.clone(), v));
    }
    Ok(out)
}

/// Runs a route handler's answer to JSON; a non-200 answer becomes the tool's error text.
async fn answer(resp: Response) -> Result<Value, String> {
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), MAX_ANSWER_BYTES)
        .await
        .map_err(|e| format!("cannot read the answer: {e}"))?;
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status.is_success() {
        Ok(v)
    } else {
        Err(v["error"]["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("HTTP {status}")))
    }
}

impl StallwatchMcp {
    async fn run(&self, name: &str, args: Map<String, Value>) -> Result<Value, String> {
        let ctx = self.ctx.clone();
        let string = |k: &str| -> Result<String, String> {
            args.get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("argument {k:?} (a string) is required"))
        };
        match name {
            "search_traces" => {
                let q = pairs(&args)?;
                answer(
                    super::traces::search(State(ctx), Query(q))
                        .await
                        .into_response(),
                )
                .await
            }
            "get_trace" => {
                let id = string("trace_id")?;
                answer(
                    super::traces::trace(State(ctx), Path(id), Query(Vec::new()))
                        .await
                        .into_response(),
                )
                .await
            }
            "list_open_spans" => {
                let q = pairs(&args)?;
                answer(
                    super::traces::open_spans(State(ctx), Query(q))
                        .await
                        .into_response(),
                )
                .await
            }
            "list_runners" => {
                let q = pairs(&args)?;
                answer(
                    super::runners::list(State(ctx), Query(q))
                        .await
                        .into_response(),
                )
                .await
            }
            "list_incidents" => {
                let q = pairs(&args)?;
                answer(
                    super::incidents::list(State(ctx), Query(q))
                        .await
                        .into_response(),
                )
                .await
            }
            "search_logs" => {
                let id = string("trace_id")?;
                let contains = args.get("contains").and_then(Value::as_str).unwrap_or("");
                if let Some(k) = args.keys().find(|k| *k != "trace_id" && *k != "contains") {
                    return Err(format!("unknown argument {k:?}"));
                }
                let trace = answer(
                    super::traces::trace(State(ctx), Path(id.clone()), Query(Vec::new()))
                        .await
                        .into_response(),
                )
                .await?;
                let items: Vec<Value> = trace["logs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|l| contains.is_empty() || l["body"].to_string().contains(contains))
                    .cloned()
                    .collect();
                Ok(json!({"trace_id": id, "items": items}))
            }
            other => Err(format!("unknown tool {other:?}")),
        }
    }
}

impl ServerHandler for StallwatchMcp {
    fn get_info(&self) -> ServerInfo {
        let info = json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "stallwatch", "version": env!("CARGO_PKG_VERSION")},
            "instructions": "Read-only access to stallwatch: traces, open tool spans, runners, incidents (why a tool was stopped) and logs.",
        });
        serde_json::from_value(info).unwrap_or_default()
    }

    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        serde_json::from_value(tools()).map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let result = match self.run(&request.name, args).await {
            Ok(v) => json!({
                "content": [{"type": "text", "text": v.to_string()}],
                "structuredContent": v,
                "isError": false,
            }),
            Err(message) => json!({
                "content": [{"type": "text", "text": message}],
                "isError": true,
            }),
        };
        serde_json::from_value(result).map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_catalogue_parses_and_is_read_only() {
        let list: ListToolsResult = serde_json::from_value(tools()).unwrap();
        let names: Vec<_> = list.tools.iter().map(|t| t.name.to_string()).collect();
        assert_eq!(
            names,
            [
                "search_traces",
                "get_trace",
                "list_open_spans",
                "list_runners",
                "list_incidents",
                "search_logs"
            ]
        );
        let v = tools();
        assert!(v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["annotations"]["readOnlyHint"] == true));
    }

    #[test]
    fn arguments_become_query_pairs() {
        let args = json!({"tool_name": "x", "limit": 5, "skip": null});
        let p = pairs(args.as_object().unwrap()).unwrap();
        assert!(p.contains(&("tool_name".into(), "x".into())));
        assert!(p.contains(&("limit".into(), "5".into())));
        assert_eq!(p.len(), 2);
        let bad = json!({"attr": ["a"]});
        assert!(pairs(bad.as_object().unwrap())
            .unwrap_err()
            .contains("attr"));
    }

    #[test]
    fn a_body_that_is_not_one_jsonrpc_message_is_refused_by_code() {
        let code = |b: &str| check_jsonrpc(b.as_bytes()).err().map(|(c, _)| c);
        assert_eq!(code("{not json"), Some(-32700));
        assert_eq!(code(""), Some(-32700));
        assert_eq!(
            code(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
            Some(-32600)
        );
        assert_eq!(code(r#""ping""#), Some(-32600));
        assert_eq!(code(r#"{"id":1,"method":"ping"}"#), Some(-32600));
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#),
            Some(-32600)
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1}"#), Some(-32600));
        let (_, why) = check_jsonrpc(b"[]").unwrap_err();
        assert!(why.contains("batches"), "{why}");
        // requests, notifications and responses pass to rmcp
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            None
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            None
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#), None);
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}"#),
            None
        );
    }
}
