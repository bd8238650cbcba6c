//! One protobuf `Span` decoded straight from its bytes into a [`SpanRef`], the record whose
//! strings and bytes stay in the request body: no prost wire types in between and no
//! allocation per string (issue 16: decoding into `opentelemetry_proto` types, moving every
//! attribute into a second vector, then copying it all again into the stored form was a
//! large share of ingest's CPU).
//!
//! It reads what prost reads, with prost's rules (protobuf.dev "Encoding"; the proto3
//! language guide, "Updating A Message Type" and "Oneof"): the last value of a scalar
//! field wins; a repeated field appends; a singular message field seen twice is merged
//! (`status`, `KeyValue.value`); a oneof takes its last member, merging when a message
//! member repeats (`arrayValue`, `kvlistValue`); varints are cast as prost casts them
//! (`int32` and enums truncate, `bool` is non-zero); unknown fields are skipped (groups
//! inside them to a depth of 100 per message, where prost counts one budget for the whole
//! tree: `wire.rs`); a known field with another wire type is an error, in prost's words.
//! The conversion rules are [`super::traces`]'s: id lengths, attribute nesting depth
//! ([`super::check_depth`], checked before a value is read, so a deep value never recurses
//! past the limit), then the per-span refusals of [`super::traces::accept`]. The tests
//! below hold this decoder to the prost path on generated, merged and damaged spans;
//! `decode::tests` on the fixtures.

use stallwatch_storage::model::encoded::Scalar;
use stallwatch_storage::model::{AnyValueRef, EventRef, KeyValueRef, LinkRef, SpanRef, StatusRef};

use super::traces::accept;
use super::{check_depth, span_id, trace_id, Refusals};
use crate::decode::path::Path;
use crate::decode::wire::{self, Fields, Value};
use crate::decode::{DecodeError, Limits};

/// A malformed field at `p`, worded like the request-level wire errors.
fn bad(p: &Path, why: &str) -> DecodeError {
    crate::decode::wire_error("ExportTraceServiceRequest", Some(p), why)
}

fn string<'a>(v: Value<'a>, p: &Path) -> Result<&'a str, DecodeError> {
    wire::str(v).map_err(|e| bad(p, e))
}

fn bytes<'a>(v: Value<'a>, p: &Path) -> Result<&'a [u8], DecodeError> {
    wire::len(v).map_err(|e| bad(p, e))
}

fn varint(v: Value<'_>, p: &Path) -> Result<u64, DecodeError> {
    wire::varint(v).map_err(|e| bad(p, e))
}

fn fixed64(v: Value<'_>, p: &Path) -> Result<u64, DecodeError> {
    wire::fixed64(v).map_err(|e| bad(p, e))
}

fn fixed32(v: Value<'_>, p: &Path) -> Result<u32, DecodeError> {
    wire::fixed32(v).map_err(|e| bad(p, e))
}

