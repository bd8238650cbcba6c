//! The forwarding queue: stored telemetry read back in row order for `[forward]`, and the
//! per-signal cursor of what the upstream acknowledged.
//!
//! The telemetry tables ARE the durable queue (docs/design.md, Beyond one machine): nothing is
//! copied on the ingest path. `forward_cursor` holds, per signal, the last row id the
//! upstream acknowledged plus the counters of what was sent and dropped; it is written
//! through `Storage::control` (`synchronous=FULL`), so a restart resumes after the last
//! acknowledged row and an acknowledged row is never read for forwarding again. Reads go
//! through the read-only pool and never touch the telemetry writer.
//!
//! Row ids of `span_batches`, `logs` and `metric_points` only grow, even across a table
//! emptied by retention and a restart (`telemetry/writer/ids.rs`; before, ids restarted at
//! 1 in an emptied table), so a hole between the cursor and the first row found is rows
//! deleted by retention before they were forwarded: reported as `missing_rows` so the
//! forwarder can count them as dropped.

use rusqlite::{params, Connection, OptionalExtension};

use crate::db::Storage;
use crate::error::StorageError;
use crate::model::{
    LogBatch, LogRecord, MetricBatch, MetricPoint, Resource, ResourceLogs, ResourceMetrics,
    ResourceSpans, Scope, ScopeLogs, ScopeMetrics, ScopeSpans, Span, TraceBatch,
};
use crate::telemetry::encode::{decode_header, decode_index, decode_span, payload_bytes};
use crate::telemetry::{last_used_id, IdTable};

/// DDL of the cursor table (part of migration 1; also run with `IF NOT EXISTS` before the
/// first cursor read so a database created before this table gains it).
///
/// - `last_id`: the last row id of the signal's table acknowledged by the upstream (or
///   skipped as dropped); rows with a larger id are the backlog.
/// - `sent`: items (spans, log records, metric points) acknowledged by the upstream.
/// - `dropped`: items given up on: over `max_queue_bytes`, refused by the upstream
///   (permanent error or partial success), or undecodable.
/// - `lost_rows`: rows deleted by retention before they were forwarded (for traces one row
///   is one stored export request; its span count is gone with it).
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS forward_cursor (
    signal    TEXT PRIMARY KEY,
    last_id   INTEGER NOT NULL,
    dropped   INTEGER NOT NULL DEFAULT 0,
    sent      INTEGER NOT NULL DEFAULT 0,
    lost_rows INTEGER NOT NULL DEFAULT 0
);
";

/// A telemetry signal, one table each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    /// Spans (`span_batches`, one row per stored export request).
    Traces,
    /// Log records (`logs`, one row per record).
    Logs,
    /// Metric data points (`metric_points`, one row per point).
    Metrics,
}

impl Signal {
    /// Every signal, in forwarding order.
    pub const ALL: [Signal; 3] = [Signal::Traces, Signal::Logs, Signal::Metrics];

    /// Its position in [`Signal::ALL`], and so in the cursors [`Storage::forward_cursors`]
    /// answers: 0, 1, 2.
    pub fn index(self) -> usize {
        match self {
            Signal::Traces => 0,
            Signal::Logs => 1,
            Signal::Metrics => 2,
        }
    }

    /// The label value and `forward_cursor.signal`: `traces`, `logs`, `metrics`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Logs => "logs",
            Signal::Metrics => "metrics",
        }
    }

    fn table(&self) -> &'static str {
        match self {
            Signal::Traces => "span_batches",
            Signal::Logs => "logs",
            Signal::Metrics => "metric_points",
        }
    }

    /// SQL expression of the items in one row.
    fn items(&self) -> &'static str {
        match self {
            Signal::Traces => "span_count",
            _ => "1",
        }
    }
}

/// One signal's row of `forward_cursor`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardCursor {
    /// Last row id acknowledged (or skipped); the backlog is every row after it.
    pub last_id: i64,
    /// Items acknowledged by the upstream since forwarding began.
    pub sent: u64,
    /// Items dropped (queue cap, upstream refusal, undecodable).
    pub dropped: u64,
    /// Rows deleted by retention before they were forwarded.
    pub lost_rows: u64,
}

