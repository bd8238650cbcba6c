//! Streaming serializers for the big read shapes (spans, logs, whole traces).
//!
//! A 10,000-span trace view must render fast (issue 5 benchmark: under 200 ms), so these
//! types borrow the storage records and implement `serde::Serialize` directly instead of
//! building a `serde_json::Value` tree. The JSON is the same as the design's Read API JSON (see
//! `json.rs` for the rules); the golden tests pin it. `trace.rs` assembles a whole trace
//! from these pieces.

use base64::Engine;
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use stallwatch_storage::model::{
    attr, AnyValue, Event, KeyValue, Link, Resource, Scope, Span, SpanId, SpanState, TraceId,
};
use stallwatch_storage::telemetry::{StoredLog, StoredSpan, TraceView};

use crate::json::{kind_name, state_name, status_name};

mod trace;

pub(crate) use trace::TraceJ;

/// A `u64` as a decimal string (`*_unix_nano`, 64-bit counts).
struct Dec(u64);
impl Serialize for Dec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

struct Hex<'a>(&'a [u8]);
impl Serialize for Hex<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

/// OTLP/JSON `AnyValue`.
pub(crate) struct Any<'a>(pub(crate) &'a AnyValue);
impl Serialize for Any<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        match self.0 {
            AnyValue::Empty => {}
            AnyValue::String(v) => m.serialize_entry("stringValue", v)?,
            AnyValue::Bool(v) => m.serialize_entry("boolValue", v)?,
            AnyValue::Int(v) => m.serialize_entry("intValue", &v.to_string())?,
            AnyValue::Double(d) if d.is_nan() => m.serialize_entry("doubleValue", "NaN")?,
            AnyValue::Double(d) if d.is_infinite() => m.serialize_entry(
                "doubleValue",
                if *d > 0.0 { "Infinity" } else { "-Infinity" },
            )?,
            AnyValue::Double(d) => m.serialize_entry("doubleValue", d)?,
            AnyValue::Bytes(b) => m.serialize_entry(
                "bytesValue",
                &base64::engine::general_purpose::STANDARD.encode(b),
            )?,
            AnyValue::Array(items) => m.serialize_entry("arrayValue", &Values(items))?,
            AnyValue::KvList(kvs) => m.serialize_entry("kvlistValue", &KvValues(kvs))?,
        }
        m.end()
    }
}

struct Values<'a>(&'a [AnyValue]);
impl Serialize for Values<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Seq<'a>(&'a [AnyValue]);
        impl Serialize for Seq<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut q = s.serialize_seq(Some(self.0.len()))?;
                for v in self.0 {
                    q.serialize_element(&Any(v))?;
                }
                q.end()
            }
        }
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("values", &Seq(self.0))?;
        m.end()
    }
}

struct KvValues<'a>(&'a [KeyValue]);
impl Serialize for KvValues<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("values", &Attrs(self.0))?;
        m.end()
    }
}

/// OTLP/JSON `KeyValue` list.
pub(crate) struct Attrs<'a>(pub(crate) &'a [KeyValue]);
impl Serialize for Attrs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Kv<'a>(&'a KeyValue);
        impl Serialize for Kv<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("key", &self.0.key)?;
                m.serialize_entry("value", &Any(&self.0.value))?;
                m.end()
            }
        }
        let mut q = s.serialize_seq(Some(self.0.len()))?;
        for kv in self.0 {
            q.serialize_element(&Kv(kv))?;
        }
        q.end()
    }
}

/// `{"attributes","dropped_attributes_count","schema_url"}`.
pub(crate) struct Res<'a>(pub(crate) &'a Resource);
impl Serialize for Res<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("attributes", &Attrs(&self.0.attributes))?;
        m.serialize_entry("dropped_attributes_count", &self.0.dropped_attributes_count)?;
        m.serialize_entry("schema_url", &self.0.schema_url)?;
        m.end()
    }
}

/// `{"name","version","attributes","dropped_attributes_count","schema_url"}`.
pub(crate) struct Scp<'a>(pub(crate) &'a Scope);
impl Serialize for Scp<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("name", &self.0.name)?;
        m.serialize_entry("version", &self.0.version)?;
        m.serialize_entry("attributes", &Attrs(&self.0.attributes))?;
        m.serialize_entry("dropped_attributes_count", &self.0.dropped_attributes_count)?;
        m.serialize_entry("schema_url", &self.0.schema_url)?;
        m.end()
    }
}

struct Events<'a>(&'a [Event]);
impl Serialize for Events<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Ev<'a>(&'a Event);
        impl Serialize for Ev<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(4))?;
                m.serialize_entry("time_unix_nano", &Dec(self.0.time_unix_nano))?;
                m.serialize_entry("name", &self.0.name)?;
                m.serialize_entry("attributes", &Attrs(&self.0.attributes))?;
                m.serialize_entry("dropped_attributes_count", &self.0.dropped_attributes_count)?;
                m.end()
            }
        }
        let mut q = s.serialize_seq(Some(self.0.len()))?;
        for e in self.0 {
            q.serialize_element(&Ev(e))?;
        }
        q.end()
    }
}

