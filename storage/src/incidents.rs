//! The append-only incident table: every verdict change, breaker transition, termination,
//! rollback and storage alarm, with its evidence. Written with `synchronous=FULL`.
//!
//! Rows are never deleted or rewritten, with one additive exception: stall forensics
//! (issue 18) may add evidence keys and one reason line to an incident after it was
//! recorded ([`Storage::attach_incident_evidence`]); keys already present are kept.

use rusqlite::{params, OptionalExtension, Row};

use crate::db::Storage;
use crate::error::StorageError;
use crate::model::{EventKind, Incident, NewIncident, SpanId, TraceId};

/// DDL for the incident table (part of migration 1).
pub(crate) const SCHEMA: &str = "
CREATE TABLE incidents (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT NOT NULL,
    runner_id       TEXT,
    tool_name       TEXT,
    trace_id        BLOB,
    span_id         BLOB,
    reason          TEXT NOT NULL,
    evidence        TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    at_unix_nano    INTEGER NOT NULL
);
CREATE INDEX incidents_runner ON incidents(runner_id, id);
";

/// Filter for [`Storage::incidents`]: all fields optional, newest first.
#[derive(Clone, Debug, Default)]
pub struct IncidentQuery {
    /// Only this runner.
    pub runner_id: Option<String>,
    /// Only this kind.
    pub kind: Option<EventKind>,
    /// Only ids below this (paging cursor, newest first).
    pub before_id: Option<i64>,
    /// Page size (capped at 1000).
    pub limit: usize,
}

fn row_to_incident(r: &Row<'_>) -> rusqlite::Result<Incident> {
    let kind: String = r.get(1)?;
    let trace: Option<Vec<u8>> = r.get(4)?;
    let span: Option<Vec<u8>> = r.get(5)?;
    let evidence: String = r.get(7)?;
    Ok(Incident {
        id: r.get(0)?,
        incident: NewIncident {
            kind: EventKind::parse(&kind).unwrap_or(EventKind::VerdictSuspect),
            runner_id: r.get(2)?,
            tool_name: r.get(3)?,
            trace_id: trace.and_then(|b| b.try_into().ok().map(TraceId)),
            span_id: span.and_then(|b| b.try_into().ok().map(SpanId)),
            reason: r.get(6)?,
            evidence: serde_json::from_str(&evidence).unwrap_or(serde_json::Value::Null),
            idempotency_key: r.get(8)?,
            at_unix_nano: r.get::<_, i64>(9)? as u64,
        },
    })
}

const COLUMNS: &str = "id, kind, runner_id, tool_name, trace_id, span_id, reason, evidence, idempotency_key, at_unix_nano";

impl Storage {
    /// Records an incident (`synchronous=FULL`). `Ok(None)` when its idempotency key was
    /// already recorded. A locked file is given `HOLD_BUSY_WAIT` (250 ms), not the
    /// full `busy_timeout`: the caller (a trip, a termination) holds the incident and acts.
    pub async fn record_incident(
        &self,
        incident: NewIncident,
    ) -> Result<Option<Incident>, StorageError> {
        self.control_with_busy_wait(crate::held::HOLD_BUSY_WAIT, move |tx| {
            insert_incident_tx(tx, incident)
        })
        .await
    }

    /// Incidents with id greater than `after_id`, oldest first (SSE `Last-Event-ID` replay,
    /// webhook catch-up). At most `limit` (capped at 1000).
    pub async fn incidents_after(
        &self,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<Incident>, StorageError> {
        let limit = limit.min(1000) as i64;
        self.read(move |c| {
            let mut st = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM incidents WHERE id > ?1 ORDER BY id LIMIT ?2"
            ))?;
            let rows = st.query_map(params![after_id, limit], row_to_incident)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Incidents matching `q`, newest first.
    pub async fn incidents(&self, q: IncidentQuery) -> Result<Vec<Incident>, StorageError> {
        let limit = q.limit.clamp(1, 1000) as i64;
        self.read(move |c| {
            let mut st = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM incidents
                 WHERE (?1 IS NULL OR runner_id = ?1) AND (?2 IS NULL OR kind = ?2)
                   AND (?3 IS NULL OR id < ?3)
                 ORDER BY id DESC LIMIT ?4"
            ))?;
            let rows = st.query_map(
                params![q.runner_id, q.kind.map(|k| k.as_str()), q.before_id, limit],
                row_to_incident,
            )?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Adds the keys of `extra` that its evidence does not have yet to incident `id` (a
    /// non-object evidence is kept under `"original"`), and appends `reason_line` to its
    /// reason after `; why: ` (reasons stay one line) unless it already ends with it. `synchronous=FULL`. Answers the
    /// updated incident; `None` when there is no incident `id`.
    pub async fn attach_incident_evidence(
        &self,
        id: i64,
        extra: serde_json::Map<String, serde_json::Value>,
        reason_line: Option<String>,
    ) -> Result<Option<Incident>, StorageError> {
        self.control(move |tx| {
            let Some(mut inc) = tx
                .query_row(
                    &format!("SELECT {COLUMNS} FROM incidents WHERE id = ?1"),
                    [id],
                    row_to_incident,
                )
                .optional()?
            else {
                return Ok(None);
            };
            let ev = &mut inc.incident.evidence;
            if !ev.is_object() {
                let original = std::mem::take(ev);
                *ev = serde_json::json!({});
                if !original.is_null() {
                    ev["original"] = original;
                }
            }
            if let Some(obj) = ev.as_object_mut() {
                for (k, v) in extra {
                    obj.entry(k).or_insert(v);
                }
            }
            if let Some(line) = reason_line.filter(|l| !l.is_empty()) {
                if !inc.incident.reason.ends_with(&line) {
                    inc.incident.reason = format!("{}; why: {line}", inc.incident.reason);
                }
            }
            tx.execute(
                "UPDATE incidents SET evidence = ?1, reason = ?2 WHERE id = ?3",
                params![inc.incident.evidence.to_string(), inc.incident.reason, id],
            )?;
            Ok(Some(inc))
        })
        .await
    }

    /// One incident by id.
    pub async fn incident(&self, id: i64) -> Result<Option<Incident>, StorageError> {
        self.read(move |c| {
            Ok(c.query_row(
                &format!("SELECT {COLUMNS} FROM incidents WHERE id = ?1"),
                [id],
                row_to_incident,
            )
            .optional()?)
        })
        .await
    }
}

/// The incident insert, inside a control transaction; `None` when its idempotency key was
/// already recorded.
pub(crate) fn insert_incident_tx(
    tx: &rusqlite::Transaction<'_>,
    incident: NewIncident,
) -> Result<Option<Incident>, StorageError> {
    let n = tx.execute(
        "INSERT INTO incidents (kind, runner_id, tool_name, trace_id, span_id, reason, evidence, idempotency_key, at_unix_nano)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT(idempotency_key) DO NOTHING",
        params![
            incident.kind.as_str(),
            incident.runner_id,
            incident.tool_name,
            incident.trace_id.map(|t| t.0.to_vec()),
            incident.span_id.map(|s| s.0.to_vec()),
            incident.reason,
            incident.evidence.to_string(),
            incident.idempotency_key,
            incident.at_unix_nano as i64,
        ],
    )?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(Incident {
        id: tx.last_insert_rowid(),
        incident,
    }))
}
