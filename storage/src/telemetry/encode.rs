//! Caller-side encoding of export requests into what the writer thread stores.
//!
//! The CPU-heavy part of a write (postcard encoding, term extraction, in-request
//! deduplication) runs here, on the caller's task, so the single writer thread only runs
//! SQL. A trace request (or each ~1 MiB chunk of a large one, [`super::TraceChunk`])
//! becomes one `span_batches` row: a per-span index
//! ([`BatchIndex`], small, decoded by searches) and a payload holding the resources and
//! scopes once plus each span's postcard body, length-delimited so a duplicate can be cut
//! out by slicing.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::bloom::IdBuild;
pub(crate) use super::index_blob::{decode_index, encode_index, encode_index_by_trace};
use super::schema::{
    PAIR_SEP, TERM_SERVICE, TERM_SERVICE_SPAN, TERM_SPAN_NAME, TERM_STATUS, TERM_TOOL,
};
use crate::model::{
    attr, AnyValue, KeyValue, LogBatch, LogRecord, MetricBatch, MetricPoint, Resource,
    ResourceSpansRef, Scope, Span, SpanRef, TraceBatch, STATUS_ERROR,
};

/// Term keys that come from attributes, besides `service.name` and `gen_ai.tool.name`.
const ATTR_TERM_KEYS: [&str; 3] = ["error.type", "process.pid", "stallwatch.runner.id"];

/// The per-span index of one stored batch (`span_batches.idx`, stored in columns with the
/// ids raw and the rest as varints: `index_blob`, [`encode_index`], [`decode_index`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct BatchIndex {
    /// The batch's terms `(key, value)`; spans refer to them by position.
    pub terms: Vec<(String, String)>,
    /// One entry per stored span copy, in payload order.
    pub spans: Vec<IdxSpan>,
}

/// One span copy in a [`BatchIndex`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct IdxSpan {
    /// Trace id.
    pub trace_id: [u8; 16],
    /// Span id.
    pub span_id: [u8; 8],
    /// True when the span has no parent.
    pub root: bool,
    /// Start, ns since the Unix epoch.
    pub start: u64,
    /// End, ns since the Unix epoch; 0 while open.
    pub end: u64,
    /// Status code.
    pub status: i32,
    /// Index of the scope in the payload header.
    pub scope: u32,
    /// Offset of the span body in the payload, bytes.
    pub off: u32,
    /// Length of the span body, bytes.
    pub len: u32,
    /// Term index of the span name.
    pub name: u32,
    /// Term index of the resource's service name.
    pub service: u32,
    /// Every term of the span (name, service, pair, tool, attributes, status).
    pub terms: Vec<u32>,
}

impl IdxSpan {
    /// True when the copy has an end time.
    pub fn ended(&self) -> bool {
        self.end != 0
    }
    /// True when the copy has status ERROR.
    pub fn error(&self) -> bool {
        self.status == STATUS_ERROR
    }
    /// Duration, ns (0 while open or when the end precedes the start).
    pub fn duration(&self) -> u64 {
        if self.end == 0 {
            0
        } else {
            self.end.saturating_sub(self.start)
        }
    }
}

/// Payload header (owned form for decoding).
#[derive(Deserialize)]
pub(crate) struct Header {
    /// Resources of the batch.
    pub resources: Vec<Resource>,
    /// Scopes of the batch with the index of their resource.
    pub scopes: Vec<(u32, Scope)>,
}

/// Payload header (borrowed form for encoding; same postcard bytes as [`Header`]).
#[derive(Serialize)]
struct HeaderRef<'a> {
    resources: Vec<&'a Resource>,
    scopes: Vec<(u32, &'a Scope)>,
}

/// Each trace id of a batch with the positions of its spans in `BatchIndex::spans`, traces
/// in order of first appearance.
pub(crate) type TraceGroups = Vec<([u8; 16], Vec<u32>)>;

/// A trace request ready for the writer.
#[derive(Debug)]
pub(crate) struct PreparedTraces {
    /// The per-span index (span bodies at `off..off + len` of the payload before
    /// compression).
    pub index: BatchIndex,
    /// `index` as stored ([`encode_index`]), made here on the caller's task so the writer
    /// thread only copies it.
    pub index_blob: Vec<u8>,
    /// The payload as stored: `[u32 LE header length][header][span bodies]`, compressed
    /// as one zstd frame ([`compress_payload`]; [`payload_bytes`] gives it back).
    pub payload: Vec<u8>,
    /// Length of the header part including its 4-byte prefix, before compression.
    pub header_len: usize,
    /// Span copies grouped by trace, in order of first appearance: positions in
    /// `index.spans`.
    pub traces: TraceGroups,
    /// Copies dropped as duplicates inside the request itself.
    pub duplicates: u64,
}

impl PreparedTraces {
    /// Bytes this request will occupy.
    pub fn bytes(&self) -> usize {
        self.payload.len() + self.index.spans.len() * 48
    }

    /// Keeps only the copies whose `keep[i]` is true: the payload is decompressed, sliced
    /// and compressed again and the index encoded again (only a request that repeats
    /// stored spans, an exporter's retry, pays for it).
    ///
    /// Errors: the payload does not decompress (a bug: it was compressed here), as text.
    pub fn retain(&mut self, keep: &[bool]) -> Result<(), String> {
        let raw = payload_bytes(&self.payload)?;
        let mut payload = Vec::with_capacity(raw.len());
        payload.extend_from_slice(&raw[..self.header_len]);
        let spans = std::mem::take(&mut self.index.spans);
        for (mut s, k) in spans.into_iter().zip(keep.iter()) {
            if !*k {
                continue;
            }
            let (off, len) = (s.off as usize, s.len as usize);
            s.off = payload.len() as u32;
            payload.extend_from_slice(&raw[off..off + len]);
            self.index.spans.push(s);
        }
        drop(raw);
        self.payload = compress_payload(&payload)?;
        self.index_blob = encode_index(&self.index);
        Ok(())
    }
}

/// Builds the local term table of a batch. Looked up several times per span, so it
/// hashes with foldhash (seeded per process) rather than SipHash (issue 16's profile).
#[derive(Default)]
pub(crate) struct TermTable {
    by_key: foldhash::HashMap<&'static str, foldhash::HashMap<String, u32>>,
    terms: Vec<(String, String)>,
    /// The key of each of `terms`, as the constant it was looked up with (for
    /// [`TermTable::id`] when tables of parts are joined).
    keys: Vec<&'static str>,
}

impl TermTable {
    fn id(&mut self, key: &'static str, value: &str) -> u32 {
        let m = self.by_key.entry(key).or_default();
        if let Some(id) = m.get(value) {
            return *id;
        }
        let id = self.terms.len() as u32;
        m.insert(value.to_string(), id);
        self.terms.push((key.to_string(), value.to_string()));
        self.keys.push(key);
        id
    }
}

/// The indexed attribute keys: each with its bit in a [`KeysSeen`] mask and the term key
/// it is stored under. Every key here is one of
/// [`crate::model::encoded::LOOKED_UP_KEYS`], the only attributes a borrowed span's
/// terms are taken from (a test holds them to that).
const TERM_KEYS: [(&str, u8, &str); 5] = [
    ("error.type", 1, ATTR_TERM_KEYS[0]),
    ("process.pid", 2, ATTR_TERM_KEYS[1]),
    ("stallwatch.runner.id", 4, ATTR_TERM_KEYS[2]),
    ("gen_ai.tool.name", 8, TERM_TOOL),
    ("service.name", 16, TERM_SERVICE),
];

/// The term key an indexed attribute key is stored under, with its bit in a
/// [`KeysSeen`] mask, or `None` for a key that is not indexed ([`TERM_KEYS`]).
fn term_key(key: &[u8]) -> Option<(u8, &'static str)> {
    TERM_KEYS
        .iter()
        .find(|(k, _, _)| k.as_bytes() == key)
        .map(|&(_, bit, term)| (bit, term))
}

