//! Telemetry: the tables for spans, logs and metric points, the group-commit writer
//! thread, and the trace read queries.
//!
//! Layout, chosen for 170k spans/s durable on two cores: an export request of spans is
//! stored as ONE `span_batches` row, or one per ~1 MiB chunk of a large request, all in one
//! transaction (a compact per-span index plus a postcard payload),
//! each trace has ONE summary row in `traces` (counts, root, and its known-span set for
//! deduplication), and search goes through per-batch term postings (`terms`,
//! `batch_terms`) for service, span name, tool name, status ERROR and the indexed
//! attribute keys. Nothing is stored or indexed per span row. Logs are one row per record
//! (indexed by trace id), metric points one row per data point.
//!
//! - `encode`: caller-side encoding (CPU work stays off the writer thread);
//! - `writer`: the writer thread, bounded queue, group commit, deduplication, size cap;
//! - `retention`: by size at once when a commit passes the high watermark (oldest first,
//!   freed pages reused), by age in the periodic pass, then `incremental_vacuum`;
//! - `read`: trace view, span, services, span names, metric points;
//! - `trace_search`: trace search over the term postings;
//! - `logs_read`: log search and the live tail's reads;
//! - `log_body`: the log body substring index (FTS5 trigram, in generations dropped whole)
//!   and its back-fill;
//! - `metrics_read`: the instrument list and points per series per step;
//! - `metrics_hist`: histogram points as distributions, and their quantile estimates;
//! - `stats`: counters for `/metrics`.

mod bloom;
mod checkpoint;
pub(crate) mod encode;
mod index_blob;
mod log_body;
mod logs_read;
mod metrics_hist;
mod metrics_read;
#[cfg(test)]
mod metrics_read_v3;
mod read;
mod retention;
mod schema;
mod span_body;
mod stats;
mod trace_search;
mod traceidx;
mod writer;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::db::Storage;
use crate::error::{StorageError, WriteError};
use crate::model::{
    LogBatch, LogRecord, MetricBatch, MetricPoint, Resource, ResourceSpansRef, Scope, Span, SpanId,
    SpanState, TraceBatch, TraceId,
};

pub(crate) use log_body::{backfill_log_bodies, GENERATIONS_SCHEMA as LOG_BODY_GENERATIONS_SCHEMA};
pub use log_body::{MAX_INDEX_CANDIDATES, MIN_INDEXED_QUERY_CHARS};
pub use logs_read::{
    body_text, LogEntry, LogPage, LogQuery, LogQueryError, MAX_SCANNED_ROWS, MAX_SEVERITY,
};
pub use metrics_read::{
    Instrument, InstrumentPage, MetricSeries, PointsQuery, StepValue, MAX_STEPS,
};
pub use schema::INDEXED_ATTRIBUTE_KEYS;
pub(crate) use schema::{
    LOGS_BODY_SCHEMA, PAYLOAD_FRAMES_SCHEMA, POSTINGS_SCHEMA, QUERY_INDEX_SCHEMA, READBACK_SCHEMA,
    SCHEMA, SERIES_INDEX_SCHEMA, TRACE_BLOCKS_SCHEMA, TRACE_RUNS_SCHEMA,
};
pub use stats::{RefusedReason, TelemetryStats, COMMIT_BUCKETS_SECONDS};
pub(crate) use writer::ids::{last_used_id, IdTable};
pub use writer::Degraded;
pub(crate) use writer::TelemetryWriter;

/// Search page size when [`TraceQuery::limit`] is 0.
pub const DEFAULT_SEARCH_LIMIT: usize = 20;
/// Largest search page (and metric point list) size; larger limits are capped.
pub const MAX_SEARCH_LIMIT: usize = 1000;

/// A span as read back: the record, its resource and scope, and its merged state.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredSpan {
    /// The span (the ended copy when one exists, docs/design.md: "the first ended copy wins").
    pub span: Span,
    /// Its resource.
    pub resource: Arc<Resource>,
    /// Its scope.
    pub scope: Arc<Scope>,
    /// `Open` while only running snapshots were seen, else `Ended`.
    pub state: SpanState,
    /// When stallwatch committed the copy shown, ns since the Unix epoch.
    pub received_unix_nano: u64,
}