/// Decodes one span's bytes (`b`, the `Span` message at path `p`). `Ok(None)`: refused
/// alone (counted in `refusals`); `Err`: the whole request is refused.
///
/// Errors: malformed wire data (naming the field's path), a wrong-length id, an attribute
/// value nested deeper than `limits.max_nesting_depth`.
pub(super) fn span<'a>(
    b: &'a [u8],
    p: &Path,
    limits: &Limits,
    refusals: &mut Refusals,
) -> Result<Option<SpanRef<'a>>, DecodeError> {
    let (mut tid, mut sid, mut parent): (&[u8], &[u8], &[u8]) = (&[], &[], &[]);
    let mut s = SpanRef::default();
    let pa = p.field("attributes");
    let pe = p.field("events");
    let pl = p.field("links");
    for f in Fields::new(b) {
        let (field, v) = f.map_err(|e| bad(p, e))?;
        match field {
            1 => tid = bytes(v, &p.field("traceId"))?,
            2 => sid = bytes(v, &p.field("spanId"))?,
            3 => s.trace_state = string(v, &p.field("traceState"))?,
            4 => parent = bytes(v, &p.field("parentSpanId"))?,
            5 => s.name = string(v, &p.field("name"))?,
            6 => s.kind = varint(v, &p.field("kind"))? as i32,
            7 => s.start_time_unix_nano = fixed64(v, &p.field("startTimeUnixNano"))?,
            8 => s.end_time_unix_nano = fixed64(v, &p.field("endTimeUnixNano"))?,
            9 => {
                let pi = pa.index(s.attributes.len());
                // Room for them all at the first: encoded, attributes never take more bytes
                // than on the wire (postcard has no field tags), so the span's own length
                // bounds them: no growing and copying, and the room a request's spans
                // hold for them is at most its body's size.
                if s.attributes.capacity() == 0 {
                    s.attributes.reserve(b.len());
                }
                let kv_bytes = bytes(v, &pi)?;
                match scalar_key_value(kv_bytes, 1, limits) {
                    Some((key, value)) => s.attributes.push_scalar(key, value),
                    None => {
                        let kv = key_value_looped(kv_bytes, &pi, 1, limits)?;
                        s.attributes.push(kv.key, &kv.value);
                    }
                }
            }
            10 => {
                s.dropped_attributes_count = varint(v, &p.field("droppedAttributesCount"))? as u32
            }
            11 => {
                let pi = pe.index(s.events.len());
                let e = event(bytes(v, &pi)?, &pi, limits)?;
                s.events.push(e);
            }
            12 => s.dropped_events_count = varint(v, &p.field("droppedEventsCount"))? as u32,
            13 => {
                let pi = pl.index(s.links.len());
                let l = link(bytes(v, &pi)?, &pi, limits)?;
                s.links.push(l);
            }
            14 => s.dropped_links_count = varint(v, &p.field("droppedLinksCount"))? as u32,
            15 => {
                let ps = p.field("status");
                status(&mut s.status, bytes(v, &ps)?, &ps)?;
            }
            16 => s.flags = fixed32(v, &p.field("flags"))?,
            _ => {}
        }
    }
    let tid = trace_id(tid, &p.field("traceId"))?;
    let sid = span_id(sid, &p.field("spanId"))?;
    // Empty or all-zero parent: a root span.
    s.parent_span_id = span_id(parent, &p.field("parentSpanId"))?;
    let times = (s.name, s.start_time_unix_nano, s.end_time_unix_nano);
    let Some((trace_id, span_id)) = accept(tid, sid, times, p, refusals) else {
        return Ok(None);
    };
    s.trace_id = trace_id;
    s.span_id = span_id;
    Ok(Some(s))
}

/// Merges a `Status` message into `into` (its fields replace, absent ones stay).
fn status<'a>(into: &mut StatusRef<'a>, b: &'a [u8], p: &Path) -> Result<(), DecodeError> {
    for f in Fields::new(b) {
        let (field, v) = f.map_err(|e| bad(p, e))?;
        match field {
            2 => into.message = string(v, &p.field("message"))?,
            3 => into.code = varint(v, &p.field("code"))? as i32,
            _ => {}
        }
    }
    Ok(())
}

fn event<'a>(b: &'a [u8], p: &Path, limits: &Limits) -> Result<EventRef<'a>, DecodeError> {
    let mut e = EventRef::default();
    let pa = p.field("attributes");
    for f in Fields::new(b) {
        let (field, v) = f.map_err(|e| bad(p, e))?;
        match field {
            1 => e.time_unix_nano = fixed64(v, &p.field("timeUnixNano"))?,
            2 => e.name = string(v, &p.field("name"))?,
            3 => {
                let pi = pa.index(e.attributes.len());
                key_value_pushed(&mut e.attributes, bytes(v, &pi)?, &pi, 1, limits)?;
            }
            4 => e.dropped_attributes_count = varint(v, &p.field("droppedAttributesCount"))? as u32,
            _ => {}
        }
    }
    Ok(e)
}

