//! The open-span ledger's durable copy: every span stallwatch has seen running and not yet
//! seen end (docs/design.md, "Open spans"), plus parents inferred from open children.
//!
//! The watchdog owns the in-memory index that the hot path reads; this table lets the
//! ledger survive a restart and lets the dashboard list open spans (`GET
//! /api/v1/open-spans`). Monotonic time cannot be persisted as an `Instant`, so each row
//! stores `CLOCK_MONOTONIC` nanoseconds together with the boot id
//! (`/proc/sys/kernel/random/boot_id`) they belong to (docs/design.md, Durability levels); wall-clock
//! times are kept for display only. The watchdog batches its writes: one control
//! transaction ([`Storage::ledger_apply`]) carries many upserts and removals.

use rusqlite::{params, Row};
use serde::{Deserialize, Serialize};

use crate::db::Storage;
use crate::error::StorageError;
use crate::model::{SpanId, SpanState, TraceId};

/// DDL for this module's tables (part of migration 1).
pub(crate) const SCHEMA: &str = "
CREATE TABLE open_spans (
    trace_id             BLOB NOT NULL,
    span_id              BLOB NOT NULL,
    parent_span_id       BLOB,
    name                 TEXT NOT NULL,
    tool_name            TEXT,
    runner_id            TEXT,
    service_name         TEXT NOT NULL,
    pid                  INTEGER,
    state                TEXT NOT NULL,
    boot_id              TEXT NOT NULL,
    first_seen_mono_ns   INTEGER NOT NULL,
    last_seen_mono_ns    INTEGER NOT NULL,
    refreshes            INTEGER NOT NULL,
    first_seen_unix_nano INTEGER NOT NULL,
    last_seen_unix_nano  INTEGER NOT NULL,
    sla_ms               INTEGER,
    sla_override_ms      INTEGER,
    PRIMARY KEY (trace_id, span_id)
) WITHOUT ROWID;
CREATE INDEX open_spans_runner ON open_spans(runner_id);
";

/// One row of the durable open-span ledger, as the watchdog writes and reloads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerRow {
    /// Trace id.
    pub trace_id: TraceId,
    /// Span id.
    pub span_id: SpanId,
    /// Parent span id; `None` for a root span.
    pub parent_span_id: Option<SpanId>,
    /// Span name.
    pub name: String,
    /// Tool name (`gen_ai.tool.name`, else the span name) when the span is a tool span.
    pub tool_name: Option<String>,
    /// Runner the span is bound to (`stallwatch.runner.id`, else `process.pid`), if any.
    pub runner_id: Option<String>,
    /// `service.name` of the span's resource.
    pub service_name: String,
    /// `process.pid` of the span's resource, if any.
    pub pid: Option<u32>,
    /// [`SpanState::Open`] (seen running) or [`SpanState::Inferred`] (only named as the
    /// parent of an open span). Never `Ended`: ended spans leave the ledger.
    pub state: SpanState,
    /// Boot id (`/proc/sys/kernel/random/boot_id`) the monotonic times belong to.
    pub boot_id: String,
    /// First arrival, `CLOCK_MONOTONIC` ns of boot `boot_id`.
    pub first_seen_mono_ns: u64,
    /// Latest arrival, `CLOCK_MONOTONIC` ns of boot `boot_id`.
    pub last_seen_mono_ns: u64,
    /// How many records refreshed the span after the one that opened it.
    pub refreshes: u32,
    /// First arrival, ns since the Unix epoch (stallwatch's wall clock; display only).
    pub first_seen_unix_nano: u64,
    /// Latest arrival, ns since the Unix epoch (display only).
    pub last_seen_unix_nano: u64,
    /// Effective SLA in ms when the span is a tool span.
    pub sla_ms: Option<u64>,
    /// The span's own `stallwatch.sla_ms` attribute, as sent (before bounds).
    pub sla_override_ms: Option<u64>,
}