struct Links<'a>(&'a [Link]);
impl Serialize for Links<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Ln<'a>(&'a Link);
        impl Serialize for Ln<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let l = self.0;
                let mut m = s.serialize_map(Some(6))?;
                m.serialize_entry("trace_id", &Hex(&l.trace_id.0))?;
                m.serialize_entry("span_id", &Hex(&l.span_id.0))?;
                m.serialize_entry("trace_state", &l.trace_state)?;
                m.serialize_entry("attributes", &Attrs(&l.attributes))?;
                m.serialize_entry("dropped_attributes_count", &l.dropped_attributes_count)?;
                m.serialize_entry("flags", &l.flags)?;
                m.end()
            }
        }
        let mut q = s.serialize_seq(Some(self.0.len()))?;
        for l in self.0 {
            q.serialize_element(&Ln(l))?;
        }
        q.end()
    }
}

/// One span. `stored` is `None` for an inferred parent (no resource, scope or arrival).
/// With `indexed`, the span names its resource and scope by their index in the trace's
/// `resources` and `scopes` lists instead of repeating them.
pub(crate) struct SpanJ<'a> {
    pub(crate) span: &'a Span,
    pub(crate) state: SpanState,
    pub(crate) stored: Option<&'a StoredSpan>,
    /// In a whole-trace answer: where the span's parent stands (see [`ParentState`]);
    /// `None` elsewhere (the key is then left out).
    pub(crate) parent_state: Option<ParentState>,
    pub(crate) indexed: Option<(usize, usize)>,
    /// The lean form (`?lean=true` on a whole trace): keys holding their default or a value
    /// derivable from elsewhere in the answer are left out (see [`TraceJ::lean`]).
    pub(crate) lean: bool,
}

impl<'a> SpanJ<'a> {
    /// A stored span.
    pub(crate) fn stored(s: &'a StoredSpan) -> Self {
        Self {
            span: &s.span,
            state: s.state,
            stored: Some(s),
            parent_state: None,
            indexed: None,
            lean: false,
        }
    }
}

/// Where a span's parent stands in a trace answer (`parent_state`; issue 12 #8):
/// `root` (no parent), `present` (the parent is stored), `inferred` (never received, but an
/// open child says it is running: drawn as "in progress (inferred)"), `missing` (never
/// received and no child says it is open: a remote parent of a distributed trace, drawn
/// as "parent not received", never made up as running).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParentState {
    Root,
    Present,
    Inferred,
    Missing,
}

impl ParentState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ParentState::Root => "root",
            ParentState::Present => "present",
            ParentState::Inferred => "inferred",
            ParentState::Missing => "missing",
        }
    }
}

/// True for a Logfire `pending_span` twin (`logfire.span_type = "pending_span"`).
fn is_pending_twin(s: &Span) -> bool {
    attr(&s.attributes, "logfire.span_type").and_then(AnyValue::as_str) == Some("pending_span")
}

/// The span record of a parent that never arrived: it starts with its earliest child.
pub(crate) fn inferred(trace_id: TraceId, span_id: SpanId, start_unix_nano: u64) -> Span {
    Span {
        trace_id,
        span_id,
        name: "(in progress, inferred)".into(),
        start_time_unix_nano: start_unix_nano,
        ..Span::default()
    }
}

