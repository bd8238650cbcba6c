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
//! a 2xx delivers; a 3xx is final (redirects are not followed; the error names the
//! `Location`); a 4xx other than 408/409/425/429 is final; anything else retries after
//! 1 s doubling to a 300 s cap with ±20 % jitter, or after the receiver's `Retry-After`
//! (seconds or HTTP-date, capped at `retry_max`), across restarts, until `max_attempts`
//! (docs/design.md, One event vocabulary). Each receiver has its own worker, so a hanging
//! one never delays a healthy one.
//!
//! At start, pending deliveries whose URL no configured webhook has (the URL was corrected
//! or removed, then stallwatch restarted) are settled as failed, "webhook is no longer
//! configured", with one WARN per URL and counted as `given_up`. A webhook URL is shown
//! (logs, the deliveries API) only through [`redact_url`], and text from a receiver is
//! logged escaped, so it cannot forge log lines.
//!
//! [`EventBus`]: stallwatch_storage::EventBus

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use stallwatch_storage::model::now_unix_nano;
use stallwatch_storage::outbox::{
    AttemptOutcome, Delivery, DeliveryAttempt, DeliveryQuery, DeliveryState, NewDelivery,
};
use stallwatch_storage::prometheus::{counter, family, Kind};
use stallwatch_storage::{EventBus, Storage};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{redact_url, DashboardConfig, WebhookConfig};
use crate::error::DashboardError;

mod delivery;

use delivery::{answer_error, escape_receiver_text, jitter_for};
pub use delivery::{
    backoff, body, idempotency_key, outcome, parse_retry_after, sign, sign_standard, signing_key,
    IDEMPOTENCY_HEADER, SIGNATURE_HEADER, WEBHOOK_ID_HEADER, WEBHOOK_SIGNATURE_HEADER,
    WEBHOOK_TIMESTAMP_HEADER,
};

/// Deliveries sent at once.
const CONCURRENCY: usize = 8;
/// Incidents read per catch-up page.
const PAGE: usize = 500;
/// Longest idle sleep between checks of the outbox.
const MAX_IDLE: Duration = Duration::from_secs(30);
/// Pending deliveries read per page when looking for those of removed webhooks.
const SETTLE_PAGE: usize = 1000;
/// The error of a delivery whose webhook URL is no longer configured.
const NO_LONGER_CONFIGURED: &str = "webhook is no longer configured";

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
        counter(
            out,
            "stallwatch_webhook_deliveries_enqueued_total",
            "Webhook deliveries put in the outbox.",
            self.enqueued.load(Ordering::Relaxed),
        );
        let mut f = family(
            out,
            "stallwatch_webhook_attempts_total",
            Kind::Counter,
            "Webhook delivery attempts, by outcome.",
        );
        for (name, v) in [
            ("delivered", &self.delivered),
            ("retry", &self.retry),
            ("given_up", &self.given_up),
        ] {
            f.sample(&[("outcome", name)], v.load(Ordering::Relaxed));
        }
    }
}

/// Starts the outbox worker: catch up from the durable cursor, deliver what is due, sleep
/// until the next due time or the next incident, until `shutdown`.
pub fn start_webhooks(
    config: Arc<DashboardConfig>,
    storage: Storage,
    events: EventBus,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    stallwatch_vocabulary::task::spawn_boxed(async move {
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
            tasks.push(stallwatch_vocabulary::task::spawn_boxed(async move {
                w.receiver_loop(hook, wake, stop).await
            }));
        }
        let mut rx = events.subscribe();
        let mut settled = false;
        loop {
            if !settled {
                match worker.settle_removed().await {
                    Ok(()) => settled = true,
                    Err(e) => {
                        tracing::warn!(
                            "webhook outbox: deliveries of removed webhooks not settled yet: {e}"
                        )
                    }
                }
            }
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
                    tracing::warn!(url = %hook.shown_url(), "webhook round failed: {e}");
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

    /// Settles as failed every pending delivery whose URL no configured webhook has (no
    /// receiver worker would ever send it), with one WARN per URL saying how many, counted
    /// as `given_up`.
    async fn settle_removed(&self) -> Result<(), DashboardError> {
        let mut removed: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
        let mut before_id = None;
        loop {
            let page = self
                .storage
                .deliveries(DeliveryQuery {
                    state: Some(DeliveryState::Pending),
                    incident_id: None,
                    before_id,
                    limit: SETTLE_PAGE,
                })
                .await?;
            for d in &page {
                if !self.is_configured(&d.webhook) {
                    removed.entry(d.webhook.clone()).or_default().push(d.id);
                }
            }
            before_id = match page.last() {
                Some(d) if page.len() == SETTLE_PAGE => Some(d.id),
                _ => break,
            };
        }
        for (url, ids) in removed {
            let n = ids.len();
            let what = if n == 1 { "delivery" } else { "deliveries" };
            for id in ids {
                self.storage
                    .abandon_delivery(id, NO_LONGER_CONFIGURED.into(), now_unix_nano())
                    .await?;
                STATS.given_up.fetch_add(1, Ordering::Relaxed);
            }
            tracing::warn!(
                url = %redact_url(&url),
                deliveries = n,
                "{NO_LONGER_CONFIGURED}: {n} pending {what} for {} settled as failed",
                redact_url(&url)
            );
        }
        Ok(())
    }

    /// True when a configured webhook has exactly this URL (the outbox's key).
    fn is_configured(&self, url: &str) -> bool {
        self.config.webhooks.iter().any(|w| w.url == url)
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
                .abandon_delivery(d.id, NO_LONGER_CONFIGURED.into(), now_unix_nano())
                .await?;
            STATS.given_up.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                delivery = d.id,
                url = %redact_url(&d.webhook),
                "{NO_LONGER_CONFIGURED}: 1 pending delivery for {} settled as failed",
                redact_url(&d.webhook)
            );
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
                let location = resp
                    .headers()
                    .get(http::header::LOCATION)
                    .map(|v| v.as_bytes());
                (Some(s.as_u16()), Some(answer_error(s, location)))
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
        let url = hook.shown_url();
        match (&next, &error) {
            (AttemptOutcome::Delivered, _) => {
                tracing::info!(delivery = d.id, event = %d.event, url = %url, "webhook delivered")
            }
            (AttemptOutcome::GiveUp, Some(e)) => {
                tracing::warn!(delivery = d.id, url = %url, attempts = attempts_made, "webhook given up: {e}")
            }
            (_, Some(e)) => {
                tracing::info!(delivery = d.id, url = %url, attempts = attempts_made, "webhook attempt failed, will retry: {e}")
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

/// A short description of a transport failure (no URL, which is already recorded), its
/// detail escaped: it may carry the receiver's own text (a TLS name, a malformed answer).
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
        format!("{what}: {}", escape_receiver_text(&detail))
    }
}
