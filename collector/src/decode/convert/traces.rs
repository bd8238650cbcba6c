//! Trace exports → records: from prost's wire types ([`traces`], the whole-request
//! reference), scanned span by span from the protobuf body ([`traces_wire`]), or streamed
//! span by span from an OTLP/JSON body ([`traces_json`]). The streaming paths hand each
//! converted span to a [`SpanSink`] at once, so the caller decides what is held: the whole
//! [`TraceBatch`] ([`Collect`]) or encoded chunks (the ingest pipeline, issue 17 #14).

#[cfg(test)]
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::resource::v1 as pr;
use opentelemetry_proto::tonic::trace::v1 as pt;
use stallwatch_storage::model::{
    Event, Link, ResourceSpans, ScopeSpans, Span, SpanId, SpanRef, Status, TraceBatch, TraceId,
};

use super::{attributes, resource, scope, span_id, trace_id, Refusals};
use crate::decode::path::Path;
use crate::decode::{DecodeError, Decoded, Limits};
use stallwatch_storage::model::{Resource, Scope};

/// Where converted trace records go, in request order: a resource, then its scopes, each
/// followed by its spans. `'a` is the request body's lifetime: the protobuf decoder hands
/// over spans that borrow their strings from it.
pub trait SpanSink<'a> {
    /// A new `ResourceSpans` starts.
    fn resource(&mut self, resource: Resource);
    /// A new `ScopeSpans` of the current resource starts.
    fn scope(&mut self, scope: Scope);
    /// One accepted span of the current scope; `source_bytes` is its size in the request
    /// body (wire or JSON bytes), for the sink's chunking.
    ///
    /// Errors: what the sink itself fails with (it becomes the request's error).
    fn span(&mut self, span: Span, source_bytes: usize) -> Result<(), DecodeError>;
    /// [`SpanSink::span`] for a span whose strings borrow from the request body (the
    /// protobuf decoder's); by default made owned and handed to [`SpanSink::span`].
    ///
    /// Errors: as [`SpanSink::span`].
    fn span_ref(&mut self, span: SpanRef<'a>, source_bytes: usize) -> Result<(), DecodeError> {
        self.span(span.to_span(), source_bytes)
    }
}

/// A [`SpanSink`] collecting the whole request into one [`TraceBatch`].
#[derive(Debug, Default)]
pub struct Collect(pub TraceBatch);

impl SpanSink<'_> for Collect {
    fn resource(&mut self, resource: Resource) {
        self.0.resource_spans.push(ResourceSpans {
            resource,
            scope_spans: Vec::new(),
        });
    }
    fn scope(&mut self, scope: Scope) {
        if let Some(rs) = self.0.resource_spans.last_mut() {
            rs.scope_spans.push(ScopeSpans {
                scope,
                spans: Vec::new(),
            });
        }
    }
    fn span(&mut self, span: Span, _source_bytes: usize) -> Result<(), DecodeError> {
        if let Some(ss) = self
            .0
            .resource_spans
            .last_mut()
            .and_then(|rs| rs.scope_spans.last_mut())
        {
            ss.spans.push(span);
        }
        Ok(())
    }
}

/// Converts an OTLP/JSON trace export span by span into `sink` with the rules of
/// [`traces`]: the body is walked in place ([`crate::decode::json::walk`]), each span is
/// read into a small JSON tree and converted at once, so decoding never holds the whole
/// request's JSON tree or wire types (issue 17 #14).
pub(crate) fn traces_json<'a>(
    body: &'a [u8],
    limits: &Limits,
    sink: &mut dyn SpanSink<'a>,
) -> Result<Decoded<()>, DecodeError> {
    struct Visit<'s, 'a> {
        limits: Limits,
        sink: &'s mut dyn SpanSink<'a>,
        refusals: Refusals,
    }
    impl crate::decode::json::Envelope<pt::Span> for Visit<'_, '_> {
        fn resource(
            &mut self,
            r: Option<pr::Resource>,
            schema_url: String,
            p: &Path,
        ) -> Result<(), DecodeError> {
            let r = resource(r, schema_url, p, &self.limits)?;
            self.sink.resource(r);
            Ok(())
        }
        fn scope(
            &mut self,
            s: Option<pc::InstrumentationScope>,
            schema_url: String,
            p: &Path,
        ) -> Result<(), DecodeError> {
            let s = scope(s, schema_url, p, &self.limits)?;
            self.sink.scope(s);
            Ok(())
        }
        fn item(&mut self, sp: pt::Span, p: &Path, source_bytes: usize) -> Result<(), DecodeError> {
            if let Some(span) = span(sp, p, &self.limits, &mut self.refusals)? {
                self.sink.span(span, source_bytes)?;
            }
            Ok(())
        }
    }
    let mut v = Visit {
        limits: *limits,
        sink,
        refusals: Refusals::default(),
    };
    crate::decode::json::traces_walk(body, &mut v)?;
    Ok(v.refusals.into_decoded((), "span"))
}