/// A log record as read back.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredLog {
    /// The record.
    pub record: LogRecord,
    /// Its resource.
    pub resource: Arc<Resource>,
    /// Its scope.
    pub scope: Arc<Scope>,
}

/// One trace: its spans (deduplicated, ended copies winning) and its logs.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceView {
    /// The trace.
    pub trace_id: TraceId,
    /// Spans ordered by start time.
    pub spans: Vec<StoredSpan>,
    /// Log records carrying this trace id, ordered by time.
    pub logs: Vec<StoredLog>,
}

/// Span status filter for search.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusFilter {
    /// Status UNSET.
    Unset,
    /// Status OK.
    Ok,
    /// Status ERROR.
    Error,
}

/// Trace search (`GET /api/v1/traces`). Every filter is optional; a trace matches when one
/// of its spans matches all span-level filters. Newest first: ordered by the batch (export
/// request) in which a matching span was most recently stored, then by trace id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceQuery {
    /// `service.name` of the matching span's resource.
    pub service: Option<String>,
    /// Exact span name.
    pub span_name: Option<String>,
    /// `gen_ai.tool.name`.
    pub tool_name: Option<String>,
    /// Span status.
    pub status: Option<StatusFilter>,
    /// Minimum span duration, ns.
    pub min_duration_ns: Option<u64>,
    /// Attribute `key=value` on the span or its resource (indexed for `gen_ai.tool.name`,
    /// `service.name`, `error.type`, `process.pid`, `stallwatch.runner.id`; other keys need
    /// a time range).
    pub attribute: Option<(String, String)>,
    /// Further attribute `key=value` filters, each like [`TraceQuery::attribute`]; one span
    /// must carry all of them (AND).
    pub attributes: Vec<(String, String)>,
    /// Maximum span duration, ns (inclusive; open spans never match a duration filter).
    pub max_duration_ns: Option<u64>,
    /// Span start at or after, ns since the Unix epoch.
    pub start_min_unix_nano: Option<u64>,
    /// Span start before, ns since the Unix epoch.
    pub start_max_unix_nano: Option<u64>,
    /// Page size (1..=1000); 0 means [`DEFAULT_SEARCH_LIMIT`], more than
    /// [`MAX_SEARCH_LIMIT`] is capped.
    pub limit: usize,
    /// Opaque cursor from a previous page.
    pub cursor: Option<String>,
}

/// One row of a trace search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceSummary {
    /// Trace id.
    pub trace_id: TraceId,
    /// Service of the root span (or of the earliest span when the root is missing).
    pub root_service: String,
    /// Name of the root span (or of the earliest span).
    pub root_name: String,
    /// Earliest span start, ns since the Unix epoch.
    pub start_time_unix_nano: u64,
    /// Latest span end, ns since the Unix epoch (0 when every span is open).
    pub end_time_unix_nano: u64,
    /// Distinct spans.
    pub span_count: u64,
    /// Spans with status ERROR.
    pub error_count: u64,
    /// Spans still open.
    pub open_count: u64,
}

/// A page of search results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TracePage {
    /// The rows.
    pub items: Vec<TraceSummary>,
    /// Cursor for the next page; `None` at the end.
    pub next_cursor: Option<String>,
    /// Duration percentiles per operation (service, span name) over the ended spans of the
    /// traces in `items`, by span count descending then name.
    pub operations: Vec<OperationStats>,
}

/// Duration statistics of one operation over a search page (nearest-rank percentiles:
/// the smallest duration with at least p% of the durations at or below it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperationStats {
    /// Resource `service.name`.
    pub service: String,
    /// Span name.
    pub span_name: String,
    /// Ended spans counted.
    pub count: u64,
    /// Median duration, ns.
    pub p50_ns: u64,
    /// 90th percentile duration, ns.
    pub p90_ns: u64,
    /// 99th percentile duration, ns.
    pub p99_ns: u64,
    /// Longest duration, ns.
    pub max_ns: u64,
}

