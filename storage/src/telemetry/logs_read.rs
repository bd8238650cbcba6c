//! Log search (`GET /api/v1/logs`) and the live tail's reads.
//!
//! A search walks one or more index ranges newest first, ordered by
//! `(time_unix_nano DESC, id DESC)`, and merges them: the trace id (`logs_trace`) or the
//! runner id (`logs_runner_time`) drives when given; else the service drives through
//! `logs_service_time(service, severity, time)`, one range per severity number from the
//! minimum to 24; else a minimum severity drives through `logs_severity_time`; else the
//! time index `logs_time`. The time range is part of every range. Everything else (body
//! text, attribute `key=value`, the filters that did not drive) is checked on each row, so
//! a page costs index seeks plus the rows it shows, unless a rare body or attribute has to
//! be searched: then at most [`MAX_SCANNED_ROWS`] rows are examined and the page ends early
//! with a cursor to go on from (the same contract as a normal page end).
//!
//! A body query of 3+ characters (without a trace id, whose records are few) first asks
//! the body index (`log_body.rs`, FTS5 trigram, from the query's rare trigrams): when at
//! most [`super::MAX_INDEX_CANDIDATES`] rows may match, those rows drive instead (filtered and sorted in SQL, each checked
//! against its decoded body), so a rare text costs its candidates, not a scan. A common
//! text is found quickly by the walk above.
//!
//! The live tail reads rows by id (arrival order) after the last one it sent.

use std::sync::Arc;

use rusqlite::types::Value as SqlValue;
use rusqlite::{params_from_iter, Connection};

use super::encode::value_text;
use super::log_body::{candidate_query, from_candidates, generation_tables, indexable};
use super::read::snapshot;
use super::{StoredLog, DEFAULT_SEARCH_LIMIT, MAX_SEARCH_LIMIT};
use crate::error::StorageError;
use crate::model::{attr, AnyValue, LogRecord, Resource, Scope, SpanId, TraceId};

/// Rows one search examines at most before it answers with what it found and a cursor.
pub const MAX_SCANNED_ROWS: usize = 200_000;
/// Highest OTLP severity number (`FATAL4`, OTLP logs data model, SeverityNumber).
pub const MAX_SEVERITY: i32 = 24;

/// Log search (`GET /api/v1/logs`). Every filter is optional and they all must hold (AND).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogQuery {
    /// Resource `service.name`, exact.
    pub service: Option<String>,
    /// Minimum `severity_number` (1..=24, OTLP logs data model: 9 INFO, 13 WARN, 17 ERROR).
    pub min_severity: Option<i32>,
    /// Case-insensitive substring of the body (string bodies as they are; other bodies in
    /// their text form).
    pub body_contains: Option<String>,
    /// Attribute `key=value` pairs on the record or its resource, all required.
    pub attributes: Vec<(String, String)>,
    /// Records carrying this trace id.
    pub trace_id: Option<TraceId>,
    /// Records carrying this span id.
    pub span_id: Option<SpanId>,
    /// Resource `stallwatch.runner.id`.
    pub runner_id: Option<String>,
    /// Record time at or after, ns since the Unix epoch (`time_unix_nano`, else
    /// `observed_time_unix_nano`).
    pub from_unix_nano: Option<u64>,
    /// Record time before, ns since the Unix epoch.
    pub to_unix_nano: Option<u64>,
    /// Page size; 0 means [`DEFAULT_SEARCH_LIMIT`], more than [`MAX_SEARCH_LIMIT`] is capped.
    pub limit: usize,
    /// Opaque cursor from a previous page.
    pub cursor: Option<String>,
}

/// A stored log record with its row id (the live tail's event id).
#[derive(Clone, Debug, PartialEq)]
pub struct LogEntry {
    /// Row id: increases with arrival.
    pub id: i64,
    /// When stallwatch committed it, ns since the Unix epoch.
    pub received_unix_nano: u64,
    /// The record with its resource and scope.
    pub log: StoredLog,
}