/// The indexed keys already taken from one attribute list (bits of [`term_key`]).
///
/// Only the first attribute of an indexed key in a list gives a term: the OpenTelemetry
/// specification requires the keys of an attribute collection to be unique (common
/// specification, "Attribute Collections"), and without this rule an exporter that repeats
/// a key with many values (a resource with 100k `process.pid` attributes) made every span
/// of its resource carry all of those terms, an allocation the size of spans × values, and
/// a quadratic search of each span's list. A span's terms are so at most its resource's
/// and its own indexed keys plus its name, pair and status: ≤ 14.
type KeysSeen = u8;

/// Pushes the term of one attribute, if its key is indexed, not already taken from this
/// list (`seen`), and its value has a text.
fn attr_term<'v>(
    table: &mut TermTable,
    key: &[u8],
    text: impl FnOnce() -> Option<Cow<'v, str>>,
    seen: &mut KeysSeen,
    out: &mut Vec<u32>,
) {
    if let Some((bit, key)) = term_key(key) {
        if *seen & bit != 0 {
            return;
        }
        *seen |= bit;
        if let Some(v) = text() {
            let id = table.id(key, &v);
            if !out.contains(&id) {
                out.push(id);
            }
        }
    }
}

/// [`AnyValue::index_text`] without copying a string value.
fn value_index_text(v: &AnyValue) -> Option<Cow<'_, str>> {
    match v {
        AnyValue::String(s) => Some(Cow::Borrowed(s)),
        v => v.index_text().map(Cow::Owned),
    }
}

/// Terms from indexed attribute keys present in `attrs`.
fn attr_terms(table: &mut TermTable, attrs: &[KeyValue], out: &mut Vec<u32>) {
    let mut seen = 0;
    for kv in attrs {
        attr_term(
            table,
            kv.key.as_bytes(),
            || value_index_text(&kv.value),
            &mut seen,
            out,
        );
    }
}

/// What the index and the deduplication read of a span.
#[derive(Clone, Copy)]
pub(crate) struct SpanHead {
    /// Trace id.
    trace_id: [u8; 16],
    /// Span id.
    span_id: [u8; 8],
    /// True when the span has no parent.
    root: bool,
    /// Start, ns since the Unix epoch.
    start: u64,
    /// End, ns since the Unix epoch; 0 while open.
    end: u64,
    /// Status code.
    status: i32,
}

/// A span as the encoder reads it: the owned [`Span`] (internal writers, OTLP/JSON) or the
/// borrowed [`SpanRef`] (protobuf exports, issue 16). Both serialize to the same postcard
/// bytes, so the stored body is the same whichever was encoded.
pub(crate) trait StoredSpan: Serialize {
    /// Ids, times and status.
    fn head(&self) -> SpanHead;
    /// Span name.
    fn span_name(&self) -> &str;
    /// Pushes the terms of the span's indexed attributes.
    fn attr_terms(&self, table: &mut TermTable, out: &mut Vec<u32>);
    /// Appends the span's stored body (its postcard bytes) to `out`.
    ///
    /// Errors: a postcard failure (a bug), as text.
    fn write_body(&self, out: &mut Vec<u8>) -> Result<(), String>;
}

/// [`StoredSpan::head`] of a [`Span`] or [`SpanRef`] (same field names).
macro_rules! span_head {
    ($s:expr) => {
        SpanHead {
            trace_id: $s.trace_id.0,
            span_id: $s.span_id.0,
            root: $s.parent_span_id.is_none(),
            start: $s.start_time_unix_nano,
            end: $s.end_time_unix_nano,
            status: $s.status.code,
        }
    };
}

impl StoredSpan for Span {
    fn head(&self) -> SpanHead {
        span_head!(self)
    }
    fn span_name(&self) -> &str {
        &self.name
    }
    fn attr_terms(&self, table: &mut TermTable, out: &mut Vec<u32>) {
        attr_terms(table, &self.attributes, out);
    }
    fn write_body(&self, out: &mut Vec<u8>) -> Result<(), String> {
        *out = postcard::to_extend(self, std::mem::take(out)).map_err(|e| e.to_string())?;
        Ok(())
    }
}

impl StoredSpan for SpanRef<'_> {
    fn head(&self) -> SpanHead {
        span_head!(self)
    }
    fn span_name(&self) -> &str {
        self.name
    }
    fn attr_terms(&self, table: &mut TermTable, out: &mut Vec<u32>) {
        let mut seen = 0;
        for (key, value) in self.attributes.looked_up() {
            attr_term(table, key.as_bytes(), || value.index_text(), &mut seen, out);
        }
    }
    fn write_body(&self, out: &mut Vec<u8>) -> Result<(), String> {
        super::span_body::write_span(self, out);
        Ok(())
    }
}

/// One resource of a request being encoded, with its scopes and their spans.
pub(crate) struct Group<'b, S> {
    /// The resource.
    pub resource: &'b Resource,
    /// Its scopes, each with its spans.
    pub scopes: Vec<(&'b Scope, &'b [S])>,
}

/// (trace id, span id) → (flat index of the kept copy, whether that copy is ended).
type SeenSpans = HashMap<([u8; 16], [u8; 8]), (usize, bool), IdBuild>;

/// Encodes an owned trace export ([`prepare_spans`]).
///
/// Errors: as [`prepare_spans`].
pub(crate) fn prepare_traces(batch: &TraceBatch) -> Result<PreparedTraces, String> {
    let groups: Vec<Group<'_, Span>> = batch
        .resource_spans
        .iter()
        .map(|rs| Group {
            resource: &rs.resource,
            scopes: rs
                .scope_spans
                .iter()
                .map(|ss| (&ss.scope, ss.spans.as_slice()))
                .collect(),
        })
        .collect();
    prepare_spans(&groups)
}

/// Encodes a protobuf export's borrowed spans ([`prepare_spans`]).
///
/// Errors: as [`prepare_spans`].
pub(crate) fn prepare_borrowed(parts: &[ResourceSpansRef<'_>]) -> Result<PreparedTraces, String> {
    prepare_spans(&borrowed_groups(parts))
}

/// The encoder's view of borrowed spans.
pub(crate) fn borrowed_groups<'b, 'a>(
    parts: &'b [ResourceSpansRef<'a>],
) -> Vec<Group<'b, SpanRef<'a>>> {
    parts
        .iter()
        .map(|rs| Group {
            resource: &rs.resource,
            scopes: rs
                .scope_spans
                .iter()
                .map(|ss| (&ss.scope, ss.spans.as_slice()))
                .collect(),
        })
        .collect()
}

