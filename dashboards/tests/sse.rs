//! The SSE incident stream: `id:` and `event:` per incident, `Last-Event-ID` replay from
//! storage, then live events from the bus without gaps or repeats.

use std::time::Duration;

use serde_json::Value;
use stallwatch_dashboards::DashboardConfig;
use stallwatch_storage::model::EventKind;

use crate::common::*;

/// Reads SSE frames until `n` events with data have arrived (or the deadline passes).
async fn read_events(
    resp: &mut reqwest::Response,
    buf: &mut String,
    n: usize,
) -> Vec<(String, String, Value)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let frames: Vec<(String, String, Value)> = buf
            .split("\n\n")
            .filter_map(|f| {
                let mut id = String::new();
                let mut ev = String::new();
                let mut data = None;
                for line in f.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().to_string();
                    }
                    if let Some(v) = line.strip_prefix("event:") {
                        ev = v.trim().to_string();
                    }
                    if let Some(v) = line.strip_prefix("data:") {
                        data = serde_json::from_str(v.trim()).ok();
                    }
                }
                data.map(|d| (id, ev, d))
            })
            .collect();
        if frames.len() >= n {
            return frames;
        }
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .expect("timed out waiting for SSE events")
            .unwrap()
            .expect("SSE stream ended");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test]
async fn last_event_id_replays_then_follows_live() {
    let h = Harness::start(DashboardConfig::default()).await;
    for (i, kind) in [
        EventKind::VerdictSuspect,
        EventKind::BreakerOpened,
        EventKind::RunnerTerminated,
    ]
    .into_iter()
    .enumerate()
    {
        h.events
            .publish(incident(kind, &format!("k{i}")))
            .await
            .unwrap();
    }
    let mut resp = h
        .client
        .get(h.url("/api/v1/events"))
        .header("last-event-id", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut buf = String::new();
    let got = read_events(&mut resp, &mut buf, 2).await;
    assert_eq!(got[0].0, "2");
    assert_eq!(got[0].1, "breaker.opened");
    assert_eq!(got[1].0, "3");
    assert_eq!(got[1].1, "runner.terminated");
    assert_eq!(got[1].2["id"], 3);
    assert_eq!(got[1].2["trace_id"], TRACE_A);

    h.events
        .publish(incident(EventKind::BreakerHalfOpen, "k3"))
        .await
        .unwrap();
    let got = read_events(&mut resp, &mut buf, 3).await;
    assert_eq!(got.len(), 3, "no repeats: {buf}");
    assert_eq!(
        (got[2].0.as_str(), got[2].1.as_str()),
        ("4", "breaker.half_open")
    );
    drop(resp);

    // Without Last-Event-ID: live only.
    let mut live = h.client.get(h.url("/api/v1/events")).send().await.unwrap();
    // The handler subscribes to the bus before answering the headers.
    h.events
        .publish(incident(EventKind::BreakerClosed, "k4"))
        .await
        .unwrap();
    let mut buf = String::new();
    let got = read_events(&mut live, &mut buf, 1).await;
    assert_eq!(
        (got[0].0.as_str(), got[0].1.as_str()),
        ("5", "breaker.closed")
    );

    let bad = h
        .client
        .get(h.url("/api/v1/events"))
        .header("last-event-id", "abc")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    h.stop().await;
}

/// Publishers whose writes share one group commit race to broadcast, so ids reach the bus
/// out of order (a probe saw 42 inversions in 200). The stream must still deliver every
/// one of them exactly once: a "newest id sent" watermark dropped the late lower ids, and
/// `stallwatch demo` then waited forever for a `runner.terminated` that was recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_publishers_reach_a_live_stream_each_exactly_once() {
    let h = Harness::start(DashboardConfig::default()).await;
    let mut resp = h
        .client
        .get(h.url("/api/v1/events?last_event_id=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    const N: usize = 200;
    let mut tasks = Vec::new();
    for n in 0..N {
        let events = h.events.clone();
        tasks.push(tokio::spawn(async move {
            events
                .publish(incident(EventKind::BreakerOpened, &format!("race-{n}")))
                .await
                .unwrap()
                .unwrap()
                .id
        }));
    }
    let mut recorded = Vec::new();
    for t in tasks {
        recorded.push(t.await.unwrap());
    }
    recorded.sort_unstable();
    let mut buf = String::new();
    let got = read_events(&mut resp, &mut buf, N).await;
    let mut sent: Vec<i64> = got.iter().map(|f| f.0.parse().unwrap()).collect();
    assert_eq!(sent.len(), N, "nothing repeated");
    sent.sort_unstable();
    assert_eq!(sent, recorded, "every recorded incident was streamed");
    h.stop().await;
}

/// Event streams have a cap of their own (three quarters of `max_connections`), so open
/// streams never take the last connection slots: past the cap a stream is refused with
/// 503 `too_many_streams` and `Retry-After`, while `/healthz` and the API still answer;
/// a closed stream gives its slot back. `Last-Event-ID` given twice or as bytes that are
/// not text is a 400 like any bad id.
#[tokio::test]
async fn event_streams_leave_room_for_requests_and_bad_last_event_ids_are_refused() {
    let mut config = DashboardConfig::default();
    config.listen_limits.max_connections = 8;
    let h = Harness::start(config).await;
    let mut open = Vec::new();
    for path in ["/api/v1/events", "/api/v1/logs/stream"]
        .into_iter()
        .cycle()
        .take(6)
    {
        let r = h.client.get(h.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        open.push(r);
    }
    for path in ["/api/v1/events", "/api/v1/logs/stream"] {
        let r = h.client.get(h.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 503, "{path}");
        assert_eq!(r.headers()["retry-after"], "1");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "too_many_streams", "{body}");
    }
    assert_eq!(h.get("/healthz").await.status(), 200);
    assert_eq!(h.get("/api/v1/runners").await.status(), 200);
    drop(open.pop());
    let again = eventually(Duration::from_secs(30), || async {
        let r = h.client.get(h.url("/api/v1/events")).send().await.ok()?;
        (r.status() == 200).then_some(r)
    })
    .await;
    assert!(again.is_some(), "a closed stream's slot never came back");
    drop(open);
    drop(again);

    let twice = h
        .client
        .get(h.url("/api/v1/events"))
        .header("last-event-id", "1")
        .header("last-event-id", "2")
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), 400);
    let body: Value = twice.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2 times"),
        "{body}"
    );
    let not_text = h
        .client
        .get(h.url("/api/v1/logs/stream"))
        .header(
            "last-event-id",
            reqwest::header::HeaderValue::from_bytes(b"\xff1").unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(not_text.status(), 400);
    h.stop().await;
}
