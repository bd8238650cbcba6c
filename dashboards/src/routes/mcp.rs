//! `/mcp`: stallwatch's own MCP endpoint over Streamable HTTP (MCP spec, Transports:
//! Streamable HTTP), served by the official Rust SDK `rmcp`, so an agent in the workbench
//! can ask why a tool was stopped (docs/design.md, Interfaces: MCP).
//!
//! Read-only tools with JSON results, each the same answer as a read API route:
//! `search_traces` (`GET /api/v1/traces`), `get_trace` (`GET /api/v1/traces/{trace_id}`),
//! `list_open_spans` (`GET /api/v1/open-spans`), `list_runners` (`GET /api/v1/runners`),
//! `list_incidents` (`GET /api/v1/incidents`), and `search_logs` (`GET /api/v1/logs`, its
//! `body` filter named `contains`). Arguments are the routes' query
//! parameters and are validated the same way (an unknown one is refused by name).
//!
//! Stateless mode with JSON responses: every POST is answered on its own, nothing is kept
//! between requests. The dashboard's Host check applies (it wraps every route), and a
//! request with an `Origin` header must come from an origin that rule allows
//! (`origin_allowed`); like the read API these tools need no token, since they change
//! nothing.

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

/// `POST /mcp`: checks the request the way MCP Streamable HTTP asks (Origin, method,
/// media types, one JSON-RPC message), answering every refusal with a JSON-RPC error body,
/// then hands the checked message to rmcp's Streamable HTTP service.
pub(crate) async fn handle(State(ctx): State<Shared>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    // Origin first: a foreign page learns nothing else, not even the body limit.
    let mut origins = parts.headers.get_all(http::header::ORIGIN).iter();
    if let Some(origin) = origins.next() {
        let shown = String::from_utf8_lossy(origin.as_bytes()).into_owned();
        // several Origin lines: a proxy and stallwatch could each read a different one
        let why = if origins.next().is_some() {
            Some("several Origin headers".to_string())
        } else if !origin_allowed(origin.as_bytes(), &ctx.app.config) {
            Some(format!(
                "Origin {shown:?} is not allowed (a loopback or [dashboard] allowed_hosts host, or a cors_allowed_origins entry)"
            ))
        } else {
            None
        };
        if let Some(why) = why {
            tracing::warn!(origin = %shown, "/mcp refused a request: {why}");
            return jsonrpc_error(
                http::StatusCode::FORBIDDEN,
                None,
                -32000,
                format!("Forbidden: {why}"),
            );
        }
    }
    if parts.method != http::Method::POST {
        // stateless: no SSE stream to GET, no session to DELETE (MCP Streamable HTTP)
        let mut resp = jsonrpc_error(
            http::StatusCode::METHOD_NOT_ALLOWED,
            None,
            -32000,
            format!(
                "Method Not Allowed: {} (this server is stateless: POST one JSON-RPC message per request)",
                parts.method
            ),
        );
        resp.headers_mut()
            .insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
        return resp;
    }
    if let Err((status, message)) = check_media_types(&parts.headers) {
        return jsonrpc_error(status, None, -32600, message);
    }
    let bytes = match axum::body::to_bytes(body, MAX_MCP_BODY_BYTES).await {
        Ok(b) => b,
        // cut by the listener's minimum body rate: 408 naming the rule, not a 413
        Err(e) => {
            return match stallwatch_storage::listen::too_slow(&e) {
                Some(t) => crate::error::DashboardError::BodyTooSlow(t.clone()),
                None => crate::error::DashboardError::BodyTooLarge {
                    limit: MAX_MCP_BODY_BYTES,
                },
            }
            .into_response()
        }
    };
    let message = match check_message(&bytes) {
        Ok(v) => v,
        Err(refusal) => {
            return jsonrpc_error(refusal.status, refusal.id, refusal.code, refusal.message)
        }
    };
    // rmcp reads what was checked, not the raw bytes: with a key given twice the two
    // parsers could each keep a different one (serde_json keeps the last)
    let bytes = match serde_json::to_vec(&message) {
        Ok(b) => b,
        Err(e) => {
            return jsonrpc_error(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                None,
                -32603,
                format!("Internal error: {e}"),
            )
        }
    };
    // the media types passed a case-insensitive check; rmcp compares them as written
    parts.headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    parts.headers.insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static("application/json, text/event-stream"),
    );
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

