//! Control endpoints: the bearer token is required (401 and nothing sent otherwise), input
//! is validated, and the reply of the reaper/watchdog becomes the HTTP answer.

use serde_json::{json, Value};
use stallwatch_dashboards::DashboardConfig;
use stallwatch_storage::control::{
    BreakerReset, BreakerState, CheckpointCreated, CheckpointError, CheckpointOutcome,
    ControlRequest, RegisterError, RunnerDeleted,
};
use tokio::sync::mpsc::error::TryRecvError;

use crate::common::*;

fn calls() -> Vec<(reqwest::Method, &'static str, Option<Value>)> {
    use reqwest::Method;
    vec![
        (
            Method::POST,
            "/api/v1/runners",
            Some(json!({"id":"nb-9","attach":{"pid":4242}})),
        ),
        (Method::DELETE, "/api/v1/runners/nb-9", None),
        (Method::POST, "/api/v1/runners/nb-9/breaker/reset", None),
        (
            Method::POST,
            "/api/v1/checkpoints",
            Some(json!({"runner_id":"nb-9","workspace":"/tmp/ws"})),
        ),
        (Method::POST, "/api/v1/checkpoints/tx-1/commit", None),
        (Method::POST, "/api/v1/checkpoints/tx-1/rollback", None),
        (Method::POST, "/api/v1/shutdown", None),
    ]
}

