//! The one connection loop of every listener (OTLP/gRPC, OTLP/HTTP, dashboard with SSE and
//! `/mcp`): slow and idle clients are bounded the same way everywhere (docs/design.md,
//! "Back-pressure and limits", Connections).
//!
//! hyper does what it has options for: the HTTP/1.1 header read timeout (which also bounds
//! the wait for the next request on a keep-alive connection), HTTP/2 keepalive PINGs and
//! the HTTP/2 stream limit. This loop adds what hyper has no option for: a per-listener
//! connection cap (a connection over it is closed at once and counted), a deadline for the
//! first request (a client that never completes one, e.g. an HTTP/2 preface sent byte by
//! byte), an idle timeout (no request in flight; a streaming response such as SSE counts as
//! in flight until its body ends) and a connection lifetime, plus a minimum request body
//! rate (below). The first-request, idle and lifetime deadlines each close
//! gracefully (HTTP/2 GOAWAY, HTTP/1.1 close after the current response) and then, after
//! [`CLOSE_GRACE`], for good. A connection whose every request in flight has waited
//! `body_read_timeout` ([`DEFAULT_BODY_READ_TIMEOUT`]) for request body bytes is dropped at once (its handlers would wait
//! for ever: a client that sent a head and part of a body holds no slot for long). At shutdown a connection with no request in the service (idle,
//! or part way through a request head) gets 250 ms to close before it is dropped, and one
//! whose every request in flight is waiting for request body bytes that stopped arriving is
//! dropped once none came for [`STOPPING_BODY_STALL`]: a client that stalled mid-head or
//! mid-body does not hold the drain, on any listener. (The OTLP listeners answer such an
//! export themselves first, with a retryable 503, after 500 ms: collector `ingest.rs`.)
//!
//! Minimum body rate ([`RequestBody`], `body_min_bytes_per_s`, `body_rate_grace_ms`): the
//! gap timeouts above only bound the pause between two pieces of a body, so a client sending
//! one byte per second never trips them and keeps its request (and, on the OTLP listeners,
//! the share of `max_inflight_bytes` reserved for it from its declared length) for as long
//! as it likes. So every request body must also keep an average pace: the time its service
//! has spent waiting for the client's bytes may be at most `body_rate_grace_ms` plus one
//! second per `body_min_bytes_per_s` bytes received (Apache mod_reqtimeout's `MinRate`,
//! counted in time waited rather than wall time, so a service that is slow to read is not
//! charged to its client). A body behind that pace is cut: its service's read ends with
//! [`BodyError::TooSlow`], which each service answers itself with a 4xx naming the rule
//! (the OTLP listeners as their stalled-body answer, 400 / `INVALID_ARGUMENT`; the
//! dashboard 408), so the request ends and what it held is released at once; counted in
//! `stallwatch_listener_request_bodies_too_slow_total{listener}`. Since the allowance only
//! grows with bytes received, a body of `n` bytes is over within `grace + n / rate` of
//! waiting at the latest, however it is sent; a body arriving at least at the rate is never
//! cut, however large (up to each service's own size cap).
//!
//! Like hosts.rs, it lives in this ground-floor crate because every listener shares it; it
//! knows connections, not HTTP statuses.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::MetricsSource;