/// The media type of a header value, lowercased, without its parameters (RFC 9110
/// §8.3.1: type and subtype are case-insensitive).
fn media_type(value: &str) -> String {
    value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Checks a POST's `Content-Type` (`application/json`, MCP Streamable HTTP: the body is
/// one JSON-RPC message) and `Accept` (the client MUST list both `application/json` and
/// `text/event-stream`), case-insensitively. Errors: (415 or 406, what is wrong).
fn check_media_types(headers: &http::HeaderMap) -> Result<(), (http::StatusCode, String)> {
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if content_type.as_deref().map(media_type).as_deref() != Some("application/json") {
        return Err((
            http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Unsupported Media Type: Content-Type must be application/json, got {}",
                content_type.map_or("none".into(), |c| format!("{c:?}"))
            ),
        ));
    }
    let accepted: Vec<String> = headers
        .get_all(http::header::ACCEPT)
        .iter()
        .flat_map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split(',')
                .map(media_type)
                .collect::<Vec<_>>()
        })
        .collect();
    let takes = |t: &str| accepted.iter().any(|a| a == t || a == "*/*");
    if !(takes("application/json") && takes("text/event-stream")) {
        return Err((
            http::StatusCode::NOT_ACCEPTABLE,
            "Not Acceptable: Accept must list both application/json and text/event-stream (MCP Streamable HTTP)".into(),
        ));
    }
    Ok(())
}

/// A JSON-RPC error answer (JSON-RPC 2.0 §5.1 codes): `id` is the request's when it had a
/// valid one, else `null`. MCP Streamable HTTP: a POST whose body the server cannot accept
/// gets an HTTP error status, and its body may be a JSON-RPC error response with no `id`.
fn jsonrpc_error(
    status: http::StatusCode,
    id: Option<Value>,
    code: i64,
    message: String,
) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id.unwrap_or(Value::Null),
        "error": {"code": code, "message": message},
    });
    let mut resp = (status, axum::Json(body)).into_response();
    resp.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    resp
}