/// Converts and validates a trace export. Spans with an empty or all-zero trace or span id
/// are refused one by one (partial success); wrong-length ids and over-deep attributes
/// refuse the whole request.
#[cfg(test)]
pub(crate) fn traces(
    req: ExportTraceServiceRequest,
    limits: &Limits,
) -> Result<Decoded<TraceBatch>, DecodeError> {
    let mut refusals = Refusals::default();
    let root = Path::ROOT;
    let prs = root.field("resourceSpans");
    let mut out = Vec::with_capacity(req.resource_spans.len());
    for (ri, rs) in req.resource_spans.into_iter().enumerate() {
        let pr = prs.index(ri);
        let resource = resource(rs.resource, rs.schema_url, &pr, limits)?;
        let pss = pr.field("scopeSpans");
        let mut scopes = Vec::with_capacity(rs.scope_spans.len());
        for (si, ss) in rs.scope_spans.into_iter().enumerate() {
            let ps = pss.index(si);
            let scope = scope(ss.scope, ss.schema_url, &ps, limits)?;
            let pspans = ps.field("spans");
            let mut spans = Vec::with_capacity(ss.spans.len());
            for (i, sp) in ss.spans.into_iter().enumerate() {
                let p = pspans.index(i);
                if let Some(span) = span(sp, &p, limits, &mut refusals)? {
                    spans.push(span);
                }
            }
            scopes.push(ScopeSpans { scope, spans });
        }
        out.push(ResourceSpans {
            resource,
            scope_spans: scopes,
        });
    }
    Ok(refusals.into_decoded(
        TraceBatch {
            resource_spans: out,
        },
        "span",
    ))
}

/// Decodes and converts a protobuf trace export one span at a time into `sink`, with the
/// rules of [`traces`]: the request is scanned in place ([`crate::decode::wire`]) and each
/// span is decoded from its own bytes straight into the record
/// ([`super::span_wire::span`]), so decoding holds one span, never the whole request's
/// wire types (issue 17 #14), and never builds prost's wire types for a span at all
/// (issue 16). Errors name the span's path, or the field's inside it.
pub(crate) fn traces_wire<'a>(
    body: &'a [u8],
    limits: &Limits,
    sink: &mut dyn SpanSink<'a>,
) -> Result<Decoded<()>, DecodeError> {
    Ok(traces_wire_part(body, limits, sink, WirePart::WHOLE)?.into_decoded((), "span"))
}

/// Where a span sits in a protobuf trace export: the indexes of its `ResourceSpans` in the
/// request, of its `ScopeSpans` in that resource, and of the span in that scope (the
/// indexes of the error paths). Ordered as the spans are on the wire.
pub(crate) type SpanCursor = (usize, usize, usize);

/// The spans of a protobuf trace export from `from` (inclusive; `None`: the first) up to
/// `to` (exclusive; `None`: past the last), for decoding one export in parts side by side
/// ([`wire_cuts`]). A part converts and hands to its sink only the resources and scopes
/// that hold its spans.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WirePart {
    /// The part's first span.
    pub from: Option<SpanCursor>,
    /// The next part's first span.
    pub to: Option<SpanCursor>,
}

impl WirePart {
    /// Every span.
    pub const WHOLE: WirePart = WirePart {
        from: None,
        to: None,
    };

    /// Whether `at` lies before this part's first span.
    fn before(&self, at: SpanCursor) -> bool {
        self.from.is_some_and(|from| at < from)
    }

    /// Whether `at` is at or past the next part's first span.
    fn past(&self, at: SpanCursor) -> bool {
        self.to.is_some_and(|to| at >= to)
    }
}