/// Default `header_read_timeout_ms`: 10 s to send a request's headers (and, on an idle
/// HTTP/1.1 keep-alive connection, to start the next request).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `idle_timeout_ms`: 60 s without a request in flight closes a connection.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `keepalive_interval_ms`: an HTTP/2 PING every 20 s on a quiet connection.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// Default `keepalive_timeout_ms`: a PING unanswered for 10 s closes the connection.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `max_connections`: open connections per listener (SSE streams and long-polls
/// count). One over it is closed at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default `max_connection_age_ms`: one hour, then the connection is closed gracefully
/// (clients reconnect; an SSE `EventSource` does so by itself).
pub const DEFAULT_MAX_CONNECTION_AGE: Duration = Duration::from_secs(3600);
/// After a graceful close is started, how long the connection may still finish in-flight
/// work before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(10);
/// At shutdown, how long a connection with no request in the service (idle, or part way
/// through sending a request head) may take to close gracefully before it is dropped; it
/// gets [`CLOSE_GRACE`] after all if a request reaches the service meanwhile. A client that
/// stalled mid-head must not hold shutdown for `header_read_timeout`.
const IDLE_CLOSE_GRACE: Duration = Duration::from_millis(250);
/// Default `body_read_timeout_ms`: how long the request bodies of a connection may all go
/// without a frame before it is dropped, on every listener (35 s). The OTLP listeners answer
/// a stalled export themselves first (400 after 30 s, collector `body_idle_timeout`); this
/// bounds every other service, whose handler would otherwise hold the connection (and its
/// slot under `max_connections`) until `max_connection_age`.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(35);
/// Default `body_min_bytes_per_s`: the slowest average pace a request body may keep once
/// [`DEFAULT_BODY_RATE_GRACE`] of waiting for it has passed, bytes per second (16 KiB/s,
/// 128 kbit/s: a 20 MiB export on such a link still arrives, in about 21 minutes; one byte
/// per second is cut after the grace).
pub const DEFAULT_BODY_MIN_RATE: u64 = 16 * 1024;
/// Default `body_rate_grace_ms`: how long a request body may keep its service waiting
/// before its pace counts at all (10 s: a client's start-up, a slow first round trip).
pub const DEFAULT_BODY_RATE_GRACE: Duration = Duration::from_secs(10);
/// At shutdown, how long the request bodies of a connection may all go without a frame
/// before it is dropped (1 s; each listener's own answer to a stalled body, if it has one,
/// comes sooner).
pub const STOPPING_BODY_STALL: Duration = Duration::from_secs(1);
/// Concurrent HTTP/2 streams per connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// How often a connection's deadlines are looked at.
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The listener keys as written in `[otlp]` and in `[dashboard]` (same names in both; every
/// field optional, durations in ms).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct RawListenLimits {
    /// [`DEFAULT_HEADER_READ_TIMEOUT`].
    pub header_read_timeout_ms: Option<u64>,
    /// [`DEFAULT_IDLE_TIMEOUT`].
    pub idle_timeout_ms: Option<u64>,
    /// [`DEFAULT_KEEPALIVE_INTERVAL`].
    pub keepalive_interval_ms: Option<u64>,
    /// [`DEFAULT_KEEPALIVE_TIMEOUT`].
    pub keepalive_timeout_ms: Option<u64>,
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: Option<usize>,
    /// [`DEFAULT_MAX_CONNECTION_AGE`].
    pub max_connection_age_ms: Option<u64>,
    /// [`DEFAULT_BODY_READ_TIMEOUT`].
    pub body_read_timeout_ms: Option<u64>,
    /// [`DEFAULT_BODY_MIN_RATE`], bytes per second; 0 turns the rule off.
    pub body_min_bytes_per_s: Option<u64>,
    /// [`DEFAULT_BODY_RATE_GRACE`], ms.
    pub body_rate_grace_ms: Option<u64>,
}

/// Validated connection limits of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenLimits {
    /// Longest time to receive a request's headers; also the longest wait for the first
    /// request on a new connection.
    pub header_read_timeout: Duration,
    /// Longest time without a request in flight.
    pub idle_timeout: Duration,
    /// HTTP/2 PING interval.
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered.
    pub keepalive_timeout: Duration,
    /// Open connections at most, at least 1.
    pub max_connections: usize,
    /// Longest life of one connection.
    pub max_connection_age: Duration,
    /// Longest time every request in flight may wait for request body bytes.
    pub body_read_timeout: Duration,
    /// Slowest average pace of a request body after `body_rate_grace`, bytes per second;
    /// 0: no pace rule (the module doc, "Minimum body rate").
    pub body_min_rate: u64,
    /// Waiting for a request body this long is allowed before its pace counts.
    pub body_rate_grace: Duration,
}

impl Default for ListenLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connection_age: DEFAULT_MAX_CONNECTION_AGE,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            body_min_rate: DEFAULT_BODY_MIN_RATE,
            body_rate_grace: DEFAULT_BODY_RATE_GRACE,
        }
    }
}

impl TryFrom<&RawListenLimits> for ListenLimits {
    type Error = String;