impl OperationStats {
    /// Nearest-rank percentile `p` (0..=100) of ascending `sorted` (empty → 0).
    pub fn nearest_rank(sorted: &[u64], p: u64) -> u64 {
        if sorted.is_empty() {
            return 0;
        }
        let n = sorted.len() as u64;
        let rank = (p * n).div_ceil(100).clamp(1, n);
        sorted[(rank - 1) as usize]
    }
}

/// Largest (and default) page of [`Storage::services`] and [`Storage::span_names`]: the
/// distinct names grow with what exporters send (a name per span is possible), so they are
/// listed a page at a time like every other list.
pub const MAX_NAMES_PAGE: usize = 1000;

/// One page of distinct names, sorted.
#[derive(Clone, Debug, PartialEq)]
pub struct NamePage {
    /// The names.
    pub items: Vec<String>,
    /// The last name of this page, to pass as `after` for the next one; `None` on the last.
    pub next_cursor: Option<String>,
}

/// Errors of a search query's shape.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The cursor is not one this server issued.
    #[error("invalid cursor")]
    BadCursor,
    /// A non-indexed attribute key was searched without a time range.
    #[error("attribute key {0:?} is not indexed: give start_min and start_max")]
    NeedsTimeRange(String),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// One part of a protobuf trace export (a run of its spans in wire order) encoded on the
/// thread that decoded it, for [`TraceChunk::join`].
#[derive(Debug)]
pub struct TracePart(encode::EncodedPart);

impl TracePart {
    /// Encodes the borrowed spans of one part: their bodies compressed as one zstd frame,
    /// their index entries and terms. `continues_scope`: the part's first scope is the
    /// last scope of the part before it (the export was cut inside that scope).
    ///
    /// Errors: [`WriteError::Failed`] when postcard cannot encode a span (a bug).
    pub fn encode_borrowed(
        parts: &[ResourceSpansRef<'_>],
        continues_scope: bool,
    ) -> Result<Self, WriteError> {
        encode::encode_part(&encode::borrowed_groups(parts), continues_scope)
            .map(TracePart)
            .map_err(WriteError::Failed)
    }
}

/// A slice of a trace export encoded for the writer on the caller's side (postcard payload
/// and per-span index, in-chunk duplicates already cut): what [`Storage::write_trace_chunks`]
/// stores as one `span_batches` row. Holding these instead of the records keeps a large
/// export's memory near its stored size.
#[derive(Debug)]
pub struct TraceChunk(encode::PreparedTraces);

impl TraceChunk {
    /// Encodes `batch` (a slice of one export request).
    ///
    /// Errors: [`WriteError::Failed`] when postcard cannot encode it (a bug).
    pub fn encode(batch: &TraceBatch) -> Result<Self, WriteError> {
        encode::prepare_traces(batch)
            .map(TraceChunk)
            .map_err(WriteError::Failed)
    }

