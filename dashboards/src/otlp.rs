//! A stored trace as OTLP/JSON `TracesData` (`GET /api/v1/traces/{trace_id}/otlp`).
//!
//! OTLP specification, "OTLP/HTTP" → "JSON Protobuf Encoding": lowerCamelCase field names,
//! trace and span ids as lowercase hex, 64-bit integers (`*UnixNano`, `intValue`) as decimal
//! strings, enums (`kind`, `status.code`) as numbers, `bytesValue` as base64. Spans are
//! grouped by resource, then by scope, in the order each first appears among the spans
//! (by start time); equal resources (or scopes) of different export requests share one
//! group. The document is accepted as it is by `POST /v1/traces` (OTLP/HTTP JSON), and
//! re-importing it stores the same spans: every field the read API shows is carried,
//! open spans keep `endTimeUnixNano` `"0"` (docs/design.md, Open spans, shape 1).

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use stallwatch_storage::model::{Event, Link, Resource, Scope, Span};
use stallwatch_storage::telemetry::{StoredSpan, TraceView};

use crate::wire::Attrs;

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

/// One resource group: the resource and its scope groups of spans.
struct ResGroup<'a> {
    resource: &'a Resource,
    scopes: Vec<(&'a Scope, Vec<&'a Span>)>,
}

/// The trace as `TracesData` (see the module doc).
pub(crate) struct TracesData<'a> {
    groups: Vec<ResGroup<'a>>,
}

impl<'a> TracesData<'a> {
    /// Groups the stored spans of `view` by resource and scope.
    pub(crate) fn new(view: &'a TraceView) -> Self {
        let mut groups: Vec<ResGroup<'a>> = Vec::new();
        for st in &view.spans {
            let StoredSpan {
                span,
                resource,
                scope,
                ..
            } = st;
            let gi = match groups.iter().position(|g| *g.resource == **resource) {
                Some(i) => i,
                None => {
                    groups.push(ResGroup {
                        resource,
                        scopes: Vec::new(),
                    });
                    groups.len() - 1
                }
            };
            let g = &mut groups[gi];
            match g.scopes.iter_mut().find(|(s, _)| **s == **scope) {
                Some((_, spans)) => spans.push(span),
                None => g.scopes.push((scope, vec![span])),
            }
        }
        Self { groups }
    }
}

impl Serialize for TracesData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("resourceSpans", &Seq(&self.groups, ResSpansJ))?;
        m.end()
    }
}

/// A sequence of `T`s serialized through the wrapper `W`.
struct Seq<'a, T, W>(&'a [T], W);

trait Wrap<T> {
    fn ser<S: Serializer>(&self, v: &T, s: S) -> Result<S::Ok, S::Error>;
}

impl<T, W: Wrap<T> + Copy> Serialize for Seq<'_, T, W> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct One<'b, T, W>(&'b T, W);
        impl<T, W: Wrap<T>> Serialize for One<'_, T, W> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.1.ser(self.0, s)
            }
        }
        let mut q = s.serialize_seq(Some(self.0.len()))?;
        for v in self.0 {
            q.serialize_element(&One(v, self.1))?;
        }
        q.end()
    }
}

#[derive(Clone, Copy)]
struct ResSpansJ;
impl Wrap<ResGroup<'_>> for ResSpansJ {
    fn ser<S: Serializer>(&self, g: &ResGroup<'_>, s: S) -> Result<S::Ok, S::Error> {
        struct ResJ<'a>(&'a Resource);
        impl Serialize for ResJ<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("attributes", &Attrs(&self.0.attributes))?;
                m.serialize_entry("droppedAttributesCount", &self.0.dropped_attributes_count)?;
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("resource", &ResJ(g.resource))?;
        m.serialize_entry("scopeSpans", &Seq(&g.scopes, ScopeSpansJ))?;
        m.serialize_entry("schemaUrl", &g.resource.schema_url)?;
        m.end()
    }
}