/// The un-forwarded rows of one signal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Rows after the cursor.
    pub rows: u64,
    /// Items in them (spans, records, points).
    pub items: u64,
    /// Their stored payload size, bytes (`length(payload)`).
    pub bytes: u64,
}

/// Rows read for forwarding, converted back to one export request.
#[derive(Clone, Debug, PartialEq)]
pub struct Chunk<T> {
    /// The last row id read; the cursor moves here once the request is acknowledged.
    pub last_id: i64,
    /// Rows read.
    pub rows: u64,
    /// Items in `data`.
    pub items: u64,
    /// Rows between the cursor and `last_id` that no longer exist (deleted by retention).
    pub missing_rows: u64,
    /// Items skipped because their stored form could not be decoded.
    pub undecodable: u64,
    /// The request, spans re-grouped by resource and scope.
    pub data: T,
}

/// Where to cut the backlog to shed `excess` bytes, oldest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trim {
    /// The new cursor (the last row given up on).
    pub last_id: i64,
    /// Rows given up on.
    pub rows: u64,
    /// Items in them.
    pub items: u64,
    /// Their payload bytes.
    pub bytes: u64,
}

/// Finds (or appends) the resource group equal to `resource`.
fn group<'a, G>(
    groups: &'a mut Vec<G>,
    resource: &Resource,
    get: impl Fn(&G) -> &Resource,
    make: impl FnOnce() -> G,
) -> &'a mut G {
    // Newest first: consecutive rows usually share their resource.
    let pos = groups.iter().rposition(|g| get(g) == resource);
    let i = match pos {
        Some(i) => i,
        None => {
            groups.push(make());
            groups.len() - 1
        }
    };
    &mut groups[i]
}

/// Adds one stored span batch row to `out`, re-grouped by resource and scope. Answers the
/// spans added and the spans skipped as undecodable.
fn add_span_row(out: &mut TraceBatch, idx: &[u8], stored: &[u8]) -> (u64, u64) {
    let Ok(payload) = payload_bytes(stored) else {
        return (0, 1);
    };
    let payload = payload.as_ref();
    let (Ok(index), Ok(header)) = (decode_index(idx), decode_header(payload)) else {
        return (0, 1);
    };
    let mut by_scope: Vec<Vec<Span>> = vec![Vec::new(); header.scopes.len()];
    let mut skipped = 0u64;
    for s in &index.spans {
        match (
            decode_span(payload, s.off, s.len),
            by_scope.get_mut(s.scope as usize),
        ) {
            (Ok(span), Some(v)) => v.push(span),
            _ => skipped += 1,
        }
    }
    let mut added = 0u64;
    for ((ri, scope), spans) in header.scopes.into_iter().zip(by_scope) {
        if spans.is_empty() {
            continue;
        }
        let Some(resource) = header.resources.get(ri as usize) else {
            skipped += spans.len() as u64;
            continue;
        };
        added += spans.len() as u64;
        let rs = group(
            &mut out.resource_spans,
            resource,
            |g| &g.resource,
            || ResourceSpans {
                resource: resource.clone(),
                scope_spans: Vec::new(),
            },
        );
        match rs.scope_spans.iter_mut().rev().find(|g| g.scope == scope) {
            Some(g) => g.spans.extend(spans),
            None => rs.scope_spans.push(ScopeSpans { scope, spans }),
        }
    }
    (added, skipped)
}

