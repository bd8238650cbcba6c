//! A trace export cut into stored chunks while it is decoded (issue 17 #14).
//!
//! [`TraceChunker`] is the [`SpanSink`] of the ingest pipeline: it gathers converted spans
//! until they came from [`CHUNK_SOURCE_BYTES`] of the body, encodes them at once into a
//! [`TraceChunk`] (the postcard form storage writes as one `span_batches` row) and drops
//! the records. Beside the chunks it keeps what the watchdog reads: open spans and pending
//! twins whole ([`stallwatch_storage::model::Span::watched_whole`]), only the ids of the
//! others, which ended. So a large export holds its encoded form plus that view, never all
//! of its records, and storage copies one chunk at a time. The chunks are
//! written together, in one transaction ([`stallwatch_storage::Storage::write_trace_chunks`]),
//! only after the whole body decoded: a bad request stores nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use bytes::Bytes;
use stallwatch_storage::model::{
    Resource, ResourceSpans, ResourceSpansRef, Scope, ScopeSpans, ScopeSpansRef, Span, SpanId,
    SpanRef, TraceBatch, TraceId,
};
use stallwatch_storage::telemetry::{TraceChunk, TracePart};
use stallwatch_storage::WriteError;

use crate::decode::{self, DecodeError, Decoded, Limits, Refusals, SpanSink, WirePart};
use crate::part_pool::PartPool;

/// Why [`chunk_protobuf_traces`] failed.
#[derive(Debug)]
pub(crate) enum ChunkError {
    /// The body is not a valid export (a 400).
    Decode(DecodeError),
    /// A chunk could not be encoded (a bug: a 500).
    Write(WriteError),
    /// A part's decode panicked on the pool (a bug: a 500).
    Panicked,
}

/// The parts to decode a protobuf trace export in, side by side: one
/// ([`WirePart::WHOLE`]) unless the body is worth cutting into up to `parts` parts of about
/// equal span bytes ([`decode::wire_cuts`]).
pub(crate) fn wire_parts(body: &[u8], parts: usize) -> Vec<WirePart> {
    let Some(cuts) = decode::wire_cuts(body, parts) else {
        return vec![WirePart::WHOLE];
    };
    std::iter::once(None)
        .chain(cuts.iter().copied().map(Some))
        .zip(cuts.iter().copied().map(Some).chain(std::iter::once(None)))
        .map(|(from, to)| WirePart { from, to })
        .collect()
}