/// One write of a batch given to [`Storage::ledger_apply`].
#[derive(Clone, Debug, PartialEq)]
pub enum LedgerWrite {
    /// Insert or replace the row keyed by (trace id, span id).
    Upsert(Box<LedgerRow>),
    /// Remove the row (the span ended, or its runner was stopped).
    Remove(TraceId, SpanId),
}

/// An open span as the dashboard lists it (`GET /api/v1/open-spans`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpenSpanRow {
    /// Trace id.
    pub trace_id: TraceId,
    /// Span id.
    pub span_id: SpanId,
    /// Parent span id, if any.
    pub parent_span_id: Option<SpanId>,
    /// Span name.
    pub name: String,
    /// Tool name when the span is a tool span.
    pub tool_name: Option<String>,
    /// Runner id when bound to a runner.
    pub runner_id: Option<String>,
    /// `service.name`.
    pub service_name: String,
    /// `open` or `inferred` (an inferred parent is shown, never acted on).
    pub state: SpanState,
    /// First arrival, ns since the Unix epoch.
    pub first_seen_unix_nano: u64,
    /// Latest arrival, ns since the Unix epoch.
    pub last_seen_unix_nano: u64,
    /// Effective SLA in ms (tool spans only).
    pub sla_ms: Option<u64>,
}

const COLUMNS: &str = "trace_id, span_id, parent_span_id, name, tool_name, runner_id, service_name, pid, state, boot_id, first_seen_mono_ns, last_seen_mono_ns, refreshes, first_seen_unix_nano, last_seen_unix_nano, sla_ms, sla_override_ms";

fn state_str(s: SpanState) -> &'static str {
    match s {
        SpanState::Open => "open",
        SpanState::Ended => "ended",
        SpanState::Inferred => "inferred",
    }
}

fn parse_state(s: &str) -> SpanState {
    match s {
        "inferred" => SpanState::Inferred,
        "ended" => SpanState::Ended,
        _ => SpanState::Open,
    }
}

fn blob_trace(b: Vec<u8>) -> rusqlite::Result<TraceId> {
    b.try_into().map(TraceId).map_err(|_| {
        rusqlite::Error::InvalidColumnType(0, "trace_id".into(), rusqlite::types::Type::Blob)
    })
}

fn blob_span(b: Vec<u8>, col: usize) -> rusqlite::Result<SpanId> {
    b.try_into().map(SpanId).map_err(|_| {
        rusqlite::Error::InvalidColumnType(col, "span_id".into(), rusqlite::types::Type::Blob)
    })
}

fn row_to_ledger(r: &Row<'_>) -> rusqlite::Result<LedgerRow> {
    let parent: Option<Vec<u8>> = r.get(2)?;
    let state: String = r.get(8)?;
    Ok(LedgerRow {
        trace_id: blob_trace(r.get(0)?)?,
        span_id: blob_span(r.get(1)?, 1)?,
        parent_span_id: parent.map(|b| blob_span(b, 2)).transpose()?,
        name: r.get(3)?,
        tool_name: r.get(4)?,
        runner_id: r.get(5)?,
        service_name: r.get(6)?,
        pid: r.get::<_, Option<i64>>(7)?.map(|p| p as u32),
        state: parse_state(&state),
        boot_id: r.get(9)?,
        first_seen_mono_ns: r.get::<_, i64>(10)? as u64,
        last_seen_mono_ns: r.get::<_, i64>(11)? as u64,
        refreshes: r.get::<_, i64>(12)? as u32,
        first_seen_unix_nano: r.get::<_, i64>(13)? as u64,
        last_seen_unix_nano: r.get::<_, i64>(14)? as u64,
        sla_ms: r.get::<_, Option<i64>>(15)?.map(|v| v as u64),
        sla_override_ms: r.get::<_, Option<i64>>(16)?.map(|v| v as u64),
    })
}

