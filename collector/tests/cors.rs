//! C18: CORS preflights and requests from browser and web-view origins.

use serde_json::Value;

use crate::common::*;

async fn preflight(h: &Harness, origin: &str) -> reqwest::Response {
    h.client
        .request(reqwest::Method::OPTIONS, h.url("/v1/traces"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type,x-otlp-api-key",
        )
        .send()
        .await
        .unwrap()
}

fn vary_has_origin(r: &reqwest::Response) -> bool {
    r.headers().get_all("vary").iter().any(|v| {
        v.to_str()
            .unwrap()
            .split(',')
            .any(|p| p.trim().eq_ignore_ascii_case("origin"))
    })
}

#[tokio::test]
async fn c18_preflight_from_allowed_origins_is_answered() {
    let h = start().await;
    let manifest_origins: Vec<String> = manifest()
        .into_iter()
        .filter(|e| e["case"] == "C18" && e["request"]["method"] == "OPTIONS")
        .map(|e| {
            e["request"]["headers"]["Origin"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(manifest_origins.len() >= 5);
    for origin in manifest_origins {
        let allowed = [
            "http://localhost:5173",
            "tauri://localhost",
            "http://tauri.localhost",
        ]
        .contains(&origin.as_str());
        let r = preflight(&h, &origin).await;
        if allowed {
            assert_eq!(r.status(), 204, "{origin}");
            assert_eq!(r.headers()["access-control-allow-origin"], origin.as_str());
            assert!(r.headers()["access-control-allow-methods"]
                .to_str()
                .unwrap()
                .contains("POST"));
            let allow_headers = r.headers()["access-control-allow-headers"]
                .to_str()
                .unwrap()
                .to_ascii_lowercase();
            assert!(
                allow_headers.contains("content-type") && allow_headers.contains("x-otlp-api-key"),
                "{allow_headers}"
            );
            assert!(vary_has_origin(&r), "{origin}");
        } else {
            // null, vscode-webview and foreign origins are not on the default list.
            assert_eq!(r.status(), 403, "{origin}");
            assert!(
                r.headers().get("access-control-allow-origin").is_none(),
                "{origin}"
            );
        }
    }
}

#[tokio::test]
async fn c18_post_from_allowed_origin_carries_cors_headers() {
    let h = start().await;
    let r = h
        .client
        .post(h.url("/v1/traces"))
        .header("origin", "http://localhost:5173")
        .header("content-type", "application/json")
        .body(case_bytes("crafted/c01_ids_lowercase_hex.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:5173"
    );
    assert!(vary_has_origin(&r));
    assert_eq!(h.stored_span_total().await, 2);
}

#[tokio::test]
async fn c18_errors_from_allowed_origin_carry_cors_headers() {
    let h = start_with(|c| c.ingest_token = Some("tok".into())).await;
    let send = |ct: &'static str, body: Vec<u8>, auth: bool| {
        let mut rb = h
            .client
            .post(h.url("/v1/traces"))
            .header("origin", "https://tauri.localhost")
            .header("content-type", ct)
            .body(body);
        if auth {
            rb = rb.header("authorization", "Bearer tok");
        }
        rb.send()
    };
    let r = send(
        "application/json",
        case_bytes("crafted/c20_truncated_body.json"),
        true,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://tauri.localhost"
    );
    let r = send("application/json", vec![], false).await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://tauri.localhost"
    );
    let r = send("text/plain", vec![], true).await.unwrap();
    assert_eq!(r.status(), 415);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://tauri.localhost"
    );
    // Preflight needs no token (browsers never send credentials on it).
    let r = preflight(&h, "https://tauri.localhost").await;
    assert_eq!(r.status(), 204);
}

#[tokio::test]
async fn c18_foreign_origin_gets_no_cors_headers_and_stores_nothing() {
    let h = start().await;
    let r = h
        .client
        .post(h.url("/v1/traces"))
        .header("origin", "https://evil.example")
        .header("content-type", "application/json")
        .body(case_bytes("crafted/c01_ids_lowercase_hex.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let v: Value = r.json().await.unwrap();
    assert!(v["message"].as_str().unwrap().contains("origin"));
    assert_eq!(h.stored_span_total().await, 0);
    // Requests without Origin (exporters) are unaffected.
    let r = h
        .post(
            "/v1/traces",
            "application/json",
            None,
            case_bytes("crafted/c01_ids_lowercase_hex.json"),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn c18_configured_origins_replace_the_default_list() {
    let h = start_with(|c| {
        c.cors_allowed_origins = vec!["vscode-webview://0a1b2c3d".into(), "null".into()]
    })
    .await;
    assert_eq!(
        preflight(&h, "vscode-webview://0a1b2c3d").await.status(),
        204
    );
    assert_eq!(preflight(&h, "null").await.status(), 204);
    assert_eq!(preflight(&h, "http://localhost:5173").await.status(), 403);
}
