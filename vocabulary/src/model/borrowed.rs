//! Borrowed twins of the span records, for the ingest path (issue 16): strings and bytes
//! point into the export request's body instead of being copied into their own
//! allocations, which were a tenth of ingest's CPU.
//!
//! Each type has the fields of its owned twin in the same order and serializes to the
//! same serde data model (a `&str` as a `String`, a `&[u8]` as a `Vec<u8>`), so postcard
//! writes the same bytes for both and stored rows read back as the owned types (storage's
//! `encode` tests hold them to that). What outlives the request (the watchdog's view of an
//! open span) is made owned with [`SpanRef::to_span`].
//!
//! A span's own attributes are not borrowed but kept in their stored encoding
//! ([`EncodedAttributes`]), written once as the decoder reads them; events' and links'
//! attributes (rare) are borrowed like the rest.

use std::borrow::Cow;

use serde::Serialize;

use super::encoded::EncodedAttributes;
use super::{
    AnyValue, Event, KeyValue, Link, Resource, Scope, Span, SpanId, Status, TraceId,
    LOGFIRE_PENDING_SPAN, LOGFIRE_SPAN_TYPE,
};

/// [`AnyValue`], borrowed.
#[derive(Clone, Debug, PartialEq, Serialize, Default)]
pub enum AnyValueRef<'a> {
    /// No value.
    #[default]
    Empty,
    /// `stringValue`.
    String(&'a str),
    /// `boolValue`.
    Bool(bool),
    /// `intValue`.
    Int(i64),
    /// `doubleValue`.
    Double(f64),
    /// `bytesValue`.
    Bytes(&'a [u8]),
    /// `arrayValue.values`.
    Array(Vec<AnyValueRef<'a>>),
    /// `kvlistValue.values`.
    KvList(Vec<KeyValueRef<'a>>),
}

impl<'a> AnyValueRef<'a> {
    /// [`AnyValue::index_text`] without copying a string value.
    pub fn index_text(&self) -> Option<Cow<'a, str>> {
        match self {
            AnyValueRef::String(s) => Some(Cow::Borrowed(s)),
            AnyValueRef::Int(i) => Some(Cow::Owned(i.to_string())),
            AnyValueRef::Bool(b) => Some(Cow::Owned(b.to_string())),
            AnyValueRef::Double(d) => Some(Cow::Owned(d.to_string())),
            _ => None,
        }
    }

    /// The owned twin.
    pub fn to_owned_value(&self) -> AnyValue {
        match self {
            AnyValueRef::Empty => AnyValue::Empty,
            AnyValueRef::String(s) => AnyValue::String((*s).to_string()),
            AnyValueRef::Bool(b) => AnyValue::Bool(*b),
            AnyValueRef::Int(i) => AnyValue::Int(*i),
            AnyValueRef::Double(d) => AnyValue::Double(*d),
            AnyValueRef::Bytes(b) => AnyValue::Bytes(b.to_vec()),
            AnyValueRef::Array(v) => AnyValue::Array(v.iter().map(Self::to_owned_value).collect()),
            AnyValueRef::KvList(v) => AnyValue::KvList(owned_attributes(v)),
        }
    }
}

/// [`KeyValue`], borrowed.
#[derive(Clone, Debug, PartialEq, Serialize, Default)]
pub struct KeyValueRef<'a> {
    /// Attribute key.
    pub key: &'a str,
    /// Attribute value.
    pub value: AnyValueRef<'a>,
}

/// Owned copies of borrowed attributes.
pub fn owned_attributes(attrs: &[KeyValueRef<'_>]) -> Vec<KeyValue> {
    attrs
        .iter()
        .map(|kv| KeyValue {
            key: kv.key.to_string(),
            value: kv.value.to_owned_value(),
        })
        .collect()
}

/// [`Event`], borrowed.
#[derive(Clone, Debug, PartialEq, Serialize, Default)]
pub struct EventRef<'a> {
    /// Event time, ns since the Unix epoch.
    pub time_unix_nano: u64,
    /// Event name.
    pub name: &'a str,
    /// Event attributes.
    pub attributes: Vec<KeyValueRef<'a>>,
    /// OTLP `dropped_attributes_count`.
    pub dropped_attributes_count: u32,
}

/// [`Link`], borrowed.
#[derive(Clone, Debug, PartialEq, Serialize, Default)]
pub struct LinkRef<'a> {
    /// Linked trace.
    pub trace_id: TraceId,
    /// Linked span.
    pub span_id: SpanId,
    /// W3C trace state of the link.
    pub trace_state: &'a str,
    /// Link attributes.
    pub attributes: Vec<KeyValueRef<'a>>,
    /// OTLP `dropped_attributes_count`.
    pub dropped_attributes_count: u32,
    /// OTLP `flags`.
    pub flags: u32,
}