/// Decodes a protobuf trace export, in up to `parts` parts side by side when it is worth
/// cutting ([`wire_parts`]), and chunks it for storage.
///
/// One request then decodes on more than one core (issue 16: at one request in flight,
/// decoding was a serial quarter of each request's time while the other core idled). The
/// parts run on the calling thread and on `pool` (its threads are kept, so their allocator
/// heaps stay warm: a new thread per part cost ~0.25 ms of CPU per 200 KB export), or one
/// after another on the calling thread without one (the tests); each part gathers its
/// spans, still borrowed from `body` ([`Gathered`]).
///
/// - A body under [`CHUNK_SOURCE_BYTES`] is one chunk: each part also encodes its spans
///   where it decoded them ([`TracePart::encode_borrowed`]: bodies, terms, its own zstd
///   frame) and makes the watchdog's view of them ([`View`]), and the calling thread joins
///   the parts in wire order ([`TraceChunk::join`]). With one export in flight, encoding
///   and compressing had been a third of the request's serial time while the other core
///   idled (issue 16). The parts are claimed one at a time by whichever thread is free
///   ([`Claims`]), so a pool thread slow to wake never holds the request up. When two
///   spans of the export share (trace id, span id) the join declines and the body is
///   decoded again whole, which keeps one copy of each.
/// - A larger body is handed to one [`TraceChunker`] in wire order, which cuts it into
///   chunks: the first part decodes on the calling thread, each other part (it borrows
///   the body) on a scoped thread of its own, started only when `pool` is given.
///
/// Either way the resource and scope a part shares with the one before it count once, so
/// the stored spans and index, the watchdog's view and what is refused are exactly those
/// of one whole decode (only a joined payload's zstd frames differ). A body that cannot be
/// cut or `parts` ≤ 1 decodes on the calling thread, streaming into the chunker as spans
/// arrive. What a part gathers is held whole until its turn, so callers cut only bodies
/// they charged that memory for.
///
/// Errors: a bad body's first error in wire order, as one whole decode reports it, else the
/// first other error: [`ChunkError::Decode`] for a bad body, [`ChunkError::Write`] when a chunk could not be
/// encoded, [`ChunkError::Panicked`] when a part's decode panicked off the calling thread, or, for a
/// body under [`CHUNK_SOURCE_BYTES`], on any thread (one on the calling thread otherwise
/// unwinds as any decode does).
pub(crate) fn chunk_protobuf_traces(
    body: &Bytes,
    limits: &Limits,
    parts: usize,
    pool: Option<&PartPool>,
) -> Result<Decoded<ChunkedTraces>, ChunkError> {
    let parts = wire_parts(body, parts);
    let mut chunker = TraceChunker::default();
    let fail = |chunker: &mut TraceChunker<'_>, e: DecodeError| match chunker.take_failure() {
        Some(w) => ChunkError::Write(w),
        None => ChunkError::Decode(e),
    };
    if parts.len() == 1 {
        let r = decode::decode_traces_part_into(body, limits, &mut chunker, WirePart::WHOLE);
        return match r {
            Ok(refusals) => {
                let chunked = chunker.finish().map_err(ChunkError::Write)?;
                Ok(refusals.into_decoded(chunked, "span"))
            }
            Err(e) => Err(fail(&mut chunker, e)),
        };
    }
    // An export under CHUNK_SOURCE_BYTES is one chunk: each part encodes its own spans
    // where it decoded them and the parts are joined (TraceChunk::join); a larger one is
    // handed to the chunker in wire order.
    let results: Vec<Result<PartOut<'_>, ChunkError>> = if body.len() < CHUNK_SOURCE_BYTES {
        Claims::run_all(body, &parts, limits, pool)
            .into_iter()
            .map(|r| r.map(|(e, v, refusals)| PartOut::Encoded(e, v, refusals)))
            .collect()
    } else {
        let gather = |part: WirePart| {
            let mut g = Gathered::default();
            let refusals = decode::decode_traces_part_into(body, limits, &mut g, part)
                .map_err(|e| g.error(e))?;
            Ok(PartOut::Gathered(g, refusals))
        };
        match pool {
            // The parts borrow the body, so they run on scoped threads, not the pool's:
            // a thread's start is small beside a part of a megabyte or more.
            Some(_) => std::thread::scope(|scope| {
                let gather = &gather;
                let later: Vec<_> = parts[1..]
                    .iter()
                    .map(|&part| {
                        std::thread::Builder::new()
                            .name("otlp-decode-part".into())
                            .spawn_scoped(scope, move || gather(part))
                            .map_err(|_| part)
                    })
                    .collect();
                let first = gather(parts[0]);
                std::iter::once(first)
                    .chain(later.into_iter().map(|t| match t {
                        Ok(t) => t.join().unwrap_or(Err(ChunkError::Panicked)),
                        // No thread: this one decodes the part.
                        Err(part) => gather(part),
                    }))
                    .collect()
            }),
            None => parts.iter().map(|&part| gather(part)).collect(),
        }
    };
    // The first error in wire order, a bad body's before any other: one whole decode
    // finds every decode error before it encodes (a part encodes as soon as it decoded).
    if let Some(e) = results
        .iter()
        .position(|r| matches!(r, Err(ChunkError::Decode(_))))
        .or_else(|| results.iter().position(Result::is_err))
    {
        return Err(results
            .into_iter()
            .nth(e)
            .and_then(Result::err)
            .unwrap_or(ChunkError::Panicked));
    }
    let outs: Vec<PartOut<'_>> = results.into_iter().flatten().collect();
    let mut all = Refusals::default();
    let mut view = View::default();
    let mut encoded = Vec::with_capacity(outs.len());
    for (part, out) in parts.iter().zip(outs) {
        // A part cut inside a scope opens that resource and scope again; one cut at a
        // scope's start, that resource. The part before it opened them already.
        let reopened = reopened(*part);
        match out {
            PartOut::Encoded(e, v, refusals) => {
                all.merge(refusals);
                view.append(v, reopened);
                encoded.push(e);
            }
            PartOut::Gathered(g, refusals) => {
                all.merge(refusals);
                feed(&mut chunker, g, reopened).map_err(|e| fail(&mut chunker, e))?;
            }
        }
    }
    if encoded.is_empty() {
        let mut chunked = chunker.finish().map_err(ChunkError::Write)?;
        chunked.parts = parts.len();
        return Ok(all.into_decoded(chunked, "span"));
    }
    let chunks = if view.spans == 0 {
        Vec::new()
    } else {
        match TraceChunk::join(&view.open, encoded).map_err(ChunkError::Write)? {
            Some(chunk) => vec![chunk],
            None => {
                // Two spans share (trace id, span id): one whole decode keeps one copy.
                drop((view, all));
                let mut whole = chunk_protobuf_traces(body, limits, 1, None)?;
                whole.batch.parts = parts.len();
                return Ok(whole);
            }
        }
    };
    let chunked = ChunkedTraces {
        chunks,
        open: view.open,
        ended: view.ended,
        spans: view.spans,
        parts: parts.len(),
    };
    Ok(all.into_decoded(chunked, "span"))
}

/// How many of a part's first items (its resource, then its scope) the part before it
/// opened already: 2 for a part cut inside a scope, 1 at a scope's start, else 0.
fn reopened(part: WirePart) -> usize {
    match part.from {
        Some((_, _, i)) if i > 0 => 2,
        Some((_, s, _)) if s > 0 => 1,
        _ => 0,
    }
}

/// Hands what a part gathered to `chunker` in wire order, the first `reopened` items
/// ([`reopened`]) left out.
///
/// Errors: the chunker's (an encoding failure).
fn feed<'a>(
    chunker: &mut TraceChunker<'a>,
    g: Gathered<'a>,
    reopened: usize,
) -> Result<(), DecodeError> {
    let mut bytes = g.bytes.into_iter();
    for (ri, rs) in g.groups.into_iter().enumerate() {
        if !(ri == 0 && reopened >= 1) {
            chunker.resource(rs.resource);
        }
        for (si, ss) in rs.scope_spans.into_iter().enumerate() {
            if !(ri == 0 && si == 0 && reopened == 2) {
                chunker.scope(ss.scope);
            }
            for span in ss.spans {
                chunker.span_ref(span, bytes.next().unwrap_or(0))?;
            }
        }
    }
    Ok(())
}

/// One encoded part: its encoding, the watchdog's view of it, its refusals.
type Encoded = (TracePart, View, Refusals);