    /// Encodes borrowed spans (a slice of one protobuf export request, its strings still
    /// in the request body): the same stored bytes as [`TraceChunk::encode`] of their
    /// owned twins, without copying each string into a record first (issue 16).
    ///
    /// Errors: [`WriteError::Failed`] when postcard cannot encode it (a bug).
    pub fn encode_borrowed(parts: &[ResourceSpansRef<'_>]) -> Result<Self, WriteError> {
        encode::prepare_borrowed(parts)
            .map(TraceChunk)
            .map_err(WriteError::Failed)
    }

    /// Joins the parts of one protobuf export, each encoded where it was decoded
    /// ([`TracePart::encode_borrowed`]), in wire order, into the chunk
    /// [`TraceChunk::encode_borrowed`] makes of the whole export: the same index and raw
    /// payload, the payload stored as one zstd frame per part after the header's. `shape`
    /// gives the whole export's resources and scopes in wire order (its spans are not
    /// read). A part's encoding runs on its own core, so with one export in flight the
    /// encoding no longer waits for the whole decode (issue 16).
    ///
    /// Answers `None` when two spans of the export share (trace id, span id): encode the
    /// whole export instead, which keeps one copy of each.
    ///
    /// Errors: [`WriteError::Failed`] when the parts do not fit `shape` or postcard
    /// cannot encode its header (bugs).
    pub fn join(shape: &TraceBatch, parts: Vec<TracePart>) -> Result<Option<Self>, WriteError> {
        let resources: Vec<&Resource> =
            shape.resource_spans.iter().map(|rs| &rs.resource).collect();
        let scopes: Vec<(u32, &Scope)> = shape
            .resource_spans
            .iter()
            .enumerate()
            .flat_map(|(ri, rs)| rs.scope_spans.iter().map(move |ss| (ri as u32, &ss.scope)))
            .collect();
        encode::join_parts(
            &resources,
            &scopes,
            parts.into_iter().map(|p| p.0).collect(),
        )
        .map(|p| p.map(TraceChunk))
        .map_err(WriteError::Failed)
    }

    /// What two encodings of the same spans share byte for byte whatever their zstd
    /// frames: the raw payload (decompressed) and the stored index. The collector's tests
    /// hold an export encoded in parts ([`TraceChunk::join`]) to one whole encoding with it.
    ///
    /// Errors: [`WriteError::Failed`] when the payload does not decompress (a bug).
    pub fn content(&self) -> Result<(Vec<u8>, &[u8]), WriteError> {
        let raw = encode::payload_bytes(&self.0.payload).map_err(WriteError::Failed)?;
        Ok((raw.into_owned(), &self.0.index_blob))
    }

    /// Zstd frames of the stored payload: 1 for a whole encoding, 1 + the parts for a
    /// joined one ([`TraceChunk::join`]).
    pub fn frames(&self) -> usize {
        encode::payload_frames(&self.0.payload)
    }

    /// Bytes the chunk holds (payload plus its index), bytes.
    pub fn bytes(&self) -> usize {
        self.0.bytes()
    }

    /// Spans in the chunk after in-chunk deduplication.
    pub fn span_count(&self) -> usize {
        self.0.index.spans.len()
    }
}

/// A metric data point as read back.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredMetricPoint {
    /// The point (NaN and the infinities survive: stored inside the payload).
    pub point: MetricPoint,
    /// Its resource.
    pub resource: Arc<Resource>,
    /// Its scope.
    pub scope: Arc<Scope>,
    /// When stallwatch committed it, ns since the Unix epoch.
    pub received_unix_nano: u64,
}

/// What one retention pass removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionReport {
    /// Span batches (stored export requests) deleted.
    pub batches_deleted: u64,
    /// Span copies in them.
    pub spans_deleted: u64,
    /// Traces left with no span and deleted. Counted by a retention pass
    /// ([`Storage::run_retention`] and the periodic one); the size step that a commit past
    /// the high watermark starts leaves it 0, as counting reads the whole trace index.
    pub traces_deleted: u64,
    /// Log records deleted.
    pub logs_deleted: u64,
    /// Metric points deleted.
    pub points_deleted: u64,
    /// Database bytes in use (pages minus free pages) before the pass.
    pub bytes_before: u64,
    /// Database bytes in use after the pass and `incremental_vacuum`.
    pub bytes_after: u64,
}