/// Cuts a protobuf trace export into at most `parts` parts of about equal span bytes, for
/// [`traces_wire_part`]: the first span of every part after the first, in wire order.
/// `None` when the body is not worth cutting (fewer than two spans in a part) or its
/// `ResourceSpans`, `ScopeSpans` or span fields cannot be walked: the whole decode then
/// reports what is wrong. Reads only field headers, never a span's contents.
pub(crate) fn wire_cuts(body: &[u8], parts: usize) -> Option<Vec<SpanCursor>> {
    use crate::decode::wire::{self, Fields};
    if parts < 2 {
        return None;
    }
    let mut spans: Vec<(SpanCursor, usize)> = Vec::new();
    let mut r = 0;
    for f in Fields::new(body) {
        let (field, v) = f.ok()?;
        if field != 1 {
            continue;
        }
        let rs = wire::len(v).ok()?;
        let mut s = 0;
        for f in Fields::new(rs) {
            let (field, v) = f.ok()?;
            if field != 2 {
                continue;
            }
            let ss = wire::len(v).ok()?;
            let mut i = 0;
            for f in Fields::new(ss) {
                let (field, v) = f.ok()?;
                if field != 2 {
                    continue;
                }
                spans.push(((r, s, i), wire::len(v).ok()?.len()));
                i += 1;
            }
            s += 1;
        }
        r += 1;
    }
    let parts = parts.min(spans.len() / 2);
    if parts < 2 {
        return None;
    }
    let total: usize = spans.iter().map(|(_, n)| n).sum();
    let mut cuts = Vec::with_capacity(parts - 1);
    let mut before = 0;
    for (at, n) in spans {
        // This span starts the next part once the parts so far hold their share.
        let part = cuts.len() + 1;
        if part < parts && before >= total / parts * part && before > 0 {
            cuts.push(at);
        }
        before += n;
    }
    (!cuts.is_empty()).then_some(cuts)
}

/// [`traces_wire`] for the spans of one [`WirePart`], returning what it refused
/// ([`Refusals::merge`] joins the parts' in wire order).
pub(crate) fn traces_wire_part<'a>(
    body: &'a [u8],
    limits: &Limits,
    sink: &mut dyn SpanSink<'a>,
    part: WirePart,
) -> Result<Refusals, DecodeError> {
    use crate::decode::wire::{self, Fields};
    use prost::Message;
    const WHAT: &str = "ExportTraceServiceRequest";
    let bad = |p: &Path, why: &str| crate::decode::wire_error(WHAT, Some(p), why);
    let mut refusals = Refusals::default();
    let root = Path::ROOT;
    let prs = root.field("resourceSpans");
    let mut n_resources = 0;
    for f in Fields::new(body) {
        let (field, v) = f.map_err(|e| bad(&root, e))?;
        if field != 1 {
            continue;
        }
        let r = n_resources;
        if part.past((r, 0, 0)) {
            break;
        }
        n_resources += 1;
        if part.before((r, usize::MAX, 0)) {
            continue;
        }
        let pr = prs.index(r);
        let rs = wire::len(v).map_err(|e| bad(&pr, e))?;
        // First pass: the resource and schema URL (they may follow the scopes on the wire).
        let mut res: Option<pr::Resource> = None;
        let mut schema_url = String::new();
        for f in Fields::new(rs) {
            let (field, v) = f.map_err(|e| bad(&pr, e))?;
            match field {
                1 => {
                    let b = wire::len(v).map_err(|e| bad(&pr.field("resource"), e))?;
                    res.get_or_insert_with(Default::default)
                        .merge(b)
                        .map_err(|e| bad(&pr.field("resource"), &e.to_string()))?;
                }
                3 => schema_url = wire::string(v).map_err(|e| bad(&pr.field("schemaUrl"), e))?,
                _ => {}
            }
        }
        sink.resource(resource(res, schema_url, &pr, limits)?);
        let pss = pr.field("scopeSpans");
        let mut n_scope = 0;
        for f in Fields::new(rs) {
            let (field, v) = f.map_err(|e| bad(&pr, e))?;
            if field != 2 {
                continue;
            }
            let sc_at = n_scope;
            if part.past((r, sc_at, 0)) {
                return Ok(refusals);
            }
            n_scope += 1;
            if part.before((r, sc_at, usize::MAX)) {
                continue;
            }
            let ps = pss.index(sc_at);
            let ss = wire::len(v).map_err(|e| bad(&ps, e))?;
            let mut sc: Option<pc::InstrumentationScope> = None;
            let mut schema_url = String::new();
            for f in Fields::new(ss) {
                let (field, v) = f.map_err(|e| bad(&ps, e))?;
                match field {
                    1 => {
                        let b = wire::len(v).map_err(|e| bad(&ps.field("scope"), e))?;
                        sc.get_or_insert_with(Default::default)
                            .merge(b)
                            .map_err(|e| bad(&ps.field("scope"), &e.to_string()))?;
                    }
                    3 => {
                        schema_url = wire::string(v).map_err(|e| bad(&ps.field("schemaUrl"), e))?
                    }
                    _ => {}
                }
            }
            sink.scope(scope(sc, schema_url, &ps, limits)?);
            let pspans = ps.field("spans");
            let mut i = 0;
            for f in Fields::new(ss) {
                let (field, v) = f.map_err(|e| bad(&ps, e))?;
                if field != 2 {
                    continue;
                }
                let at = i;
                if part.past((r, sc_at, at)) {
                    return Ok(refusals);
                }
                i += 1;
                if part.before((r, sc_at, at)) {
                    continue;
                }
                let p = pspans.index(at);
                let b = wire::len(v).map_err(|e| bad(&p, e))?;
                if let Some(span) = super::span_wire::span(b, &p, limits, &mut refusals)? {
                    sink.span_ref(span, b.len())?;
                }
            }
        }
    }
    Ok(refusals)
}

