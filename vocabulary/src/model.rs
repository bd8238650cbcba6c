//! The record model: what stallwatch stores and what every other crate speaks.
//!
//! These types mirror the OTLP data model (opentelemetry-proto `trace/v1`, `logs/v1`,
//! `metrics/v1`, `common/v1`) closely enough to be lossless: ids, links, events, flags,
//! trace state, dropped counts and schema URLs all survive a round trip. They carry no
//! protobuf or JSON wire concerns; the collector converts wire types into them in one
//! `decode` module, and the read API renders them back as OTLP/JSON-shaped output.
//!
//! Incidents and their event names live here too: every stage raises or reads them, and
//! this crate is the one every other crate may depend on (storage persists them).

use serde::{Deserialize, Serialize};
use std::fmt;

/// A 16-byte trace id (OTLP `trace_id`). Never all zero once accepted.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id (OTLP `span_id`). Never all zero once accepted.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    /// Lowercase hex, 32 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
    /// Parses 32 hex characters (case-insensitive). `None` for any other shape.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 16];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }
    /// True for the invalid all-zero id (OTLP spec: all-zero ids are invalid).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl SpanId {
    /// Lowercase hex, 16 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
    /// Parses 16 hex characters (case-insensitive). `None` for any other shape.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 8];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }
    /// True for the invalid all-zero id.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 8]
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// OTLP `AnyValue`. `Empty` is an `AnyValue` with no value set.
///
/// Doubles keep NaN and the infinities (SQLite would turn a NaN REAL into NULL, so they
/// are stored inside the encoded payload, never as a REAL column).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub enum AnyValue {
    /// No value.
    #[default]
    Empty,
    /// `stringValue`.
    String(String),
    /// `boolValue`.
    Bool(bool),
    /// `intValue` (int64; OTLP/JSON carries it as a decimal string).
    Int(i64),
    /// `doubleValue`.
    Double(f64),
    /// `bytesValue` (OTLP/JSON carries it as base64).
    Bytes(Vec<u8>),
    /// `arrayValue.values`.
    Array(Vec<AnyValue>),
    /// `kvlistValue.values`.
    KvList(Vec<KeyValue>),
}

impl AnyValue {
    /// The string inside a `String` value, else `None`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            AnyValue::String(s) => Some(s),
            _ => None,
        }
    }
    /// The integer inside an `Int` value, or a `String` that parses as one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            AnyValue::Int(i) => Some(*i),
            AnyValue::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }
    /// A short text form for indexing and display: strings as-is, numbers and bools in
    /// decimal, everything else `None`.
    pub fn index_text(&self) -> Option<String> {
        match self {
            AnyValue::String(s) => Some(s.clone()),
            AnyValue::Int(i) => Some(i.to_string()),
            AnyValue::Bool(b) => Some(b.to_string()),
            AnyValue::Double(d) => Some(d.to_string()),
            _ => None,
        }
    }
}

/// OTLP `KeyValue`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct KeyValue {
    /// Attribute key, e.g. `gen_ai.tool.name`.
    pub key: String,
    /// Attribute value.
    pub value: AnyValue,
}

impl KeyValue {
    /// Builds a key/value pair.
    pub fn new(key: impl Into<String>, value: AnyValue) -> Self {
        Self {
            key: key.into(),
            value,
        }
    }
}

/// Finds the first attribute with `key`.
pub fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attrs.iter().find(|kv| kv.key == key).map(|kv| &kv.value)
}

/// OTLP `Resource` plus the enclosing `ResourceSpans.schema_url`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Resource {
    /// Resource attributes (`service.name`, `process.pid`, `stallwatch.runner.id`, ...).
    pub attributes: Vec<KeyValue>,
    /// OTLP `dropped_attributes_count`.
    pub dropped_attributes_count: u32,
    /// `ResourceSpans.schema_url` / `ResourceLogs.schema_url` / `ResourceMetrics.schema_url`.
    pub schema_url: String,
}

/// Service name used when a resource has none (OTel SDK spec: `unknown_service`).
pub const UNKNOWN_SERVICE: &str = "unknown_service";

impl Resource {
    /// `service.name`, or [`UNKNOWN_SERVICE`].
    pub fn service_name(&self) -> &str {
        attr(&self.attributes, "service.name")
            .and_then(AnyValue::as_str)
            .unwrap_or(UNKNOWN_SERVICE)
    }
}