/// [`Status`], borrowed.
#[derive(Clone, Debug, PartialEq, Serialize, Default)]
pub struct StatusRef<'a> {
    /// Status code (0 unset, 1 ok, 2 error; other values kept raw).
    pub code: i32,
    /// Status message.
    pub message: &'a str,
}

/// [`Span`], borrowed. `end_time_unix_nano == 0`: still running.
#[derive(Clone, Debug, PartialEq, Serialize, Default)]
pub struct SpanRef<'a> {
    /// Trace id.
    pub trace_id: TraceId,
    /// Span id.
    pub span_id: SpanId,
    /// Parent span id; `None` for a root span.
    pub parent_span_id: Option<SpanId>,
    /// W3C trace state.
    pub trace_state: &'a str,
    /// OTLP `flags`.
    pub flags: u32,
    /// Span name.
    pub name: &'a str,
    /// OTLP `SpanKind`.
    pub kind: i32,
    /// Start, ns since the Unix epoch.
    pub start_time_unix_nano: u64,
    /// End, ns since the Unix epoch; 0 while open.
    pub end_time_unix_nano: u64,
    /// Span attributes, in their stored encoding.
    pub attributes: EncodedAttributes,
    /// OTLP `dropped_attributes_count`.
    pub dropped_attributes_count: u32,
    /// Span events.
    pub events: Vec<EventRef<'a>>,
    /// OTLP `dropped_events_count`.
    pub dropped_events_count: u32,
    /// Span links.
    pub links: Vec<LinkRef<'a>>,
    /// OTLP `dropped_links_count`.
    pub dropped_links_count: u32,
    /// Span status.
    pub status: StatusRef<'a>,
}

impl SpanRef<'_> {
    /// [`Span::is_ended`].
    pub fn is_ended(&self) -> bool {
        self.end_time_unix_nano != 0
    }

    /// [`Span::watched_whole`]: open, or a Logfire pending twin.
    pub fn watched_whole(&self) -> bool {
        !self.is_ended()
            || self.attributes.get(LOGFIRE_SPAN_TYPE)
                == Some(AnyValueRef::String(LOGFIRE_PENDING_SPAN))
    }

    /// The owned twin.
    pub fn to_span(&self) -> Span {
        Span {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent_span_id: self.parent_span_id,
            trace_state: self.trace_state.to_string(),
            flags: self.flags,
            name: self.name.to_string(),
            kind: self.kind,
            start_time_unix_nano: self.start_time_unix_nano,
            end_time_unix_nano: self.end_time_unix_nano,
            attributes: self.attributes.to_owned_attributes(),
            dropped_attributes_count: self.dropped_attributes_count,
            events: self
                .events
                .iter()
                .map(|e| Event {
                    time_unix_nano: e.time_unix_nano,
                    name: e.name.to_string(),
                    attributes: owned_attributes(&e.attributes),
                    dropped_attributes_count: e.dropped_attributes_count,
                })
                .collect(),
            dropped_events_count: self.dropped_events_count,
            links: self
                .links
                .iter()
                .map(|l| Link {
                    trace_id: l.trace_id,
                    span_id: l.span_id,
                    trace_state: l.trace_state.to_string(),
                    attributes: owned_attributes(&l.attributes),
                    dropped_attributes_count: l.dropped_attributes_count,
                    flags: l.flags,
                })
                .collect(),
            dropped_links_count: self.dropped_links_count,
            status: Status {
                code: self.status.code,
                message: self.status.message.to_string(),
            },
        }
    }
}

/// Borrowed spans of one scope (owned scope: one per request part, not per span).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ScopeSpansRef<'a> {
    /// The scope.
    pub scope: Scope,
    /// Its spans.
    pub spans: Vec<SpanRef<'a>>,
}

/// Borrowed spans of one resource.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ResourceSpansRef<'a> {
    /// The resource.
    pub resource: Resource,
    /// Its scopes.
    pub scope_spans: Vec<ScopeSpansRef<'a>>,
}