fn read_traces(
    conn: &Connection,
    after_id: i64,
    max_spans: usize,
) -> Result<Option<Chunk<TraceBatch>>, StorageError> {
    let mut st = conn.prepare_cached(
        "SELECT id, span_count, idx, payload FROM span_batches WHERE id > ?1 ORDER BY id",
    )?;
    let mut rows = st.query([after_id])?;
    let mut chunk = Chunk {
        last_id: after_id,
        rows: 0,
        items: 0,
        missing_rows: 0,
        undecodable: 0,
        data: TraceBatch::default(),
    };
    while let Some(r) = rows.next()? {
        let id: i64 = r.get(0)?;
        let count: i64 = r.get(1)?;
        if chunk.rows > 0 && chunk.items + count.max(0) as u64 > max_spans as u64 {
            break;
        }
        let idx = r.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
        let payload = r.get_ref(3)?.as_blob().map_err(rusqlite::Error::from)?;
        let (added, skipped) = add_span_row(&mut chunk.data, idx, payload);
        chunk.missing_rows += (id - chunk.last_id - 1).max(0) as u64;
        chunk.last_id = id;
        chunk.rows += 1;
        chunk.items += added;
        chunk.undecodable += skipped;
        if chunk.items >= max_spans as u64 {
            break;
        }
    }
    Ok((chunk.rows > 0).then_some(chunk))
}

/// Decoded `(Resource, Scope, T)` payloads of one-record-per-row tables.
type Rows<T> = Vec<(Resource, Scope, T)>;

/// Reads up to `max` rows of `(Resource, Scope, T)` payloads after `after_id`.
fn read_rows<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    table: &str,
    after_id: i64,
    max: usize,
) -> Result<(Chunk<()>, Rows<T>), StorageError> {
    let mut st = conn.prepare_cached(&format!(
        "SELECT id, payload FROM {table} WHERE id > ?1 ORDER BY id LIMIT ?2"
    ))?;
    let mut rows = st.query(params![after_id, max.max(1) as i64])?;
    let mut chunk = Chunk {
        last_id: after_id,
        rows: 0,
        items: 0,
        missing_rows: 0,
        undecodable: 0,
        data: (),
    };
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let id: i64 = r.get(0)?;
        let payload = r.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
        match postcard::from_bytes::<(Resource, Scope, T)>(payload) {
            Ok(v) => {
                out.push(v);
                chunk.items += 1;
            }
            Err(_) => chunk.undecodable += 1,
        }
        chunk.missing_rows += (id - chunk.last_id - 1).max(0) as u64;
        chunk.last_id = id;
        chunk.rows += 1;
    }
    Ok((chunk, out))
}

fn with_data<T>(c: Chunk<()>, data: T) -> Option<Chunk<T>> {
    (c.rows > 0).then_some(Chunk {
        last_id: c.last_id,
        rows: c.rows,
        items: c.items,
        missing_rows: c.missing_rows,
        undecodable: c.undecodable,
        data,
    })
}

fn read_logs(
    conn: &Connection,
    after_id: i64,
    max: usize,
) -> Result<Option<Chunk<LogBatch>>, StorageError> {
    let (chunk, rows) = read_rows::<LogRecord>(conn, "logs", after_id, max)?;
    let mut batch = LogBatch::default();
    for (resource, scope, record) in rows {
        let rl = group(
            &mut batch.resource_logs,
            &resource,
            |g| &g.resource,
            || ResourceLogs {
                resource: resource.clone(),
                scope_logs: Vec::new(),
            },
        );
        match rl.scope_logs.iter_mut().rev().find(|g| g.scope == scope) {
            Some(g) => g.log_records.push(record),
            None => rl.scope_logs.push(ScopeLogs {
                scope,
                log_records: vec![record],
            }),
        }
    }
    Ok(with_data(chunk, batch))
}

fn read_metrics(
    conn: &Connection,
    after_id: i64,
    max: usize,
) -> Result<Option<Chunk<MetricBatch>>, StorageError> {
    let (chunk, rows) = read_rows::<MetricPoint>(conn, "metric_points", after_id, max)?;
    let mut batch = MetricBatch::default();
    for (resource, scope, point) in rows {
        let rm = group(
            &mut batch.resource_metrics,
            &resource,
            |g| &g.resource,
            || ResourceMetrics {
                resource: resource.clone(),
                scope_metrics: Vec::new(),
            },
        );
        match rm.scope_metrics.iter_mut().rev().find(|g| g.scope == scope) {
            Some(g) => g.points.push(point),
            None => rm.scope_metrics.push(ScopeMetrics {
                scope,
                points: vec![point],
            }),
        }
    }
    Ok(with_data(chunk, batch))
}