/// OTLP `InstrumentationScope` plus the enclosing `ScopeSpans.schema_url`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Scope {
    /// Scope name.
    pub name: String,
    /// Scope version.
    pub version: String,
    /// Scope attributes.
    pub attributes: Vec<KeyValue>,
    /// OTLP `dropped_attributes_count`.
    pub dropped_attributes_count: u32,
    /// `ScopeSpans.schema_url` (or the logs/metrics equivalent).
    pub schema_url: String,
}

/// OTLP `Span.Event`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Event {
    /// Event time, ns since the Unix epoch.
    pub time_unix_nano: u64,
    /// Event name, e.g. `exception`.
    pub name: String,
    /// Event attributes.
    pub attributes: Vec<KeyValue>,
    /// OTLP `dropped_attributes_count`.
    pub dropped_attributes_count: u32,
}

/// OTLP `Span.Link`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Link {
    /// Linked trace.
    pub trace_id: TraceId,
    /// Linked span.
    pub span_id: SpanId,
    /// W3C trace state of the link.
    pub trace_state: String,
    /// Link attributes.
    pub attributes: Vec<KeyValue>,
    /// OTLP `dropped_attributes_count`.
    pub dropped_attributes_count: u32,
    /// OTLP `flags` (W3C trace flags in the low byte).
    pub flags: u32,
}

/// OTLP `Status`. `code`: 0 UNSET, 1 OK, 2 ERROR; unknown values are kept as sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Status {
    /// Status code (0 unset, 1 ok, 2 error; other values kept raw).
    pub code: i32,
    /// Status message.
    pub message: String,
}

/// The attribute that marks a Logfire twin span, and its value for one
/// ([`Span::is_pending_twin`], [`SpanRef::watched_whole`]).
pub const LOGFIRE_SPAN_TYPE: &str = "logfire.span_type";
/// See [`LOGFIRE_SPAN_TYPE`].
pub const LOGFIRE_PENDING_SPAN: &str = "pending_span";

/// Status code ERROR (OTLP `STATUS_CODE_ERROR`).
pub const STATUS_ERROR: i32 = 2;

/// OTLP `Span`.
///
/// `end_time_unix_nano == 0` means the span is still running (an open-span snapshot, docs/design.md
/// "Open spans" shape 1). An end before the start is kept raw; [`Span::duration_ns`] then
/// answers `Some(0)` and [`Span::clock_skewed`] answers true, never an underflow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Span {
    /// Trace id.
    pub trace_id: TraceId,
    /// Span id.
    pub span_id: SpanId,
    /// Parent span id; `None` for a root span (an empty parent id on the wire).
    pub parent_span_id: Option<SpanId>,
    /// W3C trace state.
    pub trace_state: String,
    /// OTLP `flags`.
    pub flags: u32,
    /// Span name.
    pub name: String,
    /// OTLP `SpanKind` (0 unspecified .. 5 consumer; unknown values kept raw).
    pub kind: i32,
    /// Start, ns since the Unix epoch (exporter clock).
    pub start_time_unix_nano: u64,
    /// End, ns since the Unix epoch; 0 while the span is open.
    pub end_time_unix_nano: u64,
    /// Span attributes.
    pub attributes: Vec<KeyValue>,
    /// OTLP `dropped_attributes_count`.
    pub dropped_attributes_count: u32,
    /// Span events.
    pub events: Vec<Event>,
    /// OTLP `dropped_events_count`.
    pub dropped_events_count: u32,
    /// Span links.
    pub links: Vec<Link>,
    /// OTLP `dropped_links_count`.
    pub dropped_links_count: u32,
    /// Span status.
    pub status: Status,
}