#[tokio::test]
async fn without_or_with_a_wrong_token_nothing_happens() {
    let mut h = Harness::start(DashboardConfig::default()).await;
    for (method, path, body) in calls() {
        for auth in [
            None,
            Some("Bearer nope"),
            Some(&*format!("Bearer {}x", TOKEN)),
            Some(&*format!("Basic {TOKEN}")),
        ] {
            let mut req = h.client.request(method.clone(), h.url(path));
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            if let Some(b) = &body {
                req = req.json(b);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 401, "{method} {path} with {auth:?}");
            assert_eq!(r.headers()["www-authenticate"], "Bearer");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "unauthorized");
        }
    }
    // A bad body without a token is still a 401, not a 400.
    let r = h
        .client
        .post(h.url("/api/v1/runners"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(
        matches!(h.control.try_recv(), Err(TryRecvError::Empty)),
        "a control request was sent"
    );
    h.stop().await;
}

#[tokio::test]
async fn with_the_token_requests_reach_the_channel_and_replies_come_back() {
    let mut h = Harness::start(DashboardConfig::default()).await;
    let mut rx = std::mem::replace(&mut h.control, tokio::sync::mpsc::channel(1).1);
    let responder = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(req) = rx.recv().await {
            match req {
                ControlRequest::RegisterRunner { spec, reply } => {
                    seen.push(format!("register {}", spec.id));
                    let _ = reply.send(Err(RegisterError::IdInUse("nb-9".into())));
                }
                ControlRequest::DeleteRunner { id, reply } => {
                    seen.push(format!("delete {id}"));
                    let _ = reply.send(Ok(RunnerDeleted {
                        id,
                        removed: true,
                        termination: None,
                        steps: vec![json!("SIGTERM"), json!("exited")],
                        survivors: vec![],
                    }));
                }
                ControlRequest::ResetBreaker { id, reply } => {
                    seen.push(format!("reset {id}"));
                    let _ = reply.send(Ok(BreakerReset {
                        id,
                        state: BreakerState::Closed,
                    }));
                }
                ControlRequest::CreateCheckpoint {
                    runner_id,
                    workspace,
                    reply,
                } => {
                    seen.push(format!("checkpoint {runner_id} {}", workspace.display()));
                    let _ = reply.send(Ok(CheckpointCreated {
                        id: "tx-1".into(),
                        path: "/tmp/ws/.workbench/checkpoints/tx-1".into(),
                    }));
                }
                ControlRequest::CommitCheckpoint { id, reply } => {
                    seen.push(format!("commit {id}"));
                    let _ = reply.send(Ok(CheckpointOutcome {
                        id,
                        state: "committed".into(),
                        files: None,
                    }));
                }
                ControlRequest::RollbackCheckpoint { id, reply } => {
                    seen.push(format!("rollback {id}"));
                    let _ = reply.send(Err(CheckpointError::NotFound("no checkpoint tx-1".into())));
                }
                ControlRequest::Shutdown => {
                    seen.push("shutdown".into());
                    break;
                }
            }
        }
        seen
    });
    let want = [409, 200, 200, 201, 200, 404, 202];
    for ((method, path, body), want) in calls().into_iter().zip(want) {
        let mut req = h
            .client
            .request(method.clone(), h.url(path))
            .bearer_auth(TOKEN);
        if let Some(b) = &body {
            req = req.json(b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        assert_eq!(status, want, "{method} {path}: {v}");
        if status == 409 {
            assert_eq!(
                v,
                json!({"error":{"code":"runner_exists","message":"runner nb-9 is registered and alive"}})
            );
        }
    }
    let seen = responder.await.unwrap();
    assert_eq!(
        seen,
        vec![
            "register nb-9",
            "delete nb-9",
            "reset nb-9",
            "checkpoint nb-9 /tmp/ws",
            "commit tx-1",
            "rollback tx-1",
            "shutdown"
        ]
    );
    h.stop().await;
}

#[tokio::test]
async fn control_input_is_validated_before_sending() {
    let mut h = Harness::start(DashboardConfig::default()).await;
    let bad = [
        (
            "/api/v1/runners",
            json!({"id":"Bad_ID","attach":{"pid":4242}}),
            "invalid_runner_id",
        ),
        ("/api/v1/runners", json!({"id":"nb-9"}), "invalid_runner"),
        (
            "/api/v1/runners",
            json!({"id":"nb-9","attach":{"pid":4242},"spawn":{"argv":["python3"]}}),
            "invalid_runner",
        ),
        (
            "/api/v1/runners",
            json!({"id":"nb-9","spawn":{"argv":[]}}),
            "invalid_runner",
        ),
        (
            "/api/v1/runners",
            json!({"id":"nb-9","attach":{"pid":4242},"colour":"red"}),
            "invalid_body",
        ),
        (
            "/api/v1/checkpoints",
            json!({"runner_id":"nb-9","workspace":"relative/ws"}),
            "invalid_workspace",
        ),
    ];
    for (path, body, code) in bad {
        let r = h
            .client
            .post(h.url(path))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
    }
    let r = h
        .client
        .post(h.url("/api/v1/checkpoints/..%2Fetc/commit"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // every control route refuses a query parameter it does not take, before acting
    for (method, path, body) in calls() {
        let mut req = h
            .client
            .request(method.clone(), h.url(&format!("{path}?force=1")))
            .bearer_auth(TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 400, "{method} {path}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("\"force\""),
            "{method} {path}: {v}"
        );
    }
    assert!(matches!(h.control.try_recv(), Err(TryRecvError::Empty)));
    h.stop().await;
}

/// A new user posting the wrong JSON shape, or too much of it, is told what was expected
/// and what the limit is; nothing is sent to the reaper.
#[tokio::test]
async fn wrong_shape_and_oversized_bodies_are_named() {
    let mut h = Harness::start(DashboardConfig::default()).await;
    let r = h
        .client
        .post(h.url("/api/v1/runners"))
        .bearer_auth(TOKEN)
        .json(&json!([]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_body", "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("JSON object") && m.contains("\"id\""), "{m}");
    assert!(m.contains("got an array"), "{m}");
    assert!(!m.contains("RunnerSpec") && !m.contains("struct"), "{m}");

    let big = format!(
        r#"{{"id":"nb-9","attach":{{"pid":4242}},"pad":"{}"}}"#,
        "x".repeat(stallwatch_dashboards::MAX_CONTROL_BODY_BYTES)
    );
    let r = h
        .client
        .post(h.url("/api/v1/runners"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "body_too_large", "{v}");
    let limit = stallwatch_dashboards::MAX_CONTROL_BODY_BYTES.to_string();
    assert!(
        v["error"]["message"].as_str().unwrap().contains(&limit),
        "{v}"
    );
    // A compressed body is refused for its coding (415, Accept-Encoding), not read as
    // broken JSON; `identity` is no coding at all.
    let spec = r#"{"id":"nb-9","attach":{"pid":4242}}"#;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, spec.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    for (path, body) in [
        ("/api/v1/runners", gz.clone()),
        ("/api/v1/shutdown", gz.clone()),
        ("/mcp", gz),
    ] {
        let r = h
            .client
            .post(h.url(path))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 415, "{path}");
        assert_eq!(r.headers()["accept-encoding"], "identity", "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "unsupported_encoding", "{path}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("gzip"),
            "{v}"
        );
    }
    assert!(matches!(h.control.try_recv(), Err(TryRecvError::Empty)));
    let r = h
        .client
        .post(h.url("/api/v1/runners"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("content-encoding", "identity")
        .body("[]")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "identity is read as sent");
    h.stop().await;
}
