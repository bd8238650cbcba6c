//! The durable webhook outbox: one row per (webhook, incident) delivery, its attempts, and
//! the cursor of the last incident enqueued.
//!
//! The dashboards' webhook worker enqueues a delivery for every incident a webhook wants,
//! then sends due deliveries and records each attempt here. Everything is written through
//! `Storage::control` (`synchronous=FULL`, docs/design.md "Durability levels"), so a delivery
//! survives a restart of stallwatch and is retried with its back-off where it stopped. The
//! cursor is advanced in the same transaction as the enqueue, so an incident is enqueued
//! once even across a crash.

use rusqlite::{params, OptionalExtension, Row};

use crate::db::Storage;
use crate::error::StorageError;

/// DDL for this module's tables (part of migration 1).
pub(crate) const SCHEMA: &str = "
CREATE TABLE webhook_deliveries (
    id                     INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook                TEXT NOT NULL,
    incident_id            INTEGER NOT NULL,
    event                  TEXT NOT NULL,
    idempotency_key        TEXT NOT NULL,
    body                   TEXT NOT NULL,
    state                  TEXT NOT NULL,
    attempts               INTEGER NOT NULL DEFAULT 0,
    next_attempt_unix_nano INTEGER NOT NULL,
    created_unix_nano      INTEGER NOT NULL,
    done_unix_nano         INTEGER,
    last_status            INTEGER,
    last_error             TEXT,
    UNIQUE (webhook, incident_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries(state, next_attempt_unix_nano);
CREATE TABLE webhook_attempts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id   INTEGER NOT NULL REFERENCES webhook_deliveries(id) ON DELETE CASCADE,
    at_unix_nano  INTEGER NOT NULL,
    status        INTEGER,
    error         TEXT,
    duration_ms   INTEGER NOT NULL
);
CREATE INDEX webhook_attempts_delivery ON webhook_attempts(delivery_id, id);
CREATE TABLE webhook_cursor (
    name             TEXT PRIMARY KEY,
    last_incident_id INTEGER NOT NULL
);
";

/// Name of the single cursor row.
const CURSOR: &str = "outbox";

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryState {
    /// Waiting for its next attempt.
    Pending,
    /// A receiver answered 2xx.
    Delivered,
    /// Given up (attempt limit reached, or its webhook is no longer configured).
    Failed,
}

impl DeliveryState {
    /// `pending`, `delivered` or `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }
    /// Parses [`DeliveryState::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(DeliveryState::Pending),
            "delivered" => Some(DeliveryState::Delivered),
            "failed" => Some(DeliveryState::Failed),
            _ => None,
        }
    }
}

/// A delivery to enqueue.
#[derive(Clone, Debug, PartialEq)]
pub struct NewDelivery {
    /// The webhook's identity (its URL).
    pub webhook: String,
    /// The incident it announces.
    pub incident_id: i64,
    /// The event name (`breaker.opened`, ...).
    pub event: String,
    /// The `Idempotency-Key` header value, the same on every attempt.
    pub idempotency_key: String,
    /// The JSON body, exactly as it will be signed and sent.
    pub body: String,
}

/// A stored delivery.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    /// Row id.
    pub id: i64,
    /// The webhook's identity (its URL).
    pub webhook: String,
    /// The incident it announces.
    pub incident_id: i64,
    /// The event name.
    pub event: String,
    /// The `Idempotency-Key` header value.
    pub idempotency_key: String,
    /// The JSON body.
    pub body: String,
    /// Where it stands.
    pub state: DeliveryState,
    /// Attempts made so far.
    pub attempts: u32,
    /// When the next attempt is due, ns since the Unix epoch.
    pub next_attempt_unix_nano: u64,
    /// When it was enqueued, ns since the Unix epoch.
    pub created_unix_nano: u64,
    /// When it was delivered or given up, ns since the Unix epoch.
    pub done_unix_nano: Option<u64>,
    /// HTTP status of the last attempt, when one answered.
    pub last_status: Option<u16>,
    /// Error of the last attempt (transport error or non-2xx summary).
    pub last_error: Option<String>,
}

/// One recorded delivery attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct DeliveryAttempt {
    /// The delivery.
    pub delivery_id: i64,
    /// When the attempt started, ns since the Unix epoch.
    pub at_unix_nano: u64,
    /// HTTP status answered, `None` on a transport error or timeout.
    pub status: Option<u16>,
    /// What went wrong, `None` on success.
    pub error: Option<String>,
    /// How long the attempt took, ms.
    pub duration_ms: u64,
}

/// What to do with a delivery after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The receiver accepted it.
    Delivered,
    /// Try again at this time, ns since the Unix epoch.
    RetryAt(u64),
    /// Give up.
    GiveUp,
}