impl Storage {
    /// The cursors of every signal, in [`Signal::ALL`] order. A signal seen for the first
    /// time starts just before its oldest stored row, so enabling `[forward]` on an existing
    /// database forwards what is stored and counts nothing as lost (written with
    /// `synchronous=FULL`).
    ///
    /// Errors: SQLite failures; [`StorageError::Task`] when the blocking task fails.
    pub async fn forward_cursors(&self) -> Result<[ForwardCursor; 3], StorageError> {
        self.control(|tx| {
            tx.execute_batch(SCHEMA)?;
            let mut out = [ForwardCursor::default(); 3];
            for (i, s) in Signal::ALL.iter().enumerate() {
                tx.execute(
                    &format!(
                        "INSERT OR IGNORE INTO forward_cursor (signal, last_id)
                         SELECT ?1, COALESCE(MIN(id), 1) - 1 FROM {}",
                        s.table()
                    ),
                    [s.as_str()],
                )?;
                out[i] = tx.query_row(
                    "SELECT last_id, sent, dropped, lost_rows FROM forward_cursor WHERE signal = ?1",
                    [s.as_str()],
                    |r| {
                        Ok(ForwardCursor {
                            last_id: r.get(0)?,
                            sent: r.get::<_, i64>(1)? as u64,
                            dropped: r.get::<_, i64>(2)? as u64,
                            lost_rows: r.get::<_, i64>(3)? as u64,
                        })
                    },
                )?;
            }
            Ok(out)
        })
        .await
    }

    /// Moves a signal's cursor from `from_id` to `to_id` and adds to its counters, in one
    /// `synchronous=FULL` transaction: call it right after the upstream acknowledged the
    /// rows up to `to_id` (or after giving them up). Moving backwards is allowed only to
    /// restart after the table was emptied (see [`Storage::forward_max_id`]).
    ///
    /// Errors: [`StorageError::Corrupt`] when the stored cursor is not at `from_id` (two
    /// forwarders on one database); SQLite failures.
    pub async fn forward_advance(
        &self,
        signal: Signal,
        from_id: i64,
        to_id: i64,
        delta: ForwardCursor,
    ) -> Result<(), StorageError> {
        self.control(move |tx| {
            let n = tx.execute(
                "UPDATE forward_cursor SET last_id = ?2, sent = sent + ?3,
                     dropped = dropped + ?4, lost_rows = lost_rows + ?5
                 WHERE signal = ?1 AND last_id = ?6",
                params![
                    signal.as_str(),
                    to_id,
                    delta.sent as i64,
                    delta.dropped as i64,
                    delta.lost_rows as i64,
                    from_id
                ],
            )?;
            if n == 1 {
                Ok(())
            } else {
                Err(StorageError::Corrupt(format!(
                    "forward cursor of {} is not at {from_id}",
                    signal.as_str()
                )))
            }
        })
        .await
    }

    /// Spans stored after row `after_id`, whole rows in id order until at least one row
    /// and at most `max_spans` spans (a single larger row is read alone), as one
    /// [`TraceBatch`] grouped by resource and scope; `None` when no row follows. Runs on
    /// the read-only pool.
    ///
    /// Errors: SQLite failures (an undecodable row is skipped and counted instead).
    pub async fn forward_read_traces(
        &self,
        after_id: i64,
        max_spans: usize,
    ) -> Result<Option<Chunk<TraceBatch>>, StorageError> {
        self.read(move |c| read_traces(c, after_id, max_spans))
            .await
    }

    /// Up to `max_records` log records stored after row `after_id`, in id order, grouped by
    /// resource and scope; `None` when none follows.
    ///
    /// Errors: SQLite failures.
    pub async fn forward_read_logs(
        &self,
        after_id: i64,
        max_records: usize,
    ) -> Result<Option<Chunk<LogBatch>>, StorageError> {
        self.read(move |c| read_logs(c, after_id, max_records))
            .await
    }

