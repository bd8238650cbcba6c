//! Tests of the connection loop's pure parts: its config validation and which deadlines close
//! a connection.

#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn defaults_and_zero_values_name_the_key() {
    let l = ListenLimits::try_from(&RawListenLimits::default()).unwrap();
    assert_eq!(l, ListenLimits::default());
    assert_eq!(l.header_read_timeout, Duration::from_secs(10));
    assert_eq!(l.max_connections, 512);
    let e = ListenLimits::try_from(&RawListenLimits {
        max_connections: Some(0),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.contains("max_connections"), "{e}");
    let e = ListenLimits::try_from(&RawListenLimits {
        idle_timeout_ms: Some(0),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.contains("idle_timeout_ms"), "{e}");
}

fn activity(age: Duration, seen: bool, in_flight: u64, last_done: Duration) -> Activity {
    let born = Instant::now().checked_sub(age).unwrap();
    Activity {
        born,
        in_flight: AtomicU64::new(in_flight),
        seen_request: AtomicBool::new(seen),
        last_done_ms: AtomicU64::new(last_done.as_millis() as u64),
        bodies_waiting: AtomicU64::new(0),
        last_body_ms: AtomicU64::new(0),
    }
}

#[test]
fn only_bodies_that_all_stopped_arriving_count_as_stalled() {
    let s = Duration::from_secs;
    let stall = STOPPING_BODY_STALL;
    let a = activity(s(10), true, 2, s(0));
    // both requests wait for body bytes, the last frame came 9 s ago
    a.bodies_waiting.store(2, Ordering::Relaxed);
    a.last_body_ms.store(1_000, Ordering::Relaxed);
    assert!(a.bodies_stalled(stall));
    // one request is being handled (its body not waited for): not stalled
    a.bodies_waiting.store(1, Ordering::Relaxed);
    assert!(!a.bodies_stalled(stall));
    // both wait, but a frame arrived just now: a slow client still sending
    a.bodies_waiting.store(2, Ordering::Relaxed);
    a.last_body_ms.store(a.since_born_ms(), Ordering::Relaxed);
    assert!(!a.bodies_stalled(stall));
    // no request in flight at all: that is the idle rule's case, not this one
    let idle = activity(s(10), true, 0, s(0));
    assert!(!idle.bodies_stalled(stall));
}

#[test]
fn deadlines_close_only_what_is_due() {
    let l = ListenLimits::default();
    let s = Duration::from_secs;
    // A fresh connection and one with a request in flight are left alone.
    assert_eq!(due(&activity(s(1), false, 0, s(0)), &l), None);
    assert_eq!(due(&activity(s(600), true, 1, s(0)), &l), None);
    // Recently busy: not idle yet.
    assert_eq!(due(&activity(s(100), true, 0, s(90)), &l), None);
    assert_eq!(
        due(&activity(s(11), false, 0, s(0)), &l),
        Some(CloseReason::HeaderTimeout)
    );
    assert_eq!(
        due(&activity(s(100), true, 0, s(30)), &l),
        Some(CloseReason::Idle)
    );
    assert_eq!(
        due(&activity(s(3601), true, 1, s(0)), &l),
        Some(CloseReason::MaxAge)
    );
    // A request waiting for body bytes: left alone while they come, closed once none came
    // for body_read_timeout (the request's own handler may wait for ever).
    let waiting = activity(s(600), true, 1, s(0));
    waiting.bodies_waiting.store(1, Ordering::Relaxed);
    waiting.last_body_ms.store(
        waiting.since_born_ms() - l.body_read_timeout.as_millis() as u64 + 1_000,
        Ordering::Relaxed,
    );
    assert_eq!(due(&waiting, &l), None);
    waiting.last_body_ms.store(
        waiting.since_born_ms() - l.body_read_timeout.as_millis() as u64,
        Ordering::Relaxed,
    );
    assert_eq!(due(&waiting, &l), Some(CloseReason::BodyTimeout));
}

fn pace(min_rate: u64, grace_ms: u64) -> Pace {
    Pace::new(&ListenLimits {
        body_min_rate: min_rate,
        body_rate_grace: Duration::from_millis(grace_ms),
        ..ListenLimits::default()
    })
}

#[test]
fn the_pace_allows_the_grace_plus_a_second_per_min_rate_bytes() {
    let ms = Duration::from_millis;
    let mut p = pace(1000, 1000);
    assert_eq!(p.allowance(), ms(1000));
    // within the grace nothing counts, not even a body that sent nothing yet
    p.waited = ms(999);
    assert!(!p.arrived(0));
    // 500 bytes earn 500 ms more
    p.waited = ms(1499);
    assert!(!p.arrived(500));
    assert_eq!(p.allowance(), ms(1500));
    // one byte a second after that is behind (the trickle of the report)
    p.waited = ms(2600);
    assert!(p.arrived(1));
    let cut = p.cut();
    assert_eq!(cut.received, 501);
    assert!(cut.to_string().contains("body_min_bytes_per_s"), "{cut}");
    // a body arriving at the rate is never behind, however long it takes
    let mut steady = pace(1000, 1000);
    for _ in 0..10_000 {
        steady.waited += ms(100);
        assert!(!steady.arrived(100));
    }
    // 0: no rule at all
    let mut off = pace(0, 1000);
    off.waited = Duration::from_secs(3600);
    assert!(!off.arrived(0));
}

#[test]
fn a_cut_is_found_through_the_wrappers_services_see() {
    let t = TooSlow {
        received: 1,
        waited: Duration::from_secs(2),
        min_rate: 1,
        grace: Duration::from_secs(1),
    };
    #[derive(Debug)]
    struct Wrapper(BodyError);
    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "wrapped")
        }
    }
    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    let w = Wrapper(BodyError::TooSlow(t.clone()));
    assert_eq!(too_slow(&w), Some(&t));
    let other = std::io::Error::other("reset");
    assert_eq!(too_slow(&other), None);
}