/// Encodes a trace export. Duplicates inside the request are resolved here with the same
/// rules as the writer (an ended copy wins over an open one; otherwise the first wins).
///
/// Errors: a postcard failure (a bug), as text.
pub(crate) fn prepare_spans<S: StoredSpan>(
    groups: &[Group<'_, S>],
) -> Result<PreparedTraces, String> {
    let flat = || {
        groups
            .iter()
            .flat_map(|g| g.scopes.iter().flat_map(|(_, spans)| spans.iter()))
    };
    // 1. in-request deduplication over the flat span order
    let total = flat().count();
    let mut keep = vec![true; total];
    let mut duplicates = 0u64;
    {
        let mut seen: SeenSpans = HashMap::with_capacity_and_hasher(total, IdBuild::default());
        for (i, s) in flat().enumerate() {
            let h = s.head();
            let (key, ended) = ((h.trace_id, h.span_id), h.end != 0);
            match seen.get(&key).copied() {
                None => {
                    seen.insert(key, (i, ended));
                }
                Some((prev, prev_ended)) => {
                    duplicates += 1;
                    if !prev_ended && ended {
                        keep[prev] = false;
                        seen.insert(key, (i, true));
                    } else {
                        keep[i] = false;
                    }
                }
            }
        }
    }

    // 2. header first (it only borrows the resources and scopes), then each span's body
    //    appended after it: no second copy of the bodies
    let mut header = HeaderRef {
        resources: Vec::with_capacity(groups.len()),
        scopes: Vec::new(),
    };
    for (ri, g) in groups.iter().enumerate() {
        header.resources.push(g.resource);
        for (scope, _) in &g.scopes {
            header.scopes.push((ri as u32, *scope));
        }
    }
    let head = postcard::to_allocvec(&header).map_err(|e| e.to_string())?;
    let header_len = 4 + head.len();
    let mut bodies: Vec<u8> = Vec::with_capacity(header_len + total * 400);
    bodies.extend_from_slice(&(head.len() as u32).to_le_bytes());
    bodies.extend_from_slice(&head);
    drop(head);
    let mut table = TermTable::default();
    let mut spans: Vec<IdxSpan> = Vec::with_capacity(total);
    encode_groups(groups, Some(&keep), &mut table, &mut bodies, &mut spans)?;
    let payload = compress_payload(&bodies)?;
    drop(bodies);
    let index = BatchIndex {
        terms: table.terms,
        spans,
    };
    // 3. the stored index, and the spans grouped by trace (the encoder numbers the traces)
    let (index_blob, traces) = encode_index_by_trace(&index);
    Ok(PreparedTraces {
        index,
        index_blob,
        payload,
        header_len,
        traces,
        duplicates,
    })
}

/// Appends the bodies of the spans of `groups` that `keep` keeps (all without it, in the
/// flat span order) to `bodies` and their index entries to `spans`: `off` is the body's
/// offset in `bodies`, `scope` the scope's number in `groups` (from 0), term ids are
/// `table`'s.
///
/// Errors: a postcard failure (a bug), as text.
fn encode_groups<S: StoredSpan>(
    groups: &[Group<'_, S>],
    keep: Option<&[bool]>,
    table: &mut TermTable,
    bodies: &mut Vec<u8>,
    spans: &mut Vec<IdxSpan>,
) -> Result<(), String> {
    let mut flat_i = 0usize;
    let mut si = 0u32;
    for g in groups {
        let service = g.resource.service_name();
        let service_term = table.id(TERM_SERVICE, service);
        let mut res_terms = vec![service_term];
        attr_terms(table, &g.resource.attributes, &mut res_terms);
        let mut pair = String::with_capacity(service.len() + 32);
        // The resource's few span names, each with its name and (service, name) terms: one
        // lookup per span instead of two, and no pair text built per span.
        let mut name_terms: foldhash::HashMap<&str, (u32, u32)> = Default::default();
        for (_, scope_spans) in &g.scopes {
            for s in scope_spans.iter() {
                let kept = keep.is_none_or(|k| k[flat_i]);
                flat_i += 1;
                if !kept {
                    continue;
                }
                let off = bodies.len();
                s.write_body(bodies)?;
                let span_name = s.span_name();
                let (name, pair_id) = match name_terms.get(span_name) {
                    Some(&ids) => ids,
                    None => {
                        let name = table.id(TERM_SPAN_NAME, span_name);
                        pair.clear();
                        pair.push_str(service);
                        pair.push(PAIR_SEP);
                        pair.push_str(span_name);
                        let ids = (name, table.id(TERM_SERVICE_SPAN, &pair));
                        name_terms.insert(span_name, ids);
                        ids
                    }
                };
                let mut terms = Vec::with_capacity(res_terms.len() + 4);
                terms.extend_from_slice(&res_terms);
                terms.push(name);
                terms.push(pair_id);
                s.attr_terms(table, &mut terms);
                let h = s.head();
                if h.status == STATUS_ERROR {
                    terms.push(table.id(TERM_STATUS, "error"));
                }
                spans.push(IdxSpan {
                    trace_id: h.trace_id,
                    span_id: h.span_id,
                    root: h.root,
                    start: h.start,
                    end: h.end,
                    status: h.status,
                    scope: si,
                    off: off as u32,
                    len: (bodies.len() - off) as u32,
                    name,
                    service: service_term,
                    terms,
                });
            }
            si += 1;
        }
    }
    Ok(())
}

/// One part of a trace export (a run of its spans in wire order) encoded on its own, on
/// the thread that decoded it, for [`join_parts`]: with one export in flight, encoding and
/// compressing its payload were a third of the request's serial time while the other
/// core idled (issue 16).
#[derive(Debug)]
pub(crate) struct EncodedPart {
    /// The part's span bodies, back to back, as one zstd frame ([`compress_payload`]).
    frame: Vec<u8>,
    /// Bytes of the bodies before compression.
    raw_len: usize,
    /// Index entries: `off` from the part's first body, `scope` the part's own scope
    /// number (from 0), term ids `table`'s.
    spans: Vec<IdxSpan>,
    /// The part's terms.
    table: TermTable,
    /// Scopes the part holds (with the first one if it continues the part before).
    scopes: u32,
    /// True when its first scope is the last scope of the part before (the export was cut
    /// inside that scope).
    continues_scope: bool,
    /// (trace id, span id) of the part's spans, for the duplicate check across parts.
    keys: std::collections::HashSet<([u8; 16], [u8; 8]), IdBuild>,
    /// True when two of the part's spans share (trace id, span id).
    duplicate: bool,
}

impl std::fmt::Debug for TermTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.terms).finish()
    }
}