    /// Up to `max_points` metric points stored after row `after_id`, in id order, grouped
    /// by resource and scope; `None` when none follows.
    ///
    /// Errors: SQLite failures.
    pub async fn forward_read_metrics(
        &self,
        after_id: i64,
        max_points: usize,
    ) -> Result<Option<Chunk<MetricBatch>>, StorageError> {
        self.read(move |c| read_metrics(c, after_id, max_points))
            .await
    }

    /// The largest row id a signal's table has used (0 when it never held a row): its
    /// largest stored id, or the next id retention recorded when it deleted the newest rows
    /// (ids only grow, `telemetry/writer/ids.rs`). A value below the cursor means the table
    /// was emptied by an earlier version, which restarted ids at 1: the cursor must go
    /// back to 0.
    ///
    /// Errors: SQLite failures.
    pub async fn forward_max_id(&self, signal: Signal) -> Result<i64, StorageError> {
        let table = match signal {
            Signal::Traces => IdTable::SpanBatches,
            Signal::Logs => IdTable::Logs,
            Signal::Metrics => IdTable::MetricPoints,
        };
        self.read(move |c| Ok(last_used_id(c, table)?)).await
    }

    /// The backlog of a signal after row `after_id`.
    ///
    /// Errors: SQLite failures.
    pub async fn forward_backlog(
        &self,
        signal: Signal,
        after_id: i64,
    ) -> Result<Backlog, StorageError> {
        self.read(move |c| {
            let (rows, items, bytes): (i64, i64, i64) = c.query_row(
                &format!(
                    "SELECT COUNT(*), COALESCE(SUM({}), 0), COALESCE(SUM(length(payload)), 0)
                     FROM {} WHERE id > ?1",
                    signal.items(),
                    signal.table()
                ),
                [after_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            Ok(Backlog {
                rows: rows as u64,
                items: items as u64,
                bytes: bytes as u64,
            })
        })
        .await
    }

    /// Where to cut a signal's backlog after `after_id` to shed at least `excess_bytes`
    /// of payload, oldest rows first; `None` when there is nothing to shed. The caller
    /// records the cut with [`Storage::forward_advance`] (as dropped).
    ///
    /// Errors: SQLite failures.
    pub async fn forward_trim(
        &self,
        signal: Signal,
        after_id: i64,
        excess_bytes: u64,
    ) -> Result<Option<Trim>, StorageError> {
        self.read(move |c| {
            let mut st = c.prepare_cached(&format!(
                "SELECT id, {}, length(payload) FROM {} WHERE id > ?1 ORDER BY id",
                signal.items(),
                signal.table()
            ))?;
            let mut rows = st.query([after_id])?;
            let mut trim = Trim::default();
            while trim.bytes < excess_bytes {
                let Some(r) = rows.next()? else { break };
                trim.last_id = r.get(0)?;
                trim.items += r.get::<_, i64>(1)?.max(0) as u64;
                trim.bytes += r.get::<_, i64>(2)?.max(0) as u64;
                trim.rows += 1;
            }
            Ok((trim.rows > 0).then_some(trim))
        })
        .await
    }

    /// The stored cursor row of one signal, if forwarding ever ran (for tests and tools).
    ///
    /// Errors: SQLite failures.
    pub async fn forward_cursor(
        &self,
        signal: Signal,
    ) -> Result<Option<ForwardCursor>, StorageError> {
        self.read(move |c| {
            let exists: Option<i64> = c
                .query_row(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'forward_cursor'",
                    [],
                    |r| r.get(0),
                )
                .optional()?;
            if exists.is_none() {
                return Ok(None);
            }
            Ok(c.query_row(
                "SELECT last_id, sent, dropped, lost_rows FROM forward_cursor WHERE signal = ?1",
                [signal.as_str()],
                |r| {
                    Ok(ForwardCursor {
                        last_id: r.get(0)?,
                        sent: r.get::<_, i64>(1)? as u64,
                        dropped: r.get::<_, i64>(2)? as u64,
                        lost_rows: r.get::<_, i64>(3)? as u64,
                    })
                },
            )
            .optional()?)
        })
        .await
    }
}

#[cfg(test)]
mod tests;
