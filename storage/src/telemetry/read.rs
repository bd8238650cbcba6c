//! Trace reads: one trace (spans merged, ended copies winning, plus its logs), one span,
//! services, span names and metric points (trace search is in `trace_search.rs`).
//!
//! Every read runs in one read transaction (a consistent snapshot) on a pooled read-only
//! connection. Merging never trusts the writer alone: copies of a span found in the
//! trace's batches are folded with the same rules (an ended copy beats an open one, the
//! first ended copy in batch order wins), so a duplicate that slipped in still reads right.

use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use super::encode::{decode_header, decode_index, decode_span, payload_owned, BatchIndex};
use super::schema::{PAIR_SEP, TERM_SERVICE, TERM_SERVICE_SPAN, TERM_SPAN_NAME};
use super::traceidx::{fold, trace_batches};
use super::{
    NamePage, StoredLog, StoredMetricPoint, StoredSpan, TraceView, MAX_NAMES_PAGE, MAX_SEARCH_LIMIT,
};
use crate::error::StorageError;
use crate::model::{LogRecord, MetricPoint, Resource, Scope, SpanId, SpanState, TraceId};

/// Runs `f` inside one read transaction.
pub(super) fn snapshot<T, E: From<rusqlite::Error>>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, E>,
) -> Result<T, E> {
    conn.execute_batch("BEGIN")?;
    let out = f(conn);
    let _ = conn.execute_batch("COMMIT");
    out
}

pub(super) fn corrupt(e: String) -> StorageError {
    StorageError::Corrupt(e)
}

/// A batch read for a trace view.
struct FullBatch {
    received: u64,
    index: BatchIndex,
    payload: Vec<u8>,
    resources: Vec<Arc<Resource>>,
    scopes: Vec<(usize, Arc<Scope>)>,
}

fn load_full_batch(conn: &Connection, id: i64) -> Result<Option<FullBatch>, StorageError> {
    let row: Option<(i64, Vec<u8>, Vec<u8>)> = conn
        .prepare_cached("SELECT received_unix_nano, idx, payload FROM span_batches WHERE id = ?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((received, idx, payload)) = row else {
        return Ok(None);
    };
    let index = decode_index(&idx).map_err(corrupt)?;
    let payload = payload_owned(payload).map_err(corrupt)?;
    let header = decode_header(&payload).map_err(corrupt)?;
    let resources: Vec<Arc<Resource>> = header.resources.into_iter().map(Arc::new).collect();
    let scopes = header
        .scopes
        .into_iter()
        .map(|(r, s)| (r as usize, Arc::new(s)))
        .collect();
    Ok(Some(FullBatch {
        received: received as u64,
        index,
        payload,
        resources,
        scopes,
    }))
}

/// Loads the merged spans of a trace (optionally only `only`).
fn merged_spans(
    conn: &Connection,
    trace_id: TraceId,
    only: Option<SpanId>,
) -> Result<Vec<StoredSpan>, StorageError> {
    let ids = trace_batches(conn, &trace_id.0)?;
    let mut batches = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(b) = load_full_batch(conn, id)? {
            batches.push(b);
        }
    }
    let winners = fold(&trace_id.0, batches.iter().map(|b| &b.index));
    let mut out = Vec::with_capacity(winners.len());
    for (sid, (bi, pi)) in winners {
        if only.is_some_and(|o| o.0 != sid) {
            continue;
        }
        let b = &batches[bi];
        let s = &b.index.spans[pi];
        let span = decode_span(&b.payload, s.off, s.len).map_err(corrupt)?;
        let (ri, scope) = b
            .scopes
            .get(s.scope as usize)
            .cloned()
            .ok_or_else(|| corrupt("span refers to a missing scope".into()))?;
        let resource = b
            .resources
            .get(ri)
            .cloned()
            .ok_or_else(|| corrupt("scope refers to a missing resource".into()))?;
        out.push(StoredSpan {
            state: if span.is_ended() {
                SpanState::Ended
            } else {
                SpanState::Open
            },
            span,
            resource,
            scope,
            received_unix_nano: b.received,
        });
    }
    out.sort_by(|a, b| {
        (a.span.start_time_unix_nano, a.span.span_id)
            .cmp(&(b.span.start_time_unix_nano, b.span.span_id))
    });
    Ok(out)
}

/// Log records of a trace, ordered by time.
fn trace_logs(conn: &Connection, trace_id: TraceId) -> Result<Vec<StoredLog>, StorageError> {
    let mut st = conn.prepare_cached(
        "SELECT payload FROM logs WHERE trace_id = ?1 ORDER BY time_unix_nano, id",
    )?;
    let rows = st.query_map([&trace_id.0[..]], |r| r.get::<_, Vec<u8>>(0))?;
    let mut out = Vec::new();
    for row in rows {
        let (resource, scope, record): (Resource, Scope, LogRecord) =
            postcard::from_bytes(&row?).map_err(|e| corrupt(e.to_string()))?;
        out.push(StoredLog {
            record,
            resource: Arc::new(resource),
            scope: Arc::new(scope),
        });
    }
    Ok(out)
}

