//! Alert webhooks: the outbox worker that turns incidents into signed HTTP deliveries.
//!
//! The worker never blocks the watchdog: it follows the [`EventBus`] only as a wake-up and
//! reads incidents from storage after its durable cursor, so nothing is lost when it falls
//! behind or restarts. For each incident, every webhook whose `events` list wants it gets a
//! delivery in the SQLite outbox (enqueued together with the cursor move, `synchronous=FULL`).
//! Due deliveries are POSTed signed as Standard Webhooks specifies (standardwebhooks.com,
//! "Signature scheme"): `webhook-id` (the idempotency key, the same on every attempt),
//! `webhook-timestamp` (Unix seconds, fresh on every attempt) and `webhook-signature:
//! v1,<base64 HMAC-SHA256 over "{id}.{timestamp}.{body}">`, so a captured delivery cannot be
//! replayed past the receiver's tolerance window. The key is the base64 after `whsec_` when
//! the configured secret has that prefix (the spec's secret format), else the secret's raw
//! bytes. `X-Stallwatch-Signature: sha256=<hex HMAC of the body>` stays for compatibility,
//! with `Idempotency-Key` and `Content-Type: application/json`. Every attempt is recorded;
//! a 2xx delivers; a 4xx other than 408/409/425/429 is final; anything else retries after
//! 1 s doubling to a 300 s cap with ±20 % jitter, or after the receiver's `Retry-After`
//! (seconds or HTTP-date, capped at `retry_max`), across restarts, until `max_attempts`
//! (docs/design.md, One event vocabulary). Each receiver has its own worker, so a hanging
//! one never delays a healthy one.
//!
//! [`EventBus`]: stallwatch_storage::EventBus

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::{Digest, Sha256};
use stallwatch_storage::model::{now_unix_nano, Incident};
use stallwatch_storage::outbox::{AttemptOutcome, Delivery, DeliveryAttempt, NewDelivery};
use stallwatch_storage::{EventBus, Storage};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{DashboardConfig, WebhookConfig};
use crate::error::DashboardError;

/// Signature header name.
pub const SIGNATURE_HEADER: &str = "X-Stallwatch-Signature";
/// Idempotency header name.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// Deliveries sent at once.
const CONCURRENCY: usize = 8;
/// Incidents read per catch-up page.
const PAGE: usize = 500;
/// Longest idle sleep between checks of the outbox.
const MAX_IDLE: Duration = Duration::from_secs(30);

/// Webhook counters of this process, rendered at `GET /metrics` as
/// `stallwatch_webhook_deliveries_enqueued_total` and
/// `stallwatch_webhook_attempts_total{outcome="delivered"|"retry"|"given_up"}`.
pub(crate) struct WebhookStats {
    enqueued: AtomicU64,
    delivered: AtomicU64,
    retry: AtomicU64,
    given_up: AtomicU64,
}

/// The process-wide webhook counters (one outbox worker per process).
pub(crate) static STATS: WebhookStats = WebhookStats {
    enqueued: AtomicU64::new(0),
    delivered: AtomicU64::new(0),
    retry: AtomicU64::new(0),
    given_up: AtomicU64::new(0),
};

impl WebhookStats {
    /// Appends the counters in the Prometheus text format.
    pub(crate) fn render(&self, out: &mut String) {
        use std::fmt::Write;
        out.push_str("# HELP stallwatch_webhook_deliveries_enqueued_total Webhook deliveries put in the outbox.\n");
        out.push_str("# TYPE stallwatch_webhook_deliveries_enqueued_total counter\n");
        let _ = writeln!(
            out,
            "stallwatch_webhook_deliveries_enqueued_total {}",
            self.enqueued.load(Ordering::Relaxed)
        );
        out.push_str(
            "# HELP stallwatch_webhook_attempts_total Webhook delivery attempts, by outcome.\n",
        );
        out.push_str("# TYPE stallwatch_webhook_attempts_total counter\n");
        for (name, v) in [
            ("delivered", &self.delivered),
            ("retry", &self.retry),
            ("given_up", &self.given_up),
        ] {
            let _ = writeln!(
                out,
                "stallwatch_webhook_attempts_total{{outcome=\"{name}\"}} {}",
                v.load(Ordering::Relaxed)
            );
        }
    }
}

