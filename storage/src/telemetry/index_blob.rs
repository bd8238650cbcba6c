//! The stored form of a batch's per-span index (`span_batches.idx`): [`encode_index`] and
//! [`decode_index`].
//!
//! Three forms are read; only the newest is written:
//! 1. bare postcard of [`BatchIndex`] (the first versions);
//! 2. that postcard in one zstd frame (issue 16, the index compressed);
//! 3. columns (issue 16, this module): the ids raw, each trace id once per batch instead of
//!    once per span, each distinct term list once, then times and offsets as
//!    differences, all without zstd. On otlp-blast's exports (512 spans, traces of 8) form
//!    3 stores 30.1 bytes per span where form 2 stored 28.7, and encoding it takes a
//!    fraction of form 2's postcard-then-zstd: zstd had compressed the random ids at
//!    ~1 GB/s for little gain, and the index had taken 43% of an export's compression time
//!    for a sixth of its bytes.
//!
//! Form 3's layout, after the 5-byte [`COLUMNS_MAGIC`]:
//!
//! ```text
//! varint n_traces, varint n_spans
//! n_traces × 16 bytes   the batch's distinct trace ids, in order of first appearance
//! n_spans  × 8 bytes    the span ids, in span order
//! postcard of `Rest`    the first start time, the terms, the distinct term lists of the
//!                       spans, and per span its trace's position, flags, start (after
//!                       the first), end (after its start), status, scope, body offset
//!                       (after the previous body), body length, name, service and the
//!                       position of its term list
//! ```
//!
//! `Rest` is written by hand ([`write_rest`]) in postcard's encoding (varints, zigzag for
//! signed numbers, a raw byte for `u8`) and read back with serde; a fixed and a generated
//! test hold the writer to serde's bytes.
//!
//! The forms cannot be confused: a zstd frame starts with `28 B5 2F FD` (RFC 8878,
//! section 3.1.1); bare postcard starts with the term count as a varint, and
//! `FF FF FF FF 03` would be a count of 2^30 − 1 terms, more than a batch's bytes could
//! hold.

use std::collections::HashMap;

use serde::Deserialize;

use super::bloom::IdBuild;
use super::encode::{payload_bytes, BatchIndex, IdxSpan, TraceGroups};

/// The first bytes of form 3: four bytes no earlier form starts with, then the version
/// (module doc).
pub(crate) const COLUMNS_MAGIC: [u8; 5] = [0xFF, 0xFF, 0xFF, 0xFF, 3];

/// Most term ids one span's list may hold in form 3. The encoder takes at most one term
/// per indexed key from each attribute list (`encode.rs`, `KeysSeen`), so a list holds at
/// most 14; a longer one in a stored blob is damage. Each span's list is copied out of the
/// shared ones as the index is decoded, so without the bound a damaged blob of `n` bytes
/// could ask for memory of the order of `n²`; with it, at most 64 ids per span.
pub(crate) const MAX_SPAN_TERMS: usize = 64;

/// The flag of a root span (no parent) in `RestSpan::flags`.
const FLAG_ROOT: u8 = 1;
/// The flag of an ended span (an end time, stored after its start) in `RestSpan::flags`.
const FLAG_ENDED: u8 = 2;

/// Form 3's part after the ids, decoded.
#[derive(Deserialize)]
struct Rest {
    min_start: u64,
    terms: Vec<(String, String)>,
    sets: Vec<Vec<u32>>,
    spans: Vec<RestSpan>,
}

/// One span of [`Rest`]. Times and offsets are stored as differences, so most fit in a
/// few varint bytes; wrapping arithmetic makes every value round-trip exactly, even an end
/// before its start. (Serialized only by the tests' reference writer.)
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct RestSpan {
    /// Position of the span's trace id in the trace id column.
    trace: u32,
    /// [`FLAG_ROOT`] | [`FLAG_ENDED`].
    flags: u8,
    /// `start - min_start`, ns.
    start: u64,
    /// `end - start` (wrapping) when ended, else 0, ns.
    end: i64,
    status: i32,
    scope: u32,
    /// `off - (previous off + previous len)` (0 for bodies stored one after another).
    off: i64,
    len: u32,
    name: u32,
    service: u32,
    /// Position of the span's term list in `Rest::sets`.
    set: u32,
}