    /// Errors: a message naming the key (without the section) when a duration or
    /// `max_connections` is 0 (`body_min_bytes_per_s = 0` is allowed: no pace rule).
    fn try_from(raw: &RawListenLimits) -> Result<Self, String> {
        let d = DEFAULT_HEADER_READ_TIMEOUT;
        let ms = |key: &str, v: Option<u64>, default: Duration| match v {
            None => Ok(default),
            Some(0) => Err(format!("{key} must be at least 1")),
            Some(n) => Ok(Duration::from_millis(n)),
        };
        let max_connections = raw.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 {
            return Err("max_connections must be at least 1".into());
        }
        Ok(Self {
            header_read_timeout: ms("header_read_timeout_ms", raw.header_read_timeout_ms, d)?,
            idle_timeout: ms("idle_timeout_ms", raw.idle_timeout_ms, DEFAULT_IDLE_TIMEOUT)?,
            keepalive_interval: ms(
                "keepalive_interval_ms",
                raw.keepalive_interval_ms,
                DEFAULT_KEEPALIVE_INTERVAL,
            )?,
            keepalive_timeout: ms(
                "keepalive_timeout_ms",
                raw.keepalive_timeout_ms,
                DEFAULT_KEEPALIVE_TIMEOUT,
            )?,
            max_connections,
            max_connection_age: ms(
                "max_connection_age_ms",
                raw.max_connection_age_ms,
                DEFAULT_MAX_CONNECTION_AGE,
            )?,
            body_read_timeout: ms(
                "body_read_timeout_ms",
                raw.body_read_timeout_ms,
                DEFAULT_BODY_READ_TIMEOUT,
            )?,
            body_min_rate: raw.body_min_bytes_per_s.unwrap_or(DEFAULT_BODY_MIN_RATE),
            body_rate_grace: ms(
                "body_rate_grace_ms",
                raw.body_rate_grace_ms,
                DEFAULT_BODY_RATE_GRACE,
            )?,
        })
    }
}

/// Why the server closed a connection (label `reason` of
/// `stallwatch_listener_connections_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CloseReason {
    /// No complete request headers within `header_read_timeout` (hyper's HTTP/1.1 timer,
    /// or no first request at all).
    HeaderTimeout,
    /// No request in flight for `idle_timeout`.
    Idle,
    /// Older than `max_connection_age`.
    MaxAge,
    /// Every request in flight waited `body_read_timeout` for request body bytes that
    /// did not come (dropped at once: a graceful close would wait for those requests).
    BodyTimeout,
}

impl CloseReason {
    const ALL: [CloseReason; 4] = [
        Self::HeaderTimeout,
        Self::Idle,
        Self::MaxAge,
        Self::BodyTimeout,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Self::HeaderTimeout => "header_timeout",
            Self::Idle => "idle",
            Self::MaxAge => "max_age",
            Self::BodyTimeout => "body_timeout",
        }
    }
}

/// Connection counters of one listener.
#[derive(Debug)]
pub struct ListenerStats {
    name: &'static str,
    open: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    closed: [AtomicU64; 4],
    last_cap_warning: AtomicU64,
    bodies_too_slow: AtomicU64,
    last_slow_warning: AtomicU64,
}

