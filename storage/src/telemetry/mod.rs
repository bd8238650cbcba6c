//! Telemetry tables (spans, logs, metric points), the group-commit writer thread, and the
//! trace read queries.
//!
//! (Stub signatures: the storage work fills these in. The shapes are the contract the
//! collector and the dashboards code against.)

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::StorageConfig;
use crate::db::Storage;
use crate::error::{StorageError, WriteError};
use crate::model::{
    LogBatch, LogRecord, MetricBatch, Resource, Scope, Span, SpanId, SpanState, TraceBatch, TraceId,
};

/// DDL for the telemetry tables (part of migration 1).
pub(crate) const SCHEMA: &str = "";

/// The telemetry writer thread's handle.
pub(crate) struct TelemetryWriter {}

impl TelemetryWriter {
    /// Starts the writer thread on its own connection.
    pub(crate) fn start(_config: &StorageConfig) -> Result<Self, StorageError> {
        Ok(Self {})
    }
    /// Commits what is queued and stops the thread.
    pub(crate) async fn shutdown(&self) {}
}

/// A span as read back: the record, its resource and scope, and its merged state.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredSpan {
    /// The span (the ended copy when one exists, DESIGN: "the first ended copy wins").
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
/// of its spans matches all span-level filters. Newest first.
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
    /// Span start at or after, ns since the Unix epoch.
    pub start_min_unix_nano: Option<u64>,
    /// Span start before, ns since the Unix epoch.
    pub start_max_unix_nano: Option<u64>,
    /// Page size (1..=1000).
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

impl Storage {
    /// Queues a trace export and resolves once it is committed. Duplicated
    /// (trace id, span id) pairs are stored once; an ended copy wins over open ones.
    ///
    /// Errors: [`WriteError::QueueFull`] / [`WriteError::Full`] / [`WriteError::Closed`]
    /// (retryable), [`WriteError::Failed`].
    pub async fn write_traces(&self, batch: Arc<TraceBatch>) -> Result<(), WriteError> {
        let _ = batch;
        Err(WriteError::Failed("not implemented".into()))
    }

    /// Queues a log export and resolves once it is committed.
    pub async fn write_logs(&self, batch: Arc<LogBatch>) -> Result<(), WriteError> {
        let _ = batch;
        Err(WriteError::Failed("not implemented".into()))
    }

    /// Queues a metrics export and resolves once it is committed.
    pub async fn write_metrics(&self, batch: Arc<MetricBatch>) -> Result<(), WriteError> {
        let _ = batch;
        Err(WriteError::Failed("not implemented".into()))
    }

    /// Export requests waiting for the writer.
    pub fn queue_depth(&self) -> usize {
        0
    }

    /// One trace with its logs; `None` when nothing of it is stored.
    pub async fn trace(&self, trace_id: TraceId) -> Result<Option<TraceView>, StorageError> {
        let _ = trace_id;
        Ok(None)
    }

    /// One span (merged); `None` when not stored.
    pub async fn span(
        &self,
        trace_id: TraceId,
        span_id: SpanId,
    ) -> Result<Option<StoredSpan>, StorageError> {
        let _ = (trace_id, span_id);
        Ok(None)
    }

    /// Trace search, newest first.
    pub async fn search_traces(&self, query: TraceQuery) -> Result<TracePage, QueryError> {
        let _ = query;
        Ok(TracePage {
            items: vec![],
            next_cursor: None,
        })
    }

    /// Distinct `service.name` values seen.
    pub async fn services(&self) -> Result<Vec<String>, StorageError> {
        Ok(vec![])
    }

    /// Distinct span names seen, optionally for one service.
    pub async fn span_names(&self, service: Option<String>) -> Result<Vec<String>, StorageError> {
        let _ = service;
        Ok(vec![])
    }
}