impl Span {
    /// True when the span has an end time.
    pub fn is_ended(&self) -> bool {
        self.end_time_unix_nano != 0
    }
    /// True for a Logfire twin (`logfire.span_type = "pending_span"`): its parent is the
    /// real span, still running (docs/design.md, "Open spans" shape 3).
    pub fn is_pending_twin(&self) -> bool {
        attr(&self.attributes, LOGFIRE_SPAN_TYPE).and_then(AnyValue::as_str)
            == Some(LOGFIRE_PENDING_SPAN)
    }
    /// True when the watchdog reads the whole span: while it is open, or when it is a
    /// pending twin (either becomes a ledger entry). Of any other span it needs only the
    /// ids: an ended span only closes its entry (docs/design.md, "Open spans").
    pub fn watched_whole(&self) -> bool {
        !self.is_ended() || self.is_pending_twin()
    }
    /// Duration in ns; `None` while open; `Some(0)` when the end precedes the start.
    pub fn duration_ns(&self) -> Option<u64> {
        self.is_ended().then(|| {
            self.end_time_unix_nano
                .saturating_sub(self.start_time_unix_nano)
        })
    }
    /// True when an ended span's end precedes its start (exporter clock skew).
    pub fn clock_skewed(&self) -> bool {
        self.is_ended() && self.end_time_unix_nano < self.start_time_unix_nano
    }
}

/// Spans of one instrumentation scope (OTLP `ScopeSpans`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct ScopeSpans {
    /// The scope.
    pub scope: Scope,
    /// Its spans.
    pub spans: Vec<Span>,
}

/// Spans of one resource (OTLP `ResourceSpans`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct ResourceSpans {
    /// The resource.
    pub resource: Resource,
    /// Its scopes.
    pub scope_spans: Vec<ScopeSpans>,
}

/// One accepted trace export (OTLP `ExportTraceServiceRequest` / `TracesData`), already
/// validated: every span has non-zero ids.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct TraceBatch {
    /// The resources.
    pub resource_spans: Vec<ResourceSpans>,
}

impl TraceBatch {
    /// Number of spans in the batch.
    pub fn span_count(&self) -> usize {
        self.resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum()
    }
    /// Iterates `(resource, scope, span)`.
    pub fn spans(&self) -> impl Iterator<Item = (&Resource, &Scope, &Span)> {
        self.resource_spans.iter().flat_map(|r| {
            r.scope_spans
                .iter()
                .flat_map(move |s| s.spans.iter().map(move |sp| (&r.resource, &s.scope, sp)))
        })
    }
}

/// OTLP `LogRecord`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct LogRecord {
    /// Event time, ns since the Unix epoch; 0 when unknown.
    pub time_unix_nano: u64,
    /// Time the record was observed, ns since the Unix epoch.
    pub observed_time_unix_nano: u64,
    /// OTLP `SeverityNumber` (0..24).
    pub severity_number: i32,
    /// Severity text as sent.
    pub severity_text: String,
    /// The body.
    pub body: AnyValue,
    /// Log attributes (`span.state`, `log.body.type`, ...).
    pub attributes: Vec<KeyValue>,
    /// OTLP `dropped_attributes_count`.
    pub dropped_attributes_count: u32,
    /// OTLP `flags`.
    pub flags: u32,
    /// Trace the record belongs to, when it carries one.
    pub trace_id: Option<TraceId>,
    /// Span the record belongs to, when it carries one.
    pub span_id: Option<SpanId>,
    /// OTLP `event_name`.
    pub event_name: String,
}

/// Log records of one scope (OTLP `ScopeLogs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct ScopeLogs {
    /// The scope.
    pub scope: Scope,
    /// Its records.
    pub log_records: Vec<LogRecord>,
}

/// Log records of one resource (OTLP `ResourceLogs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct ResourceLogs {
    /// The resource.
    pub resource: Resource,
    /// Its scopes.
    pub scope_logs: Vec<ScopeLogs>,
}

/// One accepted log export (OTLP `ExportLogsServiceRequest`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct LogBatch {
    /// The resources.
    pub resource_logs: Vec<ResourceLogs>,
}