/// Encodes one part of an export ([`EncodedPart`]); `continues_scope` as its field.
///
/// Errors: a postcard failure (a bug), as text.
pub(crate) fn encode_part<S: StoredSpan>(
    groups: &[Group<'_, S>],
    continues_scope: bool,
) -> Result<EncodedPart, String> {
    let total: usize = groups
        .iter()
        .flat_map(|g| g.scopes.iter().map(|(_, s)| s.len()))
        .sum();
    let mut keys: std::collections::HashSet<([u8; 16], [u8; 8]), IdBuild> =
        std::collections::HashSet::with_capacity_and_hasher(total, IdBuild::default());
    let mut duplicate = false;
    for g in groups {
        for (_, spans) in &g.scopes {
            for s in spans.iter() {
                let h = s.head();
                duplicate |= !keys.insert((h.trace_id, h.span_id));
            }
        }
    }
    let mut table = TermTable::default();
    let mut bodies: Vec<u8> = Vec::with_capacity(total * 400);
    let mut spans: Vec<IdxSpan> = Vec::with_capacity(total);
    encode_groups(groups, None, &mut table, &mut bodies, &mut spans)?;
    let frame = compress_payload(&bodies)?;
    Ok(EncodedPart {
        frame,
        raw_len: bodies.len(),
        spans,
        table,
        scopes: groups.iter().map(|g| g.scopes.len() as u32).sum(),
        continues_scope,
        keys,
        duplicate,
    })
}

/// Joins the parts of one export, in wire order, into what [`prepare_spans`] makes of the
/// whole of it: the same index (terms numbered in order of first appearance over the
/// whole export) and the same raw payload, stored as several zstd frames (the header's,
/// then each part's; they decompress to the concatenation, RFC 8878 section 3.1).
/// `resources` and `scopes` are the whole export's header (a scope's resource by
/// position); a part's first scope that `continues_scope` is the part before's last.
///
/// Answers `None` when two spans of the export share (trace id, span id): the caller
/// encodes the export whole, which resolves them ([`prepare_spans`]).
///
/// Errors: more parts than a payload may hold frames ([`MAX_PAYLOAD_FRAMES`]), the parts'
/// scopes do not add up to `scopes` (bugs), a postcard failure, as text.
pub(crate) fn join_parts(
    resources: &[&Resource],
    scopes: &[(u32, &Scope)],
    parts: Vec<EncodedPart>,
) -> Result<Option<PreparedTraces>, String> {
    if parts.len() + 1 > MAX_PAYLOAD_FRAMES {
        return Err(format!(
            "{} parts make more than {MAX_PAYLOAD_FRAMES} payload frames",
            parts.len()
        ));
    }
    if parts.iter().any(|p| p.duplicate) {
        return Ok(None);
    }
    for (k, p) in parts.iter().enumerate().skip(1) {
        let before = &parts[..k];
        if p.spans.iter().any(|s| {
            before
                .iter()
                .any(|b| b.keys.contains(&(s.trace_id, s.span_id)))
        }) {
            return Ok(None);
        }
    }
    let head = postcard::to_allocvec(&HeaderRef {
        resources: resources.to_vec(),
        scopes: scopes.to_vec(),
    })
    .map_err(|e| e.to_string())?;
    let header_len = 4 + head.len();
    let mut header = Vec::with_capacity(header_len);
    header.extend_from_slice(&(head.len() as u32).to_le_bytes());
    header.extend_from_slice(&head);
    drop(head);
    let mut payload = compress_payload(&header)?;
    payload.reserve(parts.iter().map(|p| p.frame.len()).sum());
    let mut table = TermTable::default();
    let mut spans = Vec::with_capacity(parts.iter().map(|p| p.spans.len()).sum());
    let (mut off, mut scope_start) = (header_len, 0u32);
    for (k, p) in parts.into_iter().enumerate() {
        if k > 0 && p.continues_scope {
            scope_start = scope_start
                .checked_sub(1)
                .ok_or("a part continues a scope but none came before it")?;
        }
        let ids: Vec<u32> = p
            .table
            .keys
            .iter()
            .zip(&p.table.terms)
            .map(|(key, (_, value))| table.id(key, value))
            .collect();
        let id = |t: u32| {
            ids.get(t as usize)
                .copied()
                .ok_or("a part's term out of range")
        };
        for mut s in p.spans {
            s.off = u32::try_from(off + s.off as usize).map_err(|_| "payload over 4 GiB")?;
            s.scope += scope_start;
            s.name = id(s.name)?;
            s.service = id(s.service)?;
            for t in &mut s.terms {
                *t = id(*t)?;
            }
            spans.push(s);
        }
        payload.extend_from_slice(&p.frame);
        off += p.raw_len;
        scope_start += p.scopes;
    }
    if scope_start as usize != scopes.len() {
        return Err(format!(
            "the parts hold {scope_start} scopes, the header {}",
            scopes.len()
        ));
    }
    let index = BatchIndex {
        terms: table.terms,
        spans,
    };
    let (index_blob, traces) = encode_index_by_trace(&index);
    Ok(Some(PreparedTraces {
        index,
        index_blob,
        payload,
        header_len,
        traces,
        duplicates: 0,
    }))
}

/// zstd level of the stored trace payloads: a "fast" (negative) level. On otlp-blast's
/// spans (random ids and attribute values; 200 stored payloads of 174 KB, `zstd -b`, this
/// 2-core machine) level -7 stores 2.47x smaller at ~1.2 GB/s, level -3 2.60x at ~0.7 GB/s,
/// level 1 3.0x at ~0.3 GB/s. Compression was ~12% of ingest CPU at -3, and the writer's
/// cost per stored byte is small (a payload left out of SQLite altogether saved ~3%), so the
/// faster level wins (issue 16).
pub(crate) const PAYLOAD_ZSTD_LEVEL: i32 = -7;

/// The first 4 bytes of a zstd frame (RFC 8878, section 3.1.1, `Magic_Number`
/// 0xFD2FB528, little-endian). An uncompressed payload (written by versions before this
/// one) starts with its header length instead, which is never that large.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Largest payload a stored frame may claim to decompress to: 1 GiB, far above any
/// export the listeners accept, so a damaged frame header cannot ask for more.
const MAX_PAYLOAD_BYTES: u64 = 1 << 30;

thread_local! {
    /// One zstd compression context per thread (encoding runs on the tokio workers and the
    /// writer thread), reused: a new context costs its tables' allocation every time.
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Compresses a raw payload into its stored form: one zstd frame at
/// [`PAYLOAD_ZSTD_LEVEL`] that records its content size.
///
/// Errors: zstd failed (out of memory), as text.
pub(crate) fn compress_payload(raw: &[u8]) -> Result<Vec<u8>, String> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = Some(
                zstd::bulk::Compressor::new(PAYLOAD_ZSTD_LEVEL)
                    .map_err(|e| format!("zstd context: {e}"))?,
            );
        }
        match c.as_mut() {
            Some(c) => c.compress(raw).map_err(|e| format!("zstd: {e}")),
            None => Err("zstd context missing".to_string()),
        }
    })
}

/// The most zstd frames a stored payload may hold: [`join_parts`] writes the header's
/// and one per part, and refuses more (the collector cuts a lone export into at most
/// min(cores, 4) parts, `collector`'s `DecodeThreads`).
const MAX_PAYLOAD_FRAMES: usize = 64;

/// The raw payload of a stored one: its zstd frames (one from [`compress_payload`], or
/// several from [`join_parts`]) decompressed (at most [`MAX_PAYLOAD_BYTES`] in all, the
/// sizes their frame headers record), an older uncompressed one borrowed as it is.
///
/// Errors: a frame without a content size, sizes larger than the bound, more than
/// [`MAX_PAYLOAD_FRAMES`] frames, or frames that fail to decompress to exactly their
/// recorded sizes (a damaged row), as text.
pub(crate) fn payload_bytes(stored: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    if !stored.starts_with(&ZSTD_MAGIC) {
        return Ok(std::borrow::Cow::Borrowed(stored));
    }
    let mut size: u64 = 0;
    let mut rest = stored;
    let mut frames = 0;
    while !rest.is_empty() {
        frames += 1;
        if frames > MAX_PAYLOAD_FRAMES {
            return Err(format!("payload of more than {MAX_PAYLOAD_FRAMES} frames"));
        }
        match zstd::zstd_safe::get_frame_content_size(rest) {
            Ok(Some(n)) => size = size.saturating_add(n),
            Ok(None) | Err(_) => return Err("payload frame without a content size".into()),
        }
        if size > MAX_PAYLOAD_BYTES {
            return Err(format!("payload frames claim {size} bytes"));
        }
        let len = zstd::zstd_safe::find_frame_compressed_size(rest)
            .map_err(|_| "payload frame cut short".to_string())?;
        rest = rest.get(len..).ok_or("payload frame cut short")?;
    }
    let size = size as usize;
    let raw = zstd::bulk::decompress(stored, size).map_err(|e| format!("payload frame: {e}"))?;
    if raw.len() != size {
        return Err(format!(
            "payload frames gave {} bytes, their headers say {size}",
            raw.len()
        ));
    }
    Ok(std::borrow::Cow::Owned(raw))
}

/// Zstd frames in a stored payload (0 for one stored uncompressed), as far as their
/// headers can be walked.
pub(crate) fn payload_frames(stored: &[u8]) -> usize {
    let mut rest = stored;
    let mut frames = 0;
    while rest.starts_with(&ZSTD_MAGIC) {
        frames += 1;
        match zstd::zstd_safe::find_frame_compressed_size(rest) {
            Ok(len) if len > 0 => rest = rest.get(len..).unwrap_or_default(),
            _ => break,
        }
    }
    frames
}

/// [`payload_bytes`] for a payload read into its own buffer: an uncompressed one is given
/// back without a copy.
///
/// Errors: as [`payload_bytes`].
pub(crate) fn payload_owned(stored: Vec<u8>) -> Result<Vec<u8>, String> {
    match payload_bytes(&stored)? {
        std::borrow::Cow::Borrowed(_) => Ok(stored),
        std::borrow::Cow::Owned(raw) => Ok(raw),
    }
}