/// Standard Webhooks message id header.
pub const WEBHOOK_ID_HEADER: &str = "webhook-id";
/// Standard Webhooks timestamp header (Unix seconds).
pub const WEBHOOK_TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// Standard Webhooks signature header (`v1,<base64>`).
pub const WEBHOOK_SIGNATURE_HEADER: &str = "webhook-signature";

/// The HMAC key of a configured secret: the base64 after `whsec_` (Standard Webhooks secret
/// format), else the secret's own bytes (a plain secret, also when the base64 is invalid).
pub fn signing_key(secret: &str) -> Vec<u8> {
    use base64::Engine as _;
    if let Some(b64) = secret.strip_prefix("whsec_") {
        if let Ok(k) = base64::engine::general_purpose::STANDARD.decode(b64) {
            return k;
        }
    }
    secret.as_bytes().to_vec()
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` (Standard Webhooks).
pub fn sign_standard(secret: &str, id: &str, timestamp_s: u64, body: &[u8]) -> String {
    use base64::Engine as _;
    let mut mac = match Hmac::<Sha256>::new_from_slice(&signing_key(secret)) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp_s.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// A receiver's `Retry-After` (delta seconds, or an HTTP-date, RFC 9110 section 10.2.3) as
/// a wait from `now`; `None` when absent or unreadable.
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `sha256=<lowercase hex HMAC-SHA256 of body keyed with secret>`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    // HMAC accepts keys of any length; the error arm cannot happen.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The `Idempotency-Key` of an incident: 32 hex characters derived from the incident's own
/// idempotency key, so a re-delivery (even after a restart) carries the same key.
pub fn idempotency_key(incident: &Incident) -> String {
    let digest = Sha256::digest(incident.incident.idempotency_key.as_bytes());
    hex::encode(&digest[..16])
}

/// Delay before attempt `attempts_made + 1`: `initial * 2^(attempts_made - 1)`, capped at
/// `max` (1 s, 2 s, 4 s ... 300 s with the defaults).
pub fn backoff(attempts_made: u32, initial: Duration, max: Duration) -> Duration {
    let exp = attempts_made.saturating_sub(1).min(30);
    initial.saturating_mul(1u32 << exp).min(max)
}

/// What follows an attempt that answered `status` (or failed in transport when `None`),
/// given the attempts made including this one; pure, `now` in ns since the Unix epoch.
///
/// 2xx → delivered; a 4xx other than 408, 409, 425, 429 → given up (the receiver refuses
/// the message itself); else retry after the receiver's `retry_after` when it sent one
/// (capped at `retry_max`), otherwise after [`backoff`] scaled by `jitter` in `[0, 1)` to
/// 80–120 % (so receivers that failed together are not retried together).
pub fn outcome(
    status: Option<u16>,
    attempts_made: u32,
    webhook: &WebhookConfig,
    now_unix_nano: u64,
    retry_after: Option<Duration>,
    jitter: f64,
) -> AttemptOutcome {
    if matches!(status, Some(200..=299)) {
        return AttemptOutcome::Delivered;
    }
    if matches!(status, Some(400..=499)) && !matches!(status, Some(408 | 409 | 425 | 429)) {
        return AttemptOutcome::GiveUp;
    }
    if attempts_made >= webhook.max_attempts {
        return AttemptOutcome::GiveUp;
    }
    let wait = match retry_after {
        Some(w) => w.min(webhook.retry_max),
        None => backoff(attempts_made, webhook.retry_initial, webhook.retry_max)
            .mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0)),
    };
    AttemptOutcome::RetryAt(now_unix_nano.saturating_add(wait.as_nanos() as u64))
}

/// A number in `[0, 1)` that differs per delivery and attempt (randomly seeded per process).
fn jitter_for(delivery: i64, attempts: u32) -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(delivery);
    h.write_u32(attempts);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The webhook body: what happened, to which runner, tool, trace and span, why, the
/// evidence, and links back to the dashboard (`base_url` without trailing `/`). An
/// incident with stall forensics (`evidence.classification`, issue 18) carries
/// `forensics: {summary, tool_frame, link}` and its evidence without the bulky `threads`
/// and `stacks` (the link leads to them).
pub fn body(incident: &Incident, base_url: &str) -> String {
    let n = &incident.incident;
    let trace = n.trace_id.map(|t| t.to_hex());
    let span = n.span_id.map(|s| s.to_hex());
    let mut links = serde_json::Map::new();
    links.insert(
        "incident".into(),
        format!("{base_url}/#/incident/{}", incident.id).into(),
    );
    links.insert(
        "incident_api".into(),
        format!("{base_url}/api/v1/incidents/{}", incident.id).into(),
    );
    if let Some(r) = &n.runner_id {
        links.insert("runner".into(), format!("{base_url}/#/runner/{r}").into());
    }
    if let Some(t) = &trace {
        links.insert("trace".into(), format!("{base_url}/#/trace/{t}").into());
        if let Some(s) = &span {
            links.insert("span".into(), format!("{base_url}/#/span/{t}/{s}").into());
        }
    }
    // Stall forensics (issue 18): a summary and a link instead of the threads and stacks.
    let mut evidence = n.evidence.clone();
    let forensics = n.evidence["classification"].as_str().map(|summary| {
        if let Some(e) = evidence.as_object_mut() {
            e.remove("threads");
            e.remove("stacks");
        }
        json!({
            "summary": summary,
            "tool_frame": n.evidence["stacks"]["tool_frame"],
            "link": format!("{base_url}/#/incident/{}", incident.id),
        })
    });
    json!({
        "event": n.kind.as_str(),
        "incident_id": incident.id,
        "at_unix_nano": n.at_unix_nano.to_string(),
        "runner_id": n.runner_id,
        "tool_name": n.tool_name,
        "trace_id": trace,
        "span_id": span,
        "reason": n.reason,
        "evidence": evidence,
        "forensics": forensics,
        "idempotency_key": idempotency_key(incident),
        "links": links,
    })
    .to_string()
}

/// Starts the outbox worker: catch up from the durable cursor, deliver what is due, sleep
/// until the next due time or the next incident, until `shutdown`.
pub fn start_webhooks(
    config: Arc<DashboardConfig>,
    storage: Storage,
    events: EventBus,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let client = match reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("stallwatch/", env!("CARGO_PKG_VERSION")))
            .build()
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("webhooks disabled: cannot build an HTTP client: {e}");
                return;
            }
        };
        let worker = Worker {
            config,
            storage,
            client,
        };
        let worker = Arc::new(worker);
        // One worker per receiver: a hanging receiver only delays its own deliveries.
        let mut wakers = Vec::new();
        let mut tasks = Vec::new();
        for hook in worker.config.webhooks.iter().cloned() {
            let wake = Arc::new(tokio::sync::Notify::new());
            wakers.push(wake.clone());
            let w = worker.clone();
            let stop = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                w.receiver_loop(hook, wake, stop).await
            }));
        }
        let mut rx = events.subscribe();
        loop {
            let wait = match worker.catch_up().await {
                Ok(()) => MAX_IDLE,
                Err(e) => {
                    tracing::warn!("webhook outbox round failed: {e}");
                    Duration::from_secs(1)
                }
            };
            for w in &wakers {
                w.notify_one();
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = rx.recv() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        for t in tasks {
            let _ = t.await;
        }
    })
}

struct Worker {
    config: Arc<DashboardConfig>,
    storage: Storage,
    client: reqwest::Client,
}

impl Worker {
    /// The worker of one receiver: send its due deliveries, sleep until its next due time
    /// or a wake-up (new deliveries enqueued), until `shutdown`.
    async fn receiver_loop(
        &self,
        hook: WebhookConfig,
        wake: Arc<tokio::sync::Notify>,
        shutdown: CancellationToken,
    ) {
        loop {
            let wait = match self.receiver_round(&hook, &shutdown).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(url = %hook.url, "webhook round failed: {e}");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One pass for one receiver; answers how long to sleep.
    async fn receiver_round(
        &self,
        hook: &WebhookConfig,
        shutdown: &CancellationToken,
    ) -> Result<Duration, DashboardError> {
        let now = now_unix_nano();
        let due = self
            .storage
            .due_deliveries_for(hook.url.clone(), now, 64)
            .await?;
        let full_page = due.len() == 64;
        futures::stream::iter(due)
            .for_each_concurrent(CONCURRENCY, |d| async move {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    r = self.deliver(d) => if let Err(e) = r {
                        tracing::warn!("webhook delivery not recorded: {e}");
                    }
                }
            })
            .await;
        if full_page {
            return Ok(Duration::ZERO);
        }
        let now = now_unix_nano();
        Ok(
            match self.storage.next_delivery_due_for(hook.url.clone()).await? {
                Some(t) => Duration::from_nanos(t.saturating_sub(now)).min(MAX_IDLE),
                None => MAX_IDLE,
            }
            .max(Duration::from_millis(5)),
        )
    }

    /// Enqueues deliveries for every incident after the cursor.
    async fn catch_up(&self) -> Result<(), DashboardError> {
        let base = self.config.base_url();
        let mut cursor = self.storage.outbox_cursor().await?;
        loop {
            let page = self.storage.incidents_after(cursor, PAGE).await?;
            let Some(last) = page.last().map(|i| i.id) else {
                return Ok(());
            };
            let mut new = Vec::new();
            for inc in &page {
                let wanted: Vec<&WebhookConfig> = self
                    .config
                    .webhooks
                    .iter()
                    .filter(|w| w.wants(inc.incident.kind))
                    .collect();
                if wanted.is_empty() {
                    continue;
                }
                let text = body(inc, &base);
                for w in wanted {
                    new.push(NewDelivery {
                        webhook: w.url.clone(),
                        incident_id: inc.id,
                        event: inc.incident.kind.as_str().to_string(),
                        idempotency_key: idempotency_key(inc),
                        body: text.clone(),
                    });
                }
            }
            let added = self
                .storage
                .enqueue_deliveries(new, last, now_unix_nano())
                .await?;
            if added > 0 {
                STATS.enqueued.fetch_add(added as u64, Ordering::Relaxed);
                tracing::debug!(added, "webhook deliveries enqueued");
            }
            cursor = last;
            if page.len() < PAGE {
                return Ok(());
            }
        }
    }

    /// One attempt of one delivery, recorded.
    async fn deliver(&self, d: Delivery) -> Result<(), DashboardError> {
        let Some(hook) = self.config.webhooks.iter().find(|w| w.url == d.webhook) else {
            self.storage
                .abandon_delivery(
                    d.id,
                    "webhook is no longer configured".into(),
                    now_unix_nano(),
                )
                .await?;
            return Ok(());
        };
        let at = now_unix_nano();
        let started = Instant::now();
        let timestamp_s = at / 1_000_000_000;
        let sent = self
            .client
            .post(&hook.url)
            .timeout(hook.timeout)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(WEBHOOK_ID_HEADER, &d.idempotency_key)
            .header(WEBHOOK_TIMESTAMP_HEADER, timestamp_s.to_string())
            .header(
                WEBHOOK_SIGNATURE_HEADER,
                sign_standard(
                    &hook.secret,
                    &d.idempotency_key,
                    timestamp_s,
                    d.body.as_bytes(),
                ),
            )
            .header(SIGNATURE_HEADER, sign(&hook.secret, d.body.as_bytes()))
            .header(IDEMPOTENCY_HEADER, &d.idempotency_key)
            .header("X-Stallwatch-Event", &d.event)
            .body(d.body.clone())
            .send()
            .await;
        let mut retry_after = None;
        let (status, error) = match sent {
            Ok(resp) if resp.status().is_success() => (Some(resp.status().as_u16()), None),
            Ok(resp) => {
                let s = resp.status();
                retry_after = resp
                    .headers()
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
                (Some(s.as_u16()), Some(format!("receiver answered {s}")))
            }
            Err(e) => (None, Some(transport_error(&e))),
        };
        let duration_ms = started.elapsed().as_millis() as u64;
        let attempts_made = d.attempts.saturating_add(1);
        let next = outcome(
            status,
            attempts_made,
            hook,
            now_unix_nano(),
            retry_after,
            jitter_for(d.id, attempts_made),
        );
        let counter = match next {
            AttemptOutcome::Delivered => &STATS.delivered,
            AttemptOutcome::RetryAt(_) => &STATS.retry,
            AttemptOutcome::GiveUp => &STATS.given_up,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        match (&next, &error) {
            (AttemptOutcome::Delivered, _) => {
                tracing::info!(delivery = d.id, event = %d.event, url = %hook.url, "webhook delivered")
            }
            (AttemptOutcome::GiveUp, Some(e)) => {
                tracing::warn!(delivery = d.id, url = %hook.url, attempts = attempts_made, "webhook given up: {e}")
            }
            (_, Some(e)) => {
                tracing::info!(delivery = d.id, url = %hook.url, attempts = attempts_made, "webhook attempt failed, will retry: {e}")
            }
            _ => {}
        }
        self.storage
            .record_delivery_attempt(
                DeliveryAttempt {
                    delivery_id: d.id,
                    at_unix_nano: at,
                    status,
                    error,
                    duration_ms,
                },
                next,
            )
            .await?;
        Ok(())
    }
}

/// A short description of a transport failure (no URL, which is already recorded).
fn transport_error(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_redirect() {
        "redirect refused"
    } else {
        "request failed"
    };
    let mut detail = String::new();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(s) = src {
        detail = s.to_string();
        src = s.source();
    }
    if detail.is_empty() {
        what.to_string()
    } else {
        format!("{what}: {detail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook() -> WebhookConfig {
        WebhookConfig {
            url: "http://127.0.0.1:9/".into(),
            secret: "k".into(),
            events: vec![],
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            max_attempts: 5,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn backoff_doubles_from_one_second_to_the_cap() {
        let i = Duration::from_secs(1);
        let m = Duration::from_secs(300);
        let got: Vec<u64> = (1..=11).map(|n| backoff(n, i, m).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(backoff(u32::MAX, i, m), m);
    }

    #[test]
    fn outcome_table() {
        let h = hook();
        let o = |status, attempts, now, ra| outcome(status, attempts, &h, now, ra, 0.5);
        assert_eq!(o(Some(204), 1, 0, None), AttemptOutcome::Delivered);
        assert_eq!(
            o(Some(500), 1, 10, None),
            AttemptOutcome::RetryAt(10 + 1_000_000_000)
        );
        assert_eq!(o(None, 3, 0, None), AttemptOutcome::RetryAt(4_000_000_000));
        assert_eq!(o(Some(302), 5, 0, None), AttemptOutcome::GiveUp);
        // A 4xx is final, except the four that mean "later".
        for final_status in [400, 401, 403, 404, 410, 413, 422] {
            assert_eq!(o(Some(final_status), 1, 0, None), AttemptOutcome::GiveUp);
        }
        for later in [408, 409, 425, 429] {
            assert!(matches!(
                o(Some(later), 1, 0, None),
                AttemptOutcome::RetryAt(_)
            ));
        }
        // Retry-After wins over the back-off, capped at retry_max.
        let ra = Some(Duration::from_secs(42));
        assert_eq!(
            o(Some(503), 1, 0, ra),
            AttemptOutcome::RetryAt(42_000_000_000)
        );
        let ra = Some(Duration::from_secs(4000));
        assert_eq!(
            o(Some(429), 1, 0, ra),
            AttemptOutcome::RetryAt(300_000_000_000)
        );
        // Jitter keeps the back-off within 80..=120 %.
        assert_eq!(
            outcome(Some(500), 2, &h, 0, None, 0.0),
            AttemptOutcome::RetryAt(1_600_000_000)
        );
        assert_eq!(
            outcome(Some(500), 2, &h, 0, None, 1.0),
            AttemptOutcome::RetryAt(2_400_000_000)
        );
    }

    #[test]
    fn standard_webhooks_signature_matches_the_reference_vector() {
        // The test vector of the Standard Webhooks reference libraries.
        let sig = sign_standard(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert_eq!(signing_key("plain"), b"plain".to_vec());
    }

    #[test]
    fn retry_after_seconds_and_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn signature_is_hmac_sha256_hex() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