impl ListenerStats {
    /// Counters for the listener labelled `name` (`otlp_grpc`, `otlp_http`, `dashboard`).
    pub fn new(name: &'static str) -> Arc<Self> {
        Arc::new(Self {
            name,
            open: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            closed: Default::default(),
            last_cap_warning: AtomicU64::new(0),
            bodies_too_slow: AtomicU64::new(0),
            last_slow_warning: AtomicU64::new(0),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections closed at once because `max_connections` were open.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Request bodies cut for arriving slower than `body_min_bytes_per_s`.
    pub fn bodies_too_slow(&self) -> u64 {
        self.bodies_too_slow.load(Ordering::Relaxed)
    }

    fn closed(&self, reason: CloseReason) {
        let i = CloseReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.closed[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// `/metrics` for a set of listeners: `stallwatch_listener_connections{listener}` (gauge),
/// `stallwatch_listener_connections_accepted_total{listener}`,
/// `stallwatch_listener_connections_refused_total{listener}` (over `max_connections`),
/// `stallwatch_listener_connections_closed_total{listener,reason}` (`header_timeout`,
/// `idle`, `max_age`, `body_timeout`) and
/// `stallwatch_listener_request_bodies_too_slow_total{listener}` (bodies cut by the
/// minimum-rate rule).
pub struct ListenerMetrics(pub Vec<Arc<ListenerStats>>);

/// Which counter of a [`ListenerStats`] a family shows.
type CounterOf = fn(&ListenerStats) -> &AtomicU64;

impl MetricsSource for ListenerMetrics {
    fn render_prometheus(&self, out: &mut String) {
        use crate::prometheus::{family, Kind};
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let simple: [(&str, Kind, &str, CounterOf); 4] = [
            (
                "stallwatch_listener_connections",
                Kind::Gauge,
                "Connections open now, by listener.",
                |s| &s.open,
            ),
            (
                "stallwatch_listener_connections_accepted_total",
                Kind::Counter,
                "Connections accepted, by listener.",
                |s| &s.accepted,
            ),
            (
                "stallwatch_listener_connections_refused_total",
                Kind::Counter,
                "Connections closed at once because max_connections were open.",
                |s| &s.refused,
            ),
            (
                "stallwatch_listener_request_bodies_too_slow_total",
                Kind::Counter,
                "Request bodies cut for arriving slower than body_min_bytes_per_s after body_rate_grace_ms.",
                |s| &s.bodies_too_slow,
            ),
        ];
        for (name, kind, help, field) in simple {
            let mut f = family(out, name, kind, help);
            for s in &self.0 {
                f.sample(&[("listener", s.name)], l(field(s)));
            }
        }
        let mut f = family(
            out,
            "stallwatch_listener_connections_closed_total",
            Kind::Counter,
            "Connections the server closed, by listener and reason.",
        );
        for s in &self.0 {
            for (i, r) in CloseReason::ALL.iter().enumerate() {
                f.sample(
                    &[("listener", s.name), ("reason", r.as_str())],
                    l(&s.closed[i]),
                );
            }
        }
    }
}

/// What one connection is doing, shared by its requests and its watcher.
struct Activity {
    born: Instant,
    in_flight: AtomicU64,
    seen_request: AtomicBool,
    /// Milliseconds after `born` when the last request (response body included) ended.
    last_done_ms: AtomicU64,
    /// Request bodies whose last poll found no data yet (their handler waits for the client).
    bodies_waiting: AtomicU64,
    /// Milliseconds after `born` when a request began or a request body frame last arrived.
    last_body_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            born: Instant::now(),
            in_flight: AtomicU64::new(0),
            seen_request: AtomicBool::new(false),
            last_done_ms: AtomicU64::new(0),
            bodies_waiting: AtomicU64::new(0),
            last_body_ms: AtomicU64::new(0),
        }
    }

    fn since_born_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// True when every request in flight waits for request body bytes and none arrived for
    /// `stall`: the client stopped sending (what shutdown drops the connection for).
    fn bodies_stalled(&self, stall: Duration) -> bool {
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        in_flight > 0
            && self.bodies_waiting.load(Ordering::Relaxed) >= in_flight
            && Duration::from_millis(
                self.since_born_ms()
                    .saturating_sub(self.last_body_ms.load(Ordering::Relaxed)),
            ) >= stall
    }
}

/// Held by a request until its response body is dropped.
struct ActiveGuard(Arc<Activity>);

impl ActiveGuard {
    fn new(a: Arc<Activity>) -> Self {
        a.seen_request.store(true, Ordering::Relaxed);
        a.last_body_ms.store(a.since_born_ms(), Ordering::Relaxed);
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(a)
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0
            .last_done_ms
            .store(self.0.since_born_ms(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request counted as in flight until it ends.
pub struct TrackedBody<B> {
    inner: B,
    _guard: ActiveGuard,
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A listen address: `IP:PORT` (`127.0.0.1:4317`, `[::1]:0`), the form every listener's
/// flag, environment variable and config key takes. Host names are refused with a message
/// that says so: a listener binds an address, and resolving `localhost` could give a
/// non-loopback one.
///
/// Errors: anything else, as text naming the expected form.
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        "expected IP:PORT such as 127.0.0.1:4317 or [::1]:0 (a host name such as localhost is not resolved; port 0 picks a free one)".to_string()
    })
}

/// serde's `deserialize_with` for an optional listen address in a config file, read by
/// [`parse_listen_addr`] so the file's error says what the flag's does.
///
/// Errors: a value that is not a string, or not `IP:PORT`.
pub fn deserialize_listen_addr<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    parse_listen_addr(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// A request body cut by the minimum-rate rule (the module doc, "Minimum body rate"): what
/// it had received and how long its service had waited for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooSlow {
    /// Body bytes received before the cut.
    pub received: u64,
    /// Time the service spent waiting for the client's bytes.
    pub waited: Duration,
    /// The listener's `body_min_bytes_per_s`, bytes per second.
    pub min_rate: u64,
    /// The listener's `body_rate_grace_ms`.
    pub grace: Duration,
}

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "request body arrived too slowly: {} bytes in {} ms, under the minimum average of \
             {} bytes/s after a {} ms grace (body_min_bytes_per_s, body_rate_grace_ms); send \
             it faster or in smaller requests",
            self.received,
            self.waited.as_millis(),
            self.min_rate,
            self.grace.as_millis()
        )
    }
}

impl std::error::Error for TooSlow {}

/// Why a [`RequestBody`] could not be read to its end.
#[derive(Debug)]
pub enum BodyError {
    /// hyper's own read error (the client reset, a malformed chunk, a stream error); shown
    /// as hyper shows it, and it is the error's `source`.
    Read(hyper::Error),
    /// Cut by the minimum-rate rule: the service should answer with a 4xx naming it (its
    /// `Display`). Every later poll of the body gives it again.
    TooSlow(TooSlow),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read(e) => e.fmt(f),
            Self::TooSlow(t) => t.fmt(f),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Read(e) => Some(e),
            Self::TooSlow(_) => None,
        }
    }
}

/// The minimum-rate cut in `e` or anywhere in its `source` chain (as the body error reaches
/// a service wrapped: axum's `Error`, a tonic `Status`, an extractor's rejection), if it is
/// one; `None` for every other error.
pub fn too_slow<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a TooSlow> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<TooSlow>() {
            return Some(t);
        }
        if let Some(BodyError::TooSlow(t)) = err.downcast_ref::<BodyError>() {
            return Some(t);
        }
        cur = err.source();
    }
    None
}