#[derive(Clone, Copy)]
struct ScopeSpansJ;
impl<'a> Wrap<(&'a Scope, Vec<&'a Span>)> for ScopeSpansJ {
    fn ser<S: Serializer>(&self, v: &(&'a Scope, Vec<&'a Span>), s: S) -> Result<S::Ok, S::Error> {
        struct ScopeJ<'a>(&'a Scope);
        impl Serialize for ScopeJ<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(4))?;
                m.serialize_entry("name", &self.0.name)?;
                m.serialize_entry("version", &self.0.version)?;
                m.serialize_entry("attributes", &Attrs(&self.0.attributes))?;
                m.serialize_entry("droppedAttributesCount", &self.0.dropped_attributes_count)?;
                m.end()
            }
        }
        let (scope, spans) = v;
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("scope", &ScopeJ(scope))?;
        m.serialize_entry("spans", &Seq(spans, SpanJ))?;
        m.serialize_entry("schemaUrl", &scope.schema_url)?;
        m.end()
    }
}

#[derive(Clone, Copy)]
struct SpanJ;
impl Wrap<&Span> for SpanJ {
    fn ser<S: Serializer>(&self, sp: &&Span, s: S) -> Result<S::Ok, S::Error> {
        let sp = *sp;
        let mut m = s.serialize_map(Some(17))?;
        m.serialize_entry("traceId", &Hex(&sp.trace_id.0))?;
        m.serialize_entry("spanId", &Hex(&sp.span_id.0))?;
        if !sp.trace_state.is_empty() {
            m.serialize_entry("traceState", &sp.trace_state)?;
        }
        if let Some(p) = &sp.parent_span_id {
            m.serialize_entry("parentSpanId", &Hex(&p.0))?;
        }
        m.serialize_entry("flags", &sp.flags)?;
        m.serialize_entry("name", &sp.name)?;
        m.serialize_entry("kind", &sp.kind)?;
        m.serialize_entry("startTimeUnixNano", &Dec(sp.start_time_unix_nano))?;
        m.serialize_entry("endTimeUnixNano", &Dec(sp.end_time_unix_nano))?;
        m.serialize_entry("attributes", &Attrs(&sp.attributes))?;
        m.serialize_entry("droppedAttributesCount", &sp.dropped_attributes_count)?;
        m.serialize_entry("events", &Seq(&sp.events, EventJ))?;
        m.serialize_entry("droppedEventsCount", &sp.dropped_events_count)?;
        m.serialize_entry("links", &Seq(&sp.links, LinkJ))?;
        m.serialize_entry("droppedLinksCount", &sp.dropped_links_count)?;
        struct StatusJ<'a>(&'a Span);
        impl Serialize for StatusJ<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("code", &self.0.status.code)?;
                m.serialize_entry("message", &self.0.status.message)?;
                m.end()
            }
        }
        m.serialize_entry("status", &StatusJ(sp))?;
        m.end()
    }
}

#[derive(Clone, Copy)]
struct EventJ;
impl Wrap<Event> for EventJ {
    fn ser<S: Serializer>(&self, e: &Event, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("timeUnixNano", &Dec(e.time_unix_nano))?;
        m.serialize_entry("name", &e.name)?;
        m.serialize_entry("attributes", &Attrs(&e.attributes))?;
        m.serialize_entry("droppedAttributesCount", &e.dropped_attributes_count)?;
        m.end()
    }
}

#[derive(Clone, Copy)]
struct LinkJ;
impl Wrap<Link> for LinkJ {
    fn ser<S: Serializer>(&self, l: &Link, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(6))?;
        m.serialize_entry("traceId", &Hex(&l.trace_id.0))?;
        m.serialize_entry("spanId", &Hex(&l.span_id.0))?;
        if !l.trace_state.is_empty() {
            m.serialize_entry("traceState", &l.trace_state)?;
        }
        m.serialize_entry("attributes", &Attrs(&l.attributes))?;
        m.serialize_entry("droppedAttributesCount", &l.dropped_attributes_count)?;
        m.serialize_entry("flags", &l.flags)?;
        m.end()
    }
}