/// Each span's trace and term list, numbered in order of first appearance.
struct Positions<'a> {
    /// The distinct trace ids.
    trace_ids: Vec<[u8; 16]>,
    /// Span `i`'s position in `trace_ids`.
    traces: Vec<u32>,
    /// The distinct term lists (spans of one resource and name mostly share theirs).
    sets: Vec<&'a [u32]>,
    /// Span `i`'s position in `sets`.
    set_of: Vec<u32>,
}

impl<'a> Positions<'a> {
    fn of(index: &'a BatchIndex) -> Self {
        let n = index.spans.len();
        let mut trace_pos: HashMap<[u8; 16], u32, IdBuild> =
            HashMap::with_capacity_and_hasher(n / 4 + 1, IdBuild::default());
        let mut set_pos: foldhash::HashMap<&[u32], u32> = Default::default();
        let mut p = Positions {
            trace_ids: Vec::new(),
            traces: Vec::with_capacity(n),
            sets: Vec::new(),
            set_of: Vec::with_capacity(n),
        };
        for s in &index.spans {
            let t = *trace_pos.entry(s.trace_id).or_insert_with(|| {
                p.trace_ids.push(s.trace_id);
                (p.trace_ids.len() - 1) as u32
            });
            p.traces.push(t);
            let k = *set_pos.entry(&s.terms).or_insert_with(|| {
                p.sets.push(&s.terms);
                (p.sets.len() - 1) as u32
            });
            p.set_of.push(k);
        }
        p
    }
}

/// Encodes a batch index into its stored form (form 3, the module's doc).
pub(crate) fn encode_index(index: &BatchIndex) -> Vec<u8> {
    encode(index, &Positions::of(index))
}

/// [`encode_index`], also giving the spans grouped by trace: each trace id with the
/// positions of its spans in `index.spans`, traces in order of first appearance (the
/// numbering the encoder makes anyway, so the caller need not hash the ids again).
pub(crate) fn encode_index_by_trace(index: &BatchIndex) -> (Vec<u8>, TraceGroups) {
    let p = Positions::of(index);
    let blob = encode(index, &p);
    let mut traces: TraceGroups = p.trace_ids.iter().map(|t| (*t, Vec::new())).collect();
    for (i, &t) in p.traces.iter().enumerate() {
        traces[t as usize].1.push(i as u32);
    }
    (blob, traces)
}

/// Form 3 of `index`, its traces and term lists numbered by `p`.
fn encode(index: &BatchIndex, p: &Positions<'_>) -> Vec<u8> {
    let n = index.spans.len();
    let trace_ids = &p.trace_ids;
    let min_start = index.spans.iter().map(|s| s.start).min().unwrap_or(0);
    let mut out = Vec::with_capacity(COLUMNS_MAGIC.len() + 20 + trace_ids.len() * 16 + n * 40);
    out.extend_from_slice(&COLUMNS_MAGIC);
    push_varint(&mut out, trace_ids.len() as u64);
    push_varint(&mut out, n as u64);
    for t in trace_ids {
        out.extend_from_slice(t);
    }
    for s in &index.spans {
        out.extend_from_slice(&s.span_id);
    }
    write_rest(&mut out, min_start, index, p);
    out
}