fn span(
    sp: pt::Span,
    p: &Path,
    limits: &Limits,
    refusals: &mut Refusals,
) -> Result<Option<Span>, DecodeError> {
    let tid = trace_id(&sp.trace_id, &p.field("traceId"))?;
    let sid = span_id(&sp.span_id, &p.field("spanId"))?;
    // Empty or all-zero parent: a root span.
    let parent = span_id(&sp.parent_span_id, &p.field("parentSpanId"))?;
    let attrs = attributes(sp.attributes, &p.field("attributes"), limits)?;
    let pe = p.field("events");
    let mut events = Vec::with_capacity(sp.events.len());
    for (i, e) in sp.events.into_iter().enumerate() {
        let pi = pe.index(i);
        events.push(Event {
            time_unix_nano: e.time_unix_nano,
            name: e.name,
            attributes: attributes(e.attributes, &pi.field("attributes"), limits)?,
            dropped_attributes_count: e.dropped_attributes_count,
        });
    }
    let pl = p.field("links");
    let mut links = Vec::with_capacity(sp.links.len());
    for (i, l) in sp.links.into_iter().enumerate() {
        let pi = pl.index(i);
        // A link to an invalid (empty/zero) context is legal (OTel spec: such links are
        // kept when they carry attributes or trace state); wrong lengths are not.
        let ltid = trace_id(&l.trace_id, &pi.field("traceId"))?.unwrap_or_default();
        let lsid = span_id(&l.span_id, &pi.field("spanId"))?.unwrap_or_default();
        links.push(Link {
            trace_id: ltid,
            span_id: lsid,
            trace_state: l.trace_state,
            attributes: attributes(l.attributes, &pi.field("attributes"), limits)?,
            dropped_attributes_count: l.dropped_attributes_count,
            flags: l.flags,
        });
    }
    let status = sp.status.unwrap_or_default();
    let mut span = Span {
        trace_id: TraceId::default(),
        span_id: SpanId::default(),
        parent_span_id: parent,
        trace_state: sp.trace_state,
        flags: sp.flags,
        name: sp.name,
        kind: sp.kind,
        start_time_unix_nano: sp.start_time_unix_nano,
        end_time_unix_nano: sp.end_time_unix_nano,
        attributes: attrs,
        dropped_attributes_count: sp.dropped_attributes_count,
        events,
        dropped_events_count: sp.dropped_events_count,
        links,
        dropped_links_count: sp.dropped_links_count,
        status: Status {
            code: status.code,
            message: status.message,
        },
    };
    let times = (
        span.name.as_str(),
        span.start_time_unix_nano,
        span.end_time_unix_nano,
    );
    let Some((trace_id, span_id)) = accept(tid, sid, times, p, refusals) else {
        return Ok(None);
    };
    span.trace_id = trace_id;
    span.span_id = span_id;
    Ok(Some(span))
}

/// The per-span refusals both decoders share, after every request-level check passed:
/// an empty or all-zero trace or span id (`tid`, `sid` from [`trace_id`], [`span_id`]) and
/// an end before the start refuse the span alone (partial success). Gives the ids to
/// store the span under, or `None` when it is refused.
pub(super) fn accept(
    tid: Option<TraceId>,
    sid: Option<SpanId>,
    (name, start, end): (&str, u64, u64),
    p: &Path,
    refusals: &mut Refusals,
) -> Option<(TraceId, SpanId)> {
    let (Some(trace_id), Some(span_id)) = (tid, sid) else {
        let which = if tid.is_none() { "traceId" } else { "spanId" };
        refusals.refuse(format!("{which} empty or all zero (first at {p}.{which})"));
        return None;
    };
    // An end before the start is no duration at all: refused one by one like a bad id
    // (docs/design.md, "Back-pressure and limits"). `end == 0` is an open-span snapshot.
    if end != 0 && end < start {
        refusals.end_before_start += 1;
        refusals.refuse(format!(
            "span {name:?} (spanId {}) ends before it starts: endTimeUnixNano {end} < startTimeUnixNano {start} (first at {p})",
            hex::encode(span_id.0),
        ));
        return None;
    }
    Some((trace_id, span_id))
}