/// Decodes a payload header.
pub(crate) fn decode_header(payload: &[u8]) -> Result<Header, String> {
    let len_bytes: [u8; 4] = payload
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or("payload shorter than its header prefix")?;
    let len = u32::from_le_bytes(len_bytes) as usize;
    let head = payload.get(4..4 + len).ok_or("payload header truncated")?;
    postcard::from_bytes(head).map_err(|e| e.to_string())
}

/// Decodes one span body at `off..off+len` of a payload.
pub(crate) fn decode_span(payload: &[u8], off: u32, len: u32) -> Result<Span, String> {
    let body = payload
        .get(off as usize..off as usize + len as usize)
        .ok_or("span body outside its payload")?;
    postcard::from_bytes(body).map_err(|e| e.to_string())
}

/// One log record ready for the writer.
#[derive(Debug)]
pub(crate) struct LogRow {
    /// Record time, ns.
    pub time: u64,
    /// Trace id when the record carries one.
    pub trace_id: Option<[u8; 16]>,
    /// Span id when the record carries one.
    pub span_id: Option<[u8; 8]>,
    /// Resource `service.name` (search column, migration 2).
    pub service: String,
    /// `severity_number` clamped to 0..=24 (search column).
    pub severity: i32,
    /// Resource `stallwatch.runner.id` when present (search column).
    pub runner_id: Option<String>,
    /// The body's lowercased searchable text, for `logs_body` (migration 3).
    pub body: String,
    /// postcard `(Resource, Scope, LogRecord)`.
    pub payload: Vec<u8>,
}

/// Encodes a log export, one row per record.
/// Calls `f` on the items of `v` in order, giving back its buffer as it empties (the
/// capacity is halved whenever half of it is unused), so encoding a large request never
/// holds both all of its records and all of its rows (issue 17 #14).
fn drain_freeing<T>(
    mut v: Vec<T>,
    mut f: impl FnMut(T) -> Result<(), String>,
) -> Result<(), String> {
    v.reverse();
    while let Some(x) = v.pop() {
        f(x)?;
    }
    Ok(())
}

/// [`prepare_logs`] on a batch the caller no longer needs: each record is freed as soon as
/// it is encoded. Same rows, same errors.
pub(crate) fn prepare_logs_owned(batch: LogBatch) -> Result<Vec<LogRow>, String> {
    let mut out = Vec::with_capacity(batch.record_count());
    drain_freeing(batch.resource_logs, |rl| {
        let resource = rl.resource;
        let service = resource.service_name().to_string();
        let runner_id =
            attr(&resource.attributes, "stallwatch.runner.id").and_then(AnyValue::index_text);
        drain_freeing(rl.scope_logs, |sl| {
            let prefix =
                postcard::to_allocvec(&(&resource, &sl.scope)).map_err(|e| e.to_string())?;
            drain_freeing(sl.log_records, |r| {
                out.push(log_row(&r, &prefix, &service, &runner_id)?);
                Ok(())
            })
        })
    })?;
    Ok(out)
}

fn log_row(
    r: &LogRecord,
    prefix: &[u8],
    service: &str,
    runner_id: &Option<String>,
) -> Result<LogRow, String> {
    let payload = postcard::to_extend(r, prefix.to_vec()).map_err(|e| e.to_string())?;
    Ok(LogRow {
        time: if r.time_unix_nano != 0 {
            r.time_unix_nano
        } else {
            r.observed_time_unix_nano
        },
        trace_id: r.trace_id.filter(|t| !t.is_zero()).map(|t| t.0),
        span_id: r.span_id.filter(|s| !s.is_zero()).map(|s| s.0),
        service: service.to_string(),
        severity: r.severity_number.clamp(0, 24),
        runner_id: runner_id.clone(),
        body: super::log_body::body_key(&r.body),
        payload,
    })
}

pub(crate) fn prepare_logs(batch: &LogBatch) -> Result<Vec<LogRow>, String> {
    let mut out = Vec::with_capacity(batch.record_count());
    for rl in &batch.resource_logs {
        for sl in &rl.scope_logs {
            let prefix =
                postcard::to_allocvec(&(&rl.resource, &sl.scope)).map_err(|e| e.to_string())?;
            let service = rl.resource.service_name().to_string();
            let runner_id = attr(&rl.resource.attributes, "stallwatch.runner.id")
                .and_then(AnyValue::index_text);
            for r in &sl.log_records {
                out.push(log_row(r, &prefix, &service, &runner_id)?);
            }
        }
    }
    Ok(out)
}

/// One metric point ready for the writer.
#[derive(Debug)]
pub(crate) struct PointRow {
    /// Metric name.
    pub name: String,
    /// Point time, ns.
    pub time: u64,
    /// Resource `service.name` (migration 2 column).
    pub service: String,
    /// Series key: [`series_key`] of resource, scope and point attributes.
    pub series: i64,
    /// Gauge/sum value.
    pub value: Option<f64>,
    /// Histogram/summary count.
    pub count: Option<u64>,
    /// Histogram/summary sum.
    pub sum: Option<f64>,
    /// `MetricKind::as_str` of the point.
    pub kind: &'static str,
    /// Metric unit.
    pub unit: String,
    /// Metric description.
    pub description: String,
    /// postcard `(Resource, Scope, MetricPoint)`.
    pub payload: Vec<u8>,
}

/// FNV-1a, 64 bits (stable across builds and platforms, unlike `DefaultHasher`).
fn fnv1a(h: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *h ^= u64::from(*b);
        *h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// The series of a metric point: one per (resource attributes, scope name and version,
/// point attributes), hashed with FNV-1a 64 over their postcard encoding, bit-cast to
/// `i64` for SQLite. Two processes of one service (different `service.instance.id`) are
/// two series, as in Prometheus where target labels are part of the series.
pub(crate) fn series_key(resource: &Resource, scope: &Scope, attributes: &[KeyValue]) -> i64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    let enc = postcard::to_allocvec(&(
        &resource.attributes,
        &scope.name,
        &scope.version,
        attributes,
    ))
    .unwrap_or_default();
    fnv1a(&mut h, &enc);
    h as i64
}

/// Encodes a metrics export, one row per data point.
pub(crate) fn prepare_metrics(batch: &MetricBatch) -> Result<Vec<PointRow>, String> {
    let mut out = Vec::with_capacity(batch.point_count());
    for rm in &batch.resource_metrics {
        for sm in &rm.scope_metrics {
            let prefix =
                postcard::to_allocvec(&(&rm.resource, &sm.scope)).map_err(|e| e.to_string())?;
            let service = rm.resource.service_name().to_string();
            for p in &sm.points {
                out.push(point_row(p, &rm.resource, &sm.scope, &prefix, &service)?);
            }
        }
    }
    Ok(out)
}

/// [`prepare_metrics`] on a batch the caller no longer needs: each point is freed as soon
/// as it is encoded. Same rows, same errors.
pub(crate) fn prepare_metrics_owned(batch: MetricBatch) -> Result<Vec<PointRow>, String> {
    let mut out = Vec::with_capacity(batch.point_count());
    drain_freeing(batch.resource_metrics, |rm| {
        let resource = rm.resource;
        let service = resource.service_name().to_string();
        drain_freeing(rm.scope_metrics, |sm| {
            let prefix =
                postcard::to_allocvec(&(&resource, &sm.scope)).map_err(|e| e.to_string())?;
            drain_freeing(sm.points, |p| {
                out.push(point_row(&p, &resource, &sm.scope, &prefix, &service)?);
                Ok(())
            })
        })
    })?;
    Ok(out)
}

fn point_row(
    p: &MetricPoint,
    resource: &Resource,
    scope: &Scope,
    prefix: &[u8],
    service: &str,
) -> Result<PointRow, String> {
    let payload = postcard::to_extend(p, prefix.to_vec()).map_err(|e| e.to_string())?;
    Ok(PointRow {
        name: p.name.clone(),
        time: p.time_unix_nano,
        service: service.to_string(),
        series: series_key(resource, scope, &p.attributes),
        value: p.value,
        count: p.count,
        sum: p.sum,
        kind: p.kind.as_str(),
        unit: p.unit.clone(),
        description: p.description.clone(),
        payload,
    })
}