/// Decodes one part of an export under [`CHUNK_SOURCE_BYTES`] and encodes it where it
/// decoded ([`TracePart::encode_borrowed`]); its records are dropped here, on this thread.
fn encode_part(body: &[u8], part: WirePart, limits: &Limits) -> Result<Encoded, ChunkError> {
    let mut g = Gathered::default();
    let refusals =
        decode::decode_traces_part_into(body, limits, &mut g, part).map_err(|e| g.error(e))?;
    let encoded =
        TracePart::encode_borrowed(&g.groups, reopened(part) == 2).map_err(ChunkError::Write)?;
    let view = View::of(&g);
    drop(g);
    Ok((encoded, view, refusals))
}

/// The parts of one export (under [`CHUNK_SOURCE_BYTES`]), claimed one at a time by the
/// calling thread and by the pool's threads, whichever is free first.
///
/// Why claims, not a part per thread: a pool thread asleep takes a while to run (perf
/// sched on this 2-core VM: 0.2 ms on average from its wake-up, against ~0.3 ms to decode
/// and encode half of a 512-span export). The calling thread starts on the first part at
/// once, and takes the next one too if no pool thread has claimed it yet; it then waits
/// only for parts a pool thread is working on, never for one to wake. The pool's job
/// holds the claims weakly: run after the request ended, it finds them gone (and with
/// them the body, a shared `Bytes`); run late but before, it finds nothing to claim.
struct Claims {
    body: Bytes,
    parts: Vec<WirePart>,
    limits: Limits,
    /// The next part to claim.
    next: AtomicUsize,
    /// Each part's outcome, once done.
    done: Mutex<Vec<Option<Result<Encoded, ChunkError>>>>,
    /// Notified when a part is done.
    ready: Condvar,
}

impl Claims {
    /// Every part's outcome, in wire order: claimed by the calling thread and, when
    /// `pool` is given, by up to `parts − 1` of its threads.
    fn run_all(
        body: &Bytes,
        parts: &[WirePart],
        limits: &Limits,
        pool: Option<&PartPool>,
    ) -> Vec<Result<Encoded, ChunkError>> {
        let claims = Arc::new(Claims {
            body: body.clone(),
            parts: parts.to_vec(),
            limits: *limits,
            next: AtomicUsize::new(0),
            done: Mutex::new(parts.iter().map(|_| None).collect()),
            ready: Condvar::new(),
        });
        if let Some(pool) = pool {
            let helpers = pool.threads().min(parts.len() - 1);
            for _ in 0..helpers {
                // Weak: a job that runs after the request ended must not keep its body.
                let c = Arc::downgrade(&claims);
                pool.spawn(move || {
                    if let Some(c) = c.upgrade() {
                        c.work();
                    }
                });
            }
        }
        claims.work();
        let mut done = claims.done.lock().unwrap_or_else(PoisonError::into_inner);
        while done.iter().any(Option::is_none) {
            done = claims
                .ready
                .wait(done)
                .unwrap_or_else(PoisonError::into_inner);
        }
        done.iter_mut()
            .map(|r| r.take().unwrap_or(Err(ChunkError::Panicked)))
            .collect()
    }

    /// Claims and encodes parts until none is left. A part that panics is
    /// [`ChunkError::Panicked`] (caught on every thread: its slot must be filled).
    fn work(&self) {
        loop {
            let k = self.next.fetch_add(1, Ordering::AcqRel);
            let Some(&part) = self.parts.get(k) else {
                return;
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                encode_part(&self.body, part, &self.limits)
            }))
            .unwrap_or(Err(ChunkError::Panicked));
            let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
            done[k] = Some(r);
            self.ready.notify_all();
        }
    }
}

/// What one part of [`chunk_protobuf_traces`] made.
enum PartOut<'a> {
    /// Its spans encoded on its own thread, with the watchdog's view of them.
    Encoded(TracePart, View, Refusals),
    /// Its records, for the chunker (an export of [`CHUNK_SOURCE_BYTES`] or more).
    Gathered(Gathered<'a>, Refusals),
}

/// The watchdog's view of (a part of) an export, as [`TraceChunker`] keeps it: every
/// resource and scope in wire order with the spans it reads whole, the ids of the others.
#[derive(Debug, Default)]
struct View {
    open: TraceBatch,
    ended: Vec<(TraceId, SpanId)>,
    spans: usize,
}

impl View {
    /// The view of what a part gathered.
    fn of(g: &Gathered<'_>) -> Self {
        let mut v = View {
            spans: g.bytes.len(),
            ..Default::default()
        };
        // One pass over each scope's spans: `watched_whole` reads the attributes of every
        // ended span (the Logfire pending-twin mark).
        for rs in &g.groups {
            let mut scope_spans = Vec::with_capacity(rs.scope_spans.len());
            for ss in &rs.scope_spans {
                let mut spans = Vec::new();
                for s in &ss.spans {
                    if s.watched_whole() {
                        spans.push(s.to_span());
                    } else {
                        v.ended.push((s.trace_id, s.span_id));
                    }
                }
                scope_spans.push(ScopeSpans {
                    scope: ss.scope.clone(),
                    spans,
                });
            }
            v.open.resource_spans.push(ResourceSpans {
                resource: rs.resource.clone(),
                scope_spans,
            });
        }
        v
    }

    /// Appends the view of the next part, whose first `reopened` items ([`reopened`]) the
    /// parts before it opened already.
    fn append(&mut self, next: View, reopened: usize) {
        let mut groups = next.open.resource_spans.into_iter();
        if reopened >= 1 {
            if let (Some(first), Some(last)) = (groups.next(), self.open.resource_spans.last_mut())
            {
                let mut scopes = first.scope_spans.into_iter();
                if reopened == 2 {
                    if let (Some(s), Some(l)) = (scopes.next(), last.scope_spans.last_mut()) {
                        l.spans.extend(s.spans);
                    }
                }
                last.scope_spans.extend(scopes);
            }
        }
        self.open.resource_spans.extend(groups);
        self.ended.extend(next.ended);
        self.spans += next.spans;
    }
}

