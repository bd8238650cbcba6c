//! The open-span ledger's durable copy: every span stallwatch has seen running and not yet
//! seen end (docs/design.md, "Open spans"), plus parents inferred from open children.
//!
//! The watchdog owns the in-memory index that the hot path reads; this table lets the
//! ledger survive a restart and lets the dashboard list open spans (`GET
//! /api/v1/open-spans`, a page at a time: [`Storage::open_spans`]). It mirrors the watchdog's
//! index, so it holds at most `[watchdog] max_open_spans` rows; a file that holds more (a
//! lower bound, a file from before it) is cut down at start ([`Storage::ledger_trim`]). Monotonic time cannot be persisted as an `Instant`, so each row
//! stores `CLOCK_MONOTONIC` nanoseconds together with the boot id
//! (`/proc/sys/kernel/random/boot_id`) they belong to (docs/design.md, Durability levels); wall-clock
//! times are kept for display only. The watchdog batches its writes: one control
//! transaction ([`Storage::ledger_apply`]) carries many upserts and removals.

use rusqlite::{params, Row};
use serde::{Deserialize, Serialize};

use crate::db::Storage;
use crate::error::StorageError;
use crate::model::{SpanId, SpanState, TraceId};
use crate::telemetry::QueryError;

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

/// DDL of migration 10: the open-span list in pages, oldest first
/// ([`Storage::open_spans`]), walks an index in that order, for all runners or one, and
/// reads a page's rows only (`LIMIT`), not the whole ledger. The runner index is replaced
/// by one that also serves the runner's own lookups ([`Storage::ledger_runner_open`]).
/// Idempotent (`IF [NOT] EXISTS`): a file whose version number was taken back (the
/// migration tests do) migrates again.
pub(crate) const PAGING_SCHEMA: &str = "
DROP INDEX IF EXISTS open_spans_runner;
CREATE INDEX IF NOT EXISTS open_spans_age
    ON open_spans(first_seen_unix_nano, trace_id, span_id);
CREATE INDEX IF NOT EXISTS open_spans_runner_age
    ON open_spans(runner_id, first_seen_unix_nano, trace_id, span_id);
";

/// Default page size of [`Storage::open_spans`] (`GET /api/v1/open-spans`).
pub const DEFAULT_OPEN_SPANS_PAGE: usize = 100;
/// Largest page size of [`Storage::open_spans`].
pub const MAX_OPEN_SPANS_PAGE: usize = 1000;

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

/// One page request of [`Storage::open_spans`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpenSpanQuery {
    /// Only the spans bound to this runner.
    pub runner_id: Option<String>,
    /// Page size, 1..=[`MAX_OPEN_SPANS_PAGE`] (0 reads as 1, more as the maximum).
    pub limit: usize,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// One page of open spans, oldest first.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenSpanPage {
    /// The spans, by first arrival, then trace id, then span id.
    pub items: Vec<OpenSpanRow>,
    /// Cursor for the next page; `None` when this page is the last.
    pub next_cursor: Option<String>,
}

/// Encodes a page cursor: the key (first arrival, trace id, span id) of the last row shown,
/// as `<first_seen hex>.<trace id hex><span id hex>`.
fn encode_cursor(r: &OpenSpanRow) -> String {
    format!(
        "{:x}.{}{}",
        r.first_seen_unix_nano,
        r.trace_id.to_hex(),
        r.span_id.to_hex()
    )
}