/// True when a request's `Origin` may use `/mcp` (MCP, Transports: Streamable HTTP,
/// Security Warning: servers MUST validate `Origin`, and answer 403 when it is present and
/// invalid; a DNS rebinding guard next to the `Host` check): the origin's host is one the
/// `Host` rule allows (loopback, `*.localhost`, `[dashboard] allowed_hosts`; any scheme, so
/// `tauri://localhost` passes), or the whole origin matches a `cors_allowed_origins`
/// pattern. `null` (a sandboxed or file page) and anything unparsable are refused.
fn origin_allowed(origin: &[u8], config: &crate::DashboardConfig) -> bool {
    let Ok(origin) = std::str::from_utf8(origin) else {
        return false;
    };
    let origin = origin.trim();
    if config
        .cors_allowed_origins
        .iter()
        .any(|p| crate::origin_matches(p, origin))
    {
        return true;
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let scheme_ok = !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    // an origin is scheme://host[:port], nothing after it
    scheme_ok
        && !authority.is_empty()
        && !authority.contains(['/', '@', '?', '#'])
        && crate::host_allowed(authority, &config.allowed_hosts)
}

/// Why a POST body is refused before rmcp sees it.
#[derive(Debug)]
struct Refusal {
    /// 400 for a body that is not a request (or has no usable id); 200 for a request with a
    /// valid id whose `params` do not fit its method: that is the request's JSON-RPC answer.
    status: http::StatusCode,
    /// The request's id, when it had a valid one.
    id: Option<Value>,
    /// JSON-RPC 2.0 §5.1 error code.
    code: i64,
    message: String,
}

/// True for an id MCP accepts: a string or an integer (MCP, Basic: Requests: "MUST be a
/// string or integer", never null; JSON-RPC 2.0 §4 numbers "SHOULD NOT contain fractional
/// parts") of at most 64 signed bits.
fn valid_id(id: &Value) -> bool {
    // rmcp keeps a number id as an i64: a larger one was taken for a notification
    id.is_string() || id.is_i64()
}

/// Refuses, before rmcp sees it, a POST body that is not one JSON-RPC 2.0 message that MCP
/// can take, with the JSON-RPC code that names the fault (rmcp answered all of these 415 in
/// plain text, with its Rust type names):
/// - not JSON: -32700 parse error (HTTP 400);
/// - a batch, a non-object, `"jsonrpc"` other than `"2.0"`, no `method`, `result` or
///   `error`, a `method` that is not a string, an `id` that is not a string or an integer
///   (null, a boolean, an object, a fraction: once treated as a notification), `params`
///   that are not an object: -32600 invalid request (HTTP 400);
/// - a message whose envelope is sound but whose `params` do not fit its method (a
///   `tools/call` without a string `name`, say): -32602 invalid params, answered to the
///   request's id (HTTP 200, it is the request's answer), HTTP 400 for a notification.
///
/// Unknown methods pass: rmcp answers them -32601.
fn check_message(body: &[u8]) -> Result<Value, Refusal> {
    let bad = |id: Option<&Value>, code: i64, message: String| Refusal {
        status: http::StatusCode::BAD_REQUEST,
        id: id.cloned(),
        code,
        message,
    };
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        bad(
            None,
            -32700,
            format!("Parse error: the body is not JSON: {e}"),
        )
    })?;
    let invalid =
        |id: Option<&Value>, why: &str| bad(id, -32600, format!("Invalid Request: {why}"));
    let Some(o) = v.as_object() else {
        return Err(invalid(
            None,
            if v.is_array() {
                "JSON-RPC batches are not supported (MCP 2025-06-18 removed them); send one message per request"
            } else {
                "a JSON-RPC message is an object"
            },
        ));
    };
    let id = o.get("id");
    let good_id = id.filter(|id| valid_id(id));
    if o.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(good_id, "\"jsonrpc\" must be \"2.0\""));
    }
    if let Some(id) = id {
        // JSON-RPC 2.0 §5: an error answering a request whose id could not be read has a
        // null id; everything else needs a string or an integer
        let null_error = id.is_null() && o.contains_key("error") && !o.contains_key("method");
        if !valid_id(id) && !null_error {
            return Err(invalid(
                None,
                &format!("\"id\" must be a string or an integer (MCP: Requests), not {id}"),
            ));
        }
    }
    match o.get("method") {
        Some(Value::String(_)) => {}
        Some(m) => {
            return Err(invalid(
                good_id,
                &format!("\"method\" must be a string, not {m}"),
            ))
        }
        None if o.contains_key("result") || o.contains_key("error") => {}
        None => {
            return Err(invalid(
                good_id,
                "a message needs a \"method\" (request, notification) or a \"result\" or \"error\" (response)",
            ))
        }
    }
    if o.get("params").is_some_and(|p| !p.is_object()) {
        return Err(invalid(
            good_id,
            "\"params\" must be an object (MCP: Requests)",
        ));
    }
    // the envelope is sound: what is left is a method's params that rmcp cannot take
    use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage};
    match <ClientJsonRpcMessage as serde::Deserialize>::deserialize(&v) {
        Err(e) => Err(invalid(
            good_id,
            &format!("not a message MCP can take: {e}"),
        )),
        // rmcp takes a known method whose params do not fit for a custom one, and answers
        // it "method not found"
        Ok(JsonRpcMessage::Request(r)) => match &r.request {
            ClientRequest::CustomRequest(c) => match params_error(&c.method, o) {
                Some(e) => Err(Refusal {
                    status: http::StatusCode::OK,
                    id: good_id.cloned(),
                    code: -32602,
                    message: format!("Invalid params for {}: {e}", c.method),
                }),
                None => Ok(v),
            },
            _ => Ok(v),
        },
        // rmcp acknowledges notifications and responses with 202; a message with an id
        // and a method is a request, which must be answered
        Ok(JsonRpcMessage::Notification(_)) if o.contains_key("id") => Err(invalid(
            None,
            "a request's id must be a string or an integer that fits in 64 signed bits",
        )),
        Ok(_) => Ok(v),
    }
}

/// Why the `params` of `msg` do not fit `method`, for an MCP client request method whose
/// params rmcp could not type (MCP schema 2025-06-18), or `None` for a method MCP does not
/// define (rmcp answers those -32601).
fn params_error(method: &str, msg: &Map<String, Value>) -> Option<String> {
    use rmcp::model as m;
    fn err<T: serde::de::DeserializeOwned>(v: Value) -> Option<String> {
        match serde_json::from_value::<T>(v) {
            Ok(_) => Some("params rmcp cannot take".into()),
            Err(e) => Some(e.to_string()),
        }
    }
    let mut req = Map::new();
    req.insert("method".into(), Value::String(method.into()));
    if let Some(p) = msg.get("params") {
        req.insert("params".into(), p.clone());
    }
    let req = Value::Object(req);
    match method {
        "initialize" => err::<m::InitializeRequest>(req),
        "tools/call" => err::<m::CallToolRequest>(req),
        "completion/complete" => err::<m::CompleteRequest>(req),
        "prompts/get" => err::<m::GetPromptRequest>(req),
        "resources/read" => err::<m::ReadResourceRequest>(req),
        "resources/subscribe" => err::<m::SubscribeRequest>(req),
        "resources/unsubscribe" => err::<m::UnsubscribeRequest>(req),
        "ping"
        | "logging/setLevel"
        | "tools/list"
        | "prompts/list"
        | "resources/list"
        | "resources/templates/list"
        | "tasks/get"
        | "tasks/list"
        | "tasks/result"
        | "tasks/cancel" => Some("params rmcp cannot take".into()),
        _ => None,
    }
}