/// Appends `Rest` (the module's doc) in postcard's encoding: `min_start`, the terms, the
/// term lists, and each span's fields as differences.
fn write_rest(out: &mut Vec<u8>, min_start: u64, index: &BatchIndex, p: &Positions<'_>) {
    push_varint(out, min_start);
    push_varint(out, index.terms.len() as u64);
    for (k, v) in &index.terms {
        push_varint(out, k.len() as u64);
        out.extend_from_slice(k.as_bytes());
        push_varint(out, v.len() as u64);
        out.extend_from_slice(v.as_bytes());
    }
    push_varint(out, p.sets.len() as u64);
    for set in &p.sets {
        // never more than the decoder takes (the encoder's lists are far shorter)
        let set = &set[..set.len().min(MAX_SPAN_TERMS)];
        push_varint(out, set.len() as u64);
        for &t in set {
            push_varint(out, u64::from(t));
        }
    }
    push_varint(out, index.spans.len() as u64);
    let mut next_off = 0u32;
    for ((sp, &trace), &set) in index.spans.iter().zip(&p.traces).zip(&p.set_of) {
        push_varint(out, u64::from(trace));
        out.push(if sp.root { FLAG_ROOT } else { 0 } | if sp.ended() { FLAG_ENDED } else { 0 });
        push_varint(out, sp.start.wrapping_sub(min_start));
        push_zigzag(
            out,
            if sp.ended() {
                sp.end.wrapping_sub(sp.start) as i64
            } else {
                0
            },
        );
        push_zigzag(out, i64::from(sp.status));
        push_varint(out, u64::from(sp.scope));
        push_zigzag(out, i64::from(sp.off) - i64::from(next_off));
        push_varint(out, u64::from(sp.len));
        push_varint(out, u64::from(sp.name));
        push_varint(out, u64::from(sp.service));
        push_varint(out, u64::from(set));
        next_off = sp.off.wrapping_add(sp.len);
    }
}

/// Decodes a batch index blob in any of the three forms (module doc).
///
/// Errors: a damaged blob (a count larger than the blob, a damaged zstd frame
/// ([`payload_bytes`]) or postcard, a span count or trace position that does not match
/// the id columns), as text.
pub(crate) fn decode_index(idx: &[u8]) -> Result<BatchIndex, String> {
    let Some(cols) = idx.strip_prefix(&COLUMNS_MAGIC[..]) else {
        // forms 1 and 2
        let raw = payload_bytes(idx)?;
        return postcard::from_bytes(&raw).map_err(|e| e.to_string());
    };
    let mut at = 0usize;
    let n_traces = read_varint(cols, &mut at)?;
    let n_spans = read_varint(cols, &mut at)?;
    let ids_len = n_traces
        .checked_mul(16)
        .and_then(|t| n_spans.checked_mul(8).and_then(|s| t.checked_add(s)))
        .filter(|&l| l <= (cols.len() - at) as u64)
        .ok_or("index columns longer than the blob")? as usize;
    let (n_traces, n_spans) = (n_traces as usize, n_spans as usize);
    let (trace_col, span_col) = cols[at..at + ids_len].split_at(n_traces * 16);
    let r: Rest = postcard::from_bytes(&cols[at + ids_len..]).map_err(|e| e.to_string())?;
    if r.spans.len() != n_spans {
        return Err(format!(
            "index has {} spans after its id columns, {n_spans} in them",
            r.spans.len()
        ));
    }
    if let Some(long) = r.sets.iter().find(|l| l.len() > MAX_SPAN_TERMS) {
        return Err(format!(
            "index term list of {} ids, more than {MAX_SPAN_TERMS}",
            long.len()
        ));
    }
    let mut spans = Vec::with_capacity(n_spans);
    let mut next_off = 0u32;
    for (s, span_id) in r.spans.into_iter().zip(span_col.chunks_exact(8)) {
        let t = s.trace as usize;
        let trace_id: [u8; 16] = trace_col
            .chunks_exact(16)
            .nth(t)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| format!("index span names trace {t} of {n_traces}"))?;
        let terms = r
            .sets
            .get(s.set as usize)
            .ok_or_else(|| format!("index span names term list {} of {}", s.set, r.sets.len()))?
            .clone();
        let start = r.min_start.wrapping_add(s.start);
        let off = i64::from(next_off).wrapping_add(s.off) as u32;
        next_off = off.wrapping_add(s.len);
        spans.push(IdxSpan {
            trace_id,
            span_id: span_id.try_into().map_err(|_| "span id column")?,
            root: s.flags & FLAG_ROOT != 0,
            start,
            end: if s.flags & FLAG_ENDED != 0 {
                start.wrapping_add(s.end as u64)
            } else {
                0
            },
            status: s.status,
            scope: s.scope,
            off,
            len: s.len,
            name: s.name,
            service: s.service,
            terms,
        });
    }
    Ok(BatchIndex {
        terms: r.terms,
        spans,
    })
}

