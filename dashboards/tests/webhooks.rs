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

/// The text of every tracing event on this thread while installed (`level message fields`).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

struct Line<'a>(&'a mut String);

impl tracing::field::Visit for Line<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.push_str(&format!(" {value:?}"));
        } else {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut Line(&mut line));
        self.0.lock().unwrap().push(line);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Capture {
    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// A port that was just free: connections to it are refused.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

async fn webhooks_given_up(h: &Harness) -> u64 {
    let text = h.get("/metrics").await.text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("stallwatch_webhook_attempts_total{outcome=\"given_up\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

// Runs on the test's thread (current-thread runtime), so `Capture` sees the worker's events.
#[tokio::test]
async fn pending_deliveries_of_a_webhook_no_longer_configured_are_settled_failed_at_start() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    // First life: a typo'd receiver with a password in its URL; the delivery stays pending.
    let mut typo = config(format!(
        "http://hookuser:hookpass@127.0.0.1:{}/typo",
        free_port()
    ));
    typo.webhooks[0].retry_initial = Duration::from_secs(60);
    typo.webhooks[0].retry_max = Duration::from_secs(60);
    let h = Harness::start(typo.clone()).await;
    let stop1 = CancellationToken::new();
    let worker = start_webhooks(
        Arc::new(typo.clone()),
        h.storage.clone(),
        h.events.clone(),
        stop1.clone(),
    );
    for key in ["t1", "t2"] {
        h.events
            .publish(incident(EventKind::RunnerTerminated, key))
            .await
            .unwrap();
    }
    let pending = eventually(Duration::from_secs(20), || async {
        let (_, v) = h
            .get_json("/api/v1/webhooks/deliveries?state=pending")
            .await;
        let items = v["items"].as_array().cloned().unwrap_or_default();
        (items.len() == 2 && items.iter().all(|d| d["attempts"].as_u64() >= Some(1))).then_some(v)
    })
    .await
    .expect("two pending deliveries with an attempt each");
    // The API shows the URL without its password.
    let shown = pending["items"][0]["webhook"].as_str().unwrap();
    assert!(
        shown.starts_with("http://hookuser:***@127.0.0.1:"),
        "{shown}"
    );
    stop1.cancel();
    worker.await.unwrap();
    let dir = h.stop().await;
    let before = capture.lines().len();

    // Second life: the URL was corrected.
    let fixed = config(format!("http://127.0.0.1:{}/fixed", free_port()));
    let h = Harness::start_in(dir, fixed.clone()).await;
    let given_up_before = webhooks_given_up(&h).await;
    let stop2 = CancellationToken::new();
    let worker = start_webhooks(
        Arc::new(fixed),
        h.storage.clone(),
        h.events.clone(),
        stop2.clone(),
    );
    let failed = eventually(Duration::from_secs(10), || async {
        let (_, v) = h.get_json("/api/v1/webhooks/deliveries?state=failed").await;
        (v["items"].as_array().map(Vec::len) == Some(2)).then_some(v)
    })
    .await
    .expect("the deliveries of the removed webhook were never settled");
    for d in failed["items"].as_array().unwrap() {
        assert_eq!(d["last_error"], "webhook is no longer configured", "{d}");
    }
    assert!(webhooks_given_up(&h).await >= given_up_before + 2);
    stop2.cancel();
    worker.await.unwrap();
    let lines = capture.lines()[before..].to_vec();
    let warned: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("no longer configured"))
        .collect();
    assert_eq!(warned.len(), 1, "one WARN for the URL: {lines:#?}");
    let w = warned[0];
    assert!(w.starts_with("WARN"), "{w}");
    assert!(w.contains("2 pending"), "{w}");
    assert!(w.contains("http://hookuser:***@127.0.0.1:"), "{w}");
    assert!(
        lines.iter().all(|l| !l.contains("hookpass")),
        "password logged: {lines:#?}"
    );
    h.stop().await;
}

async fn redirect(
    State(seen): State<Arc<Mutex<Vec<HeaderMap>>>>,
    headers: HeaderMap,
) -> (StatusCode, HeaderMap) {
    seen.lock().unwrap().push(headers);
    let mut h = HeaderMap::new();
    h.insert(
        "location",
        "http://mover:moverpass@elsewhere.example/hook"
            .parse()
            .unwrap(),
    );
    (StatusCode::FOUND, h)
}

#[tokio::test]
async fn a_redirect_is_final_named_and_the_password_never_shown() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://hookuser:hookpass@{}/hook",
        listener.local_addr().unwrap()
    );
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(redirect))
        .with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let cfg = config(url);
    let h = Harness::start(cfg.clone()).await;
    let stop = CancellationToken::new();
    let worker = start_webhooks(
        Arc::new(cfg),
        h.storage.clone(),
        h.events.clone(),
        stop.clone(),
    );
    h.events
        .publish(incident(EventKind::RunnerTerminated, "r1"))
        .await
        .unwrap();
    let v = eventually(Duration::from_secs(20), || async {
        let (_, v) = h.get_json("/api/v1/webhooks/deliveries?state=failed").await;
        (v["items"].as_array().map(Vec::len) == Some(1)).then_some(v)
    })
    .await
    .expect("a 302 was not final");
    // Give a wrong retry (300 ms back-off) every chance to show up.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.cancel();
    worker.await.unwrap();
    let d = &v["items"][0];
    assert_eq!(d["attempts"], 1, "{d}");
    assert_eq!(d["last_status"], 302, "{d}");
    let reason = d["last_error"].as_str().unwrap();
    assert!(
        reason.contains("http://mover:***@elsewhere.example/hook")
            && reason.contains("redirects are not followed"),
        "{reason}"
    );
    assert!(!reason.contains("moverpass"), "{reason}");
    assert!(
        d["webhook"].as_str().unwrap().contains("hookuser:***@"),
        "{d}"
    );
    // Sent once, to the real URL (its credentials as basic auth).
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode("hookuser:hookpass");
    assert_eq!(
        seen[0].get("authorization").unwrap(),
        format!("Basic {basic}").as_str()
    );
    let lines = capture.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("WARN") && l.contains("redirects are not followed")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("hookpass") && !l.contains("moverpass")),
        "password logged: {lines:#?}"
    );
    h.stop().await;
}