/// The [`SpanSink`] of one part of [`chunk_protobuf_traces`]: what the part decoded, in
/// the export's shape (a resource per `resource` call, a scope per `scope` call).
#[derive(Debug, Default)]
struct Gathered<'a> {
    groups: Vec<ResourceSpansRef<'a>>,
    /// Each span's size in the body, bytes, in wire order.
    bytes: Vec<usize>,
    /// Set when an owned span was handed over: the protobuf decoder hands over borrowed
    /// ones, so this is a bug (a 500).
    failed: Option<WriteError>,
}

impl<'a> Gathered<'a> {
    /// The error of a failed decode: [`ChunkError::Write`] when it failed on an owned span,
    /// else the decode's. (An owned span fails the decode, so a decode that succeeded
    /// never has `failed` set.)
    fn error(&mut self, e: DecodeError) -> ChunkError {
        match self.failed.take() {
            Some(w) => ChunkError::Write(w),
            None => ChunkError::Decode(e),
        }
    }
}

impl<'a> SpanSink<'a> for Gathered<'a> {
    fn resource(&mut self, resource: Resource) {
        self.groups.push(ResourceSpansRef {
            resource,
            scope_spans: Vec::new(),
        });
    }
    fn scope(&mut self, scope: Scope) {
        if let Some(rs) = self.groups.last_mut() {
            rs.scope_spans.push(ScopeSpansRef {
                scope,
                spans: Vec::new(),
            });
        }
    }
    fn span(&mut self, _span: Span, _source_bytes: usize) -> Result<(), DecodeError> {
        let why = "a part of a protobuf trace export handed over an owned span";
        self.failed = Some(WriteError::Failed(why.into()));
        Err(DecodeError::new(why))
    }
    fn span_ref(&mut self, span: SpanRef<'a>, source_bytes: usize) -> Result<(), DecodeError> {
        if let Some(ss) = self
            .groups
            .last_mut()
            .and_then(|rs| rs.scope_spans.last_mut())
        {
            ss.spans.push(span);
            self.bytes.push(source_bytes);
        }
        Ok(())
    }
}

/// Body bytes whose spans make one chunk, bytes (1 MiB): SQLite then copies about this
/// much at a time, and a 20 MiB export is about 20 rows.
pub(crate) const CHUNK_SOURCE_BYTES: usize = 1024 * 1024;

/// Encodes a trace export chunk by chunk as its spans arrive (see the module doc). `'a`
/// is the request body's lifetime: protobuf spans are gathered borrowed from it.
#[derive(Debug, Default)]
pub(crate) struct TraceChunker<'a> {
    /// Encoded chunks, in request order.
    chunks: Vec<TraceChunk>,
    /// Owned records of the chunk being gathered (OTLP/JSON).
    current: TraceBatch,
    /// Borrowed records of the chunk being gathered (protobuf). A request comes in one
    /// encoding, so one of `current` and `current_ref` stays empty.
    current_ref: Vec<ResourceSpansRef<'a>>,
    /// Body bytes of the spans in `current`.
    current_bytes: usize,
    /// The accepted spans the watchdog reads whole (open spans, pending twins).
    open: TraceBatch,
    /// The ids of the other accepted spans (ended).
    ended: Vec<(TraceId, SpanId)>,
    /// Spans accepted.
    spans: usize,
    /// An encoding failure (a bug): the request answers 500, not 400.
    failed: Option<WriteError>,
}

/// What a [`TraceChunker`] made of a whole request.
#[derive(Debug)]
pub(crate) struct ChunkedTraces {
    /// The encoded chunks, for [`stallwatch_storage::Storage::write_trace_chunks`].
    pub chunks: Vec<TraceChunk>,
    /// The accepted spans the watchdog reads whole (open spans, pending twins).
    pub open: TraceBatch,
    /// The ids of the other accepted spans (ended), in request order.
    pub ended: Vec<(TraceId, SpanId)>,
    /// Spans accepted (before deduplication).
    pub spans: usize,
    /// The parts the export was decoded in side by side (1: whole; an export whose parts
    /// held one span id twice counts its parts, though it was then decoded whole again).
    pub parts: usize,
}

impl TraceChunker<'_> {
    /// Encodes what is gathered as one chunk and starts the next one in the same resource
    /// and scope.
    fn flush(&mut self) -> Result<(), WriteError> {
        let next_ref = self.current_ref.last().map(|rs| ResourceSpansRef {
            resource: rs.resource.clone(),
            scope_spans: rs
                .scope_spans
                .last()
                .map(|ss| ScopeSpansRef {
                    scope: ss.scope.clone(),
                    spans: Vec::new(),
                })
                .into_iter()
                .collect(),
        });
        let done_ref = std::mem::replace(&mut self.current_ref, next_ref.into_iter().collect());
        if done_ref
            .iter()
            .any(|rs| rs.scope_spans.iter().any(|ss| !ss.spans.is_empty()))
        {
            self.chunks.push(TraceChunk::encode_borrowed(&done_ref)?);
        }
        let last_scope = |b: &TraceBatch| {
            let rs = b.resource_spans.last()?;
            Some((
                rs.resource.clone(),
                rs.scope_spans.last().map(|s| s.scope.clone()),
            ))
        };
        let next = last_scope(&self.current).map(|(resource, scope)| ResourceSpans {
            resource,
            scope_spans: scope
                .map(|scope| ScopeSpans {
                    scope,
                    spans: Vec::new(),
                })
                .into_iter()
                .collect(),
        });
        let done = std::mem::replace(
            &mut self.current,
            TraceBatch {
                resource_spans: next.into_iter().collect(),
            },
        );
        self.current_bytes = 0;
        if done.span_count() > 0 {
            self.chunks.push(TraceChunk::encode(&done)?);
        }
        Ok(())
    }

    /// Encodes the last chunk and hands everything over.
    ///
    /// Errors: [`WriteError::Failed`] when a chunk could not be encoded (a bug).
    pub(crate) fn finish(mut self) -> Result<ChunkedTraces, WriteError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        self.flush()?;
        Ok(ChunkedTraces {
            chunks: self.chunks,
            open: self.open,
            ended: self.ended,
            spans: self.spans,
            parts: 1,
        })
    }

    /// The encoding failure that stopped the decode, if any.
    pub(crate) fn take_failure(&mut self) -> Option<WriteError> {
        self.failed.take()
    }
}