/// The minimum-rate rule of one request body: the time its service waited for the client
/// may be at most `grace` plus one second per `min_rate` bytes received.
#[derive(Debug)]
struct Pace {
    /// Bytes per second; 0: no rule.
    min_rate: u64,
    grace: Duration,
    received: u64,
    /// Time waited for the client's bytes, the current wait excluded.
    waited: Duration,
    /// When the current wait began (the last poll found no data).
    wait_began: Option<tokio::time::Instant>,
    /// Wakes a body that is waiting when its allowance runs out.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Set once the body was cut.
    cut: Option<TooSlow>,
}

impl Pace {
    fn new(limits: &ListenLimits) -> Self {
        Self {
            min_rate: limits.body_min_rate,
            grace: limits.body_rate_grace,
            received: 0,
            waited: Duration::ZERO,
            wait_began: None,
            timer: None,
            cut: None,
        }
    }

    /// How long the client may have kept its service waiting, given what it sent:
    /// `grace + received / min_rate`.
    fn allowance(&self) -> Duration {
        if self.min_rate == 0 {
            return Duration::MAX;
        }
        let nanos = u128::from(self.received) * 1_000_000_000 / u128::from(self.min_rate);
        self.grace.saturating_add(Duration::from_nanos(
            u64::try_from(nanos).unwrap_or(u64::MAX),
        ))
    }

    /// Time waited so far, the current wait included.
    fn waited_at(&self, now: tokio::time::Instant) -> Duration {
        self.waited
            .saturating_add(self.wait_began.map_or(Duration::ZERO, |b| now - b))
    }