/// Filter for [`Storage::deliveries`]: newest first.
#[derive(Clone, Debug, Default)]
pub struct DeliveryQuery {
    /// Only this state.
    pub state: Option<DeliveryState>,
    /// Only this incident.
    pub incident_id: Option<i64>,
    /// Only ids below this (paging cursor, newest first).
    pub before_id: Option<i64>,
    /// Page size (1..=1000).
    pub limit: usize,
}

const COLUMNS: &str = "id, webhook, incident_id, event, idempotency_key, body, state, attempts, \
     next_attempt_unix_nano, created_unix_nano, done_unix_nano, last_status, last_error";

fn row_to_delivery(r: &Row<'_>) -> rusqlite::Result<Delivery> {
    let state: String = r.get(6)?;
    Ok(Delivery {
        id: r.get(0)?,
        webhook: r.get(1)?,
        incident_id: r.get(2)?,
        event: r.get(3)?,
        idempotency_key: r.get(4)?,
        body: r.get(5)?,
        state: DeliveryState::parse(&state).unwrap_or(DeliveryState::Failed),
        attempts: r.get::<_, i64>(7)?.max(0) as u32,
        next_attempt_unix_nano: r.get::<_, i64>(8)?.max(0) as u64,
        created_unix_nano: r.get::<_, i64>(9)?.max(0) as u64,
        done_unix_nano: r.get::<_, Option<i64>>(10)?.map(|v| v.max(0) as u64),
        last_status: r.get::<_, Option<i64>>(11)?.map(|v| v.clamp(0, 999) as u16),
        last_error: r.get(12)?,
    })
}