impl LogBatch {
    /// Number of log records in the batch.
    pub fn record_count(&self) -> usize {
        self.resource_logs
            .iter()
            .flat_map(|r| &r.scope_logs)
            .map(|s| s.log_records.len())
            .sum()
    }
    /// What the watchdog reads of this export: the same resources and scopes with only the
    /// records that carry an open-span attribute (`span.state` or `partial.event`,
    /// docs/design.md "Open spans" shapes 2 and 4); ordinary logs are left out, so the
    /// observation of a large log export does not hold its records (issue 17 #14).
    pub fn watchdog_view(&self) -> LogBatch {
        let open_span = |r: &&LogRecord| {
            attr(&r.attributes, "span.state").is_some()
                || attr(&r.attributes, "partial.event").is_some()
        };
        LogBatch {
            resource_logs: self
                .resource_logs
                .iter()
                .map(|rl| ResourceLogs {
                    resource: rl.resource.clone(),
                    scope_logs: rl
                        .scope_logs
                        .iter()
                        .map(|sl| ScopeLogs {
                            scope: sl.scope.clone(),
                            log_records: sl.log_records.iter().filter(open_span).cloned().collect(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// The kind of metric a data point belongs to (OTLP `Metric.data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetricKind {
    /// `gauge`.
    Gauge,
    /// `sum`.
    Sum,
    /// `histogram`.
    Histogram,
    /// `exponentialHistogram`.
    ExponentialHistogram,
    /// `summary`.
    Summary,
}

impl MetricKind {
    /// Lowercase name for storage and the API (`gauge`, `sum`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            MetricKind::Gauge => "gauge",
            MetricKind::Sum => "sum",
            MetricKind::Histogram => "histogram",
            MetricKind::ExponentialHistogram => "exponential_histogram",
            MetricKind::Summary => "summary",
        }
    }
}

/// One metric data point, flattened with its metric's identity.
///
/// `value` is the number for gauge/sum points; histogram-like points keep `count` and
/// `sum`, and their full shape (buckets, quantiles, exemplars) in `detail` as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricPoint {
    /// Metric name.
    pub name: String,
    /// Metric description.
    pub description: String,
    /// Metric unit (UCUM, e.g. `ms`).
    pub unit: String,
    /// Which data kind.
    pub kind: MetricKind,
    /// Start of the aggregation window, ns since the Unix epoch (0 when absent).
    pub start_time_unix_nano: u64,
    /// Point time, ns since the Unix epoch.
    pub time_unix_nano: u64,
    /// Gauge/sum value (int values converted to f64 are also kept exactly in `detail`).
    pub value: Option<f64>,
    /// Histogram/summary count.
    pub count: Option<u64>,
    /// Histogram/summary sum.
    pub sum: Option<f64>,
    /// Point attributes.
    pub attributes: Vec<KeyValue>,
    /// Everything else about the point (buckets, quantiles, exemplars, temporality,
    /// monotonicity, exact int value) as JSON text.
    pub detail: String,
}

/// Metric points of one scope.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct ScopeMetrics {
    /// The scope.
    pub scope: Scope,
    /// Its points.
    pub points: Vec<MetricPoint>,
}

/// Metric points of one resource.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct ResourceMetrics {
    /// The resource.
    pub resource: Resource,
    /// Its scopes.
    pub scope_metrics: Vec<ScopeMetrics>,
}

/// One accepted metrics export (OTLP `ExportMetricsServiceRequest`), flattened to points.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct MetricBatch {
    /// The resources.
    pub resource_metrics: Vec<ResourceMetrics>,
}

impl MetricBatch {
    /// Number of data points in the batch.
    pub fn point_count(&self) -> usize {
        self.resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .map(|s| s.points.len())
            .sum()
    }
}

/// The state of a span as the read API shows it (docs/design.md, Read API JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanState {
    /// Seen only as a running snapshot (no end time yet).
    Open,
    /// Seen with an end time.
    Ended,
    /// Never seen itself; a child names it as parent (shown as "in progress (inferred)").
    Inferred,
}