    /// The poll found no data: starts (or continues) a wait and arms the timer for the end
    /// of the allowance. True when the allowance is already used up.
    fn pending(&mut self, cx: &mut Context<'_>) -> bool {
        if self.min_rate == 0 {
            return false;
        }
        let now = tokio::time::Instant::now();
        let began = *self.wait_began.get_or_insert(now);
        let left = self.allowance().saturating_sub(self.waited);
        let Some(deadline) = began.checked_add(left) else {
            return false; // beyond any clock: the body cannot fall behind
        };
        if now >= deadline {
            return true;
        }
        let timer = match &mut self.timer {
            Some(t) => {
                if t.deadline() != deadline {
                    t.as_mut().reset(deadline);
                }
                t
            }
            None => self
                .timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        timer.as_mut().poll(cx).is_ready()
    }

    /// A frame (or the end) arrived with `bytes` of data: ends the current wait. True when
    /// the body is behind its pace even so.
    fn arrived(&mut self, bytes: usize) -> bool {
        let now = tokio::time::Instant::now();
        self.waited = self.waited_at(now);
        self.wait_began = None;
        self.received = self
            .received
            .saturating_add(u64::try_from(bytes).unwrap_or(u64::MAX));
        self.waited > self.allowance()
    }

    /// Records the cut and returns its error.
    fn cut(&mut self) -> TooSlow {
        let t = TooSlow {
            received: self.received,
            waited: self.waited_at(tokio::time::Instant::now()),
            min_rate: self.min_rate,
            grace: self.grace,
        };
        self.wait_began = None;
        self.timer = None;
        self.cut = Some(t.clone());
        t
    }
}

/// A request body as every listener's service receives it: hyper's body, plus the record
/// of whether its handler is waiting for the client ([`STOPPING_BODY_STALL`]) and the
/// minimum-rate rule (the module doc, "Minimum body rate"). Frames are hyper's, unchanged;
/// errors are hyper's as [`BodyError::Read`], or [`BodyError::TooSlow`] for a body cut.
pub struct RequestBody {
    inner: Incoming,
    activity: Arc<Activity>,
    /// The last poll found no data (counted in `Activity::bodies_waiting`).
    waiting: bool,
    pace: Pace,
    stats: Arc<ListenerStats>,
}

impl RequestBody {
    fn set_waiting(&mut self, waiting: bool) {
        if waiting != self.waiting {
            self.waiting = waiting;
            if waiting {
                self.activity.bodies_waiting.fetch_add(1, Ordering::Relaxed);
            } else {
                self.activity.bodies_waiting.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Cuts the body: counts it, warns (at most once a minute per listener) and returns the
    /// error the service gets.
    fn cut(&mut self) -> BodyError {
        self.set_waiting(false);
        let t = self.pace.cut();
        self.stats.bodies_too_slow.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            listener = self.stats.name,
            received = t.received,
            waited_ms = t.waited.as_millis() as u64,
            "request body cut: too slow"
        );
        if once_a_minute(&self.stats.last_slow_warning) {
            tracing::warn!(
                listener = self.stats.name,
                body_min_bytes_per_s = t.min_rate,
                body_rate_grace_ms = t.grace.as_millis() as u64,
                "request bodies arriving slower than the minimum rate are cut (more in /metrics, stallwatch_listener_request_bodies_too_slow_total)"
            );
        }
        BodyError::TooSlow(t)
    }
}

impl Body for RequestBody {
    type Data = bytes::Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(t) = &this.pace.cut {
            return Poll::Ready(Some(Err(BodyError::TooSlow(t.clone()))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if this.pace.pending(cx) {
                    return Poll::Ready(Some(Err(this.cut())));
                }
                this.set_waiting(true);
                Poll::Pending
            }
            Poll::Ready(r) => {
                this.set_waiting(false);
                this.activity
                    .last_body_ms
                    .store(this.activity.since_born_ms(), Ordering::Relaxed);
                let bytes = match &r {
                    Some(Ok(f)) => f.data_ref().map_or(0, bytes::Bytes::len),
                    _ => 0,
                };
                // A frame that completes the body is taken even when late: cutting it
                // would release nothing sooner.
                let late = this.pace.arrived(bytes);
                if late && matches!(r, Some(Ok(_))) && !this.inner.is_end_stream() {
                    return Poll::Ready(Some(Err(this.cut())));
                }
                Poll::Ready(r.map(|f| f.map_err(BodyError::Read)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pace.cut.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        self.set_waiting(false);
    }
}

/// The hyper service of one connection: the listener's tower service plus activity
/// tracking.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    limits: ListenLimits,
    stats: Arc<ListenerStats>,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: tower::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Unpin + Send + 'static,
{
    type Response = Response<TrackedBody<B>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let guard = ActiveGuard::new(self.activity.clone());
        let http1 = req.version() <= http::Version::HTTP_11;
        let req = req.map(|inner| RequestBody {
            inner,
            activity: self.activity.clone(),
            waiting: false,
            pace: Pace::new(&self.limits),
            stats: self.stats.clone(),
        });
        let svc = self.inner.clone();
        Box::pin(async move {
            let mut resp = tower::ServiceExt::oneshot(svc, req).await?;
            // A body refused as too large is left unread, so hyper closes the connection
            // after the answer: say so (RFC 9112 §9.6), so a client does not send its next
            // request on it.
            if http1 && resp.status() == http::StatusCode::PAYLOAD_TOO_LARGE {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            Ok(resp.map(|inner| TrackedBody {
                inner,
                _guard: guard,
            }))
        })
    }
}

/// A request's framing fault that hyper lets through, which every HTTP listener refuses
/// before the body is read, each with its own status and envelope
/// ([`framing_fault`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FramingFault {
    /// A `Transfer-Encoding` naming a coding other than `chunked` (the codings, joined):
    /// RFC 9112 §6.1 says a server that receives a transfer coding it does not understand
    /// SHOULD answer 501; hyper removes only the chunked framing, so a `gzip, chunked` body
    /// would be read as if it were not compressed.
    TransferCoding(String),
    /// More than one `Content-Type` field, or one listing several types (the values,
    /// joined): RFC 9110 §8.3 allows a single media type; which one is meant cannot be
    /// known, and a proxy and stallwatch could each read a different one (a 400).
    ContentTypes(String),
}

impl std::fmt::Display for FramingFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TransferCoding(c) => write!(
                f,
                "Transfer-Encoding {c:?} is not supported: send the body chunked or with a Content-Length (Content-Encoding for compression)"
            ),
            Self::ContentTypes(t) => {
                write!(f, "more than one Content-Type ({t}): send exactly one")
            }
        }
    }
}

/// The [`FramingFault`] of a request's headers, if any.
pub fn framing_fault(headers: &http::HeaderMap) -> Option<FramingFault> {
    let codings = headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("chunked"))
        .collect::<Vec<_>>();
    if !codings.is_empty() {
        return Some(FramingFault::TransferCoding(codings.join(", ")));
    }
    let types: Vec<&http::HeaderValue> =
        headers.get_all(http::header::CONTENT_TYPE).iter().collect();
    let listed = types
        .iter()
        .any(|v| v.to_str().is_ok_and(|t| media_types(t) > 1));
    if types.len() > 1 || listed {
        let all: Vec<String> = types
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        return Some(FramingFault::ContentTypes(all.join("; ")));
    }
    None
}

/// How many media types a `Content-Type` value lists: commas outside quoted parameter
/// values separate them (`text/plain; a="x,y"` is one).
fn media_types(value: &str) -> usize {
    let mut n = 1;
    let mut quoted = false;
    let mut escaped = false;
    for c in value.chars() {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, _, '"') => quoted = !quoted,
            (false, _, ',') => n += 1,
            _ => {}
        }
    }
    n
}