/// A link. A link to an invalid (empty or all-zero) context is legal (OTel spec: such
/// links are kept when they carry attributes or trace state); wrong lengths are not.
fn link<'a>(b: &'a [u8], p: &Path, limits: &Limits) -> Result<LinkRef<'a>, DecodeError> {
    let mut l = LinkRef::default();
    let (mut tid, mut sid): (&[u8], &[u8]) = (&[], &[]);
    let pa = p.field("attributes");
    for f in Fields::new(b) {
        let (field, v) = f.map_err(|e| bad(p, e))?;
        match field {
            1 => tid = bytes(v, &p.field("traceId"))?,
            2 => sid = bytes(v, &p.field("spanId"))?,
            3 => l.trace_state = string(v, &p.field("traceState"))?,
            4 => {
                let pi = pa.index(l.attributes.len());
                key_value_pushed(&mut l.attributes, bytes(v, &pi)?, &pi, 1, limits)?;
            }
            5 => l.dropped_attributes_count = varint(v, &p.field("droppedAttributesCount"))? as u32,
            6 => l.flags = fixed32(v, &p.field("flags"))?,
            _ => {}
        }
    }
    l.trace_id = trace_id(tid, &p.field("traceId"))?.unwrap_or_default();
    l.span_id = span_id(sid, &p.field("spanId"))?.unwrap_or_default();
    Ok(l)
}

/// Appends to `to` the `KeyValue` at path `p` whose value sits at nesting `depth` (1 for
/// top-level attributes): read by [`scalar_key_value`] when it can, else by
/// [`key_value_looped`]. On an error the request is refused and `to`, holding the part
/// decoded, is dropped with it.
fn key_value_pushed<'a>(
    to: &mut Vec<KeyValueRef<'a>>,
    b: &'a [u8],
    p: &Path,
    depth: usize,
    limits: &Limits,
) -> Result<(), DecodeError> {
    let kv = match scalar_key_value(b, depth, limits) {
        Some((key, value)) => KeyValueRef {
            key,
            value: value.into(),
        },
        None => key_value_looped(b, p, depth, limits)?,
    };
    to.push(kv);
    Ok(())
}

/// The `KeyValue` at path `p` whose value sits at nesting `depth`, read field by field
/// by the general rules (any layout, merged and repeated fields, nested values).
fn key_value_looped<'a>(
    b: &'a [u8],
    p: &Path,
    depth: usize,
    limits: &Limits,
) -> Result<KeyValueRef<'a>, DecodeError> {
    let pv = p.field("value");
    check_depth(&pv, depth, limits)?;
    let mut kv = KeyValueRef::default();
    for f in Fields::new(b) {
        let (field, v) = f.map_err(|e| bad(p, e))?;
        match field {
            1 => kv.key = string(v, &p.field("key"))?,
            2 => any_value(&mut kv.value, bytes(v, &pv)?, &pv, depth, limits)?,
            // `key_strindex` (profiles only): read as prost reads it, then ignored like
            // `string_value_strindex`
            3 => {
                varint(v, &p.field("keyStrindex"))?;
            }
            _ => {}
        }
    }
    Ok(kv)
}