impl Storage {
    /// Applies a batch of ledger writes in ONE control transaction (`synchronous=FULL`), in
    /// order. An empty batch does nothing. The batch is shared (`Arc`) so a caller can keep
    /// it for a retry without copying it.
    ///
    /// Errors: [`StorageError::Sqlite`] (or a full disk, see [`StorageError::is_full`]); the
    /// whole batch is then not applied and the caller may retry it.
    pub async fn ledger_apply(
        &self,
        writes: std::sync::Arc<Vec<LedgerWrite>>,
    ) -> Result<(), StorageError> {
        if writes.is_empty() {
            return Ok(());
        }
        self.control(move |tx| {
            let mut up = tx.prepare_cached(&format!(
                "INSERT OR REPLACE INTO open_spans ({COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
            ))?;
            let mut del =
                tx.prepare_cached("DELETE FROM open_spans WHERE trace_id = ?1 AND span_id = ?2")?;
            for w in writes.iter() {
                match w {
                    LedgerWrite::Upsert(r) => {
                        up.execute(params![
                            r.trace_id.0.as_slice(),
                            r.span_id.0.as_slice(),
                            r.parent_span_id.as_ref().map(|p| p.0.to_vec()),
                            r.name,
                            r.tool_name,
                            r.runner_id,
                            r.service_name,
                            r.pid.map(i64::from),
                            state_str(r.state),
                            r.boot_id,
                            r.first_seen_mono_ns as i64,
                            r.last_seen_mono_ns as i64,
                            i64::from(r.refreshes),
                            r.first_seen_unix_nano as i64,
                            r.last_seen_unix_nano as i64,
                            r.sla_ms.map(|v| v as i64),
                            r.sla_override_ms.map(|v| v as i64),
                        ])?;
                    }
                    LedgerWrite::Remove(t, s) => {
                        del.execute(params![t.0.as_slice(), s.0.as_slice()])?;
                    }
                }
            }
            Ok(())
        })
        .await
    }

    /// Every row of the ledger, for the watchdog to rebuild its in-memory index at start.
    pub async fn ledger_load(&self) -> Result<Vec<LedgerRow>, StorageError> {
        self.read(|c| {
            let mut st = c.prepare(&format!("SELECT {COLUMNS} FROM open_spans"))?;
            let rows = st.query_map([], row_to_ledger)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// (trace id, span id) of every span the durable ledger holds as `open` (not inferred)
    /// for `runner_id`, in key order: the spans whose end the reaper writes when the runner
    /// ends, whatever ended it (issue 12 #1). With `pid`, the spans of another known process
    /// (`process.pid`) are left out: a new process of the same runner id may already export
    /// its own, and the old one's end is not theirs. Uses the `open_spans_runner` index.
    pub async fn ledger_runner_open(
        &self,
        runner_id: String,
        pid: Option<u32>,
    ) -> Result<Vec<(TraceId, SpanId)>, StorageError> {
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT trace_id, span_id FROM open_spans
                 WHERE runner_id = ?1 AND state = 'open'
                   AND (?2 IS NULL OR pid IS NULL OR pid = ?2)
                 ORDER BY trace_id, span_id",
            )?;
            let rows = st.query_map(params![runner_id, pid.map(i64::from)], |r| {
                Ok((blob_trace(r.get(0)?)?, blob_span(r.get(1)?, 1)?))
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Open and inferred spans for the dashboard, oldest first (by first arrival).
    pub async fn open_spans(&self) -> Result<Vec<OpenSpanRow>, StorageError> {
        let rows = self.ledger_load().await?;
        let mut out: Vec<OpenSpanRow> = rows
            .into_iter()
            .map(|r| OpenSpanRow {
                trace_id: r.trace_id,
                span_id: r.span_id,
                parent_span_id: r.parent_span_id,
                name: r.name,
                tool_name: r.tool_name,
                runner_id: r.runner_id,
                service_name: r.service_name,
                state: r.state,
                first_seen_unix_nano: r.first_seen_unix_nano,
                last_seen_unix_nano: r.last_seen_unix_nano,
                sla_ms: r.sla_ms,
            })
            .collect();
        out.sort_by_key(|r| (r.first_seen_unix_nano, r.trace_id, r.span_id));
        Ok(out)
    }
}
