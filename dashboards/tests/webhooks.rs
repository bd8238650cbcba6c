//! Alert webhooks against a local receiver that fails the first attempts, then accepts:
//! delivered exactly once by idempotency key, signature verified, across a restart of the
//! webhook worker and the storage in the middle; every attempt visible through the API.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;
use stallwatch_dashboards::webhooks::sign;
use stallwatch_dashboards::{start_webhooks, DashboardConfig, WebhookConfig};
use stallwatch_storage::model::EventKind;
use tokio_util::sync::CancellationToken;

use crate::common::*;

const SECRET: &str = "s3cret-for-tests";

#[derive(Default)]
struct Receiver {
    /// (idempotency key, signature ok, status answered, body)
    seen: Vec<(String, bool, u16, Value)>,
    fail_first: usize,
}

async fn receive(
    State(rx): State<Arc<Mutex<Receiver>>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let mut r = rx.lock().unwrap();
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let sig = headers
        .get("x-stallwatch-signature")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let sig_ok = sig == sign(SECRET, &body)
        && headers
            .get("content-type")
            .map(|v| v == "application/json")
            .unwrap_or(false);
    let status = if r.seen.len() < r.fail_first {
        500
    } else {
        204
    };
    let already = r.seen.iter().any(|(k, _, s, _)| k == &key && *s == 204);
    let status = if already { 200 } else { status };
    r.seen.push((
        key,
        sig_ok,
        status,
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    ));
    StatusCode::from_u16(status).unwrap()
}

fn config(url: String) -> DashboardConfig {
    DashboardConfig {
        public_url: Some("http://127.0.0.1:4319".into()),
        webhooks: vec![WebhookConfig {
            url,
            secret: SECRET.into(),
            events: vec![EventKind::BreakerOpened, EventKind::RunnerTerminated],
            retry_initial: Duration::from_millis(300),
            retry_max: Duration::from_secs(2),
            max_attempts: 20,
            timeout: Duration::from_secs(5),
        }],
        ..DashboardConfig::default()
    }
}

#[tokio::test]
async fn delivered_once_across_a_restart_with_signature() {
    let receiver = Arc::new(Mutex::new(Receiver {
        fail_first: 2,
        ..Receiver::default()
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(receiver.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let cfg = config(url.clone());

    // First life: the incident is enqueued and the first attempt fails.
    let h = Harness::start(cfg.clone()).await;
    let stop1 = CancellationToken::new();
    let worker = start_webhooks(
        Arc::new(cfg.clone()),
        h.storage.clone(),
        h.events.clone(),
        stop1.clone(),
    );
    h.events
        .publish(incident(EventKind::VerdictSuspect, "not-wanted"))
        .await
        .unwrap();
    h.events
        .publish(incident(EventKind::BreakerOpened, "wanted"))
        .await
        .unwrap();
    let first = eventually(Duration::from_secs(20), || async {
        let (_, v) = h.get_json("/api/v1/webhooks/deliveries").await;
        (v["items"][0]["attempts"].as_u64().unwrap_or(0) >= 1).then_some(())
    })
    .await;
    assert!(first.is_some(), "no first attempt");
    stop1.cancel();
    worker.await.unwrap();
    let dir = h.stop().await;

    // Second life on the same database file: retried until accepted.
    let h = Harness::start_in(dir, cfg.clone()).await;
    let stop2 = CancellationToken::new();
    let worker = start_webhooks(
        Arc::new(cfg.clone()),
        h.storage.clone(),
        h.events.clone(),
        stop2.clone(),
    );
    let delivered = eventually(Duration::from_secs(30), || async {
        let (_, v) = h.get_json("/api/v1/webhooks/deliveries").await;
        (v["items"][0]["state"] == "delivered").then_some(v)
    })
    .await
    .expect("delivery never completed");
    // Give a wrong duplicate every chance to show up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop2.cancel();
    worker.await.unwrap();

    let r = Receiver {
        seen: receiver.lock().unwrap().seen.clone(),
        fail_first: 0,
    };
    let keys: std::collections::BTreeSet<&str> = r.seen.iter().map(|(k, ..)| k.as_str()).collect();
    assert_eq!(
        keys.len(),
        1,
        "one incident, one idempotency key: {:?}",
        r.seen
    );
    let accepted = r.seen.iter().filter(|(_, _, s, _)| *s == 204).count();
    assert_eq!(accepted, 1, "accepted exactly once: {:?}", r.seen);
    assert_eq!(
        r.seen.len(),
        3,
        "two failures then success, no extra sends: {:?}",
        r.seen
    );
    assert!(
        r.seen.iter().all(|(_, ok, ..)| *ok),
        "signature or content type wrong"
    );
    let body = &r.seen[2].3;
    assert_eq!(body["event"], "breaker.opened");
    assert_eq!(body["runner_id"], "nb-1");
    assert_eq!(body["tool_name"], "run_notebook");
    assert_eq!(body["trace_id"], TRACE_A);
    assert_eq!(body["span_id"], TOOL);
    assert_eq!(body["evidence"]["sla_ms"], 30000);
    assert_eq!(
        body["links"]["trace"],
        format!("http://127.0.0.1:4319/#/trace/{TRACE_A}")
    );
    assert_eq!(body["idempotency_key"], *keys.iter().next().unwrap());

    let items = delivered["items"].as_array().unwrap();
    assert_eq!(
        items.len(),
        1,
        "only the wanted event is enqueued: {delivered}"
    );
    let statuses: Vec<Value> = items[0]["attempt_log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].clone())
        .collect();
    assert_eq!(
        statuses,
        vec![Value::from(500), Value::from(500), Value::from(204)]
    );
    assert_eq!(items[0]["attempts"], 3);
    assert_eq!(items[0]["last_status"], 204);
    let mut delivered = delivered;
    assert_eq!(delivered["items"][0]["webhook"], url.as_str());
    delivered["items"][0]["webhook"] = "<receiver>".into();
    assert_golden("deliveries_after_retry", delivered);
    h.stop().await;
}

#[tokio::test]
async fn unreachable_receiver_records_transport_errors_and_backs_off() {
    // A port that was just free: connection refused.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = config(format!("http://127.0.0.1:{port}/hook"));
    let h = Harness::start(cfg.clone()).await;
    let stop = CancellationToken::new();
    let worker = start_webhooks(
        Arc::new(cfg),
        h.storage.clone(),
        h.events.clone(),
        stop.clone(),
    );
    h.events
        .publish(incident(EventKind::RunnerTerminated, "t1"))
        .await
        .unwrap();
    let v = eventually(Duration::from_secs(20), || async {
        let (_, v) = h
            .get_json("/api/v1/webhooks/deliveries?state=pending")
            .await;
        (v["items"][0]["attempts"].as_u64().unwrap_or(0) >= 2).then_some(v)
    })
    .await
    .expect("no retries recorded");
    let d = &v["items"][0];
    assert!(d["last_status"].is_null());
    assert!(
        d["last_error"].as_str().unwrap().contains("connection"),
        "{d}"
    );
    let log = d["attempt_log"].as_array().unwrap();
    let t0: u64 = log[0]["at_unix_nano"].as_str().unwrap().parse().unwrap();
    let t1: u64 = log[1]["at_unix_nano"].as_str().unwrap().parse().unwrap();
    // 300 ms back-off with ±20 % jitter (docs/design.md, Webhooks): never before 240 ms
    assert!(
        t1 - t0 >= 240_000_000,
        "second attempt came before the 300 ms back-off less its 20 % jitter"
    );
    stop.cancel();
    worker.await.unwrap();
    h.stop().await;
}