impl Storage {
    /// Queues a trace export and resolves once it is committed. Duplicated
    /// (trace id, span id) pairs are stored once: an ended copy wins over open ones, the
    /// first ended copy wins over later ones, and a later open copy is dropped; re-sending a
    /// request stores nothing new (docs/design.md, Durability and limits; OTLP/JSON case choices).
    /// The encoding runs on the caller's task; the writer thread only runs SQL.
    ///
    /// Errors: [`WriteError::QueueFull`] at once when the queue holds
    /// `queue_capacity` requests, [`WriteError::Full`] when the request does not fit in
    /// telemetry's share of `max_db_bytes` ([`crate::config::telemetry_budget_bytes`]) even
    /// after the oldest telemetry was deleted for it, or the disk is full,
    /// [`WriteError::AtCap`] when its commit met that share's page limit for a moment (the
    /// oldest were deleted to make room), [`WriteError::Closed`] after [`Storage::shutdown`]
    /// (all retryable);
    /// [`WriteError::Failed`] for other commit failures.
    pub async fn write_traces(&self, batch: Arc<TraceBatch>) -> Result<(), WriteError> {
        let w = &self.inner.telemetry;
        w.precheck()?;
        if let Some(why) = self.ingest_paused() {
            return Err(WriteError::Full(why));
        }
        if batch.span_count() == 0 {
            return Ok(());
        }
        let prepared = encode::prepare_traces(&batch).map_err(WriteError::Failed)?;
        drop(batch);
        w.submit(writer::Prepared::Traces(Box::new(prepared))).await
    }

    /// Queues a trace export that the caller encoded in chunks ([`TraceChunk::encode`], a
    /// slice of its spans each) and resolves once every chunk is committed: all chunks go
    /// in ONE transaction, each as its own `span_batches` row, so the request is stored
    /// whole or not at all and is acknowledged only after its COMMIT. Deduplication runs
    /// across chunks as across requests (the writer sees the earlier chunks' rows in the
    /// same transaction). Decode-time memory stays bounded: the caller holds the encoded
    /// chunks instead of the whole request's records, and SQLite copies one chunk at a time
    /// (issue 17 #14). Errors: as [`Storage::write_traces`].
    pub async fn write_trace_chunks(&self, chunks: Vec<TraceChunk>) -> Result<(), WriteError> {
        let w = &self.inner.telemetry;
        w.precheck()?;
        if let Some(why) = self.ingest_paused() {
            return Err(WriteError::Full(why));
        }
        let chunks: Vec<_> = chunks
            .into_iter()
            .map(|c| c.0)
            .filter(|c| !c.index.spans.is_empty())
            .collect();
        if chunks.is_empty() {
            return Ok(());
        }
        w.submit(writer::Prepared::TraceChunks(chunks)).await
    }

    /// Queues a log export (one row per record, linked to its trace/span when it carries
    /// ids) and resolves once it is committed. Errors: as [`Storage::write_traces`].
    pub async fn write_logs(&self, batch: Arc<LogBatch>) -> Result<(), WriteError> {
        let w = &self.inner.telemetry;
        w.precheck()?;
        if let Some(why) = self.ingest_paused() {
            return Err(WriteError::Full(why));
        }
        if batch.record_count() == 0 {
            return Ok(());
        }
        // A caller that passed its only reference gets each record freed as it is
        // encoded: the records and their rows are never all held at once.
        let rows = match Arc::try_unwrap(batch) {
            Ok(owned) => encode::prepare_logs_owned(owned),
            Err(shared) => encode::prepare_logs(&shared),
        }
        .map_err(WriteError::Failed)?;
        w.submit(writer::Prepared::Logs(rows)).await
    }

    /// Queues a metrics export (one row per data point) and resolves once it is committed.
    /// Errors: as [`Storage::write_traces`].
    pub async fn write_metrics(&self, batch: Arc<MetricBatch>) -> Result<(), WriteError> {
        let w = &self.inner.telemetry;
        w.precheck()?;
        if let Some(why) = self.ingest_paused() {
            return Err(WriteError::Full(why));
        }
        if batch.point_count() == 0 {
            return Ok(());
        }
        // A caller that passed its only reference gets each record freed as it is
        // encoded: the records and their rows are never all held at once.
        let rows = match Arc::try_unwrap(batch) {
            Ok(owned) => encode::prepare_metrics_owned(owned),
            Err(shared) => encode::prepare_metrics(&shared),
        }
        .map_err(WriteError::Failed)?;
        w.submit(writer::Prepared::Metrics(rows)).await
    }