/// The tools [`tools`] lists, in its order.
const TOOL_NAMES: [&str; 6] = [
    "search_traces",
    "get_trace",
    "list_open_spans",
    "list_runners",
    "list_incidents",
    "search_logs",
];

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
    let attr = |d: &str| json!({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}], "description": d});
    json!({ "tools": [
        tool("search_traces", "Search stored traces, newest first. Answers {\"items\":[trace summary],\"next_cursor\"}.", json!({
            "service": s("service.name"),
            "span_name": s("span name"),
            "tool_name": s("gen_ai.tool.name"),
            "status": s("unset, ok or error"),
            "min_duration_ms": json!({"type": "number", "minimum": 0}),
            "max_duration_ms": json!({"type": "number", "minimum": 0}),
            "attr": attr("key=value on an indexed attribute (gen_ai.tool.name, service.name, error.type, process.pid, stallwatch.runner.id); several: all must hold"),
            "start_unix_nano": n("earliest start, ns since the Unix epoch"),
            "end_unix_nano": n("latest start, ns since the Unix epoch"),
            "limit": page(),
            "cursor": s("next_cursor of the previous page"),
        }), &[]),
        tool("get_trace", "One trace: {\"trace_id\",\"spans\",\"logs\"} (spans with attributes as OTLP KeyValue lists, state open | ended | inferred).", json!({
            "trace_id": s("32 lowercase hex digits"),
            "lean": json!({"type": "boolean", "description": "leave out attributes, events and links"}),
        }), &["trace_id"]),
        tool("list_open_spans", "Spans still open (tool spans with their age and SLA), oldest first, a page at a time as GET /api/v1/open-spans answers them: {\"items\":[open span],\"next_cursor\"} (100 by default; pass next_cursor as cursor for more).", json!({
            "runner_id": s("only this runner's"),
            "limit": page(),
            "cursor": s("next_cursor of the previous page"),
        }), &[]),
        tool("list_runners", "Every runner as the watchdog sees it: breaker (CLOSED | OPEN | HALF_OPEN), verdict, heartbeat, lifecycle, worst open span.", json!({}), &[]),
        tool("list_incidents", "Incidents newest first (breaker.opened, runner.terminated, ...) with reason and evidence: why a tool was stopped.", json!({
            "runner_id": s("only this runner's"),
            "event": s("only this event name"),
            "before_id": n("page before this incident id"),
            "cursor": s("next_cursor of the previous page"),
            "limit": page(),
        }), &[]),
        tool("search_logs", "Log records newest first, as GET /api/v1/logs answers them: {\"items\":[log],\"next_cursor\"}; every filter is optional and all must hold.", json!({
            "trace_id": s("only this trace's records: 32 lowercase hex digits"),
            "span_id": s("only this span's records: 16 lowercase hex digits"),
            "contains": s("a case-insensitive substring of the record's body (its text, not its JSON)"),
            "service": s("service.name"),
            "runner_id": s("stallwatch.runner.id"),
            "min_severity": s("1..24 or trace, debug, info, warn, error, fatal"),
            "attr": attr("key=value on the record or its resource; several: all must hold"),
            "start_unix_nano": n("earliest record time, ns since the Unix epoch"),
            "end_unix_nano": n("records before this time, ns since the Unix epoch"),
            "limit": page(),
            "cursor": s("next_cursor of the previous page"),
        }), &[]),
    ]})
}