/// A `KeyValue` (its value at nesting `depth`) in the form every OpenTelemetry SDK writes
/// for a scalar attribute, read without the general field loop: `key` (field 1), then
/// `value` (field 2) holding one `stringValue`, `boolValue`, `intValue`, `doubleValue` or
/// `bytesValue`, each field once, nothing else, every varint shorter than 10 bytes and
/// every string UTF-8. What [`key_value_looped`] makes of the same bytes; `None` for
/// anything else (other members, repeated or extra fields, another order, a malformed or
/// non-UTF-8 field, a depth past the limit), which the loop then reads, or refuses, by the
/// general rules. Attributes are most of a span's fields, and the loop's per-field tag
/// dispatch was most of their cost (issue 16).
#[inline(always)]
fn scalar_key_value<'a>(
    b: &'a [u8],
    depth: usize,
    limits: &Limits,
) -> Option<(&'a str, Scalar<'a>)> {
    if depth > limits.max_nesting_depth {
        return None;
    }
    let rest = b.strip_prefix(&[0x0a])?;
    let (key, rest) = short_len(rest)?;
    let rest = rest.strip_prefix(&[0x12])?;
    let (value, rest) = short_len(rest)?;
    if !rest.is_empty() {
        return None;
    }
    let key = wire::utf8(key)?;
    let (&tag, v) = value.split_first()?;
    let value = match tag {
        // stringValue (1) and bytesValue (7): length-delimited
        0x0a | 0x3a => {
            let (body, rest) = short_len(v)?;
            if !rest.is_empty() {
                return None;
            }
            if tag == 0x0a {
                Scalar::String(wire::utf8(body)?)
            } else {
                Scalar::Bytes(body)
            }
        }
        // boolValue (2) and intValue (3): varints
        0x10 | 0x18 => {
            let (n, rest) = short_varint(v)?;
            if !rest.is_empty() {
                return None;
            }
            if tag == 0x10 {
                Scalar::Bool(n != 0)
            } else {
                Scalar::Int(n as i64)
            }
        }
        // doubleValue (4): fixed64
        0x21 => {
            let bits: [u8; 8] = v.try_into().ok()?;
            Scalar::Double(f64::from_bits(u64::from_le_bytes(bits)))
        }
        _ => return None,
    };
    Some((key, value))
}

/// A varint of at most 9 bytes (every value below 2^63) at the start of `b`, and the bytes
/// after it; `None` for a longer one or the end of `b`.
#[inline(always)]
fn short_varint(b: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(9) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Some((v, &b[i + 1..]));
        }
    }
    None
}

/// A length-delimited field's bytes (its length a [`short_varint`]) at the start of `b`,
/// and the bytes after them; `None` when they run past the end.
#[inline(always)]
fn short_len(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (n, rest) = short_varint(b)?;
    let n = usize::try_from(n).ok()?;
    (n <= rest.len()).then(|| rest.split_at(n))
}