fn builder(limits: &ListenLimits) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        // A client may shut down its sending side once the request is sent (`nc -N`,
        // HTTP/1.0 scripts): the request is whole, so it is answered. Without this, hyper
        // takes the end of input for an abort and drops the request unanswered.
        .half_close(true);
    b.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
    b
}

/// Serves `service` on `listener` with `limits` until `shutdown` is cancelled, then stops
/// accepting, closes every connection gracefully and returns when they are all gone
/// (callers bound that wait). `on_accept` runs on each accepted socket (e.g. TCP_NODELAY).
///
/// `service` answers every request (`Infallible`); its response bodies must be `Unpin`
/// (axum's and tonic's are).
pub async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    limits: ListenLimits,
    stats: Arc<ListenerStats>,
    shutdown: CancellationToken,
) where
    S: tower::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builder = Arc::new(builder(&limits));
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let tasks = TaskTracker::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(pair) => pair,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(listener = stats.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            warn_cap(&stats, limits.max_connections);
            drop(tcp);
            continue;
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        stats.open.fetch_add(1, Ordering::Relaxed);
        tasks.spawn(connection(
            builder.clone(),
            tcp,
            peer,
            service.clone(),
            limits,
            stats.clone(),
            permit,
            shutdown.clone(),
        ));
    }
    drop(listener);
    tasks.close();
    tasks.wait().await;
}