/// One trace with its logs; `None` when neither is stored.
pub(super) fn load_trace(
    conn: &Connection,
    trace_id: TraceId,
) -> Result<Option<TraceView>, StorageError> {
    snapshot(conn, |c| {
        let spans = merged_spans(c, trace_id, None)?;
        let logs = trace_logs(c, trace_id)?;
        if spans.is_empty() && logs.is_empty() {
            return Ok(None);
        }
        Ok(Some(TraceView {
            trace_id,
            spans,
            logs,
        }))
    })
}

/// One merged span.
pub(super) fn load_span(
    conn: &Connection,
    trace_id: TraceId,
    span_id: SpanId,
) -> Result<Option<StoredSpan>, StorageError> {
    snapshot(conn, |c| {
        Ok(merged_spans(c, trace_id, Some(span_id))?.into_iter().next())
    })
}

/// A page of distinct values of a term key, sorted, each after `after` (exclusive) when
/// given, at most `limit` (held to 1..=[`MAX_NAMES_PAGE`]): along the `(key, value)` index,
/// the page's rows only plus one to know whether more follow.
fn term_values(
    conn: &Connection,
    key: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<NamePage, StorageError> {
    term_range(conn, key, "", after.map(str::to_string), None, limit)
}

/// The values of `key` in `[lo, hi)` (no upper end without `hi`), after `after` (a full
/// value, exclusive) when given, each answered without its first `lo.len()` bytes.
fn term_range(
    conn: &Connection,
    key: &str,
    lo: &str,
    after: Option<String>,
    hi: Option<&str>,
    limit: usize,
) -> Result<NamePage, StorageError> {
    let limit = limit.clamp(1, MAX_NAMES_PAGE);
    let mut sql = String::from("SELECT value FROM terms WHERE key = ?");
    let mut args: Vec<rusqlite::types::Value> = vec![key.to_string().into()];
    match after {
        Some(a) => {
            sql.push_str(" AND value > ?");
            args.push(a.into());
        }
        None => {
            sql.push_str(" AND value >= ?");
            args.push(lo.to_string().into());
        }
    }
    if let Some(hi) = hi {
        sql.push_str(" AND value < ?");
        args.push(hi.to_string().into());
    }
    sql.push_str(" ORDER BY value LIMIT ?");
    args.push((limit as i64 + 1).into());
    let mut st = conn.prepare_cached(&sql)?;
    let rows = st
        .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    let more = rows.len() > limit;
    let items: Vec<String> = rows
        .into_iter()
        .take(limit)
        .map(|v| v.get(lo.len()..).unwrap_or_default().to_string())
        .collect();
    let next_cursor = if more { items.last().cloned() } else { None };
    Ok(NamePage { items, next_cursor })
}

/// Services seen (`service.name` terms), a page at a time.
pub(super) fn services(
    conn: &Connection,
    after: Option<&str>,
    limit: usize,
) -> Result<NamePage, StorageError> {
    term_values(conn, TERM_SERVICE, after, limit)
}

/// Span names seen, optionally of one service, a page at a time.
pub(super) fn span_names(
    conn: &Connection,
    service: Option<&str>,
    after: Option<&str>,
    limit: usize,
) -> Result<NamePage, StorageError> {
    let Some(service) = service else {
        return term_values(conn, TERM_SPAN_NAME, after, limit);
    };
    let lo = format!("{service}{PAIR_SEP}");
    let hi = format!("{service}{}", char::from(PAIR_SEP as u8 + 1));
    let after = after.map(|a| format!("{lo}{a}"));
    term_range(conn, TERM_SERVICE_SPAN, &lo, after, Some(&hi), limit)
}

/// Newest metric points, optionally of one metric name.
pub(super) fn metric_points(
    conn: &Connection,
    name: Option<&str>,
    limit: usize,
) -> Result<Vec<StoredMetricPoint>, StorageError> {
    let limit = limit.clamp(1, MAX_SEARCH_LIMIT) as i64;
    let mut st = conn.prepare_cached(
        "SELECT received_unix_nano, payload FROM metric_points
         WHERE ?1 IS NULL OR name = ?1 ORDER BY id DESC LIMIT ?2",
    )?;
    let rows = st.query_map(params![name, limit], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (received, payload) = row?;
        let (resource, scope, point): (Resource, Scope, MetricPoint) =
            postcard::from_bytes(&payload).map_err(|e| corrupt(e.to_string()))?;
        out.push(StoredMetricPoint {
            point,
            resource: Arc::new(resource),
            scope: Arc::new(scope),
            received_unix_nano: received as u64,
        });
    }
    Ok(out)
}