/// Text form of an attribute value for attribute search (same as the term values).
pub(crate) fn value_text(v: &AnyValue) -> Option<String> {
    v.index_text()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::{ResourceSpans, ScopeSpans, SpanId, TraceId};

    fn span(s: u8, end: u64, name: &str) -> Span {
        Span {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([s; 8]),
            name: name.into(),
            start_time_unix_nano: 5,
            end_time_unix_nano: end,
            ..Default::default()
        }
    }

    #[test]
    fn in_request_duplicates_and_slicing() {
        let b = TraceBatch {
            resource_spans: vec![ResourceSpans {
                resource: Resource::default(),
                scope_spans: vec![ScopeSpans {
                    scope: Scope::default(),
                    spans: vec![
                        span(1, 0, "open"),
                        span(2, 9, "b"),
                        span(1, 7, "ended"),
                        span(2, 8, "b2"),
                    ],
                }],
            }],
        };
        let mut p = prepare_traces(&b).unwrap();
        let header_and_both = payload_bytes(&p.payload).unwrap().len();
        assert_eq!(p.duplicates, 2);
        assert_eq!(p.index.spans.len(), 2);
        assert_eq!(p.traces.len(), 1);
        assert!(p.payload.starts_with(&ZSTD_MAGIC), "stored compressed");
        let raw = payload_bytes(&p.payload).unwrap();
        let header = decode_header(&raw).unwrap();
        assert_eq!(header.resources.len(), 1);
        let names: Vec<String> = p
            .index
            .spans
            .iter()
            .map(|s| decode_span(&raw, s.off, s.len).unwrap().name)
            .collect();
        assert_eq!(names, vec!["b".to_string(), "ended".to_string()]);
        // unknown_service term for a resource without service.name
        assert!(p.index.terms.contains(&(
            TERM_SERVICE.to_string(),
            crate::model::UNKNOWN_SERVICE.to_string()
        )));
        p.retain(&[false, true]).unwrap();
        assert_eq!(p.index.spans.len(), 1);
        let s = &p.index.spans[0];
        let raw = payload_bytes(&p.payload).unwrap();
        assert_eq!(decode_span(&raw, s.off, s.len).unwrap().name, "ended");
        assert!(decode_header(&raw).is_ok());
        assert!(raw.len() < header_and_both, "the dropped copy is gone");
        // the stored index follows the retained copies
        assert!(
            p.index_blob
                .starts_with(&crate::telemetry::index_blob::COLUMNS_MAGIC),
            "index stored in columns"
        );
        let stored = decode_index(&p.index_blob).unwrap();
        assert_eq!(stored.spans.len(), 1);
        assert_eq!(stored.spans[0].span_id, [1; 8]);
        assert_eq!(stored.spans[0].end, 7);
    }

    /// An attribute list that repeats an indexed key gives one term for it, its first
    /// value's: a resource with a thousand `process.pid` attributes does not copy a
    /// thousand terms into each of its spans, and a span's own repeats count once too.
    #[test]
    fn a_repeated_indexed_key_gives_one_term_per_list() {
        let kv = |k: &str, v: String| KeyValue {
            key: k.into(),
            value: AnyValue::String(v),
        };
        let mut resource = Resource::default();
        resource.attributes.push(kv("service.name", "rep".into()));
        for pid in 0..1000 {
            resource.attributes.push(kv("process.pid", pid.to_string()));
        }
        let mut spans: Vec<Span> = (1..=50u8).map(|i| span(i, 9, "s")).collect();
        for v in ["first", "second", "third"] {
            spans[0].attributes.push(kv("error.type", v.into()));
        }
        let b = TraceBatch {
            resource_spans: vec![ResourceSpans {
                resource,
                scope_spans: vec![ScopeSpans {
                    scope: Scope::default(),
                    spans,
                }],
            }],
        };
        let p = prepare_traces(&b).unwrap();
        let text = |s: &IdxSpan| -> Vec<(String, String)> {
            s.terms
                .iter()
                .map(|&t| p.index.terms[t as usize].clone())
                .collect()
        };
        for s in &p.index.spans {
            let t = text(s);
            let pids: Vec<&str> = t
                .iter()
                .filter(|(k, _)| k == ATTR_TERM_KEYS[1])
                .map(|(_, v)| v.as_str())
                .collect();
            assert_eq!(pids, vec!["0"], "the first process.pid only");
            assert!(t.len() <= 6, "{t:?}");
        }
        let errors: Vec<String> = text(&p.index.spans[0])
            .into_iter()
            .filter(|(k, _)| k == ATTR_TERM_KEYS[0])
            .map(|(_, v)| v)
            .collect();
        assert_eq!(errors, vec!["first".to_string()]);
        // and the stored index reads back with the same terms
        let stored = decode_index(&p.index_blob).unwrap();
        assert_eq!(stored.spans[0].terms, p.index.spans[0].terms);
    }

    /// Every span's name and (service, name) terms name its own resource's service and its
    /// own name, also when names repeat within a resource and across resources (the
    /// per-resource memo of name terms in [`prepare_spans`]).
    #[test]
    fn name_and_pair_terms_follow_each_span_and_resource() {
        let service = |name: &str| Resource {
            attributes: vec![KeyValue {
                key: "service.name".into(),
                value: AnyValue::String(name.into()),
            }],
            ..Default::default()
        };
        let spans = |names: &[(u8, &str)]| -> Vec<Span> {
            names.iter().map(|(i, n)| span(*i, 9, n)).collect()
        };
        let b = TraceBatch {
            resource_spans: vec![
                ResourceSpans {
                    resource: service("alpha"),
                    scope_spans: vec![
                        ScopeSpans {
                            scope: Scope::default(),
                            spans: spans(&[(1, "read"), (2, "write"), (3, "read")]),
                        },
                        ScopeSpans {
                            scope: Scope::default(),
                            spans: spans(&[(4, "write"), (5, "read")]),
                        },
                    ],
                },
                ResourceSpans {
                    resource: service("beta"),
                    scope_spans: vec![ScopeSpans {
                        scope: Scope::default(),
                        spans: spans(&[(6, "read"), (7, "close")]),
                    }],
                },
            ],
        };
        let p = prepare_traces(&b).unwrap();
        let term = |i: u32| p.index.terms[i as usize].clone();
        let seen: Vec<(String, String, String)> = p
            .index
            .spans
            .iter()
            .map(|s| {
                let (nk, name) = term(s.name);
                assert_eq!(nk, TERM_SPAN_NAME);
                assert!(s.terms.contains(&s.name));
                let pairs: Vec<String> = s
                    .terms
                    .iter()
                    .map(|t| term(*t))
                    .filter(|(k, _)| k == TERM_SERVICE_SPAN)
                    .map(|(_, v)| v)
                    .collect();
                assert_eq!(pairs.len(), 1, "one pair term per span");
                let (_, service) = term(s.service);
                (service, name, pairs[0].clone())
            })
            .collect();
        let want = |svc: &str, name: &str| {
            (
                svc.to_string(),
                name.to_string(),
                format!("{svc}{PAIR_SEP}{name}"),
            )
        };
        assert_eq!(
            seen,
            vec![
                want("alpha", "read"),
                want("alpha", "write"),
                want("alpha", "read"),
                want("alpha", "write"),
                want("alpha", "read"),
                want("beta", "read"),
                want("beta", "close"),
            ]
        );
        // each distinct term once in the table
        let mut terms = p.index.terms.clone();
        terms.sort();
        terms.dedup();
        assert_eq!(terms.len(), p.index.terms.len());
    }

    /// A borrowed span's terms come from its looked-up attributes only; so every indexed
    /// key must be one of them.
    #[test]
    fn every_indexed_key_is_looked_up() {
        for (key, _, _) in TERM_KEYS {
            assert!(
                crate::model::encoded::LOOKED_UP_KEYS.contains(&key),
                "{key}"
            );
        }
    }

    /// Borrowed spans (the protobuf ingest path) are stored as the very bytes of their
    /// owned twins: every value kind, nested lists, events, links and status, plus the
    /// index and terms.
    #[test]
    fn borrowed_spans_store_the_bytes_of_their_owned_twins() {
        use crate::model::{
            AnyValueRef as V, EventRef, KeyValueRef, LinkRef, ResourceSpansRef, ScopeSpansRef,
            SpanRef, StatusRef,
        };
        let kv = |key, value| KeyValueRef { key, value };
        let attrs = vec![
            kv("gen_ai.tool.name", V::String("run_notebook")),
            kv("process.pid", V::Int(4242)),
            kv("error.type", V::Bool(true)),
            // every indexed key (each of `LOOKED_UP_KEYS` that `term_key` maps)
            kv("stallwatch.runner.id", V::String("r-7")),
            kv("service.name", V::String("own-service")),
            kv("ratio", V::Double(f64::NAN)),
            kv("raw", V::Bytes(&[0, 1, 255])),
            kv("none", V::Empty),
            kv(
                "nested",
                V::Array(vec![
                    V::Int(-1),
                    V::KvList(vec![
                        kv("inner", V::String("x")),
                        kv("deeper", V::Array(vec![])),
                    ]),
                ]),
            ),
        ];
        let span = |sid: u8, end: u64| SpanRef {
            trace_id: TraceId([7; 16]),
            span_id: SpanId([sid; 8]),
            parent_span_id: (sid > 1).then_some(SpanId([1; 8])),
            trace_state: "k=v",
            flags: 0x301,
            name: "tools/call run_notebook",
            kind: 3,
            start_time_unix_nano: 1_700_000_000_000_000_000,
            end_time_unix_nano: end,
            attributes: attrs.clone().into(),
            dropped_attributes_count: 2,
            events: vec![EventRef {
                time_unix_nano: 5,
                name: "exception",
                attributes: vec![kv("exception.type", V::String("Timeout"))],
                dropped_attributes_count: 1,
            }],
            dropped_events_count: 3,
            links: vec![LinkRef {
                trace_id: TraceId([9; 16]),
                span_id: SpanId([8; 8]),
                trace_state: "",
                attributes: vec![kv("l", V::Int(1))],
                dropped_attributes_count: 0,
                flags: 1,
            }],
            dropped_links_count: 4,
            status: StatusRef {
                code: STATUS_ERROR,
                message: "timed out",
            },
        };
        let mut resource = Resource::default();
        resource.attributes.push(KeyValue::new(
            "service.name",
            AnyValue::String("mcp-runner-python".into()),
        ));
        let spans = vec![
            span(1, 1_700_000_000_500_000_000),
            span(2, 0),
            span(2, 1_700_000_000_600_000_000),
        ];
        let borrowed = vec![ResourceSpansRef {
            resource: resource.clone(),
            scope_spans: vec![ScopeSpansRef {
                scope: Scope {
                    name: "sc".into(),
                    ..Default::default()
                },
                spans: spans.clone(),
            }],
        }];
        let owned = TraceBatch {
            resource_spans: vec![ResourceSpans {
                resource,
                scope_spans: vec![ScopeSpans {
                    scope: borrowed[0].scope_spans[0].scope.clone(),
                    spans: spans.iter().map(SpanRef::to_span).collect(),
                }],
            }],
        };
        let (b, o) = (
            prepare_borrowed(&borrowed).unwrap(),
            prepare_traces(&owned).unwrap(),
        );
        assert_eq!(
            payload_bytes(&b.payload).unwrap(),
            payload_bytes(&o.payload).unwrap()
        );
        assert_eq!(
            postcard::to_allocvec(&b.index).unwrap(),
            postcard::to_allocvec(&o.index).unwrap()
        );
        assert_eq!((b.duplicates, b.index.spans.len()), (1, 2));
        // and the stored body reads back as the owned span
        let raw = payload_bytes(&b.payload).unwrap();
        let s = &b.index.spans[1];
        let back = decode_span(&raw, s.off, s.len).unwrap();
        let want = spans[2].to_span();
        assert_eq!(
            format!("{back:?}"),
            format!("{want:?}"),
            "NaN compared as text"
        );
        assert!(b
            .index
            .terms
            .contains(&(TERM_TOOL.to_string(), "run_notebook".to_string())));
        assert!(b
            .index
            .terms
            .contains(&(ATTR_TERM_KEYS[1].to_string(), "4242".to_string())));
    }

    /// An index blob written before index compression (bare postcard) and one written now
    /// (columns, `index_blob`) decode to the same index; a truncated blob is an error.
    #[test]
    fn stored_indexes_old_and_new() {
        let spans = (0..200u8)
            .map(|i| span(i.max(1), 9 + u64::from(i), &format!("s{}", i % 7)))
            .collect();
        let b = TraceBatch {
            resource_spans: vec![ResourceSpans {
                resource: Resource::default(),
                scope_spans: vec![ScopeSpans {
                    scope: Scope::default(),
                    spans,
                }],
            }],
        };
        let p = prepare_traces(&b).unwrap();
        let bare = postcard::to_allocvec(&p.index).unwrap();
        // the trace id stored once, not once per span: at least 15 bytes per span fewer
        assert!(
            p.index_blob.len() + 15 * p.index.spans.len() < bare.len(),
            "{} of {}",
            p.index_blob.len(),
            bare.len()
        );
        let (old, new) = (
            decode_index(&bare).unwrap(),
            decode_index(&p.index_blob).unwrap(),
        );
        assert_eq!(postcard::to_allocvec(&old).unwrap(), bare);
        assert_eq!(postcard::to_allocvec(&new).unwrap(), bare);
        assert_eq!(
            new.spans.len(),
            199,
            "span id 1 twice, both ended: the first kept"
        );
        assert!(decode_index(&p.index_blob[..p.index_blob.len() - 3]).is_err());
    }

    /// An uncompressed payload (rows written before compression) is read as it is; a
    /// frame is given back whole; a damaged frame is an error, never a panic or a huge
    /// allocation.
    #[test]
    fn stored_payloads_old_and_new_and_damaged() {
        let raw: Vec<u8> = (0..50_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let mut old = (8u32).to_le_bytes().to_vec();
        old.extend_from_slice(&raw[..64]);
        assert!(matches!(
            payload_bytes(&old).unwrap(),
            std::borrow::Cow::Borrowed(b) if b == old.as_slice()
        ));
        let stored = compress_payload(&raw).unwrap();
        assert!(
            stored.len() < raw.len() / 2,
            "{} of {}",
            stored.len(),
            raw.len()
        );
        assert_eq!(payload_bytes(&stored).unwrap().as_ref(), raw.as_slice());
        let cut = &stored[..stored.len() - 7];
        assert!(payload_bytes(cut).is_err(), "truncated frame");
        let mut huge = stored.clone();
        // Frame_Header_Descriptor: FCS_Field_Size 8 bytes, single segment; size 2^40
        huge.truncate(4);
        huge.extend_from_slice(&[0xE0]);
        huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let e = payload_bytes(&huge).unwrap_err();
        assert!(e.contains("claim"), "{e}");
    }

    /// Payloads of several frames (joined parts) read back as their concatenation; a
    /// damaged later frame, or more frames than any writer makes, is an error.
    #[test]
    fn a_payload_of_several_frames_reads_back_whole() {
        let raw: Vec<u8> = (0..60_000u32)
            .flat_map(|i| (i % 509).to_le_bytes())
            .collect();
        let (a, b) = raw.split_at(100_000);
        let mut two = compress_payload(a).unwrap();
        two.extend_from_slice(&compress_payload(b).unwrap());
        assert_eq!(payload_frames(&two), 2);
        assert_eq!(payload_bytes(&two).unwrap().as_ref(), raw.as_slice());
        assert_eq!(payload_owned(two.clone()).unwrap(), raw);
        assert!(
            payload_bytes(&two[..two.len() - 5]).is_err(),
            "second frame cut"
        );
        let first_len = zstd::zstd_safe::find_frame_compressed_size(&two).unwrap();
        assert!(
            payload_bytes(&two[..first_len + 4]).is_err(),
            "second frame's magic only"
        );
        let many: Vec<u8> = std::iter::repeat_n(compress_payload(b"x").unwrap(), 65)
            .flatten()
            .collect();
        let e = payload_bytes(&many).unwrap_err();
        assert!(e.contains("frames"), "{e}");
    }

    /// An export encoded in parts (cut inside a scope, and at a scope's start) and
    /// joined stores exactly what one whole encoding stores: the raw payload and the index
    /// byte for byte (terms numbered over the whole export); a span id repeated across
    /// the parts or inside one answers `None`.
    #[test]
    fn parts_joined_store_what_the_whole_stores() {
        let kv = |k: &str, v: &str| KeyValue {
            key: k.into(),
            value: AnyValue::String(v.into()),
        };
        let res = |svc: &str, pid: &str| Resource {
            attributes: vec![kv("service.name", svc), kv("process.pid", pid)],
            ..Default::default()
        };
        let mut n = 0u8;
        let mut spans = |count: usize, tool: &str| -> Vec<Span> {
            (0..count)
                .map(|i| {
                    n += 1;
                    let mut s = span(n, if i % 3 == 0 { 0 } else { 9 }, &format!("op{}", i % 4));
                    s.trace_id = TraceId([n % 3 + 1; 16]);
                    s.attributes = vec![kv("gen_ai.tool.name", &format!("{tool}{}", i % 2))];
                    if i % 5 == 0 {
                        s.status.code = STATUS_ERROR;
                    }
                    s
                })
                .collect()
        };
        let scope = |name: &str| Scope {
            name: name.into(),
            ..Default::default()
        };
        let whole = TraceBatch {
            resource_spans: vec![
                ResourceSpans {
                    resource: res("a", "1"),
                    scope_spans: vec![ScopeSpans {
                        scope: scope("s0"),
                        spans: spans(7, "t"),
                    }],
                },
                ResourceSpans {
                    resource: res("b", "2"),
                    scope_spans: vec![
                        ScopeSpans {
                            scope: scope("s1"),
                            spans: spans(9, "u"),
                        },
                        ScopeSpans {
                            scope: scope("s2"),
                            spans: Vec::new(),
                        },
                        ScopeSpans {
                            scope: scope("s3"),
                            spans: spans(6, "v"),
                        },
                    ],
                },
            ],
        };
        let expect = prepare_traces(&whole).unwrap();
        let (rs0, rs1) = (&whole.resource_spans[0], &whole.resource_spans[1]);
        fn g(
            rs: &ResourceSpans,
            scopes: Vec<(usize, std::ops::Range<usize>)>,
        ) -> Vec<(&Scope, &[Span])> {
            scopes
                .into_iter()
                .map(|(si, range)| (&rs.scope_spans[si].scope, &rs.scope_spans[si].spans[range]))
                .collect()
        }
        let resources: Vec<&Resource> = vec![&rs0.resource, &rs1.resource];
        let scopes: Vec<(u32, &Scope)> = vec![
            (0, &rs0.scope_spans[0].scope),
            (1, &rs1.scope_spans[0].scope),
            (1, &rs1.scope_spans[1].scope),
            (1, &rs1.scope_spans[2].scope),
        ];
        // Cut inside scope s1 (the second part continues it), then at scope s3's start.
        let cuts = [vec![
            vec![
                Group {
                    resource: &rs0.resource,
                    scopes: g(rs0, vec![(0, 0..7)]),
                },
                Group {
                    resource: &rs1.resource,
                    scopes: g(rs1, vec![(0, 0..4)]),
                },
            ],
            vec![Group {
                resource: &rs1.resource,
                scopes: g(rs1, vec![(0, 4..9), (1, 0..0)]),
            }],
            vec![Group {
                resource: &rs1.resource,
                scopes: g(rs1, vec![(2, 0..6)]),
            }],
        ]];
        // A part at a new resource whose only scope's spans were all refused (an empty
        // frame), then the rest, continuing that scope.
        let empty_then_rest = vec![
            vec![Group {
                resource: &rs0.resource,
                scopes: g(rs0, vec![(0, 0..7)]),
            }],
            vec![Group {
                resource: &rs1.resource,
                scopes: g(rs1, vec![(0, 0..0)]),
            }],
            vec![Group {
                resource: &rs1.resource,
                scopes: g(rs1, vec![(0, 0..9), (1, 0..0), (2, 0..6)]),
            }],
        ];
        for (parts, continues) in [
            (&cuts[0], [false, true, false]),
            (&empty_then_rest, [false, false, true]),
        ] {
            let encoded: Vec<EncodedPart> = parts
                .iter()
                .zip(continues)
                .map(|(p, c)| encode_part(p, c).unwrap())
                .collect();
            let joined = join_parts(&resources, &scopes, encoded).unwrap().unwrap();
            assert_eq!(payload_frames(&joined.payload), 1 + parts.len());
            assert_eq!(
                payload_bytes(&joined.payload).unwrap(),
                payload_bytes(&expect.payload).unwrap(),
                "the same raw payload"
            );
            assert_eq!(joined.index_blob, expect.index_blob, "the same index");
            assert_eq!(joined.header_len, expect.header_len);
            assert_eq!(joined.traces, expect.traces);
            assert!(joined.index.terms.len() > 10, "{:?}", joined.index.terms);
        }
        // A span id of the first part again in the last: the caller encodes it whole.
        let mut copy = rs1.scope_spans[2].spans.clone();
        copy[0].span_id = rs0.scope_spans[0].spans[0].span_id;
        copy[0].trace_id = rs0.scope_spans[0].spans[0].trace_id;
        let twice = vec![
            encode_part(
                &[Group {
                    resource: &rs0.resource,
                    scopes: g(rs0, vec![(0, 0..7)]),
                }],
                false,
            )
            .unwrap(),
            encode_part(
                &[Group {
                    resource: &rs1.resource,
                    scopes: vec![(&rs1.scope_spans[2].scope, &copy[..])],
                }],
                false,
            )
            .unwrap(),
        ];
        let two_scopes = [
            (0, &rs0.scope_spans[0].scope),
            (1, &rs1.scope_spans[2].scope),
        ];
        assert!(join_parts(&resources, &two_scopes, twice)
            .unwrap()
            .is_none());
        // ... and inside one part
        let inside = vec![encode_part(
            &[Group {
                resource: &rs1.resource,
                scopes: vec![
                    (&rs1.scope_spans[2].scope, &copy[..]),
                    (&rs0.scope_spans[0].scope, &rs0.scope_spans[0].spans[..1]),
                ],
            }],
            false,
        )
        .unwrap()];
        assert!(join_parts(&resources, &two_scopes, inside)
            .unwrap()
            .is_none());
        // Parts that do not add up to the header's scopes are a bug, reported.
        let short = vec![encode_part(
            &[Group {
                resource: &rs0.resource,
                scopes: g(rs0, vec![(0, 0..7)]),
            }],
            false,
        )
        .unwrap()];
        let e = join_parts(&resources, &scopes, short).unwrap_err();
        assert!(e.contains("scopes"), "{e}");
        // More parts than a payload may hold frames is refused, not stored unreadable.
        let many: Vec<EncodedPart> = (0..MAX_PAYLOAD_FRAMES)
            .map(|_| encode_part::<Span>(&[], false).unwrap())
            .collect();
        let e = join_parts(&resources, &scopes, many).unwrap_err();
        assert!(e.contains("frames"), "{e}");
    }
}