    /// Export requests waiting for the writer.
    pub fn queue_depth(&self) -> usize {
        self.inner.telemetry.stats.queue_depth()
    }

    /// The telemetry counters (also a [`crate::MetricsSource`] for `GET /metrics`).
    pub fn telemetry_stats(&self) -> Arc<TelemetryStats> {
        self.inner.telemetry.stats.clone()
    }

    /// `Some(reason)` while telemetry writes are refused with [`WriteError::Full`] (size cap
    /// or disk full), `None` once they are accepted again: the source of the `storage.full`
    /// incident (docs/design.md, One event vocabulary).
    pub fn storage_full(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.inner.telemetry.full.clone()
    }

    /// `Some` while the telemetry writer is in a transient condition (lock held by another
    /// process, I/O error, full disk, file deleted) and refuses with a retryable error;
    /// `None` once a commit (or the idle probe, every second) succeeds again. Telemetry
    /// refused by [`Storage::pause_ingest`] is not in it: [`Storage::condition`] holds both.
    pub fn degraded(&self) -> tokio::sync::watch::Receiver<Option<Degraded>> {
        self.inner.telemetry.degraded.clone()
    }

    /// Why telemetry is refused now, if it is: the writer's condition
    /// ([`Storage::degraded`]), else a pause ([`Storage::pause_ingest`], the filesystem out
    /// of space) as [`crate::Transient::Full`] with the pause's reason. The source of `/readyz`'s
    /// `degraded` and the dashboard's banner, so they say so for as long as either refuses.
    pub fn condition(&self) -> Option<Degraded> {
        if let Some(d) = self.inner.telemetry.degraded.borrow().clone() {
            return Some(d);
        }
        self.ingest_paused().map(|detail| Degraded {
            kind: crate::Transient::Full,
            detail,
        })
    }

    /// Runs one retention pass now on the writer thread (by age; then, when telemetry uses
    /// over 85% of its budget, the oldest down to 75%; then `PRAGMA incremental_vacuum`).
    /// The writer also runs it every `retention_interval` when idle, and runs the size step
    /// on its own right after any commit that leaves telemetry over 85% of its budget.
    ///
    /// Errors: [`StorageError::Closed`] after shutdown; SQLite failures.
    pub async fn run_retention(&self) -> Result<RetentionReport, StorageError> {
        self.inner.telemetry.retention().await
    }

    /// One trace with its logs; `None` when nothing of it is stored. Spans are merged (one
    /// per span id, the ended copy winning) and ordered by start time; logs carrying the
    /// trace id are ordered by time.
    pub async fn trace(&self, trace_id: TraceId) -> Result<Option<TraceView>, StorageError> {
        self.read(move |c| read::load_trace(c, trace_id)).await
    }

    /// One span (merged); `None` when not stored.
    pub async fn span(
        &self,
        trace_id: TraceId,
        span_id: SpanId,
    ) -> Result<Option<StoredSpan>, StorageError> {
        self.read(move |c| read::load_span(c, trace_id, span_id))
            .await
    }