impl Serialize for SpanJ<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let sp = self.span;
        let lean = self.lean;
        let mut m = s.serialize_map(None)?;
        if !lean {
            m.serialize_entry("trace_id", &Hex(&sp.trace_id.0))?;
        }
        m.serialize_entry("span_id", &Hex(&sp.span_id.0))?;
        if !lean || sp.parent_span_id.is_some() {
            m.serialize_entry(
                "parent_span_id",
                &sp.parent_span_id.as_ref().map(|p| Hex(&p.0)),
            )?;
        }
        if !lean || !sp.trace_state.is_empty() {
            m.serialize_entry("trace_state", &sp.trace_state)?;
        }
        if !lean || sp.flags != 0 {
            m.serialize_entry("flags", &sp.flags)?;
        }
        m.serialize_entry("name", &sp.name)?;
        m.serialize_entry("kind", &sp.kind)?;
        if !lean {
            m.serialize_entry("kind_name", kind_name(sp.kind))?;
        }
        m.serialize_entry("start_time_unix_nano", &Dec(sp.start_time_unix_nano))?;
        m.serialize_entry("end_time_unix_nano", &Dec(sp.end_time_unix_nano))?;
        let d = sp.duration_ns();
        if !lean {
            m.serialize_entry("duration_ns", &d.map(Dec))?;
        }
        m.serialize_entry("duration_ms", &d.map(|d| d as f64 / 1e6))?;
        if !lean || sp.clock_skewed() {
            m.serialize_entry("clock_skewed", &sp.clock_skewed())?;
        }
        m.serialize_entry("state", state_name(self.state))?;
        if let Some(ps) = self.parent_state {
            m.serialize_entry("parent_state", ps.as_str())?;
        }
        let tool = attr(&sp.attributes, "gen_ai.tool.name").and_then(AnyValue::as_str);
        if !lean || tool.is_some() {
            m.serialize_entry("tool_name", &tool)?;
        }
        m.serialize_entry("attributes", &Attrs(&sp.attributes))?;
        if !lean || sp.dropped_attributes_count != 0 {
            m.serialize_entry("dropped_attributes_count", &sp.dropped_attributes_count)?;
        }
        if !lean || !sp.events.is_empty() {
            m.serialize_entry("events", &Events(&sp.events))?;
        }
        if !lean || sp.dropped_events_count != 0 {
            m.serialize_entry("dropped_events_count", &sp.dropped_events_count)?;
        }
        if !lean || !sp.links.is_empty() {
            m.serialize_entry("links", &Links(&sp.links))?;
        }
        if !lean || sp.dropped_links_count != 0 {
            m.serialize_entry("dropped_links_count", &sp.dropped_links_count)?;
        }
        if lean {
            m.serialize_entry("status", &LeanStatusJ(sp))?;
        } else {
            m.serialize_entry("status", &StatusJ(sp))?;
        }
        match (self.stored, self.indexed) {
            (Some(st), Some((ri, si))) => {
                if !lean {
                    m.serialize_entry("service_name", st.resource.service_name())?;
                }
                m.serialize_entry("resource_index", &ri)?;
                m.serialize_entry("scope_index", &si)?;
                if !lean {
                    m.serialize_entry("received_unix_nano", &Dec(st.received_unix_nano))?;
                }
            }
            (Some(st), None) => {
                m.serialize_entry("service_name", st.resource.service_name())?;
                m.serialize_entry("resource", &Res(&st.resource))?;
                m.serialize_entry("scope", &Scp(&st.scope))?;
                m.serialize_entry("received_unix_nano", &Dec(st.received_unix_nano))?;
            }
            (None, Some(_)) => {
                m.serialize_entry("service_name", &())?;
                m.serialize_entry("resource_index", &())?;
                m.serialize_entry("scope_index", &())?;
                m.serialize_entry("received_unix_nano", &())?;
            }
            (None, None) => {
                m.serialize_entry("service_name", &())?;
                m.serialize_entry("resource", &())?;
                m.serialize_entry("scope", &())?;
                m.serialize_entry("received_unix_nano", &())?;
            }
        }
        m.end()
    }
}

/// The lean status: `{"code"}`, plus `"message"` when there is one.
struct LeanStatusJ<'a>(&'a Span);
impl Serialize for LeanStatusJ<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("code", &self.0.status.code)?;
        if !self.0.status.message.is_empty() {
            m.serialize_entry("message", &self.0.status.message)?;
        }
        m.end()
    }
}

struct StatusJ<'a>(&'a Span);
impl Serialize for StatusJ<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("code", &self.0.status.code)?;
        m.serialize_entry("code_name", status_name(self.0.status.code))?;
        m.serialize_entry("message", &self.0.status.message)?;
        m.end()
    }
}

/// One log record with its resource and scope (or, with `.1`, their indices in the
/// trace's `resources` and `scopes`).
pub(crate) struct LogJ<'a>(pub(crate) &'a StoredLog, pub(crate) Option<(usize, usize)>);
impl Serialize for LogJ<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = &self.0.record;
        let mut m = s.serialize_map(Some(14))?;
        m.serialize_entry("time_unix_nano", &Dec(r.time_unix_nano))?;
        m.serialize_entry("observed_time_unix_nano", &Dec(r.observed_time_unix_nano))?;
        m.serialize_entry("severity_number", &r.severity_number)?;
        m.serialize_entry("severity_text", &r.severity_text)?;
        m.serialize_entry("body", &Any(&r.body))?;
        m.serialize_entry("attributes", &Attrs(&r.attributes))?;
        m.serialize_entry("dropped_attributes_count", &r.dropped_attributes_count)?;
        m.serialize_entry("flags", &r.flags)?;
        m.serialize_entry("trace_id", &r.trace_id.as_ref().map(|t| Hex(&t.0)))?;
        m.serialize_entry("span_id", &r.span_id.as_ref().map(|t| Hex(&t.0)))?;
        m.serialize_entry("event_name", &r.event_name)?;
        m.serialize_entry("service_name", self.0.resource.service_name())?;
        match self.1 {
            Some((ri, si)) => {
                m.serialize_entry("resource_index", &ri)?;
                m.serialize_entry("scope_index", &si)?;
            }
            None => {
                m.serialize_entry("resource", &Res(&self.0.resource))?;
                m.serialize_entry("scope", &Scp(&self.0.scope))?;
            }
        }
        m.end()
    }
}