/// Merges an `AnyValue` message into `into`. A oneof member replaces the value, except
/// that `arrayValue` and `kvlistValue` merge into a value of their own kind (prost's
/// oneof merge); `string_value_strindex` (profiles only) reads as no value, as in
/// [`super::any_value`].
fn any_value<'a>(
    into: &mut AnyValueRef<'a>,
    b: &'a [u8],
    p: &Path,
    depth: usize,
    limits: &Limits,
) -> Result<(), DecodeError> {
    for f in Fields::new(b) {
        let (field, v) = f.map_err(|e| bad(p, e))?;
        match field {
            1 => *into = AnyValueRef::String(string(v, &p.field("stringValue"))?),
            2 => *into = AnyValueRef::Bool(varint(v, &p.field("boolValue"))? != 0),
            3 => *into = AnyValueRef::Int(varint(v, &p.field("intValue"))? as i64),
            4 => *into = AnyValueRef::Double(f64::from_bits(fixed64(v, &p.field("doubleValue"))?)),
            5 => {
                let pa = p.field("arrayValue");
                let b = bytes(v, &pa)?;
                if !matches!(into, AnyValueRef::Array(_)) {
                    *into = AnyValueRef::Array(Vec::new());
                }
                if let AnyValueRef::Array(values) = into {
                    array(values, b, &pa, depth + 1, limits)?;
                }
            }
            6 => {
                let pk = p.field("kvlistValue");
                let b = bytes(v, &pk)?;
                if !matches!(into, AnyValueRef::KvList(_)) {
                    *into = AnyValueRef::KvList(Vec::new());
                }
                if let AnyValueRef::KvList(values) = into {
                    kvlist(values, b, &pk, depth + 1, limits)?;
                }
            }
            7 => *into = AnyValueRef::Bytes(bytes(v, &p.field("bytesValue"))?),
            8 => {
                varint(v, &p.field("stringValueStrindex"))?;
                *into = AnyValueRef::Empty;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Merges an `ArrayValue` (`values` at `depth`) into `values`.
fn array<'a>(
    values: &mut Vec<AnyValueRef<'a>>,
    b: &'a [u8],
    p: &Path,
    depth: usize,
    limits: &Limits,
) -> Result<(), DecodeError> {
    let pv = p.field("values");
    for f in Fields::new(b) {
        let (field, v) = f.map_err(|e| bad(p, e))?;
        if field == 1 {
            let pi = pv.index(values.len());
            check_depth(&pi, depth, limits)?;
            let mut value = AnyValueRef::Empty;
            any_value(&mut value, bytes(v, &pi)?, &pi, depth, limits)?;
            values.push(value);
        }
    }
    Ok(())
}

/// Merges a `KeyValueList` (values at `depth`) into `values`.
fn kvlist<'a>(
    values: &mut Vec<KeyValueRef<'a>>,
    b: &'a [u8],
    p: &Path,
    depth: usize,
    limits: &Limits,
) -> Result<(), DecodeError> {
    let pv = p.field("values");
    for f in Fields::new(b) {
        let (field, v) = f.map_err(|e| bad(p, e))?;
        if field == 1 {
            let pi = pv.index(values.len());
            key_value_pushed(values, bytes(v, &pi)?, &pi, depth, limits)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! This decoder against the prost path it replaced ([`super::super::traces`], prost's
    //! `ExportTraceServiceRequest` then the conversion): generated spans, the same bytes
    //! with fields repeated and flipped, and depth limits small enough to be reached.
    #![allow(clippy::unwrap_used)]

    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1 as pc;
    use opentelemetry_proto::tonic::trace::v1 as pt;
    use proptest::prelude::*;
    use prost::Message;

    use crate::decode::{decode_traces, protobuf, DecodeError, Decoded, Format, Limits};
    use stallwatch_storage::model::TraceBatch;

    fn by_prost(body: &[u8], limits: &Limits) -> Result<Decoded<TraceBatch>, DecodeError> {
        crate::decode::convert::traces(protobuf(body, "ExportTraceServiceRequest")?, limits)
    }

    /// Both paths accept or both refuse; accepted, they give the same records, refusal
    /// counts and messages. Refused, each names a fault, not always the same one when
    /// a span has several: prost reads the whole span before any rule is checked, this
    /// decoder checks a value's depth before reading it (single-fault messages are
    /// compared in `decode::tests`).
    fn same(body: &[u8], limits: &Limits) {
        let direct = decode_traces(body, Format::Protobuf, limits);
        let prost = by_prost(body, limits);
        match (&direct, &prost) {
            (Ok(d), Ok(p)) => assert_eq!(d, p),
            (Err(_), Err(_)) => {}
            _ => panic!("direct {direct:?}\nprost {prost:?}"),
        }
    }

    fn id(len: usize) -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            6 => proptest::collection::vec(any::<u8>(), len..=len),
            1 => Just(Vec::new()),
            1 => Just(vec![0; len]),
            1 => proptest::collection::vec(any::<u8>(), 1..len),
        ]
    }

    fn value() -> impl Strategy<Value = Option<pc::any_value::Value>> {
        use pc::any_value::Value as V;
        let leaf = prop_oneof![
            Just(None),
            ".{0,6}".prop_map(|s| Some(V::StringValue(s))),
            any::<bool>().prop_map(|b| Some(V::BoolValue(b))),
            any::<i64>().prop_map(|i| Some(V::IntValue(i))),
            (-1e12f64..1e12).prop_map(|d| Some(V::DoubleValue(d))),
            proptest::collection::vec(any::<u8>(), 0..5).prop_map(|b| Some(V::BytesValue(b))),
            any::<i32>().prop_map(|i| Some(V::StringValueStrindex(i))),
        ];
        leaf.prop_recursive(5, 24, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(|vs| {
                    Some(V::ArrayValue(pc::ArrayValue {
                        values: vs.into_iter().map(|value| pc::AnyValue { value }).collect(),
                    }))
                }),
                proptest::collection::vec(("[a-z.]{0,5}", inner), 0..3).prop_map(|kvs| {
                    Some(V::KvlistValue(pc::KeyValueList {
                        values: kvs
                            .into_iter()
                            .map(|(key, value)| pc::KeyValue {
                                key,
                                value: Some(pc::AnyValue { value }),
                                ..Default::default()
                            })
                            .collect(),
                    }))
                }),
            ]
        })
    }

    fn attributes() -> impl Strategy<Value = Vec<pc::KeyValue>> {
        proptest::collection::vec(("[a-z._]{0,8}", value(), any::<bool>()), 0..4).prop_map(|kvs| {
            kvs.into_iter()
                .map(|(key, value, absent)| pc::KeyValue {
                    key,
                    value: (!absent || value.is_some()).then_some(pc::AnyValue { value }),
                    ..Default::default()
                })
                .collect()
        })
    }

    fn span() -> impl Strategy<Value = pt::Span> {
        let event = (any::<u64>(), ".{0,4}", attributes(), any::<u32>()).prop_map(
            |(time_unix_nano, name, attributes, dropped_attributes_count)| pt::span::Event {
                time_unix_nano,
                name,
                attributes,
                dropped_attributes_count,
            },
        );
        let link = (
            id(16),
            id(8),
            ".{0,4}",
            attributes(),
            any::<u32>(),
            any::<u32>(),
        )
            .prop_map(
                |(trace_id, span_id, trace_state, attributes, dropped_attributes_count, flags)| {
                    pt::span::Link {
                        trace_id,
                        span_id,
                        trace_state,
                        attributes,
                        dropped_attributes_count,
                        flags,
                    }
                },
            );
        let ids = (id(16), id(8), id(8), ".{0,4}", any::<u32>());
        let body = (
            ".{0,8}",
            -1i32..8,
            (0u64..4, 0u64..4),
            attributes(),
            proptest::collection::vec(event, 0..3),
            proptest::collection::vec(link, 0..2),
            (any::<u32>(), any::<u32>(), any::<u32>()),
            proptest::option::of((-1i32..4, ".{0,4}")),
        );
        (ids, body).prop_map(
            |(
                (trace_id, span_id, parent_span_id, trace_state, flags),
                (name, kind, (start, end), attributes, events, links, dropped, status),
            )| pt::Span {
                trace_id,
                span_id,
                parent_span_id,
                trace_state,
                flags,
                name,
                kind,
                // small times so that some spans end before they start
                start_time_unix_nano: start,
                end_time_unix_nano: end,
                attributes,
                dropped_attributes_count: dropped.0,
                events,
                dropped_events_count: dropped.1,
                links,
                dropped_links_count: dropped.2,
                status: status.map(|(code, message)| pt::Status { message, code }),
            },
        )
    }

    fn request(spans: Vec<pt::Span>) -> Vec<u8> {
        ExportTraceServiceRequest {
            resource_spans: vec![pt::ResourceSpans {
                scope_spans: vec![pt::ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    /// The bytes of one span, inside the request framing [`request`] gives.
    fn request_of_span_bytes(span: &[u8]) -> Vec<u8> {
        let mut scope = Vec::new();
        prost::encoding::bytes::encode(2, &span.to_vec(), &mut scope);
        let mut rs = Vec::new();
        prost::encoding::bytes::encode(2, &scope, &mut rs);
        let mut body = Vec::new();
        prost::encoding::bytes::encode(1, &rs, &mut body);
        body
    }

    const DEEP: Limits = Limits {
        max_nesting_depth: 32,
    };
    const SHALLOW: Limits = Limits {
        max_nesting_depth: 2,
    };

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Generated spans decode alike, with a depth limit they never reach and with
        /// one they often do.
        #[test]
        fn generated_spans_decode_as_prost_decodes_them(spans in proptest::collection::vec(span(), 1..4)) {
            let body = request(spans);
            same(&body, &DEEP);
            same(&body, &SHALLOW);
        }

        /// A span's encoding with a second copy of some of its fields appended (a later
        /// scalar wins, a repeated field appends, `status` and attribute values merge,
        /// a oneof takes its last member) decodes alike.
        #[test]
        fn repeated_fields_merge_as_prost_merges_them(a in span(), b in span(), pick in any::<u16>()) {
            // `b`'s fields, one by one, some of them appended after all of `a`
            let mut bytes = a.encode_to_vec();
            let mut picked = pt::Span::default();
            let take = |bit: u16| pick & (1 << bit) != 0;
            if take(0) { picked.trace_id = b.trace_id.clone(); }
            if take(1) { picked.span_id = b.span_id.clone(); }
            if take(2) { picked.name = b.name.clone(); }
            if take(3) { picked.kind = b.kind; }
            if take(4) { picked.start_time_unix_nano = b.start_time_unix_nano; }
            if take(5) { picked.end_time_unix_nano = b.end_time_unix_nano; }
            if take(6) { picked.attributes = b.attributes.clone(); }
            if take(7) { picked.events = b.events.clone(); }
            if take(8) { picked.links = b.links.clone(); }
            if take(9) { picked.status = b.status.clone(); }
            if take(10) { picked.flags = b.flags; }
            if take(11) { picked.parent_span_id = b.parent_span_id.clone(); }
            bytes.extend_from_slice(&picked.encode_to_vec());
            let body = request_of_span_bytes(&bytes);
            same(&body, &DEEP);
            same(&body, &SHALLOW);
        }

        /// Damaged bytes: both refuse or both give the same records, never a panic.
        #[test]
        fn damaged_spans_are_refused_or_read_alike(
            s in span(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = s.encode_to_vec();
            prop_assume!(!bytes.is_empty());
            for (at, to) in flips {
                let i = at.index(bytes.len());
                bytes[i] = to;
            }
            same(&request_of_span_bytes(&bytes), &DEEP);
        }
    }

    /// Attribute values merged across two `value` fields and two `arrayValue` members:
    /// the exact records prost gives (arrays append; a scalar replaces an array).
    #[test]
    fn a_value_given_twice_is_merged_like_prost() {
        use pc::any_value::Value as V;
        let arr = |n: i64| pc::AnyValue {
            value: Some(V::ArrayValue(pc::ArrayValue {
                values: vec![pc::AnyValue {
                    value: Some(V::IntValue(n)),
                }],
            })),
        };
        let mut kv = Vec::new();
        prost::encoding::string::encode(1, &"k".to_string(), &mut kv);
        prost::encoding::message::encode(2, &arr(1), &mut kv);
        prost::encoding::message::encode(2, &arr(2), &mut kv);
        let mut span = pt::Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            ..Default::default()
        }
        .encode_to_vec();
        prost::encoding::bytes::encode(9, &kv, &mut span);
        let body = request_of_span_bytes(&span);
        let d = decode_traces(&body, Format::Protobuf, &DEEP).unwrap();
        let attrs = &d.batch.resource_spans[0].scope_spans[0].spans[0].attributes;
        assert_eq!(
            attrs[0].value,
            stallwatch_storage::model::AnyValue::Array(vec![
                stallwatch_storage::model::AnyValue::Int(1),
                stallwatch_storage::model::AnyValue::Int(2)
            ])
        );
        same(&body, &DEEP);
    }

    /// Scalar attributes in the layout SDKs write are read by [`super::scalar_key_value`]
    /// and everything near that layout by the field loop, each as prost reads it: long
    /// lengths, 10-byte varints, an empty key or value, fields repeated, reordered or
    /// extra, a value of no member, non-UTF-8 text, a length past the end.
    #[test]
    fn scalar_attributes_read_on_the_short_path_or_the_loop_as_prost_reads_them() {
        let field = |n: u8, body: &[u8]| {
            let mut out = Vec::new();
            prost::encoding::bytes::encode(u32::from(n), &body.to_vec(), &mut out);
            out
        };
        let varint = |n: u8, v: u64| {
            let mut out = Vec::new();
            prost::encoding::uint64::encode(u32::from(n), &v, &mut out);
            out
        };
        let kv = |key: &[u8], value: &[u8]| [field(1, key), field(2, value)].concat();
        let long = "x".repeat(300);
        let mut double = vec![0x21];
        double.extend_from_slice(&1.5f64.to_bits().to_le_bytes());
        let short: Vec<(&str, Vec<u8>)> = vec![
            ("string", kv(b"k", &field(1, b"v"))),
            ("long string", kv(b"k", &field(1, long.as_bytes()))),
            ("long key", kv(long.as_bytes(), &field(1, b"v"))),
            ("empty key", kv(b"", &field(1, b"v"))),
            ("empty string", kv(b"k", &field(1, b""))),
            ("non-ASCII", kv("kä".as_bytes(), &field(1, "vé".as_bytes()))),
            ("bytes", kv(b"k", &field(7, &[0, 255]))),
            ("bool", kv(b"k", &varint(2, 1))),
            ("bool 2", kv(b"k", &varint(2, 2))),
            ("int", kv(b"k", &varint(3, 1 << 62))),
            ("double", kv(b"k", &double)),
        ];
        let looped: Vec<(&str, Vec<u8>)> = vec![
            ("negative int", kv(b"k", &varint(3, -5i64 as u64))),
            ("no member", kv(b"k", b"")),
            ("no value", field(1, b"k")),
            (
                "value first",
                [field(2, &field(1, b"v")), field(1, b"k")].concat(),
            ),
            (
                "key twice",
                [kv(b"a", &field(1, b"v")), field(1, b"b")].concat(),
            ),
            (
                "two members",
                kv(b"k", &[field(1, b"v"), varint(3, 7)].concat()),
            ),
            (
                "extra field",
                [kv(b"k", &field(1, b"v")), varint(3, 1)].concat(),
            ),
            ("array", kv(b"k", &field(5, &field(1, &varint(3, 1))))),
            ("strindex", kv(b"k", &varint(8, 3))),
            ("bad key", kv(&[0xff], &field(1, b"v"))),
            ("bad string", kv(b"k", &field(1, &[0xc3]))),
            ("short double", kv(b"k", &double[..5])),
            ("length past the end", vec![0x0a, 5, b'k']),
        ];
        for (cases, on_short_path) in [(&short, true), (&looped, false)] {
            for (name, kv) in cases {
                assert_eq!(
                    super::scalar_key_value(kv, 1, &DEEP).is_some(),
                    on_short_path,
                    "{name}"
                );
                let mut span = pt::Span {
                    trace_id: vec![1; 16],
                    span_id: vec![2; 8],
                    name: "s".into(),
                    ..Default::default()
                }
                .encode_to_vec();
                prost::encoding::bytes::encode(9, kv, &mut span);
                let body = request_of_span_bytes(&span);
                let direct = decode_traces(&body, Format::Protobuf, &DEEP);
                let prost = by_prost(&body, &DEEP);
                match (&direct, &prost) {
                    (Ok(d), Ok(p)) => assert_eq!(d, p, "{name}"),
                    // worded apart (`same`), each naming the fault
                    (Err(d), Err(_)) => assert!(!on_short_path, "{name}: {d}"),
                    _ => panic!("{name}: direct {direct:?}\nprost {prost:?}"),
                }
            }
        }
    }
}