impl Storage {
    /// The id of the last incident the outbox has enqueued (or skipped); 0 before the first
    /// enqueue. The outbox table is created by the same migration as the incident table, so
    /// a database without a cursor holds no incident older than the outbox itself.
    pub async fn outbox_cursor(&self) -> Result<i64, StorageError> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT last_incident_id FROM webhook_cursor WHERE name = ?1",
                [CURSOR],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(0))
        })
        .await
    }

    /// Enqueues `deliveries` (a (webhook, incident) pair already present is kept as it is)
    /// and moves the cursor to `cursor`, in one `synchronous=FULL` transaction. Answers how
    /// many deliveries were new. Each is due at `now_unix_nano`.
    pub async fn enqueue_deliveries(
        &self,
        deliveries: Vec<NewDelivery>,
        cursor: i64,
        now_unix_nano: u64,
    ) -> Result<usize, StorageError> {
        self.control(move |tx| {
            let mut added = 0;
            {
                let mut st = tx.prepare_cached(
                    "INSERT INTO webhook_deliveries (webhook, incident_id, event, idempotency_key, body, state, attempts, next_attempt_unix_nano, created_unix_nano)
                     VALUES (?1, ?2, ?3, ?4, ?5, 'pending', 0, ?6, ?6)
                     ON CONFLICT(webhook, incident_id) DO NOTHING",
                )?;
                for d in &deliveries {
                    added += st.execute(params![
                        d.webhook,
                        d.incident_id,
                        d.event,
                        d.idempotency_key,
                        d.body,
                        now_unix_nano as i64
                    ])?;
                }
            }
            tx.execute(
                "INSERT INTO webhook_cursor (name, last_incident_id) VALUES (?1, ?2)
                 ON CONFLICT(name) DO UPDATE SET last_incident_id = MAX(last_incident_id, excluded.last_incident_id)",
                params![CURSOR, cursor],
            )?;
            Ok(added)
        })
        .await
    }

    /// Pending deliveries due at or before `now_unix_nano`, oldest due first, at most
    /// `limit` (capped at 1000).
    pub async fn due_deliveries(
        &self,
        now_unix_nano: u64,
        limit: usize,
    ) -> Result<Vec<Delivery>, StorageError> {
        let limit = limit.clamp(1, 1000) as i64;
        self.read(move |c| {
            let mut st = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM webhook_deliveries
                 WHERE state = 'pending' AND next_attempt_unix_nano <= ?1
                 ORDER BY next_attempt_unix_nano, id LIMIT ?2"
            ))?;
            let rows = st.query_map(params![now_unix_nano as i64, limit], row_to_delivery)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Pending deliveries of one webhook `url` due at `now_unix_nano`, soonest first (each
    /// receiver has its own worker, so a hanging one never delays another).
    pub async fn due_deliveries_for(
        &self,
        url: String,
        now_unix_nano: u64,
        limit: usize,
    ) -> Result<Vec<Delivery>, StorageError> {
        let limit = limit.clamp(1, 1000) as i64;
        self.read(move |c| {
            let mut st = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM webhook_deliveries
                 WHERE state = 'pending' AND webhook = ?1 AND next_attempt_unix_nano <= ?2
                 ORDER BY next_attempt_unix_nano, id LIMIT ?3"
            ))?;
            let rows = st.query_map(params![url, now_unix_nano as i64, limit], row_to_delivery)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// When the earliest pending delivery of webhook `url` is due, ns since the Unix epoch.
    pub async fn next_delivery_due_for(&self, url: String) -> Result<Option<u64>, StorageError> {
        self.read(move |c| {
            let v: Option<i64> = c.query_row(
                "SELECT MIN(next_attempt_unix_nano) FROM webhook_deliveries
                 WHERE state = 'pending' AND webhook = ?1",
                [url],
                |r| r.get(0),
            )?;
            Ok(v.map(|v| v.max(0) as u64))
        })
        .await
    }

    /// When the earliest pending delivery is due, ns since the Unix epoch; `None` when
    /// nothing is pending.
    pub async fn next_delivery_due(&self) -> Result<Option<u64>, StorageError> {
        self.read(|c| {
            let v: Option<i64> = c.query_row(
                "SELECT MIN(next_attempt_unix_nano) FROM webhook_deliveries WHERE state = 'pending'",
                [],
                |r| r.get(0),
            )?;
            Ok(v.map(|v| v.max(0) as u64))
        })
        .await
    }

    /// Records one attempt and applies its outcome, in one `synchronous=FULL` transaction.
    /// A delivery that is no longer pending is left as it is (its attempt is still kept).
    pub async fn record_delivery_attempt(
        &self,
        attempt: DeliveryAttempt,
        outcome: AttemptOutcome,
    ) -> Result<(), StorageError> {
        self.control(move |tx| {
            tx.execute(
                "INSERT INTO webhook_attempts (delivery_id, at_unix_nano, status, error, duration_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    attempt.delivery_id,
                    attempt.at_unix_nano as i64,
                    attempt.status.map(i64::from),
                    attempt.error,
                    attempt.duration_ms as i64
                ],
            )?;
            let done_at = attempt.at_unix_nano as i64 + (attempt.duration_ms as i64) * 1_000_000;
            let (state, next, done) = match outcome {
                AttemptOutcome::Delivered => ("delivered", None, Some(done_at)),
                AttemptOutcome::RetryAt(t) => ("pending", Some(t as i64), None),
                AttemptOutcome::GiveUp => ("failed", None, Some(done_at)),
            };
            tx.execute(
                "UPDATE webhook_deliveries
                 SET attempts = attempts + 1, state = ?2,
                     next_attempt_unix_nano = COALESCE(?3, next_attempt_unix_nano),
                     done_unix_nano = ?4, last_status = ?5, last_error = ?6
                 WHERE id = ?1 AND state = 'pending'",
                params![
                    attempt.delivery_id,
                    state,
                    next,
                    done,
                    attempt.status.map(i64::from),
                    attempt.error
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// Marks a pending delivery failed without an attempt (e.g. its webhook was removed
    /// from the configuration), with `reason` as its last error.
    pub async fn abandon_delivery(
        &self,
        id: i64,
        reason: String,
        now_unix_nano: u64,
    ) -> Result<(), StorageError> {
        self.control(move |tx| {
            tx.execute(
                "UPDATE webhook_deliveries SET state = 'failed', done_unix_nano = ?2, last_error = ?3
                 WHERE id = ?1 AND state = 'pending'",
                params![id, now_unix_nano as i64, reason],
            )?;
            Ok(())
        })
        .await
    }

    /// Deliveries matching `q`, newest first.
    pub async fn deliveries(&self, q: DeliveryQuery) -> Result<Vec<Delivery>, StorageError> {
        let limit = q.limit.clamp(1, 1000) as i64;
        self.read(move |c| {
            let mut st = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM webhook_deliveries
                 WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR incident_id = ?2)
                   AND (?3 IS NULL OR id < ?3)
                 ORDER BY id DESC LIMIT ?4"
            ))?;
            let rows = st.query_map(
                params![
                    q.state.map(|s| s.as_str()),
                    q.incident_id,
                    q.before_id,
                    limit
                ],
                row_to_delivery,
            )?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// The attempts of the given deliveries, oldest first per delivery.
    pub async fn delivery_attempts(
        &self,
        delivery_ids: Vec<i64>,
    ) -> Result<Vec<DeliveryAttempt>, StorageError> {
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT delivery_id, at_unix_nano, status, error, duration_ms
                 FROM webhook_attempts WHERE delivery_id = ?1 ORDER BY id",
            )?;
            let mut out = Vec::new();
            for id in delivery_ids {
                let rows = st.query_map([id], |r| {
                    Ok(DeliveryAttempt {
                        delivery_id: r.get(0)?,
                        at_unix_nano: r.get::<_, i64>(1)?.max(0) as u64,
                        status: r.get::<_, Option<i64>>(2)?.map(|v| v.clamp(0, 999) as u16),
                        error: r.get(3)?,
                        duration_ms: r.get::<_, i64>(4)?.max(0) as u64,
                    })
                })?;
                for a in rows {
                    out.push(a?);
                }
            }
            Ok(out)
        })
        .await
    }
}