/// A service that reads its whole request body: 200 and the byte count, or 408 naming the
/// rule when the listener cut it.
async fn read_all(req: Request<RequestBody>) -> Result<Response<String>, Infallible> {
    let mut body = req.into_body();
    let mut n = 0usize;
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => break,
            Some(Ok(f)) => n += f.data_ref().map_or(0, bytes::Bytes::len),
            Some(Err(e)) => {
                let status = if too_slow(&e).is_some() { 408 } else { 400 };
                let mut r = Response::new(e.to_string());
                *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
                return Ok(r);
            }
        }
    }
    Ok(Response::new(n.to_string()))
}

/// Sends `len` body bytes in pieces of `piece` every `every` after a POST head; answers
/// the response head's first line and when it came.
async fn send_paced(
    addr: SocketAddr,
    len: usize,
    piece: usize,
    every: Duration,
) -> (String, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t0 = Instant::now();
    let s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(format!("POST / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {len}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let writer = tokio::spawn(async move {
        let mut sent = 0;
        while sent < len {
            let n = piece.min(len - sent);
            if wr.write_all(&vec![b'x'; n]).await.is_err() {
                break; // cut: the server closed the connection
            }
            sent += n;
            tokio::time::sleep(every).await;
        }
        wr // still connected on the client's side
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut answer)).await;
    let took = t0.elapsed();
    writer.abort();
    let text = String::from_utf8_lossy(&answer).into_owned();
    (text, took)
}

/// The report's trickle: a body declared at 1000 bytes sent a byte every 100 ms (10 B/s)
/// passes every gap timeout but is cut soon after the grace (300 ms of waiting here) with
/// the service's answer naming the rule, and counted; beside it, a body sent at twice the
/// minimum rate, for five times the grace, is read whole (the healthy case).
#[tokio::test]
async fn a_trickled_body_is_cut_after_the_grace_and_a_slow_steady_one_is_read() {
    let limits = ListenLimits {
        body_min_rate: 2000,
        body_rate_grace: Duration::from_millis(300),
        ..ListenLimits::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = ListenerStats::new("test");
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(
        listener,
        tower::service_fn(read_all),
        limits,
        stats.clone(),
        shutdown.clone(),
    ));
    let ms = Duration::from_millis;
    let trickle = tokio::spawn(send_paced(addr, 1000, 1, ms(100)));
    // 6000 bytes, 200 every 50 ms: 4000 B/s for 1.5 s
    let steady = tokio::spawn(send_paced(addr, 6000, 200, ms(50)));
    let (text, took) = trickle.await.unwrap();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_min_bytes_per_s"), "{text}");
    assert!(
        took >= ms(300) && took < ms(3000),
        "the trickle was cut after {took:?}, want soon after the 300 ms grace"
    );
    let (text, took) = steady.await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("6000"), "{text}");
    assert!(took >= ms(1400), "the steady body took {took:?}");
    assert_eq!(stats.bodies_too_slow(), 1);
    let mut m = String::new();
    ListenerMetrics(vec![stats.clone()]).render_prometheus(&mut m);
    assert!(
        m.contains("stallwatch_listener_request_bodies_too_slow_total{listener=\"test\"} 1"),
        "{m}"
    );
    shutdown.cancel();
    server.await.unwrap();
}

#[test]
fn framing_faults_hyper_lets_through() {
    let h = |pairs: &[(&str, &str)]| {
        let mut m = http::HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        super::framing_fault(&m).map(|f| {
            let status = match f {
                super::FramingFault::TransferCoding(_) => 501,
                super::FramingFault::ContentTypes(_) => 400,
            };
            (status, f.to_string())
        })
    };
    // healthy
    assert_eq!(h(&[]), None);
    assert_eq!(h(&[("transfer-encoding", "chunked")]), None);
    assert_eq!(h(&[("transfer-encoding", "Chunked")]), None);
    assert_eq!(
        h(&[("content-type", "application/json; charset=utf-8")]),
        None
    );
    assert_eq!(h(&[("content-type", r#"text/plain; a="x,y""#)]), None);
    // refused
    let (status, msg) = h(&[("transfer-encoding", "gzip, chunked")]).unwrap();
    assert_eq!(status, 501);
    assert!(msg.contains("\"gzip\""), "{msg}");
    let (status, msg) = h(&[
        ("content-type", "application/json"),
        ("content-type", "application/x-protobuf"),
    ])
    .unwrap();
    assert_eq!(status, 400);
    assert!(
        msg.contains("application/json; application/x-protobuf"),
        "{msg}"
    );
    assert_eq!(
        h(&[("content-type", "application/json, application/x-protobuf")]).map(|(s, _)| s),
        Some(400)
    );
}
