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
            return crate::error::DashboardError::bad_param(format!(
                "MCP request body over {MAX_MCP_BODY_BYTES} bytes"
            ))
            .into_response()
        }
    };
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
            "limit": n("page size"),
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
            "limit": n("page size"),
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
}