fn decode_cursor(s: &str) -> Result<(i64, TraceId, SpanId), QueryError> {
    let (t, ids) = s.split_once('.').ok_or(QueryError::BadCursor)?;
    let first = u64::from_str_radix(t, 16).map_err(|_| QueryError::BadCursor)?;
    let first = i64::try_from(first).map_err(|_| QueryError::BadCursor)?;
    if ids.len() != 48 || !ids.is_char_boundary(32) {
        return Err(QueryError::BadCursor);
    }
    let trace = TraceId::from_hex(&ids[..32]).ok_or(QueryError::BadCursor)?;
    let span = SpanId::from_hex(&ids[32..]).ok_or(QueryError::BadCursor)?;
    Ok((first, trace, span))
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

    /// The rows of the ledger, for the watchdog to rebuild its in-memory index at start: at
    /// most `max_rows` (its bound, `max_open_spans`), those [`Storage::ledger_trim`] keeps.
    pub async fn ledger_load(&self, max_rows: usize) -> Result<Vec<LedgerRow>, StorageError> {
        let limit = i64::try_from(max_rows).unwrap_or(i64::MAX);
        self.read(move |c| {
            let mut st = c.prepare(&format!(
                "SELECT {COLUMNS} FROM open_spans ORDER BY {KEEP_ORDER} LIMIT ?1"
            ))?;
            let rows = st.query_map([limit], row_to_ledger)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Cuts the ledger down to `max_rows` rows (the watchdog's bound), in one control
    /// transaction; answers how many were removed (0 when it held no more). Kept first: the
    /// spans bound to a runner, open ones before inferred parents, the latest seen. Run at
    /// start, before [`Storage::ledger_load`]: a file may hold more rows than the bound
    /// (written before it, or under a larger `max_open_spans`).
    ///
    /// Errors: [`StorageError::Sqlite`] (nothing removed then).
    pub async fn ledger_trim(&self, max_rows: usize) -> Result<u64, StorageError> {
        let limit = i64::try_from(max_rows).unwrap_or(i64::MAX);
        self.control(move |tx| {
            let n: i64 = tx.query_row("SELECT count(*) FROM open_spans", [], |r| r.get(0))?;
            if n <= limit {
                return Ok(0);
            }
            let removed = tx.execute(
                &format!(
                    "DELETE FROM open_spans WHERE (trace_id, span_id) NOT IN
                     (SELECT trace_id, span_id FROM open_spans ORDER BY {KEEP_ORDER} LIMIT ?1)"
                ),
                [limit],
            )?;
            Ok(removed as u64)
        })
        .await
    }

    /// (trace id, span id) of every span the durable ledger holds as `open` (not inferred)
    /// for `runner_id`, in key order: the spans whose end the reaper writes when the runner
    /// ends, whatever ended it (issue 12 #1). With `pid`, the spans of another known process
    /// (`process.pid`) are left out: a new process of the same runner id may already export
    /// its own, and the old one's end is not theirs. Uses the `open_spans_runner_age` index.
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

    /// One page of open and inferred spans for the dashboard, oldest first: by first
    /// arrival, then trace id, then span id (a stable order: a span keeps its place while it
    /// is open, so paging never shows one twice or skips one that stayed open). Reads the
    /// page's rows only, along `open_spans_age` (or `open_spans_runner_age` for one runner),
    /// plus one to know whether a next page exists.
    ///
    /// Errors: [`QueryError::BadCursor`] for a cursor this server did not issue,
    /// [`QueryError::Storage`] when the read fails.
    pub async fn open_spans(&self, q: OpenSpanQuery) -> Result<OpenSpanPage, QueryError> {
        let after = q.cursor.as_deref().map(decode_cursor).transpose()?;
        let limit = q.limit.clamp(1, MAX_OPEN_SPANS_PAGE);
        let page = self
            .read(move |c| {
                let mut args: Vec<rusqlite::types::Value> = Vec::new();
                if let Some(r) = &q.runner_id {
                    args.push(r.clone().into());
                }
                if let Some((first, t, sp)) = after {
                    args.push(first.into());
                    args.push(t.0.to_vec().into());
                    args.push(sp.0.to_vec().into());
                }
                args.push((limit as i64 + 1).into());
                let sql = page_sql(q.runner_id.is_some(), after.is_some());
                let mut st = c.prepare_cached(&sql)?;
                let rows = st.query_map(rusqlite::params_from_iter(args), row_to_open_span)?;
                let mut items = rows.collect::<Result<Vec<_>, _>>()?;
                let more = items.len() > limit;
                items.truncate(limit);
                let next_cursor = if more {
                    items.last().map(encode_cursor)
                } else {
                    None
                };
                Ok(OpenSpanPage { items, next_cursor })
            })
            .await?;
        Ok(page)
    }
}

/// The query of one [`Storage::open_spans`] page: parameters the runner id (with
/// `runner`), the cursor's key (with `after`), then the row limit.
fn page_sql(runner: bool, after: bool) -> String {
    let mut sql = String::from(
        "SELECT trace_id, span_id, parent_span_id, name, tool_name, runner_id,
                service_name, state, first_seen_unix_nano, last_seen_unix_nano, sla_ms
         FROM open_spans WHERE 1",
    );
    if runner {
        sql.push_str(" AND runner_id = ?");
    }
    if after {
        sql.push_str(" AND (first_seen_unix_nano, trace_id, span_id) > (?, ?, ?)");
    }
    sql.push_str(" ORDER BY first_seen_unix_nano, trace_id, span_id LIMIT ?");
    sql
}

/// The order in which [`Storage::ledger_trim`] keeps rows and [`Storage::ledger_load`]
/// reads them: bound to a runner first, open before inferred, latest seen first.
const KEEP_ORDER: &str =
    "(runner_id IS NULL), (state <> 'open'), last_seen_unix_nano DESC, trace_id, span_id";

fn row_to_open_span(r: &Row<'_>) -> rusqlite::Result<OpenSpanRow> {
    let parent: Option<Vec<u8>> = r.get(2)?;
    let state: String = r.get(7)?;
    Ok(OpenSpanRow {
        trace_id: blob_trace(r.get(0)?)?,
        span_id: blob_span(r.get(1)?, 1)?,
        parent_span_id: parent.map(|b| blob_span(b, 2)).transpose()?,
        name: r.get(3)?,
        tool_name: r.get(4)?,
        runner_id: r.get(5)?,
        service_name: r.get(6)?,
        state: parse_state(&state),
        first_seen_unix_nano: r.get::<_, i64>(8)? as u64,
        last_seen_unix_nano: r.get::<_, i64>(9)? as u64,
        sla_ms: r.get::<_, Option<i64>>(10)?.map(|v| v as u64),
    })
}

#[cfg(test)]
mod tests;