    /// Trace search, newest first, one page at a time.
    ///
    /// Errors: [`QueryError::BadCursor`] for a cursor this server did not issue,
    /// [`QueryError::NeedsTimeRange`] for an attribute key outside
    /// [`INDEXED_ATTRIBUTE_KEYS`] without both `start_min_unix_nano` and
    /// `start_max_unix_nano`, [`QueryError::Storage`].
    pub async fn search_traces(&self, query: TraceQuery) -> Result<TracePage, QueryError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            this.read_blocking(|c| match trace_search::search(c, &query) {
                Ok(p) => Ok(Ok(p)),
                Err(QueryError::Storage(e)) => Err(e),
                Err(other) => Ok(Err(other)),
            })
        })
        .await
        .map_err(|e| QueryError::Storage(StorageError::Task(e.to_string())))??
    }

    /// Distinct `service.name` values of stored spans, sorted, a page at a time: those after
    /// `after` (the previous page's `next_cursor`, the last name it showed), at most `limit`
    /// (held to 1..=[`MAX_NAMES_PAGE`]). Reads the page's rows only.
    pub async fn services(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<NamePage, StorageError> {
        self.read(move |c| read::services(c, after.as_deref(), limit))
            .await
    }

    /// Distinct span names of stored spans, sorted, optionally for one service, a page at a
    /// time as [`Storage::services`].
    pub async fn span_names(
        &self,
        service: Option<String>,
        after: Option<String>,
        limit: usize,
    ) -> Result<NamePage, StorageError> {
        self.read(move |c| read::span_names(c, service.as_deref(), after.as_deref(), limit))
            .await
    }

    /// The newest metric points, optionally of one metric `name`; `limit` is capped to
    /// 1..=[`MAX_SEARCH_LIMIT`].
    pub async fn metric_points(
        &self,
        name: Option<String>,
        limit: usize,
    ) -> Result<Vec<StoredMetricPoint>, StorageError> {
        self.read(move |c| read::metric_points(c, name.as_deref(), limit))
            .await
    }
}

impl Storage {
    /// Log search, newest first (by record time, then arrival), one page at a time.
    ///
    /// Errors: [`LogQueryError::BadCursor`] for a cursor this server did not issue,
    /// [`LogQueryError::Storage`].
    pub async fn search_logs(&self, query: LogQuery) -> Result<LogPage, LogQueryError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            this.read_blocking(|c| match logs_read::search_logs(c, &query) {
                Ok(p) => Ok(Ok(p)),
                Err(LogQueryError::Storage(e)) => Err(e),
                Err(other) => Ok(Err(other)),
            })
        })
        .await
        .map_err(|e| LogQueryError::Storage(StorageError::Task(e.to_string())))??
    }

    /// Log records stored after row `after_id` matching `query` (cursor and limit aside),
    /// oldest first, at most `limit`; with the row id to go on from (the live tail).
    pub async fn logs_after(
        &self,
        query: LogQuery,
        after_id: i64,
        limit: usize,
    ) -> Result<(Vec<LogEntry>, i64), StorageError> {
        self.read(move |c| logs_read::logs_after(c, &query, after_id, limit))
            .await
    }

    /// The newest log row id (0 when none is stored).
    pub async fn newest_log_id(&self) -> Result<i64, StorageError> {
        self.read(logs_read::newest_log_id).await
    }

    /// The stored instruments, one per (metric name, service), sorted, a page at a time:
    /// after `cursor` (the previous page's `next_cursor`), at most `limit` (held to
    /// 1..=[`MAX_NAMES_PAGE`]); optionally of one service.
    ///
    /// Errors: [`QueryError::BadCursor`] for a cursor this server did not issue,
    /// [`QueryError::Storage`] when the read fails.
    pub async fn instruments(
        &self,
        service: Option<String>,
        cursor: Option<String>,
        limit: usize,
    ) -> Result<InstrumentPage, QueryError> {
        self.read(move |c| {
            Ok(metrics_read::instruments(
                c,
                service.as_deref(),
                cursor.as_deref(),
                limit,
            ))
        })
        .await?
    }

    /// Whether an instrument named `name` is stored, of any service (one index seek).
    pub async fn instrument_known(&self, name: String) -> Result<bool, StorageError> {
        self.read(move |c| metrics_read::instrument_known(c, &name))
            .await
    }

    /// One instrument's points per series, aggregated per step (see [`PointsQuery`] and
    /// `metrics_read.rs` for the aggregation and the quantile estimates).
    pub async fn metric_series(
        &self,
        query: PointsQuery,
    ) -> Result<Vec<MetricSeries>, StorageError> {
        self.read(move |c| metrics_read::metric_series(c, &query))
            .await
    }
}

impl From<rusqlite::Error> for QueryError {
    fn from(e: rusqlite::Error) -> Self {
        QueryError::Storage(StorageError::Sqlite(e))
    }
}
