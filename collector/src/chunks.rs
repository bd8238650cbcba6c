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

use stallwatch_storage::model::{
    Resource, ResourceSpans, ResourceSpansRef, Scope, ScopeSpans, ScopeSpansRef, Span, SpanId,
    SpanRef, TraceBatch, TraceId,
};
use stallwatch_storage::telemetry::TraceChunk;
use stallwatch_storage::WriteError;

use crate::decode::{DecodeError, SpanSink};

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
}
