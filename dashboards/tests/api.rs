//! Golden JSON for every read endpoint over seeded data, parameter validation, the Host
//! check, CORS, health, readiness, metrics and the OpenAPI document.

use serde_json::Value;
use stallwatch_dashboards::{DashboardConfig, ROUTES};

/// The OpenAPI document as written (the dashboard serves it gzip-compressed by build.rs).
const OPENAPI_JSON: &str = include_str!("../src/openapi.json");

use crate::common::*;

#[tokio::test]
async fn read_endpoints_match_golden_json() {
    let h = Harness::start(DashboardConfig::default()).await;
    seed(&h).await;
    let cases: &[(&str, String)] = &[
        ("traces", "/api/v1/traces".into()),
        (
            "traces_tool",
            "/api/v1/traces?tool_name=run_notebook".into(),
        ),
        (
            "traces_error",
            "/api/v1/traces?status=error&min_duration_ms=1000".into(),
        ),
        (
            "traces_attr",
            "/api/v1/traces?attr=stallwatch.runner.id=nb-1&limit=1".into(),
        ),
        ("trace_a", format!("/api/v1/traces/{TRACE_A}")),
        ("trace_b_inferred", format!("/api/v1/traces/{TRACE_B}")),
        (
            "span_tool",
            format!("/api/v1/traces/{TRACE_A}/spans/{TOOL}"),
        ),
        (
            "span_inferred",
            format!("/api/v1/traces/{TRACE_B}/spans/{MISSING_PARENT}"),
        ),
        ("open_spans", "/api/v1/open-spans".into()),
        ("services", "/api/v1/services".into()),
        (
            "span_names",
            "/api/v1/span-names?service=python-runner".into(),
        ),
        ("runners", "/api/v1/runners".into()),
        ("runner_nb1", "/api/v1/runners/nb-1".into()),
        ("breakers", "/api/v1/breakers".into()),
        ("incidents", "/api/v1/incidents".into()),
        (
            "incidents_terminated",
            "/api/v1/incidents?event=runner.terminated&runner_id=nb-1".into(),
        ),
        ("incident_1", "/api/v1/incidents/1".into()),
        ("checkpoints", "/api/v1/checkpoints".into()),
        ("deliveries", "/api/v1/webhooks/deliveries".into()),
    ];
    for (name, path) in cases {
        let (status, body) = h.get_json(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_golden(name, body);
    }
    h.stop().await;
}

#[tokio::test]
async fn trace_view_shows_open_and_inferred_spans() {
    let h = Harness::start(DashboardConfig::default()).await;
    seed(&h).await;
    let (_, a) = h.get_json(&format!("/api/v1/traces/{TRACE_A}")).await;
    let state_of = |v: &Value, id: &str| {
        v["spans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["span_id"] == id)
            .map(|s| s["state"].as_str().unwrap().to_string())
    };
    assert_eq!(state_of(&a, OPEN).as_deref(), Some("open"));
    assert_eq!(state_of(&a, TOOL).as_deref(), Some("ended"));
    assert_eq!(a["logs"][0]["span_id"], TOOL);
    // an open child makes its unreceived parent "in progress (inferred)"
    assert_eq!(
        a["spans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["span_id"] == OPEN)
            .map(|s| s["parent_state"].clone()),
        Some(Value::from("present"))
    );
    // Issue 12 #8: a parent that only an ENDED child names is a remote parent, "parent
    // not received": no made-up running span, and the child says so.
    let (_, b) = h.get_json(&format!("/api/v1/traces/{TRACE_B}")).await;
    assert_eq!(state_of(&b, MISSING_PARENT), None, "{b:#}");
    let orphan = b["spans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["span_id"] == ORPHAN)
        .unwrap();
    assert_eq!(orphan["parent_state"], "missing", "{orphan:#}");
    h.stop().await;
}

#[tokio::test]
async fn paging_walks_every_trace_once() {
    let h = Harness::start(DashboardConfig::default()).await;
    seed(&h).await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let path = match &cursor {
            Some(c) => format!("/api/v1/traces?limit=1&cursor={c}"),
            None => "/api/v1/traces?limit=1".into(),
        };
        let (status, page) = h.get_json(&path).await;
        assert_eq!(status, 200, "{page}");
        for it in page["items"].as_array().unwrap() {
            seen.push(it["trace_id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, vec![TRACE_A.to_string(), TRACE_B.to_string()]);
    h.stop().await;
}

/// The name lists are paged like the others: every span name of a service once, in order,
/// across pages of 3; one page of the most holds them all (the golden answers).
#[tokio::test]
async fn name_lists_are_paged() {
    let h = Harness::start(DashboardConfig::default()).await;
    seed(&h).await;
    let (_, whole) = h.get_json("/api/v1/span-names?service=python-runner").await;
    assert!(whole["next_cursor"].is_null(), "{whole}");
    let mut seen: Vec<Value> = Vec::new();
    let mut path = "/api/v1/span-names?service=python-runner&limit=3".to_string();
    let mut pages = 0;
    loop {
        let (status, page) = h.get_json(&path).await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        assert!(pages < 10, "paging does not end: {page}");
        seen.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => {
                path = format!(
                    "/api/v1/span-names?service=python-runner&limit=3&cursor={}",
                    c.replace(' ', "%20")
                )
            }
            None => break,
        }
    }
    assert_eq!(pages, 2);
    assert_eq!(Value::from(seen), whole["items"]);
    let (_, one) = h.get_json("/api/v1/services?limit=1").await;
    assert_eq!(one["items"].as_array().map(Vec::len), Some(1), "{one}");
    h.stop().await;
}

#[tokio::test]
async fn bad_parameters_get_clear_400s() {
    let h = Harness::start(DashboardConfig::default()).await;
    let cases = [
        ("/api/v1/traces?limit=0", "limit"),
        ("/api/v1/traces?limit=100000", "limit"),
        ("/api/v1/traces?status=broken", "status"),
        ("/api/v1/traces?min_duration_ms=-3", "min_duration_ms"),
        ("/api/v1/traces?attr=novalue", "attr"),
        ("/api/v1/traces?colour=red", "colour"),
        (
            "/api/v1/traces?start_unix_nano=10&end_unix_nano=5",
            "end_unix_nano",
        ),
        ("/api/v1/traces?cursor=%21%21", "cursor"),
        ("/api/v1/open-spans?limit=0", "limit"),
        ("/api/v1/open-spans?limit=1001", "limit"),
        ("/api/v1/open-spans?cursor=%21%21", "cursor"),
        ("/api/v1/open-spans?page=2", "page"),
        ("/api/v1/services?limit=0", "limit"),
        ("/api/v1/span-names?limit=1001", "limit"),
        ("/api/v1/metrics?limit=0", "limit"),
        ("/api/v1/metrics?cursor=zz", "cursor"),
        ("/api/v1/traces/xyz", "trace_id"),
        (
            "/api/v1/traces/0af7651916cd43dd8448eb211c80319c/spans/zz",
            "span_id",
        ),
        (
            "/api/v1/incidents?event=breaker.exploded",
            "breaker.exploded",
        ),
        ("/api/v1/incidents/abc", "incident id"),
        ("/api/v1/webhooks/deliveries?state=lost", "state"),
        ("/api/v1/traces?attr=custom.key=1", "custom.key"),
        ("/api/v1/events?board=maybe", "board"),
        // every route refuses a parameter it does not take, the ones on an id included
        (
            "/api/v1/traces/0af7651916cd43dd8448eb211c80319c/otlp?download=1",
            "download",
        ),
        (
            "/api/v1/traces/0af7651916cd43dd8448eb211c80319c/spans/b7ad6b7169203331?x=1",
            "\"x\"",
        ),
        ("/api/v1/runners/nb-1?verbose=1", "verbose"),
        ("/api/v1/runners/nb-1/admit?force=1", "force"),
        ("/api/v1/incidents/1?full=1", "full"),
        ("/api/v1/openapi.json?zzz=1", "zzz"),
        // a path segment that is not UTF-8: the routing layer's refusal, in the same shape
        ("/api/v1/traces/%FF", "UTF-8"),
        ("/api/v1/runners/%FF", "UTF-8"),
        ("/api/v1/incidents/%FF", "UTF-8"),
        ("/api/v1/metrics/%FF/points", "UTF-8"),
        (
            "/api/v1/traces/0af7651916cd43dd8448eb211c80319c/spans/%FF",
            "UTF-8",
        ),
    ];
    for (path, needle) in cases {
        let (status, body) = h.get_json(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert!(body["error"]["code"].is_string(), "{path}: {body}");
        assert!(
            msg.contains(needle),
            "{path}: {msg:?} should name {needle:?}"
        );
    }
    let (_, body) = h.get_json("/api/v1/traces/%FF").await;
    assert_eq!(body["error"]["code"], "invalid_path", "{body}");
    // A method a route does not take: 405 with Allow, in the same shape.
    for (method, path) in [
        (reqwest::Method::DELETE, "/api/v1/traces"),
        (reqwest::Method::PUT, "/api/v1/shutdown"),
        (reqwest::Method::POST, "/api/v1/runners/nb-1/admit"),
    ] {
        let r = reqwest::Client::new()
            .request(method.clone(), h.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 405, "{method} {path}");
        assert!(r.headers().contains_key("allow"), "{method} {path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(method.as_str()) && msg.contains(path), "{msg}");
    }
    let (status, body) = h
        .get_json("/api/v1/traces/0af7651916cd43dd8448eb211c80319d")
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    let (status, _) = h.get_json("/api/v1/runners/ghost").await;
    assert_eq!(status, 404);
    let (status, body) = h.get_json("/api/v1/metrics/ghost.metric/points").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    h.stop().await;
}

#[tokio::test]
async fn admission_follows_the_breaker() {
    let h = Harness::start(DashboardConfig::default()).await;
    h.board.send_replace(board());
    let r = h.get("/api/v1/runners/nb-1/admit").await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v,
        serde_json::json!({"state":"CLOSED","admit":true,"reason":"","retry_after_ms":null,"lifecycle":"running"})
    );
    let r = h.get("/api/v1/runners/py-2/admit").await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "13");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["state"], "OPEN");
    assert_eq!(v["admit"], false);
    assert_eq!(v["retry_after_ms"], 12500);
    let r = h.get("/api/v1/runners/nobody/admit").await;
    assert_eq!(r.status(), 404);
    h.stop().await;
}

#[tokio::test]
async fn foreign_host_is_refused() {
    let h = Harness::start(DashboardConfig {
        allowed_hosts: vec!["workbench.lan".into()],
        ..DashboardConfig::default()
    })
    .await;
    for (host, want) in [
        ("evil.example:4319", 421),
        ("127.0.0.1.nip.io", 421),
        ("localhost:4319", 200),
        ("[::1]:4319", 200),
        ("workbench.lan:4319", 200),
    ] {
        let r = h
            .client
            .get(h.url("/api/v1/runners"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "Host: {host}");
        if want == 421 {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "host_not_allowed");
            // The same words OTLP/HTTP and gRPC answer, from the one rule.
            assert_eq!(
                v["error"]["message"],
                stallwatch_storage::hosts::refusal_message(host),
                "Host: {host}"
            );
        }
    }
    h.stop().await;
}

#[tokio::test]
async fn cors_only_for_configured_origins() {
    let h = Harness::start(DashboardConfig {
        cors_allowed_origins: vec!["tauri://localhost".into(), "http://localhost:*".into()],
        ..DashboardConfig::default()
    })
    .await;
    for (origin, allowed) in [
        ("tauri://localhost", true),
        ("http://localhost:1420", true),
        ("https://evil.example", false),
    ] {
        let r = h
            .client
            .get(h.url("/api/v1/runners"))
            .header("origin", origin)
            .send()
            .await
            .unwrap();
        let acao = r
            .headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(acao.as_deref(), allowed.then_some(origin), "{origin}");
    }
    // A browser MCP client's preflight for /mcp: after `initialize` it sends
    // MCP-Protocol-Version on every request, so that header must be allowed.
    let r = h
        .client
        .request(reqwest::Method::OPTIONS, h.url("/mcp"))
        .header("origin", "tauri://localhost")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type,mcp-protocol-version",
        )
        .send()
        .await
        .unwrap();
    let allowed = r
        .headers()
        .get("access-control-allow-headers")
        .map(|v| v.to_str().unwrap().to_ascii_lowercase())
        .unwrap_or_default();
    assert!(allowed.contains("mcp-protocol-version"), "{allowed:?}");
    h.stop().await;
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let h = Harness::start(DashboardConfig::default()).await;
    assert_eq!(h.get("/healthz").await.status(), 200);
    assert_eq!(h.get("/readyz").await.status(), 200);
    h.ready.send_replace(false);
    assert_eq!(h.get("/readyz").await.status(), 503);
    assert_eq!(h.get("/healthz").await.status(), 200);
    let text = h.get("/metrics").await.text().await.unwrap();
    assert!(text.contains("stallwatch_test_spans_total 7"), "{text}");
    assert!(
        text.contains(r#"stallwatch_dashboard_http_requests_total{route="/healthz",code="2xx"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"stallwatch_dashboard_http_requests_total{route="/readyz",code="5xx"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"stallwatch_webhook_attempts_total{outcome="delivered"}"#),
        "{text}"
    );
    h.stop().await;
}

#[tokio::test]
async fn openapi_documents_every_route() {
    let doc: Value = serde_json::from_str(OPENAPI_JSON).unwrap();
    assert_eq!(
        doc["openapi"].as_str().map(|v| v.starts_with("3.")),
        Some(true)
    );
    let paths = doc["paths"].as_object().unwrap();
    for route in ROUTES {
        assert!(
            paths.contains_key(*route),
            "{route} missing from openapi.json"
        );
    }
    for p in paths.keys() {
        assert!(
            ROUTES.contains(&p.as_str())
                || ["/healthz", "/readyz", "/metrics"].contains(&p.as_str()),
            "openapi.json documents {p}, which is not routed"
        );
    }
    let h = Harness::start(DashboardConfig::default()).await;
    let (status, served) = h.get_json("/api/v1/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(served, doc);
    // every documented GET without path parameters answers (no 404/500)
    for (p, item) in paths {
        if item.get("get").is_some() && !p.contains('{') && p != "/api/v1/events" {
            let s = h.get(p).await.status().as_u16();
            assert!(s == 200 || s == 503, "{p} answered {s}");
        }
    }
    h.stop().await;
}

#[tokio::test]
async fn ui_is_embedded() {
    let h = Harness::start(DashboardConfig::default()).await;
    let r = h.get("/").await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let html = r.text().await.unwrap();
    assert!(html.contains("/ui/app.js") && html.contains("/ui/app.css"));
    let js = h.get("/ui/app.js").await;
    assert_eq!(js.status(), 200);
    assert!(js.headers().get("content-encoding").is_none());
    let js = js.text().await.unwrap();
    assert!(js.contains("EventSource"));
    assert_eq!(js, include_str!("../ui/app.js"));
    // A browser (it takes gzip) gets the embedded gzip bytes, which inflate to the file.
    for (path, source) in [
        ("/ui/app.js", include_str!("../ui/app.js")),
        ("/", include_str!("../ui/index.html")),
        ("/api/v1/openapi.json", OPENAPI_JSON),
    ] {
        let r = h
            .client
            .get(h.url(path))
            .header("accept-encoding", "gzip, deflate, br, zstd")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-encoding"], "gzip", "{path}");
        assert_eq!(r.headers()["vary"], "accept-encoding", "{path}");
        let gz = r.bytes().await.unwrap();
        assert!(gz.len() < source.len(), "{path}");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut text)
            .unwrap();
        assert_eq!(text, source, "{path}");
    }
    assert_eq!(h.get("/ui/secret.txt").await.status(), 404);
    h.stop().await;
}

/// `/mcp` end to end on seeded data: the tools answer as their read routes do (arguments
/// validated by the route, `search_logs` matching the body's text), and what MCP asks of
/// the transport: an unknown tool is a protocol error, every request with an id gets an
/// answer, media types compare case-insensitively, refusals are JSON-RPC errors.
#[tokio::test]
async fn mcp_tools_and_transport_rules() {
    let h = Harness::start(DashboardConfig::default()).await;
    seed(&h).await;
    let post = |body: String, headers: &[(&str, &str)]| {
        let mut r = h
            .client
            .post(h.url("/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.send()
    };
    let call = |tool: &str, args: Value| {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": tool, "arguments": args}});
        post(body.to_string(), &[])
    };
    let result = |r: reqwest::Response| async move {
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        v["result"].clone()
    };
    // search_logs matches the body's text, case-insensitively, not its JSON envelope
    let found = result(
        call(
            "search_logs",
            serde_json::json!({"trace_id": TRACE_A, "contains": "CELL 7"}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(found["isError"], false, "{found}");
    let items = found["structuredContent"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{found}");
    assert_eq!(
        items[0]["body"]["stringValue"], "cell 7 still running",
        "{found}"
    );
    let none = result(
        call(
            "search_logs",
            serde_json::json!({"contains": "stringValue"}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        none["structuredContent"]["items"],
        serde_json::json!([]),
        "{none}"
    );
    // arguments are the route's query: an unknown one is refused by name, `lean` is taken
    let bad = result(
        call(
            "get_trace",
            serde_json::json!({"trace_id": TRACE_A, "bogus": 1}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(bad["isError"], true, "{bad}");
    assert!(
        bad["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("bogus"),
        "{bad}"
    );
    let lean = result(
        call(
            "get_trace",
            serde_json::json!({"trace_id": TRACE_A, "lean": true}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(lean["isError"], false, "{lean}");
    let bad = result(
        call(
            "get_trace",
            serde_json::json!({"trace_id": TRACE_A, "lean": "maybe"}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(bad["isError"], true, "{bad}");
    // list_open_spans is the paged route: a page, its cursor, and the route's limit rule
    let open = result(
        call("list_open_spans", serde_json::json!({"limit": 1}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(open["isError"], false, "{open}");
    assert_eq!(
        open["structuredContent"]["items"].as_array().map(Vec::len),
        Some(1),
        "{open}"
    );
    assert!(
        open["structuredContent"]
            .as_object()
            .is_some_and(|o| o.contains_key("next_cursor")),
        "{open}"
    );
    let bad = result(
        call("list_open_spans", serde_json::json!({"limit": 5000}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(bad["isError"], true, "{bad}");
    assert!(
        bad["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("limit"),
        "{bad}"
    );
    // several attr filters: all must hold
    let both = result(
        call(
            "search_traces",
            serde_json::json!({"attr": ["stallwatch.runner.id=nb-1", "stallwatch.runner.id=nb-1"]}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(both["isError"], false, "{both}");
    // an unknown tool: a JSON-RPC error, -32602
    let r = call("nope", serde_json::json!({})).await.unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], -32602, "{v}");
    // an integer id past i64: refused, not taken for a notification (202, no answer)
    let r = post(
        r#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}"#.into(),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], -32600, "{v}");
    // a key given twice: rmcp reads what was checked (the last one), so the request is
    // answered to the id that passed the check
    let r = post(
        r#"{"jsonrpc":"2.0","id":true,"id":7,"method":"ping"}"#.into(),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["id"], 7, "{v}");
    // media types compare case-insensitively; a wrong one is a JSON-RPC error
    let ping = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
    // one Content-Type and one Accept, as given
    let with_types = |content_type: &'static str, accept: &'static str| {
        h.client
            .post(h.url("/mcp"))
            .header("content-type", content_type)
            .header("accept", accept)
            .body(ping)
            .send()
    };
    let r = with_types(
        "Application/JSON; charset=utf-8",
        "APPLICATION/JSON, TEXT/EVENT-STREAM",
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let r = with_types("application/jsonfoo", "application/json, text/event-stream")
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Content-Type"),
        "{v}"
    );
    let r = post(ping.into(), &[("accept", "application/json")]).await;
    // reqwest joins the two Accept headers: still both types, so served
    assert_eq!(r.unwrap().status(), 200);
    let r = with_types("application/json", "application/json")
        .await
        .unwrap();
    assert_eq!(r.status(), 406);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("text/event-stream"),
        "{v}"
    );
    // GET and DELETE: 405 with Allow: POST and a JSON-RPC error
    for m in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let r = h
            .client
            .request(m.clone(), h.url("/mcp"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{m}");
        assert_eq!(r.headers()["allow"], "POST", "{m}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["code"].is_i64(), "{m}: {v}");
    }
    // two Origin lines: refused, whatever their order
    for pair in [
        ["http://localhost", "https://evil.example"],
        ["https://evil.example", "http://localhost"],
    ] {
        let r = post(ping.into(), &[("origin", pair[0]), ("origin", pair[1])])
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{pair:?}");
    }
    // a foreign origin is refused before the body is read: 403, not 413
    let r = post("x".repeat(2 << 20), &[("origin", "https://evil.example")])
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    h.stop().await;
}
