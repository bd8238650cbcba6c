//! Alert webhooks: the outbox worker that turns incidents into signed HTTP deliveries.
//!
//! The worker never blocks the watchdog: it follows the [`EventBus`] only as a wake-up and
//! reads incidents from storage after its durable cursor, so nothing is lost when it falls
//! behind or restarts. For each incident, every webhook whose `events` list wants it gets a
//! delivery in the SQLite outbox (enqueued together with the cursor move, `synchronous=FULL`).
//! Due deliveries are POSTed with `X-Stallwatch-Signature: sha256=<hex HMAC-SHA256 of the
//! body>`, `Idempotency-Key` (the same on every attempt) and `Content-Type:
//! application/json`; every attempt is recorded; failures retry after 1 s doubling to a
//! 300 s cap (DESIGN, One event vocabulary), across restarts, until `max_attempts`.
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
pub fn outcome(
    status: Option<u16>,
    attempts_made: u32,
    webhook: &WebhookConfig,
    now_unix_nano: u64,
) -> AttemptOutcome {
    if matches!(status, Some(200..=299)) {
        return AttemptOutcome::Delivered;
    }
    if attempts_made >= webhook.max_attempts {
        return AttemptOutcome::GiveUp;
    }
    let wait = backoff(attempts_made, webhook.retry_initial, webhook.retry_max);
    AttemptOutcome::RetryAt(now_unix_nano.saturating_add(wait.as_nanos() as u64))
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
        let mut rx = events.subscribe();
        loop {
            let wait = match worker.round(&shutdown).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!("webhook outbox round failed: {e}");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = rx.recv() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    })
}

struct Worker {
    config: Arc<DashboardConfig>,
    storage: Storage,
    client: reqwest::Client,
}

impl Worker {
    /// One pass: enqueue new incidents, send due deliveries; answers how long to sleep.
    async fn round(&self, shutdown: &CancellationToken) -> Result<Duration, DashboardError> {
        self.catch_up().await?;
        let now = now_unix_nano();
        let due = self.storage.due_deliveries(now, 64).await?;
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
        Ok(match self.storage.next_delivery_due().await? {
            Some(t) => Duration::from_nanos(t.saturating_sub(now)).min(MAX_IDLE),
            None => MAX_IDLE,
        }
        .max(Duration::from_millis(5)))
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
        let sent = self
            .client
            .post(&hook.url)
            .timeout(hook.timeout)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, sign(&hook.secret, d.body.as_bytes()))
            .header(IDEMPOTENCY_HEADER, &d.idempotency_key)
            .header("X-Stallwatch-Event", &d.event)
            .body(d.body.clone())
            .send()
            .await;
        let (status, error) = match sent {
            Ok(resp) if resp.status().is_success() => (Some(resp.status().as_u16()), None),
            Ok(resp) => {
                let s = resp.status();
                (Some(s.as_u16()), Some(format!("receiver answered {s}")))
            }
            Err(e) => (None, Some(transport_error(&e))),
        };
        let duration_ms = started.elapsed().as_millis() as u64;
        let attempts_made = d.attempts.saturating_add(1);
        let next = outcome(status, attempts_made, hook, now_unix_nano());
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
        assert_eq!(outcome(Some(204), 1, &h, 0), AttemptOutcome::Delivered);
        assert_eq!(
            outcome(Some(500), 1, &h, 10),
            AttemptOutcome::RetryAt(10 + 1_000_000_000)
        );
        assert_eq!(
            outcome(None, 3, &h, 0),
            AttemptOutcome::RetryAt(4_000_000_000)
        );
        assert_eq!(outcome(Some(302), 5, &h, 0), AttemptOutcome::GiveUp);
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