fn warn_cap(stats: &ListenerStats, max: usize) {
    if once_a_minute(&stats.last_cap_warning) {
        tracing::warn!(
            listener = stats.name,
            max_connections = max,
            "connection cap reached: new connections are closed at once (more in /metrics, stallwatch_listener_connections_refused_total)"
        );
    }
}

/// True at most once a minute per `last` (Unix seconds of the last true answer): for
/// warnings a flood of clients would otherwise repeat.
fn once_a_minute(last: &AtomicU64) -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let prev = last.load(Ordering::Relaxed);
    now >= prev + 60
        && last
            .compare_exchange(prev, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

#[allow(clippy::too_many_arguments)]
async fn connection<S, B>(
    builder: Arc<auto::Builder<TokioExecutor>>,
    tcp: TcpStream,
    peer: SocketAddr,
    service: S,
    limits: ListenLimits,
    stats: Arc<ListenerStats>,
    _permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
) where
    S: tower::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let activity = Arc::new(Activity::new());
    let svc = Tracked {
        inner: service,
        activity: activity.clone(),
        limits,
        stats: stats.clone(),
    };
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), svc);
    tokio::pin!(conn);
    // When a graceful close was started: when it started and the instant it must be over.
    let mut closing: Option<(Instant, Instant)> = None;
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    let timed_out = e
                        .downcast_ref::<hyper::Error>()
                        .is_some_and(hyper::Error::is_timeout);
                    if timed_out {
                        stats.closed(CloseReason::HeaderTimeout);
                    }
                    tracing::debug!(listener = stats.name, %peer, error = %e, "connection ended with an error");
                }
                break;
            }
            () = shutdown.cancelled(), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                let now = Instant::now();
                let grace = if activity.in_flight.load(Ordering::Relaxed) == 0 {
                    IDLE_CLOSE_GRACE
                } else {
                    CLOSE_GRACE
                };
                closing = Some((now, now + grace));
            }
            _ = tick.tick() => {
                if let Some((started, deadline)) = closing {
                    if shutdown.is_cancelled() && activity.bodies_stalled(STOPPING_BODY_STALL) {
                        tracing::debug!(listener = stats.name, %peer, "dropping a connection whose request bodies stopped arriving at shutdown");
                        break;
                    }
                    if Instant::now() >= deadline {
                        let full = started + CLOSE_GRACE;
                        if deadline < full && activity.in_flight.load(Ordering::Relaxed) > 0 {
                            // a request reached the service during the short grace
                            closing = Some((started, full));
                            continue;
                        }
                        break;
                    }
                    continue;
                }
                if let Some(reason) = due(&activity, &limits) {
                    stats.closed(reason);
                    tracing::debug!(listener = stats.name, %peer, reason = reason.as_str(), "closing a connection");
                    if reason == CloseReason::BodyTimeout {
                        break;
                    }
                    conn.as_mut().graceful_shutdown();
                    let now = Instant::now();
                    closing = Some((now, now + CLOSE_GRACE));
                }
            }
        }
    }
    stats.open.fetch_sub(1, Ordering::Relaxed);
}

/// The limit a connection has passed, if any.
fn due(a: &Activity, limits: &ListenLimits) -> Option<CloseReason> {
    let age = a.born.elapsed();
    if age >= limits.max_connection_age {
        return Some(CloseReason::MaxAge);
    }
    if !a.seen_request.load(Ordering::Relaxed) {
        return (age >= limits.header_read_timeout).then_some(CloseReason::HeaderTimeout);
    }
    if a.bodies_stalled(limits.body_read_timeout) {
        return Some(CloseReason::BodyTimeout);
    }
    if a.in_flight.load(Ordering::Relaxed) == 0 {
        let idle_ms = a
            .since_born_ms()
            .saturating_sub(a.last_done_ms.load(Ordering::Relaxed));
        if Duration::from_millis(idle_ms) >= limits.idle_timeout {
            return Some(CloseReason::Idle);
        }
    }
    None
}

#[cfg(test)]
mod tests;