impl<'a> SpanSink<'a> for TraceChunker<'a> {
    fn resource(&mut self, resource: Resource) {
        self.open.resource_spans.push(ResourceSpans {
            resource: resource.clone(),
            scope_spans: Vec::new(),
        });
        self.current_ref.push(ResourceSpansRef {
            resource: resource.clone(),
            scope_spans: Vec::new(),
        });
        self.current.resource_spans.push(ResourceSpans {
            resource,
            scope_spans: Vec::new(),
        });
    }

    fn scope(&mut self, scope: Scope) {
        if let Some(rs) = self.current_ref.last_mut() {
            rs.scope_spans.push(ScopeSpansRef {
                scope: scope.clone(),
                spans: Vec::new(),
            });
        }
        for b in [&mut self.open, &mut self.current] {
            if let Some(rs) = b.resource_spans.last_mut() {
                rs.scope_spans.push(ScopeSpans {
                    scope: scope.clone(),
                    spans: Vec::new(),
                });
            }
        }
    }

    fn span_ref(&mut self, span: SpanRef<'a>, source_bytes: usize) -> Result<(), DecodeError> {
        if !span.watched_whole() {
            self.ended.push((span.trace_id, span.span_id));
        } else if let Some(v) = last(&mut self.open) {
            v.push(span.to_span());
        }
        if let Some(c) = self
            .current_ref
            .last_mut()
            .and_then(|rs| rs.scope_spans.last_mut())
        {
            c.spans.push(span);
        }
        self.gathered(source_bytes)
    }

    fn span(&mut self, span: Span, source_bytes: usize) -> Result<(), DecodeError> {
        if !span.watched_whole() {
            self.ended.push((span.trace_id, span.span_id));
        } else if let Some(v) = last(&mut self.open) {
            v.push(span.clone());
        }
        if let Some(c) = last(&mut self.current) {
            c.push(span);
        }
        self.gathered(source_bytes)
    }
}

/// The span list of the last scope of the last resource of `b`.
fn last(b: &mut TraceBatch) -> Option<&mut Vec<Span>> {
    b.resource_spans
        .last_mut()
        .and_then(|rs| rs.scope_spans.last_mut())
        .map(|ss| &mut ss.spans)
}