/// The tool's arguments as query pairs (strings, numbers and booleans; an array gives one
/// pair per item; anything else is refused by name).
fn pairs(args: &Map<String, Value>) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let one = |k: &str, v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(format!(
            "argument {k:?} must be a string, a number or a boolean"
        )),
    };
    for (k, v) in args {
        match v {
            Value::Null => continue,
            // a repeatable filter (`attr`); the route refuses a repeat of any other
            Value::Array(items) => {
                for item in items {
                    out.push((k.clone(), one(k, item)?));
                }
            }
            v => out.push((k.clone(), one(k, v)?)),
        }
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
                // the rest (`lean`) is the route's query: it refuses what it does not know
                let mut rest = args.clone();
                rest.remove("trace_id");
                let q = pairs(&rest)?;
                answer(
                    super::traces::trace(State(ctx), Path(id), Query(q))
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
                // GET /api/v1/logs: `contains` is its `body` filter (the body's text,
                // case-insensitive), the other arguments its query parameters
                let q = pairs(&args)?
                    .into_iter()
                    .map(|(k, v)| {
                        if k == "contains" {
                            ("body".into(), v)
                        } else {
                            (k, v)
                        }
                    })
                    .collect();
                answer(
                    super::logs::search(State(ctx), Query(q))
                        .await
                        .into_response(),
                )
                .await
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
        // an unknown tool is a protocol error, not a tool result (MCP 2025-06-18, Tools:
        // Error Handling: "Unknown tools", -32602)
        if !TOOL_NAMES.contains(&request.name.as_ref()) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {:?}", request.name),
                None,
            ));
        }
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
        assert_eq!(names, TOOL_NAMES, "call_tool's list of known tools");
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
        // an array repeats the parameter (`attr`); an object or a nested array is refused
        let two = json!({"attr": ["a=1", "b=2"]});
        assert_eq!(
            pairs(two.as_object().unwrap()).unwrap(),
            [("attr".into(), "a=1".into()), ("attr".into(), "b=2".into())]
        );
        for bad in [json!({"attr": {"a": 1}}), json!({"attr": [["a"]]})] {
            assert!(pairs(bad.as_object().unwrap())
                .unwrap_err()
                .contains("attr"));
        }
    }

    #[test]
    fn a_body_that_is_not_one_jsonrpc_message_is_refused_by_code() {
        let code = |b: &str| check_message(b.as_bytes()).err().map(|r| r.code);
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
        let r = check_message(b"[]").unwrap_err();
        assert!(r.message.contains("batches"), "{}", r.message);
        assert_eq!(r.status, http::StatusCode::BAD_REQUEST);
        // requests, notifications and responses pass to rmcp
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            None
        );
        assert_eq!(
            code(
                r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"list_runners"}}"#
            ),
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
        // an unknown method passes (rmcp answers -32601)
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":"no/such"}"#), None);
    }

    #[test]
    fn an_id_that_is_not_a_string_or_an_integer_is_an_invalid_request() {
        for id in ["null", "true", "{}", "[1]", "1.5"] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#);
            let r = check_message(body.as_bytes()).unwrap_err();
            assert_eq!((r.code, r.status.as_u16()), (-32600, 400), "{id}");
            assert!(r.message.contains("\"id\""), "{}", r.message);
            assert_eq!(r.id, None, "{id}");
        }
        let r = check_message(br#"{"jsonrpc":"2.0","id":3,"method":5}"#).unwrap_err();
        assert_eq!((r.code, r.id), (-32600, Some(json!(3))));
        assert!(r.message.contains("\"method\""), "{}", r.message);
        let r = check_message(br#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":7}"#)
            .unwrap_err();
        assert_eq!((r.code, r.id), (-32600, Some(json!(3))));
    }

    #[test]
    fn params_that_do_not_fit_the_method_answer_the_request_with_invalid_params() {
        let r = check_message(
            br#"{"jsonrpc":"2.0","id":"q","method":"tools/call","params":{"name":5}}"#,
        )
        .unwrap_err();
        assert_eq!(r.code, -32602);
        assert_eq!(r.id, Some(json!("q")));
        assert_eq!(r.status, http::StatusCode::OK);
        assert!(r.message.contains("tools/call"), "{}", r.message);
        for body in [
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","arguments":5}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"initialize","params":{}}"#,
        ] {
            let r = check_message(body.as_bytes()).unwrap_err();
            assert_eq!((r.code, r.id), (-32602, Some(json!(2))), "{body}");
        }
        // a notification rmcp cannot type is taken as a custom one (and answered 202)
        assert!(check_message(
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{}}}"#,
        )
        .is_ok());
    }

    #[test]
    fn origins_of_loopback_pages_pass_and_foreign_ones_are_refused() {
        let config = crate::DashboardConfig {
            allowed_hosts: vec!["workbench.lan".into()],
            cors_allowed_origins: vec!["https://app.example:*".into()],
            ..Default::default()
        };
        for o in [
            "http://localhost:6274",
            "http://127.0.0.1:4319",
            "http://[::1]:8080",
            "tauri://localhost",
            "http://tauri.localhost",
            "http://workbench.lan:3000",
            "https://app.example:8443",
        ] {
            assert!(origin_allowed(o.as_bytes(), &config), "{o}");
        }
        for o in [
            "null",
            "https://evil.example",
            "http://127.0.0.1.evil.example",
            "http://localhost@evil.example",
            "http://localhost/path",
            "localhost",
            "://localhost",
            "",
        ] {
            assert!(!origin_allowed(o.as_bytes(), &config), "{o}");
        }
        assert!(!origin_allowed(b"http://\xff", &config));
    }
}