/// A page of log search results, newest first.
#[derive(Clone, Debug, PartialEq)]
pub struct LogPage {
    /// The records.
    pub items: Vec<LogEntry>,
    /// Cursor for the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// The search's shape was wrong.
#[derive(Debug, thiserror::Error)]
pub enum LogQueryError {
    /// The cursor is not one this server issued.
    #[error("invalid cursor")]
    BadCursor,
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl From<rusqlite::Error> for LogQueryError {
    fn from(e: rusqlite::Error) -> Self {
        LogQueryError::Storage(StorageError::Sqlite(e))
    }
}

fn encode_cursor(time: i64, id: i64) -> String {
    format!("{:x}.{id:x}", time as u64)
}

fn decode_cursor(s: &str) -> Result<(i64, i64), LogQueryError> {
    let (t, i) = s.split_once('.').ok_or(LogQueryError::BadCursor)?;
    let t = u64::from_str_radix(t, 16).map_err(|_| LogQueryError::BadCursor)? as i64;
    let i = i64::from_str_radix(i, 16).map_err(|_| LogQueryError::BadCursor)?;
    if i <= 0 {
        return Err(LogQueryError::BadCursor);
    }
    Ok((t, i))
}

/// A decoded row, before the residual checks.
struct Row {
    id: i64,
    time: i64,
    received: i64,
    payload: Vec<u8>,
}

fn decode(payload: &[u8]) -> Result<StoredLog, StorageError> {
    let (resource, scope, record): (Resource, Scope, LogRecord) =
        postcard::from_bytes(payload).map_err(|e| StorageError::Corrupt(e.to_string()))?;
    Ok(StoredLog {
        record,
        resource: Arc::new(resource),
        scope: Arc::new(scope),
    })
}

/// The body's searchable text: a string body as it is, scalars in decimal, anything else
/// as its JSON form.
pub fn body_text(v: &AnyValue) -> String {
    match v {
        AnyValue::String(s) => s.clone(),
        AnyValue::Empty => String::new(),
        other => other
            .index_text()
            .unwrap_or_else(|| serde_json::to_string(other).unwrap_or_default()),
    }
}

/// The checks that need the decoded record (body, attributes).
struct Residual {
    body_lower: Option<String>,
    attributes: Vec<(String, String)>,
}

impl Residual {
    fn new(q: &LogQuery) -> Self {
        Self {
            body_lower: q.body_contains.as_ref().map(|b| b.to_lowercase()),
            attributes: q.attributes.clone(),
        }
    }

    fn needs_payload(&self) -> bool {
        self.body_lower.is_some() || !self.attributes.is_empty()
    }