impl TraceChunker<'_> {
    /// Counts one gathered span of `source_bytes` and encodes the chunk once it reached
    /// [`CHUNK_SOURCE_BYTES`].
    fn gathered(&mut self, source_bytes: usize) -> Result<(), DecodeError> {
        self.spans += 1;
        self.current_bytes += source_bytes;
        if self.current_bytes >= CHUNK_SOURCE_BYTES {
            if let Err(e) = self.flush() {
                let msg = e.to_string();
                self.failed = Some(e);
                return Err(DecodeError::new(msg));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{decode_traces, decode_traces_into, Format, Limits};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::resource::v1::Resource as PbResource;
    use opentelemetry_proto::tonic::trace::v1 as pt;
    use prost::Message;

    const LIMITS: Limits = Limits {
        max_nesting_depth: 32,
    };

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(v.into())),
            }),
            ..Default::default()
        }
    }

    /// Two resources, each with two scopes of `n` spans carrying a 1 KiB attribute; every
    /// tenth span open.
    fn request(n: u64) -> Vec<u8> {
        let big = "x".repeat(1024);
        let rs = |r: u64| pt::ResourceSpans {
            resource: Some(PbResource {
                attributes: vec![kv("service.name", &format!("svc{r}"))],
                ..Default::default()
            }),
            scope_spans: (0..2)
                .map(|s| pt::ScopeSpans {
                    spans: (1..=n)
                        .map(|i| pt::Span {
                            trace_id: vec![r as u8 + 1; 16],
                            span_id: (r * 1_000_000 + s * 100_000 + i).to_be_bytes().to_vec(),
                            name: format!("op{i}"),
                            start_time_unix_nano: 10,
                            end_time_unix_nano: if i % 10 == 0 { 0 } else { 20 },
                            attributes: vec![kv("payload", &big)],
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        ExportTraceServiceRequest {
            resource_spans: vec![rs(0), rs(1)],
        }
        .encode_to_vec()
    }

    #[test]
    fn a_large_export_is_cut_into_chunks_that_keep_every_span_in_its_resource_and_scope() {
        // 4 scopes × 700 spans × ~1.1 KiB: about 3 MiB, so several chunks, one cut
        // inside a scope.
        let body = request(700);
        let mut chunker = TraceChunker::default();
        let d = decode_traces_into(&body, Format::Protobuf, &LIMITS, &mut chunker).unwrap();
        assert_eq!(d.rejected, 0);
        let out = chunker.finish().unwrap();
        assert_eq!(out.spans, 2800);
        assert!(out.chunks.len() >= 3, "{} chunks", out.chunks.len());
        assert_eq!(
            out.chunks.iter().map(TraceChunk::span_count).sum::<usize>(),
            2800
        );
        for c in &out.chunks {
            // about CHUNK_SOURCE_BYTES each, never the whole request
            assert!(c.bytes() < 2 * CHUNK_SOURCE_BYTES, "{}", c.bytes());
        }
        // The watchdog's view: open spans whole, in their resource and scope; ended ones
        // as ids, in request order.
        let whole = decode_traces(&body, Format::Protobuf, &LIMITS)
            .unwrap()
            .batch;
        let open: Vec<_> = whole.spans().filter(|s| !s.2.is_ended()).collect();
        assert_eq!(open.len(), 280);
        assert_eq!(out.open.spans().collect::<Vec<_>>(), open);
        assert_eq!(out.open.resource_spans.len(), 2);
        let ended: Vec<_> = whole
            .spans()
            .filter(|s| s.2.is_ended())
            .map(|s| (s.2.trace_id, s.2.span_id))
            .collect();
        assert_eq!(out.ended, ended);
    }

    #[test]
    fn a_large_json_export_is_walked_into_chunks_whatever_its_member_order() {
        // `scopeSpans` before `resource`: the resource is still every chunk's.
        let big = "y".repeat(1024);
        let spans: Vec<String> = (1..=3000u64)
            .map(|i| {
                format!(
                    r#"{{"traceId":"{:032x}","spanId":"{:016x}","name":"op","startTimeUnixNano":"10","endTimeUnixNano":"{}","attributes":[{{"key":"p","value":{{"stringValue":"{big}"}}}}]}}"#,
                    i / 10 + 1,
                    i,
                    if i % 100 == 0 { 0 } else { 20 }
                )
            })
            .collect();
        let body = format!(
            r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{}],"scope":{{"name":"s"}}}}],"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"json-svc"}}}}]}}}}]}}"#,
            spans.join(",")
        );
        let mut chunker = TraceChunker::default();
        let d = decode_traces_into(body.as_bytes(), Format::Json, &LIMITS, &mut chunker).unwrap();
        assert_eq!(d.rejected, 0);
        let out = chunker.finish().unwrap();
        assert_eq!(out.spans, 3000);
        assert!(out.chunks.len() >= 3, "{} chunks", out.chunks.len());
        assert_eq!(
            out.chunks.iter().map(TraceChunk::span_count).sum::<usize>(),
            3000
        );
        assert_eq!(out.ended.len(), 2970);
        assert_eq!(out.open.span_count(), 30);
        let (res, scope, _) = out.open.spans().next().unwrap();
        assert_eq!(res.service_name(), "json-svc");
        assert_eq!(scope.name, "s");
        // The same records as the whole-request decode.
        let whole = decode_traces(body.as_bytes(), Format::Json, &LIMITS)
            .unwrap()
            .batch;
        assert_eq!(whole.span_count(), 3000);
        assert_eq!(whole.resource_spans[0].resource.service_name(), "json-svc");
    }

    /// `body` decoded in `parts` parts: the parts' chunk count and everything else. With
    /// more than one part, the parts after the first run on a pool of 3 threads.
    fn in_parts(body: &[u8], parts: usize) -> (usize, Decoded<ChunkedTraces>) {
        let pool = PartPool::new(3, "part-test").unwrap();
        let d = chunk_protobuf_traces(&Bytes::copy_from_slice(body), &LIMITS, parts, Some(&pool))
            .unwrap();
        let one_by_one =
            chunk_protobuf_traces(&Bytes::copy_from_slice(body), &LIMITS, parts, None).unwrap();
        assert_eq!(d.batch.open, one_by_one.batch.open);
        assert_eq!(d.batch.chunks.len(), one_by_one.batch.chunks.len());
        (d.batch.chunks.len(), d)
    }

    /// The same request with one refused span (all-zero trace id) early and one late.
    fn request_with_refusals(n: u64) -> ExportTraceServiceRequest {
        let mut req = ExportTraceServiceRequest::decode(request(n).as_slice()).unwrap();
        req.resource_spans[0].scope_spans[0].spans[3].trace_id = vec![0; 16];
        req.resource_spans[1].scope_spans[1].spans[5].trace_id = vec![0; 16];
        req
    }

    /// [`request_with_refusals`] with a copy of its first span at its end, in a resource
    /// of its own.
    fn request_with_refusals_and_a_copy(n: u64) -> Vec<u8> {
        let mut req = request_with_refusals(n);
        let mut copy = req.resource_spans[0].clone();
        copy.scope_spans.truncate(1);
        copy.scope_spans[0].spans.truncate(1);
        req.resource_spans.push(copy);
        req.encode_to_vec()
    }

    #[test]
    fn wire_cuts_fall_on_spans_at_about_equal_bytes_and_refuse_what_is_not_worth_cutting() {
        // 4 scopes × 100 spans of the same size: halves and quarters fall on scope starts.
        let body = request(100);
        assert_eq!(decode::wire_cuts(&body, 2), Some(vec![(1, 0, 0)]));
        assert_eq!(
            decode::wire_cuts(&body, 4),
            Some(vec![(0, 1, 0), (1, 0, 0), (1, 1, 0)])
        );
        // Three parts cut inside scopes.
        let cuts = decode::wire_cuts(&body, 3).unwrap();
        assert_eq!(cuts.len(), 2);
        assert!(cuts.iter().all(|&(_, _, i)| i > 0), "{cuts:?}");
        assert_eq!(decode::wire_cuts(&body, 1), None);
        // One span per scope: 4 spans make at most 2 parts.
        assert_eq!(decode::wire_cuts(&request(1), 4), Some(vec![(1, 0, 0)]));
        // Not walkable: the whole decode reports it.
        let mut broken = body.clone();
        broken.truncate(body.len() - 10);
        assert_eq!(decode::wire_cuts(&broken, 2), None);
        assert_eq!(decode::wire_cuts(b"", 2), None);
    }

    /// What a decode's chunks store, whatever their zstd frames: each chunk's raw payload
    /// and index.
    fn stored(d: &Decoded<ChunkedTraces>) -> Vec<(Vec<u8>, Vec<u8>)> {
        d.batch
            .chunks
            .iter()
            .map(|c| {
                let (raw, index) = c.content().unwrap();
                (raw, index.to_vec())
            })
            .collect()
    }

    #[test]
    fn an_export_decoded_in_parts_gives_what_one_decode_gives() {
        // One chunk (~0.7 MB) encoded in its parts and joined; the same with a copy of a
        // span (decoded whole again after the parts); several chunks (~3 MB, one cut
        // inside a scope), handed to the chunker.
        let bodies = [
            (request_with_refusals(150).encode_to_vec(), true),
            (request_with_refusals_and_a_copy(150), false),
            (request(700), false),
        ];
        for (body, joined) in bodies {
            let (one_chunks, whole) = in_parts(&body, 1);
            assert!(whole.batch.chunks.iter().all(|c| c.frames() == 1));
            for parts in 2..=4 {
                assert!(wire_parts(&body, parts).len() > 1);
                let (chunks, d) = in_parts(&body, parts);
                assert_eq!(d.batch.parts, parts);
                assert_eq!(chunks, one_chunks);
                // joined: the header's frame and one per part
                let frames = if joined { 1 + parts } else { 1 };
                assert!(
                    d.batch.chunks.iter().all(|c| c.frames() == frames),
                    "{parts} parts"
                );
                assert!(stored(&d) == stored(&whole), "the same stored bytes");
                assert_eq!(d.rejected, whole.rejected);
                assert_eq!(d.rejected_end_before_start, whole.rejected_end_before_start);
                assert_eq!(d.message, whole.message, "the first refusal in wire order");
                assert_eq!(d.batch.spans, whole.batch.spans);
                assert_eq!(d.batch.ended, whole.batch.ended);
                assert_eq!(d.batch.open, whole.batch.open);
            }
        }
        let (_, whole) = in_parts(&request_with_refusals_and_a_copy(150), 1);
        assert_eq!(whole.rejected, 2);
        assert!(
            whole.message.starts_with("2 spans refused: ")
                && whole
                    .message
                    .contains("first at resourceSpans[0].scopeSpans[0].spans[3]"),
            "{}",
            whole.message
        );
        assert_eq!(
            whole.batch.spans, 599,
            "the copy counts until storage cuts it"
        );
    }

    /// The calling thread claims every part itself when the pool's threads are all busy:
    /// it never waits for one to come free, and stores what one whole decode stores.
    #[test]
    fn every_part_is_encoded_by_the_calling_thread_while_the_pool_is_busy() {
        let pool = PartPool::new(1, "part-test").unwrap();
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let (started, running) = std::sync::mpsc::channel::<()>();
        pool.spawn(move || {
            started.send(()).unwrap();
            let _ = blocked.recv();
        });
        running.recv().unwrap();
        let body = Bytes::from(request_with_refusals(150).encode_to_vec());
        let whole = chunk_protobuf_traces(&body, &LIMITS, 1, None).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let d = chunk_protobuf_traces(&body, &LIMITS, 2, Some(&pool));
                tx.send(d.map(|d| (stored(&d), d.batch.chunks[0].frames(), d.batch.spans)))
                    .unwrap();
            });
            let done = rx.recv_timeout(std::time::Duration::from_secs(20));
            release.send(()).unwrap();
            let (chunks, frames, spans) = done.expect("decoded while the pool was busy").unwrap();
            assert_eq!(frames, 3, "two parts joined");
            assert!(chunks == stored(&whole));
            assert_eq!(spans, whole.batch.spans);
        });
    }

    #[test]
    fn a_bad_span_fails_the_parts_with_the_whole_decodes_error() {
        let bad_at = |places: &[(usize, usize, usize)]| {
            let mut req = ExportTraceServiceRequest::decode(request(150).as_slice()).unwrap();
            for &(r, s, i) in places {
                req.resource_spans[r].scope_spans[s].spans[i].span_id = vec![1, 2, 3];
            }
            req.encode_to_vec()
        };
        let pool = PartPool::new(3, "part-test").unwrap();
        let err = |body: &[u8], parts| {
            let on_pool = match chunk_protobuf_traces(
                &Bytes::copy_from_slice(body),
                &LIMITS,
                parts,
                Some(&pool),
            ) {
                Err(ChunkError::Decode(e)) => e.0,
                other => panic!("{other:?}"),
            };
            match chunk_protobuf_traces(&Bytes::copy_from_slice(body), &LIMITS, parts, None) {
                Err(ChunkError::Decode(e)) => assert_eq!(e.0, on_pool),
                other => panic!("{other:?}"),
            }
            on_pool
        };
        // Only in the last part: its path counts the spans before the cut.
        let body = bad_at(&[(1, 1, 140)]);
        let whole = err(&body, 1);
        assert!(
            whole.contains("resourceSpans[1].scopeSpans[1].spans[140].spanId"),
            "{whole}"
        );
        for parts in 2..=4 {
            assert_eq!(err(&body, parts), whole);
        }
        // In the first and the last part: the first in wire order.
        let body = bad_at(&[(0, 0, 7), (1, 1, 140)]);
        let whole = err(&body, 1);
        assert!(whole.contains("scopeSpans[0].spans[7]"), "{whole}");
        for parts in 2..=4 {
            assert_eq!(err(&body, parts), whole);
        }
    }

    #[tokio::test]
    async fn an_export_decoded_in_parts_reads_back_as_one_decode() {
        // with a copy (decoded whole again) and without one (joined, several frames)
        for (body, spans) in [
            (request_with_refusals_and_a_copy(150), 598),
            (request_with_refusals(150).encode_to_vec(), 598),
        ] {
            reads_back_as_one_decode(&body, spans).await;
        }
    }

    async fn reads_back_as_one_decode(body: &[u8], want: usize) {
        let dir = tempfile::tempdir().unwrap();
        let mut stored = Vec::new();
        for (n, parts) in [(1, 1), (2, 4), (3, 2)] {
            let storage = stallwatch_storage::Storage::open(
                stallwatch_storage::StorageConfig::new(dir.path().join(format!("{n}.db"))),
            )
            .unwrap();
            let pool = (parts > 1).then(test_pool);
            let d =
                chunk_protobuf_traces(&Bytes::copy_from_slice(body), &LIMITS, parts, pool).unwrap();
            assert_eq!(d.batch.chunks.len(), 1);
            storage.write_trace_chunks(d.batch.chunks).await.unwrap();
            let mut spans = Vec::new();
            for t in [[1u8; 16], [2u8; 16]] {
                let trace = storage
                    .trace(stallwatch_storage::model::TraceId(t))
                    .await
                    .unwrap()
                    .unwrap();
                spans.extend(trace.spans.into_iter().map(|s| (s.span, s.state)));
            }
            stored.push(spans);
        }
        // 600 spans, 2 refused, a copy stored once whatever the parts.
        assert_eq!(stored[0].len(), want);
        assert_eq!(stored[1], stored[0]);
        assert_eq!(stored[2], stored[0]);
    }

    /// A pool of 3 part decoders shared by the generated cases.
    fn test_pool() -> &'static PartPool {
        static POOL: std::sync::OnceLock<PartPool> = std::sync::OnceLock::new();
        POOL.get_or_init(|| PartPool::new(3, "part-test").unwrap())
    }

    /// One decode's whole outcome, comparable: the stored bytes, the watchdog's view, the
    /// refusals, or the error.
    fn outcome(body: &[u8], parts: usize, pool: Option<&PartPool>) -> String {
        match chunk_protobuf_traces(&Bytes::copy_from_slice(body), &LIMITS, parts, pool) {
            Ok(d) => format!(
                "{:?} {:?} {:?} {} {} {} {}",
                stored(&d),
                d.batch.open,
                d.batch.ended,
                d.batch.spans,
                d.rejected,
                d.rejected_end_before_start,
                d.message
            ),
            Err(ChunkError::Decode(e)) => format!("decode error: {}", e.0),
            Err(ChunkError::Write(e)) => format!("write error: {e}"),
            Err(ChunkError::Panicked) => "panicked".into(),
        }
    }

    /// A span of a generated request: its trace (1–3), and what is wrong with it.
    fn gen_span() -> impl proptest::strategy::Strategy<Value = (u8, u8)> {
        use proptest::prelude::*;
        // 0–5: fine (3 open); 6: zero trace id (refused); 7: end before start (refused);
        // 8: span id 3 bytes long (a 400).
        (
            1u8..4,
            prop_oneof![8 => 0u8..6, 1 => 6u8..8, 1 => Just(8u8)],
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Generated exports, whole or damaged, decode in 2–4 parts exactly as whole:
        /// the same stored bytes, view and refusals, or the same error.
        #[test]
        fn generated_exports_decode_in_parts_as_whole(
            shape in proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(gen_span(), 0..7), 0..4),
                1..4,
            ),
            damage in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 0..3),
        ) {
            let mut k = 0u64;
            let req = ExportTraceServiceRequest {
                resource_spans: shape
                    .iter()
                    .enumerate()
                    .map(|(r, scopes)| pt::ResourceSpans {
                        resource: Some(PbResource {
                            attributes: vec![kv("service.name", &format!("svc{r}"))],
                            ..Default::default()
                        }),
                        scope_spans: scopes
                            .iter()
                            .map(|spans| pt::ScopeSpans {
                                spans: spans
                                    .iter()
                                    .map(|&(trace, what)| {
                                        k += 1;
                                        pt::Span {
                                            trace_id: if what == 6 { vec![0; 16] } else { vec![trace; 16] },
                                            span_id: if what == 8 { vec![1, 2, 3] } else { (k % 5 + 1).to_be_bytes().to_vec() },
                                            name: format!("op{k}"),
                                            start_time_unix_nano: 100,
                                            end_time_unix_nano: match what { 3 => 0, 7 => 50, _ => 200 + k },
                                            attributes: vec![kv("n", &"x".repeat(k as usize % 40))],
                                            ..Default::default()
                                        }
                                    })
                                    .collect(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
            };
            let mut body = req.encode_to_vec();
            for (at, byte) in &damage {
                if !body.is_empty() {
                    let i = at.index(body.len());
                    body[i] = *byte;
                }
            }
            let whole = outcome(&body, 1, None);
            for parts in 2..=4 {
                proptest::prop_assert_eq!(&outcome(&body, parts, None), &whole);
                proptest::prop_assert_eq!(&outcome(&body, parts, Some(test_pool())), &whole);
            }
        }
    }
}