/// Appends `v` as a LEB128 varint (postcard's unsigned encoding).
fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends `v` zigzag-encoded as a varint (postcard's signed encoding).
fn push_zigzag(out: &mut Vec<u8>, v: i64) {
    push_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Reads a LEB128 varint at `*at`, advancing it.
///
/// Errors: the blob ends inside it, or it is longer than 10 bytes.
fn read_varint(b: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = *b.get(*at).ok_or("index columns truncated")?;
        *at += 1;
        v |= u64::from(byte & 0x7F).checked_shl(shift).unwrap_or(0);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("index varint longer than 10 bytes".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;
    use serde::ser::SerializeSeq;
    use serde::{Serialize, Serializer};

    /// `Rest` borrowed from an index and written through serde: the reference
    /// [`write_rest`] is held to.
    struct RestRef<'a> {
        min_start: u64,
        index: &'a BatchIndex,
        traces: &'a [u32],
        sets: &'a [Vec<u32>],
        set_of: &'a [u32],
    }

    impl Serialize for RestRef<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeTuple;
            let mut t = s.serialize_tuple(4)?;
            t.serialize_element(&self.min_start)?;
            t.serialize_element(&self.index.terms)?;
            t.serialize_element(self.sets)?;
            t.serialize_element(&SpansRef(self))?;
            t.end()
        }
    }

    /// The span sequence of a [`RestRef`].
    struct SpansRef<'r, 'a>(&'r RestRef<'a>);

    impl Serialize for SpansRef<'_, '_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let r = self.0;
            let mut seq = s.serialize_seq(Some(r.index.spans.len()))?;
            let mut next_off = 0u32;
            for ((sp, &trace), &set) in r.index.spans.iter().zip(r.traces).zip(r.set_of) {
                let flags =
                    if sp.root { FLAG_ROOT } else { 0 } | if sp.ended() { FLAG_ENDED } else { 0 };
                seq.serialize_element(&RestSpan {
                    trace,
                    flags,
                    start: sp.start.wrapping_sub(r.min_start),
                    end: if sp.ended() {
                        sp.end.wrapping_sub(sp.start) as i64
                    } else {
                        0
                    },
                    status: sp.status,
                    scope: sp.scope,
                    off: i64::from(sp.off) - i64::from(next_off),
                    len: sp.len,
                    name: sp.name,
                    service: sp.service,
                    set,
                })?;
                next_off = sp.off.wrapping_add(sp.len);
            }
            seq.end()
        }
    }

    /// A batch shaped like otlp-blast's: traces of 8 spans spread over 4 resources,
    /// bodies one after another, times a few ms apart.
    fn blast_like(traces: usize) -> BatchIndex {
        let terms = vec![
            ("service".to_string(), "tauri-backend".to_string()),
            ("span".to_string(), "tools/call read_file".to_string()),
        ];
        let mut spans = Vec::new();
        let mut off = 300u32;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for res in 0..4u32 {
            for t in 0..traces {
                let mut trace_id = [0u8; 16];
                trace_id[..8].copy_from_slice(&(t as u64 * 7919).to_le_bytes());
                for k in 0..2u64 {
                    let start = 1_764_000_000_000_000_000 + rnd() % 2_000_000_000;
                    let len = 350 + (rnd() % 60) as u32;
                    spans.push(IdxSpan {
                        trace_id,
                        span_id: rnd().to_le_bytes(),
                        root: res == 0 && k == 0,
                        start,
                        end: start + 200_000 + rnd() % 250_000_000,
                        status: i32::from(rnd() % 50 == 0) * 2,
                        scope: res,
                        off,
                        len,
                        name: 1,
                        service: 0,
                        terms: vec![0, 1, 2 + (rnd() % 3) as u32],
                    });
                    off += len;
                }
            }
        }
        BatchIndex { terms, spans }
    }

    fn bytes(i: &BatchIndex) -> Vec<u8> {
        postcard::to_allocvec(i).unwrap()
    }

    /// Numbers `items` by first appearance (a linear search, independent of
    /// [`Positions::of`]): the distinct items and each item's number.
    fn first_seen<T: PartialEq + Clone>(items: impl Iterator<Item = T>) -> (Vec<T>, Vec<u32>) {
        let mut seen: Vec<T> = Vec::new();
        let numbers = items
            .map(|x| match seen.iter().position(|t| *t == x) {
                Some(p) => p as u32,
                None => {
                    seen.push(x);
                    (seen.len() - 1) as u32
                }
            })
            .collect();
        (seen, numbers)
    }

    fn min_start(index: &BatchIndex) -> u64 {
        index.spans.iter().map(|s| s.start).min().unwrap_or(0)
    }

    fn rest_by_hand(index: &BatchIndex) -> Vec<u8> {
        let mut out = Vec::new();
        write_rest(&mut out, min_start(index), index, &Positions::of(index));
        out
    }

    fn rest_by_serde(index: &BatchIndex) -> Vec<u8> {
        let (_, traces) = first_seen(index.spans.iter().map(|s| s.trace_id));
        let (sets, set_of) = first_seen(index.spans.iter().map(|s| s.terms.clone()));
        postcard::to_allocvec(&RestRef {
            min_start: min_start(index),
            index,
            traces: &traces,
            sets: &sets,
            set_of: &set_of,
        })
        .unwrap()
    }

    /// All three stored forms decode to the same index; form 3 is what is written, and on
    /// otlp-blast-shaped batches it is smaller than form 2 (the trace ids once per trace).
    #[test]
    fn every_form_decodes_to_the_same_index() {
        let index = blast_like(64);
        let bare = bytes(&index);
        // form 2 as it was written: level -3
        let framed = zstd::bulk::compress(&bare, -3).unwrap();
        let columns = encode_index(&index);
        assert!(columns.starts_with(&COLUMNS_MAGIC));
        assert!(framed.starts_with(&[0x28, 0xB5, 0x2F, 0xFD]));
        for form in [&bare, &framed, &columns] {
            assert_eq!(bytes(&decode_index(form).unwrap()), bare);
        }
        // without zstd, form 3 is still the smaller (each trace id and term list once)
        assert!(
            columns.len() < framed.len(),
            "columns {} bytes, form 2 {}",
            columns.len(),
            framed.len()
        );
        assert_eq!(rest_by_hand(&index), rest_by_serde(&index));
    }

    /// Values at their edges round-trip exactly: an end before its start, an open span,
    /// the largest times, bodies out of order, a span with no terms, an empty index.
    #[test]
    fn edge_values_round_trip() {
        let mut index = blast_like(2);
        index.spans[0].end = 0;
        index.spans[1].end = index.spans[1].start - 1;
        index.spans[2].start = u64::MAX;
        index.spans[2].end = 1;
        index.spans[3].start = 0;
        index.spans[3].end = u64::MAX;
        index.spans[4].off = 0;
        index.spans[5].off = u32::MAX;
        index.spans[5].len = u32::MAX;
        index.spans[6].terms.clear();
        index.spans[7].status = i32::MIN;
        let back = decode_index(&encode_index(&index)).unwrap();
        assert_eq!(bytes(&back), bytes(&index));
        assert_eq!(rest_by_hand(&index), rest_by_serde(&index));
        let empty = BatchIndex::default();
        let back = decode_index(&encode_index(&empty)).unwrap();
        assert_eq!(bytes(&back), bytes(&empty));
    }

    /// A damaged blob is an error, never a panic or a huge allocation: every truncation,
    /// counts larger than the blob, a trace position past the trace ids.
    #[test]
    fn damaged_blobs_are_errors() {
        let index = blast_like(3);
        let blob = encode_index(&index);
        for n in COLUMNS_MAGIC.len()..blob.len() {
            assert!(decode_index(&blob[..n]).is_err(), "cut at {n}");
        }
        let mut huge = COLUMNS_MAGIC.to_vec();
        push_varint(&mut huge, u64::MAX / 8);
        push_varint(&mut huge, u64::MAX / 8);
        huge.extend_from_slice(&[0; 64]);
        assert!(decode_index(&huge)
            .unwrap_err()
            .contains("longer than the blob"));
        // one trace id fewer than the spans name
        let mut short = COLUMNS_MAGIC.to_vec();
        push_varint(&mut short, 2);
        push_varint(&mut short, index.spans.len() as u64);
        let whole = &blob[COLUMNS_MAGIC.len() + 2..];
        short.extend_from_slice(&whole[16..]);
        assert!(decode_index(&short).is_err());
        // the frame's span count disagrees with the columns
        let mut fewer = COLUMNS_MAGIC.to_vec();
        push_varint(&mut fewer, 3);
        push_varint(&mut fewer, index.spans.len() as u64 - 2);
        fewer.extend_from_slice(&whole[..3 * 16 + (index.spans.len() - 2) * 8]);
        fewer.extend_from_slice(&whole[3 * 16 + index.spans.len() * 8..]);
        assert!(decode_index(&fewer).unwrap_err().contains("spans"));
        // a term list longer than any the encoder writes (written through serde's
        // reference, which does not cap it): refused, not copied into every span
        let mut long = blast_like(1);
        long.spans[0].terms = (0..=MAX_SPAN_TERMS as u32).collect();
        let mut blob = COLUMNS_MAGIC.to_vec();
        push_varint(&mut blob, 1);
        push_varint(&mut blob, long.spans.len() as u64);
        blob.extend_from_slice(&long.spans[0].trace_id);
        for s in &long.spans {
            blob.extend_from_slice(&s.span_id);
        }
        blob.extend_from_slice(&rest_by_serde(&long));
        let trimmed = decode_index(&encode_index(&long)).unwrap();
        assert_eq!(
            trimmed.spans[0].terms.len(),
            MAX_SPAN_TERMS,
            "the encoder caps it"
        );
        assert!(decode_index(&blob)
            .unwrap_err()
            .contains(&format!("more than {MAX_SPAN_TERMS}")));
    }

    fn idx_span() -> impl Strategy<Value = IdxSpan> {
        (
            (0u8..4, any::<[u8; 8]>(), any::<bool>(), any::<u64>()),
            (
                prop_oneof![Just(0u64), any::<u64>()],
                any::<i32>(),
                any::<u32>(),
            ),
            (any::<u32>(), any::<u32>(), 0u32..50, 0u32..50),
            proptest::collection::vec(0u32..300, 0..6),
        )
            .prop_map(
                |(
                    (t, span_id, root, start),
                    (end, status, scope),
                    (off, len, name, service),
                    terms,
                )| {
                    IdxSpan {
                        trace_id: [t; 16],
                        span_id,
                        root,
                        start,
                        end,
                        status,
                        scope,
                        off,
                        len,
                        name,
                        service,
                        terms,
                    }
                },
            )
    }

    proptest! {
        /// Any index round-trips through form 3 to the same postcard bytes, and a flipped
        /// byte anywhere in the blob gives an error or an index, never a panic.
        #[test]
        fn generated_indexes_round_trip(
            spans in proptest::collection::vec(idx_span(), 0..40),
            flip in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let index = BatchIndex {
                terms: vec![("service".into(), "a".into()), ("span".into(), "b".into())],
                spans,
            };
            let blob = encode_index(&index);
            prop_assert_eq!(bytes(&decode_index(&blob).unwrap()), bytes(&index));
            prop_assert_eq!(rest_by_hand(&index), rest_by_serde(&index));
            let mut bad = blob.clone();
            let i = flip.index(bad.len());
            bad[i] ^= 1 << bit;
            let _ = decode_index(&bad);
        }
    }
}