/// The event vocabulary shared by incidents, the SSE stream and webhooks (docs/design.md, "One
/// event vocabulary").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// `verdict.suspect`
    #[serde(rename = "verdict.suspect")]
    VerdictSuspect,
    /// `breaker.opened`
    #[serde(rename = "breaker.opened")]
    BreakerOpened,
    /// `breaker.half_open`
    #[serde(rename = "breaker.half_open")]
    BreakerHalfOpen,
    /// `breaker.closed`
    #[serde(rename = "breaker.closed")]
    BreakerClosed,
    /// `runner.started`
    #[serde(rename = "runner.started")]
    RunnerStarted,
    /// `runner.exited`
    #[serde(rename = "runner.exited")]
    RunnerExited,
    /// `runner.crashed`
    #[serde(rename = "runner.crashed")]
    RunnerCrashed,
    /// `runner.terminated`
    #[serde(rename = "runner.terminated")]
    RunnerTerminated,
    /// `runner.restarted`
    #[serde(rename = "runner.restarted")]
    RunnerRestarted,
    /// `runner.orphaned`
    #[serde(rename = "runner.orphaned")]
    RunnerOrphaned,
    /// `checkpoint.committed`
    #[serde(rename = "checkpoint.committed")]
    CheckpointCommitted,
    /// `checkpoint.rolled_back`
    #[serde(rename = "checkpoint.rolled_back")]
    CheckpointRolledBack,
    /// `storage.full`
    #[serde(rename = "storage.full")]
    StorageFull,
    /// `sidecar.degraded`: stallwatch's own trouble (out of file descriptors, its watchdog
    /// task starved) made a heartbeat unknowable; no runner was blamed (issue 17 #11).
    #[serde(rename = "sidecar.degraded")]
    SidecarDegraded,
}

impl EventKind {
    /// Every event name, in vocabulary order.
    pub const ALL: [EventKind; 14] = [
        EventKind::VerdictSuspect,
        EventKind::BreakerOpened,
        EventKind::BreakerHalfOpen,
        EventKind::BreakerClosed,
        EventKind::RunnerStarted,
        EventKind::RunnerExited,
        EventKind::RunnerCrashed,
        EventKind::RunnerTerminated,
        EventKind::RunnerRestarted,
        EventKind::RunnerOrphaned,
        EventKind::CheckpointCommitted,
        EventKind::CheckpointRolledBack,
        EventKind::StorageFull,
        EventKind::SidecarDegraded,
    ];

    /// The wire name, e.g. `breaker.opened`.
    pub fn as_str(&self) -> &'static str {
        match self {
            EventKind::VerdictSuspect => "verdict.suspect",
            EventKind::BreakerOpened => "breaker.opened",
            EventKind::BreakerHalfOpen => "breaker.half_open",
            EventKind::BreakerClosed => "breaker.closed",
            EventKind::RunnerStarted => "runner.started",
            EventKind::RunnerExited => "runner.exited",
            EventKind::RunnerCrashed => "runner.crashed",
            EventKind::RunnerTerminated => "runner.terminated",
            EventKind::RunnerRestarted => "runner.restarted",
            EventKind::RunnerOrphaned => "runner.orphaned",
            EventKind::CheckpointCommitted => "checkpoint.committed",
            EventKind::CheckpointRolledBack => "checkpoint.rolled_back",
            EventKind::StorageFull => "storage.full",
            EventKind::SidecarDegraded => "sidecar.degraded",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An incident to record: one event of the vocabulary with its evidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewIncident {
    /// What happened.
    pub kind: EventKind,
    /// The runner it concerns, if any.
    pub runner_id: Option<String>,
    /// Tool name (`gen_ai.tool.name`) of the span involved, if any.
    pub tool_name: Option<String>,
    /// Trace of the span involved, if any.
    pub trace_id: Option<TraceId>,
    /// The span involved, if any.
    pub span_id: Option<SpanId>,
    /// One human sentence: why (e.g. "tool span run_notebook over its SLA of 30000 ms").
    pub reason: String,
    /// Structured evidence (SLA, elapsed ms, last PONG, latency, steps, ...), a JSON object.
    pub evidence: serde_json::Value,
    /// Deduplication key: recording the same key twice stores one incident.
    pub idempotency_key: String,
    /// When, ns since the Unix epoch (stallwatch's wall clock).
    pub at_unix_nano: u64,
}

/// A recorded incident: [`NewIncident`] plus its sequence number.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    /// Monotonic sequence number; the SSE `id:`.
    pub id: i64,
    /// The recorded event.
    #[serde(flatten)]
    pub incident: NewIncident,
}

/// Current wall-clock time in ns since the Unix epoch (0 if the clock is before 1970).
pub fn now_unix_nano() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

mod borrowed;
pub mod encoded;
pub use borrowed::{
    owned_attributes, AnyValueRef, EventRef, KeyValueRef, LinkRef, ResourceSpansRef, ScopeSpansRef,
    SpanRef, StatusRef,
};
pub use encoded::EncodedAttributes;