    fn matches(&self, l: &StoredLog) -> bool {
        if let Some(b) = &self.body_lower {
            if !body_text(&l.record.body)
                .to_lowercase()
                .contains(b.as_str())
            {
                return false;
            }
        }
        self.attributes.iter().all(|(k, v)| {
            let on = |attrs: &[crate::model::KeyValue]| {
                attr(attrs, k).and_then(value_text).as_deref() == Some(v.as_str())
            };
            on(&l.record.attributes) || on(&l.resource.attributes)
        })
    }
}

/// Builds the `WHERE` clause shared by every driving range and the residual column
/// checks, with its parameters.
fn column_filters(q: &LogQuery, sql: &mut String, args: &mut Vec<SqlValue>) {
    if let Some(t) = q.trace_id {
        sql.push_str(" AND trace_id = ?");
        args.push(SqlValue::Blob(t.0.to_vec()));
    }
    if let Some(s) = q.span_id {
        sql.push_str(" AND span_id = ?");
        args.push(SqlValue::Blob(s.0.to_vec()));
    }
    if let Some(r) = &q.runner_id {
        sql.push_str(" AND runner_id = ?");
        args.push(SqlValue::Text(r.clone()));
    }
    if let Some(s) = &q.service {
        sql.push_str(" AND service = ?");
        args.push(SqlValue::Text(s.clone()));
    }
    if let Some(f) = q.from_unix_nano {
        sql.push_str(" AND time_unix_nano >= ?");
        args.push(SqlValue::Integer(f.min(i64::MAX as u64) as i64));
    }
    if let Some(t) = q.to_unix_nano {
        sql.push_str(" AND time_unix_nano < ?");
        args.push(SqlValue::Integer(t.min(i64::MAX as u64) as i64));
    }
}

/// Log search, newest first (by record time, then arrival).
pub(super) fn search_logs(conn: &Connection, q: &LogQuery) -> Result<LogPage, LogQueryError> {
    let limit = if q.limit == 0 {
        DEFAULT_SEARCH_LIMIT
    } else {
        q.limit.min(MAX_SEARCH_LIMIT)
    };
    let (ct, ci) = match q.cursor.as_deref() {
        Some(c) => decode_cursor(c)?,
        None => (i64::MAX, i64::MAX),
    };
    let min_sev = q.min_severity.unwrap_or(0).clamp(0, MAX_SEVERITY + 1);
    // the driving ranges: (index, extra equality on severity)
    let (index, per_severity) = if q.trace_id.is_some() {
        ("logs_trace", false)
    } else if q.runner_id.is_some() {
        ("logs_runner_time", false)
    } else if q.service.is_some() {
        ("logs_service_time", true)
    } else if min_sev > 0 {
        ("logs_severity_time", true)
    } else {
        ("logs_time", false)
    };
    let residual = Residual::new(q);
    let body_drives = residual
        .body_lower
        .as_deref()
        .filter(|b| q.trace_id.is_none() && indexable(b));
    if let Some(lower) = body_drives {
        let page = snapshot(conn, |c| {
            search_by_body(c, q, lower, &residual, limit, (ct, ci), min_sev)
        })?;
        if let Some(page) = page {
            return Ok(page);
        }
    }
    let payload_col = "payload";
    let mut stmts = Vec::new();
    let mut stmt_args = Vec::new();
    let severities: Vec<Option<i32>> = if per_severity {
        (min_sev..=MAX_SEVERITY).map(Some).collect()
    } else {
        vec![None]
    };
    for sev in &severities {
        let mut sql = format!(
            "SELECT id, time_unix_nano, received_unix_nano, {payload_col} FROM logs INDEXED BY {index}
             WHERE time_unix_nano <= ? AND (time_unix_nano, id) < (?, ?)"
        );
        let mut args = vec![
            SqlValue::Integer(ct),
            SqlValue::Integer(ct),
            SqlValue::Integer(ci),
        ];
        column_filters(q, &mut sql, &mut args);
        match sev {
            Some(s) => {
                sql.push_str(" AND severity = ?");
                args.push(SqlValue::Integer(i64::from(*s)));
            }
            None if min_sev > 0 => {
                sql.push_str(" AND severity >= ?");
                args.push(SqlValue::Integer(i64::from(min_sev)));
            }
            None => {}
        }
        sql.push_str(" ORDER BY time_unix_nano DESC, id DESC");
        stmts.push(conn.prepare_cached(&sql)?);
        stmt_args.push(args);
    }
    snapshot(conn, |_| {
        let mut rows = Vec::with_capacity(stmts.len());
        for (st, args) in stmts.iter_mut().zip(&stmt_args) {
            rows.push(st.query(params_from_iter(args.iter()))?);
        }
        let mut heads: Vec<Option<Row>> = Vec::with_capacity(rows.len());
        for r in rows.iter_mut() {
            heads.push(next_row(r)?);
        }
        let mut items = Vec::new();
        let mut scanned = 0usize;
        loop {
            // the newest head
            let best = heads
                .iter()
                .enumerate()
                .filter_map(|(i, h)| h.as_ref().map(|h| (h.time, h.id, i)))
                .max();
            let Some((time, id, i)) = best else {
                return Ok(LogPage {
                    items,
                    next_cursor: None,
                });
            };
            let row = heads[i].take();
            heads[i] = next_row(&mut rows[i])?;
            let Some(row) = row else { continue };
            scanned += 1;
            let log = decode(&row.payload)?;
            if !residual.needs_payload() || residual.matches(&log) {
                items.push(LogEntry {
                    id: row.id,
                    received_unix_nano: row.received as u64,
                    log,
                });
                if items.len() == limit {
                    let more = heads.iter().any(Option::is_some);
                    return Ok(LogPage {
                        items,
                        next_cursor: more.then(|| encode_cursor(time, id)),
                    });
                }
            }
            if scanned >= MAX_SCANNED_ROWS {
                return Ok(LogPage {
                    items,
                    next_cursor: Some(encode_cursor(time, id)),
                });
            }
        }
    })
}

/// A body search driven by the body index (`log_body.rs`) when the query text is rare:
/// the candidates' rows are filtered by the column filters and the cursor in SQL, sorted
/// newest first, and each is checked against its decoded body until the page is full.
/// `None` when there are more than [`super::MAX_INDEX_CANDIDATES`] candidates (the caller walks
/// the time-ordered indexes instead).
fn search_by_body(
    conn: &Connection,
    q: &LogQuery,
    lower: &str,
    residual: &Residual,
    limit: usize,
    (ct, ci): (i64, i64),
    min_sev: i32,
) -> Result<Option<LogPage>, LogQueryError> {
    let tables = generation_tables(conn)?;
    let Some(fts) = candidate_query(conn, &tables, lower)? else {
        return Ok(None);
    };
    let mut sql = format!(
        "SELECT id, time_unix_nano FROM {}
         AND time_unix_nano <= ? AND (time_unix_nano, id) < (?, ?)",
        from_candidates(&tables)
    );
    let mut args = vec![
        SqlValue::Text(fts),
        SqlValue::Integer(ct),
        SqlValue::Integer(ct),
        SqlValue::Integer(ci),
    ];
    column_filters(q, &mut sql, &mut args);
    if min_sev > 0 {
        sql.push_str(" AND severity >= ?");
        args.push(SqlValue::Integer(i64::from(min_sev)));
    }
    sql.push_str(" ORDER BY time_unix_nano DESC, id DESC");
    let hits = conn
        .prepare_cached(&sql)?
        .query_map(params_from_iter(args.iter()), |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut row =
        conn.prepare_cached("SELECT received_unix_nano, payload FROM logs WHERE id = ?1")?;
    let mut items = Vec::new();
    for (n, (id, time)) in hits.iter().enumerate() {
        let (received, payload): (i64, Vec<u8>) =
            row.query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let log = decode(&payload)?;
        if residual.matches(&log) {
            items.push(LogEntry {
                id: *id,
                received_unix_nano: received as u64,
                log,
            });
            if items.len() == limit {
                let more = n + 1 < hits.len();
                return Ok(Some(LogPage {
                    items,
                    next_cursor: more.then(|| encode_cursor(*time, *id)),
                }));
            }
        }
    }
    Ok(Some(LogPage {
        items,
        next_cursor: None,
    }))
}

fn next_row(rows: &mut rusqlite::Rows<'_>) -> Result<Option<Row>, rusqlite::Error> {
    match rows.next()? {
        None => Ok(None),
        Some(r) => Ok(Some(Row {
            id: r.get(0)?,
            time: r.get(1)?,
            received: r.get(2)?,
            payload: r.get(3)?,
        })),
    }
}

/// Records stored after row `after_id` that match `q` (its cursor and limit aside),
/// oldest first, at most `limit` (capped to [`MAX_SEARCH_LIMIT`]), examining at most
/// [`MAX_SCANNED_ROWS`] rows; also answers the last row id examined, from which the next
/// call goes on.
pub(super) fn logs_after(
    conn: &Connection,
    q: &LogQuery,
    after_id: i64,
    limit: usize,
) -> Result<(Vec<LogEntry>, i64), StorageError> {
    let limit = limit.clamp(1, MAX_SEARCH_LIMIT);
    let mut sql =
        "SELECT id, time_unix_nano, received_unix_nano, payload FROM logs WHERE id > ?".to_string();
    let mut args = vec![SqlValue::Integer(after_id)];
    column_filters(q, &mut sql, &mut args);
    if let Some(m) = q.min_severity.filter(|m| *m > 0) {
        sql.push_str(" AND severity >= ?");
        args.push(SqlValue::Integer(i64::from(m)));
    }
    // the id range bounds the scan; a filtered tail skips what does not match
    sql.push_str(" AND id <= ? ORDER BY id");
    args.push(SqlValue::Integer(
        after_id.saturating_add(MAX_SCANNED_ROWS as i64),
    ));
    let residual = Residual::new(q);
    snapshot(conn, |c| {
        let max_id: i64 = c.query_row("SELECT coalesce(max(id), 0) FROM logs", [], |r| r.get(0))?;
        let mut st = c.prepare_cached(&sql)?;
        let mut rows = st.query(params_from_iter(args.iter()))?;
        let mut out = Vec::new();
        let mut last = after_id;
        while let Some(row) = next_row(&mut rows)? {
            last = row.id;
            let log = decode(&row.payload)?;
            if !residual.needs_payload() || residual.matches(&log) {
                out.push(LogEntry {
                    id: row.id,
                    received_unix_nano: row.received as u64,
                    log,
                });
                if out.len() == limit {
                    return Ok((out, last));
                }
            }
        }
        // nothing more matched up to the newest row (or the scan bound)
        let upto = max_id.min(after_id.saturating_add(MAX_SCANNED_ROWS as i64));
        Ok((out, last.max(upto)))
    })
}

/// The newest log row id (0 when there is none): where a live tail without
/// `Last-Event-ID` starts.
pub(super) fn newest_log_id(conn: &Connection) -> Result<i64, StorageError> {
    Ok(conn.query_row("SELECT coalesce(max(id), 0) FROM logs", [], |r| r.get(0))?)
}
