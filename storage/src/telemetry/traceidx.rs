//! Finding a trace's batches, and folding its span copies into one span per id.
//!
//! A trace's batches are its `trace_index` rows, one per run at most (batches up to
//! `merged_upto`, see `schema::TRACE_RUNS_SCHEMA`) plus the newer, not yet merged batches
//! whose `traces` column holds its id. Folding is the one
//! merge rule shared by the writer and every read: copies in (batch id, position) order;
//! the first copy is taken; a later ended copy replaces an open one; everything else is a
//! duplicate.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension};

use super::encode::{BatchIndex, IdxSpan, TraceGroups};
use super::schema::META_MERGED_UPTO;

/// Encodes a batch id list (i64 LE each).
pub(crate) fn encode_batches(ids: &[i64]) -> Vec<u8> {
    ids.iter().flat_map(|i| i.to_le_bytes()).collect()
}

/// Decodes a batch id list.
pub(crate) fn decode_batches(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            i64::from_le_bytes(a)
        })
        .collect()
}

/// Most traces in one block of a form-2 run ([`encode_block`]): about 3.6 KiB when each
/// trace lies in one batch, inside a 16 KiB page without overflow pages.
pub(crate) const BLOCK_TRACES: usize = 128;
/// A block is ended early once its batch lists pass this many bytes (traces spread over
/// many batches), bytes.
pub(crate) const BLOCK_LIST_BYTES: usize = 2048;

/// Encodes one block of a form-2 run (`schema::TRACE_BLOCKS_SCHEMA`): `entries` are
/// (trace id, its batch ids) in ascending trace-id order. Layout: `n` (u32 LE), the `n`
/// trace ids (16 bytes each), `n + 1` offsets (u32 LE) into the lists that follow, then
/// the batch-id lists ([`encode_batches`], concatenated). A trace id is found by binary
/// search over the ids in place ([`block_batches`]), without decoding the block.
pub(crate) fn encode_block(entries: &[([u8; 16], Vec<i64>)]) -> Vec<u8> {
    let n = entries.len();
    let lists: usize = entries.iter().map(|(_, l)| l.len() * 8).sum();
    let mut out = Vec::with_capacity(4 + n * 20 + 4 + lists);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    for (t, _) in entries {
        out.extend_from_slice(t);
    }
    let mut at = 0u32;
    out.extend_from_slice(&at.to_le_bytes());
    for (_, l) in entries {
        at += (l.len() * 8) as u32;
        out.extend_from_slice(&at.to_le_bytes());
    }
    for (_, l) in entries {
        for b in l {
            out.extend_from_slice(&b.to_le_bytes());
        }
    }
    out
}

/// A block's trace ids (ascending), its `n + 1` offsets, and the lists they point into.
type BlockParts<'a> = (&'a [[u8; 16]], &'a [u8], &'a [u8]);

/// A block's parts ([`BlockParts`]), checked against each other.
fn block_parts(block: &[u8]) -> Option<BlockParts<'_>> {
    let n = u32::from_le_bytes(block.get(..4)?.try_into().ok()?) as usize;
    let ids_end = 4usize.checked_add(n.checked_mul(16)?)?;
    let offs_end = ids_end.checked_add(n.checked_add(1)?.checked_mul(4)?)?;
    let (ids, _) = block.get(4..ids_end)?.as_chunks::<16>();
    let offs = block.get(ids_end..offs_end)?;
    let lists = block.get(offs_end..)?;
    Some((ids, offs, lists))
}

/// The undecoded batch list of the `i`-th trace of a block, from its parts.
fn block_list<'a>(offs: &[u8], lists: &'a [u8], i: usize) -> Option<&'a [u8]> {
    let offset = |i: usize| -> Option<usize> {
        let b = offs.get(i * 4..i * 4 + 4)?;
        Some(u32::from_le_bytes(b.try_into().ok()?) as usize)
    };
    lists.get(offset(i)?..offset(i + 1)?)
}

fn damaged_block() -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Blob,
        "damaged trace-index block".into(),
    )
}

/// The batch ids of `t` in a block of a form-2 run: `Ok(None)` when the block does not
/// hold `t`.
///
/// Errors: a block whose counts or offsets do not fit its length (damage).
pub(crate) fn block_batches(
    block: &[u8],
    t: &[u8; 16],
) -> Result<Option<Vec<i64>>, rusqlite::Error> {
    let (ids, offs, lists) = block_parts(block).ok_or_else(damaged_block)?;
    let Ok(i) = ids.binary_search(t) else {
        return Ok(None);
    };
    let list = block_list(offs, lists, i).ok_or_else(damaged_block)?;
    Ok(Some(decode_batches(list)))
}

/// Every trace id of a block of a form-2 run (none when it is damaged).
pub(crate) fn block_trace_ids(block: &[u8]) -> impl Iterator<Item = [u8; 16]> + '_ {
    block_parts(block)
        .map(|(ids, _, _)| ids)
        .unwrap_or_default()
        .iter()
        .copied()
}

/// Cuts a merge's entries (ascending trace ids) into blocks: at most [`BLOCK_TRACES`]
/// traces each, ended early once the batch lists pass [`BLOCK_LIST_BYTES`].
pub(crate) fn blocks(entries: &[([u8; 16], Vec<i64>)]) -> Vec<&[([u8; 16], Vec<i64>)]> {
    let mut out = Vec::with_capacity(entries.len() / BLOCK_TRACES + 1);
    let (mut start, mut bytes) = (0, 0);
    for (i, (_, l)) in entries.iter().enumerate() {
        bytes += l.len() * 8;
        if i + 1 - start >= BLOCK_TRACES || bytes >= BLOCK_LIST_BYTES {
            out.push(&entries[start..=i]);
            start = i + 1;
            bytes = 0;
        }
    }
    if start < entries.len() {
        out.push(&entries[start..]);
    }
    out
}

/// The sorted distinct trace ids of a batch, concatenated (`span_batches.traces`).
///
/// From the batch's traces (`traces`, each with its span positions, distinct) and the
/// copies kept of them (`keep`, by position): the writer sorts the ~64 distinct ids of a
/// 512-span export, not its 512 span copies (that sort was ~1.5% of ingest CPU on the
/// writer thread, issue 16).
pub(crate) fn batch_trace_ids(traces: &TraceGroups, keep: &[bool]) -> Vec<u8> {
    let mut ids: Vec<[u8; 16]> = traces
        .iter()
        .filter(|(_, positions)| {
            positions
                .iter()
                .any(|&p| keep.get(p as usize).copied().unwrap_or(false))
        })
        .map(|(t, _)| *t)
        .collect();
    ids.sort_unstable();
    ids.concat()
}

/// True when the sorted id list `list` holds `t`.
pub(crate) fn list_contains(list: &[u8], t: &[u8; 16]) -> bool {
    let n = list.len() / 16;
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        match list[mid * 16..mid * 16 + 16].cmp(&t[..]) {
            std::cmp::Ordering::Equal => return true,
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
        }
    }
    false
}

/// The newest batch id merged into `trace_index` (0 when none).
pub(crate) fn merged_upto(conn: &Connection) -> Result<i64, rusqlite::Error> {
    Ok(conn
        .prepare_cached("SELECT value FROM telemetry_meta WHERE key = ?1")?
        .query_row([META_MERGED_UPTO], |r| r.get::<_, i64>(0))
        .optional()?
        .unwrap_or(0))
}

/// (batch id, its term ids ascending) of every batch whose postings are not in
/// `batch_terms` yet (the `pending_terms` rows), newest first.
pub(crate) fn unmerged_postings(
    conn: &Connection,
) -> Result<Vec<(i64, Vec<i64>)>, rusqlite::Error> {
    let mut st =
        conn.prepare_cached("SELECT batch_id, term_ids FROM pending_terms ORDER BY batch_id DESC")?;
    let rows = st.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            decode_batches(r.get_ref(1)?.as_blob()?),
        ))
    })?;
    rows.collect()
}

/// Batches listed for `t` in `trace_index`: the union of its rows over every run
/// (`trace_runs`, one B-tree seek per run), ascending and distinct. May hold ids of
/// batches retention already deleted (a run partly deleted keeps them until it is
/// deleted whole); readers skip ids whose row is gone.
pub(crate) fn indexed_batches(
    conn: &Connection,
    t: &[u8; 16],
) -> Result<Vec<i64>, rusqlite::Error> {
    // CROSS JOIN keeps trace_runs as the outer loop. Per run, the row with the greatest
    // trace id not above `t` (one seek for the max, one for the row): in a form-1 run the
    // trace's own row when the ids are equal, in a form-2 run the block that would hold it
    // (`schema::TRACE_BLOCKS_SCHEMA`).
    let mut st = conn.prepare_cached(
        "SELECT r.form, t.trace_id, t.batches FROM trace_runs r CROSS JOIN trace_index t
         ON t.run = r.run
         AND t.trace_id = (SELECT max(trace_id) FROM trace_index
                           WHERE run = r.run AND trace_id <= ?1)",
    )?;
    let mut rows = st.query([&t[..]])?;
    let mut out = Vec::new();
    let mut runs = 0;
    while let Some(r) = rows.next()? {
        let batches = r.get_ref(2)?.as_blob()?;
        if r.get::<_, i64>(0)? == 2 {
            if let Some(list) = block_batches(batches, t)? {
                out.extend(list);
                runs += 1;
            }
        } else if r.get_ref(1)?.as_blob()? == &t[..] {
            out.extend(decode_batches(batches));
            runs += 1;
        }
    }
    if runs > 1 {
        out.sort_unstable();
        out.dedup();
    }
    Ok(out)
}

/// How many of `ids` (ascending, distinct) no run of `trace_index` lists with a batch
/// newer than `hi`: the traces retention deleted whole once the batches up to `hi` are
/// gone. One ordered pass over the rows of each run that reaches past `hi`, merged with
/// `ids`, instead of [`indexed_batches`]' seeks per id and run: at a 2 GiB size cap, one
/// retention chunk holds ~5,000 traces (8 MiB of ~100 KB batches of 64 traces) and the
/// store ~70 runs, so ~350,000 seeks per chunk (estimated, not counted); the writer thread
/// spent 88% of the CPU in B-tree seeks (`perf record`) and ingest at the cap fell to 98k
/// spans/s (issue 16, `benches/side-by-side --retention 90 --max-db-bytes 2147483648`).
pub(crate) fn count_unlisted_after(
    conn: &Connection,
    ids: &[[u8; 16]],
    hi: i64,
) -> Result<u64, rusqlite::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let runs: Vec<(i64, i64)> = {
        let mut st = conn.prepare_cached("SELECT run, form FROM trace_runs WHERE hi > ?1")?;
        let rows = st.query_map([hi], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<Result<_, _>>()?
    };
    let mut listed = vec![false; ids.len()];
    let mut st = conn.prepare_cached(
        "SELECT trace_id, batches FROM trace_index WHERE run = ?1 ORDER BY trace_id",
    )?;
    for (run, form) in runs {
        // `ids[j]` is the first id not below the trace ids of the run seen so far.
        let mut j = 0usize;
        let mut visit = |t: &[u8; 16], list: &[u8]| {
            while j < ids.len() && ids[j] < *t {
                j += 1;
            }
            if j < ids.len() && ids[j] == *t && !listed[j] {
                listed[j] = decode_batches(list).iter().any(|&b| b > hi);
            }
            j == ids.len()
        };
        let mut rows = st.query([run])?;
        while let Some(r) = rows.next()? {
            let blob = r.get_ref(1)?.as_blob()?;
            let done = if form == 2 {
                let (block_ids, offs, lists) = block_parts(blob).unwrap_or_default();
                let mut done = false;
                for (i, t) in block_ids.iter().enumerate() {
                    let list = block_list(offs, lists, i).ok_or_else(damaged_block)?;
                    done = visit(t, list);
                    if done {
                        break;
                    }
                }
                done
            } else if let Ok(t) = <[u8; 16]>::try_from(r.get_ref(0)?.as_blob()?) {
                visit(&t, blob)
            } else {
                false
            };
            if done {
                break;
            }
        }
    }
    Ok(listed.iter().filter(|&&l| !l).count() as u64)
}

/// Trace id → the batches that hold it, in id order: the trace index's part not yet
/// merged into runs. Hashed with foldhash, seeded per process (trace ids come from
/// exporters), like the writer's span-id and term caches; one lookup per trace of every
/// export here. With SipHash in these three maps the writer thread showed
/// `DefaultHasher::write` at 0.33% and `hash_one` at 0.23% of the samples; with foldhash
/// neither appears on it (issue 16, `perf record` at HTTP/protobuf c=1).
pub(crate) type L0Map = foldhash::HashMap<[u8; 16], Vec<i64>>;

/// Trace id → batches, for every batch newer than `merged_upto`.
pub(crate) fn unmerged_map(conn: &Connection, merged_upto: i64) -> Result<L0Map, rusqlite::Error> {
    let mut st =
        conn.prepare_cached("SELECT id, traces FROM span_batches WHERE id > ?1 ORDER BY id")?;
    let rows = st.query_map([merged_upto], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    let mut out = L0Map::default();
    for row in rows {
        let (id, list) = row?;
        for c in list.chunks_exact(16) {
            let mut t = [0u8; 16];
            t.copy_from_slice(c);
            out.entry(t).or_default().push(id);
        }
    }
    Ok(out)
}

/// Every batch holding spans of `t`, ascending.
pub(crate) fn trace_batches(conn: &Connection, t: &[u8; 16]) -> Result<Vec<i64>, rusqlite::Error> {
    let upto = merged_upto(conn)?;
    let mut out = indexed_batches(conn, t)?;
    let mut st =
        conn.prepare_cached("SELECT id, traces FROM span_batches WHERE id > ?1 ORDER BY id")?;
    let rows = st.query_map([upto], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    for row in rows {
        let (id, list) = row?;
        if list_contains(&list, t) {
            out.push(id);
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Where the winning copy of a span is: (index into the folded batch list, position).
pub(crate) type Winner = (usize, usize);

/// Folds the copies of trace `t` found in `batches` (ascending batch order). Answers the
/// winners keyed by span id, in order of first appearance.
pub(crate) fn fold<'a>(
    t: &[u8; 16],
    batches: impl IntoIterator<Item = &'a BatchIndex>,
) -> Vec<([u8; 8], Winner)> {
    let mut pos: HashMap<[u8; 8], usize> = HashMap::new();
    let mut out: Vec<([u8; 8], Winner)> = Vec::new();
    let mut ended: Vec<bool> = Vec::new();
    for (bi, b) in batches.into_iter().enumerate() {
        for (pi, s) in b.spans.iter().enumerate() {
            if &s.trace_id != t {
                continue;
            }
            match pos.get(&s.span_id) {
                None => {
                    pos.insert(s.span_id, out.len());
                    out.push((s.span_id, (bi, pi)));
                    ended.push(s.ended());
                }
                Some(&i) => {
                    if !ended[i] && s.ended() {
                        out[i].1 = (bi, pi);
                        ended[i] = true;
                    }
                }
            }
        }
    }
    out
}

/// Summary numbers of folded spans: (start, end, spans, errors, open, root copy).
pub(crate) fn summarize<'a>(
    winners: impl Iterator<Item = (&'a BatchIndex, &'a IdxSpan)>,
) -> Option<Summary<'a>> {
    let mut s: Option<Summary<'a>> = None;
    for (b, c) in winners {
        let cur = s.get_or_insert(Summary {
            start: c.start,
            end: c.end,
            spans: 0,
            errors: 0,
            open: 0,
            root: (b, c),
        });
        cur.start = cur.start.min(c.start);
        cur.end = cur.end.max(c.end);
        cur.spans += 1;
        cur.errors += u64::from(c.error());
        cur.open += u64::from(!c.ended());
        let r = cur.root.1;
        if (c.root && !r.root) || (c.root == r.root && c.start < r.start) {
            cur.root = (b, c);
        }
    }
    s
}

/// What a trace summary is computed from.
pub(crate) struct Summary<'a> {
    /// Earliest start, ns.
    pub start: u64,
    /// Latest end, ns (0 when all open).
    pub end: u64,
    /// Distinct spans.
    pub spans: u64,
    /// Spans with status ERROR.
    pub errors: u64,
    /// Spans still open.
    pub open: u64,
    /// The root span copy (or the earliest) and its batch.
    pub root: (&'a BatchIndex, &'a IdxSpan),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn tid(i: u32) -> [u8; 16] {
        let mut t = [7u8; 16];
        t[..4].copy_from_slice(&i.to_be_bytes());
        t
    }

    /// Every trace of a block is found with its batches; ids between, before and after
    /// them are not.
    #[test]
    fn a_block_finds_each_of_its_traces_and_no_other() {
        let entries: Vec<([u8; 16], Vec<i64>)> = (0..100u32)
            .map(|i| {
                (
                    tid(2 * i + 1),
                    (0..i64::from(i % 4) + 1)
                        .map(|k| k * 1000 + i64::from(i))
                        .collect(),
                )
            })
            .collect();
        let block = encode_block(&entries);
        for (t, l) in &entries {
            assert_eq!(block_batches(&block, t).unwrap().as_ref(), Some(l));
        }
        for i in [0u32, 2, 100, 198, 200, 1000] {
            assert_eq!(block_batches(&block, &tid(i)).unwrap(), None, "{i}");
        }
        let ids: Vec<[u8; 16]> = block_trace_ids(&block).collect();
        assert_eq!(ids, entries.iter().map(|e| e.0).collect::<Vec<_>>());
        assert_eq!(block_batches(&encode_block(&[]), &tid(1)).unwrap(), None);
    }

    /// A cut or lying block is an error (or no id), never a panic.
    #[test]
    fn a_damaged_block_is_an_error() {
        let entries: Vec<([u8; 16], Vec<i64>)> =
            (0..10u32).map(|i| (tid(i), vec![i64::from(i)])).collect();
        let block = encode_block(&entries);
        for cut in 0..block.len() {
            let b = &block[..cut];
            // the last id's list may still be whole when only nothing after it is cut
            let _ = block_batches(b, &tid(9));
            let _ = block_trace_ids(b).count();
        }
        assert!(block_batches(&block[..3], &tid(1)).is_err());
        assert!(block_batches(&block[..block.len() - 1], &tid(9)).is_err());
        let mut lying = block.clone();
        lying[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(block_batches(&lying, &tid(1)).is_err());
        assert_eq!(block_trace_ids(&lying).count(), 0);
        let mut bad_offset = block.clone();
        let offs = 4 + 16 * 10;
        bad_offset[offs + 4..offs + 8].copy_from_slice(&9999u32.to_le_bytes());
        assert!(block_batches(&bad_offset, &tid(0)).is_err());
    }

    /// Blocks hold at most BLOCK_TRACES traces, end early once their lists pass
    /// BLOCK_LIST_BYTES, and together hold every entry once, in order.
    #[test]
    fn entries_are_cut_into_blocks_by_count_and_by_list_bytes() {
        let one: Vec<([u8; 16], Vec<i64>)> = (0..300u32).map(|i| (tid(i), vec![1])).collect();
        let sizes: Vec<usize> = blocks(&one).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![128, 128, 44]);
        let wide: Vec<([u8; 16], Vec<i64>)> =
            (0..10u32).map(|i| (tid(i), (0..100).collect())).collect();
        let sizes: Vec<usize> = blocks(&wide).iter().map(|b| b.len()).collect();
        // 800 bytes of batch ids per trace: a block ends at its third trace (2,400 bytes)
        assert_eq!(sizes, vec![3, 3, 3, 1]);
        assert!(blocks(&[]).is_empty());
        let back: Vec<[u8; 16]> = blocks(&one)
            .iter()
            .flat_map(|b| b.iter().map(|e| e.0))
            .collect();
        assert_eq!(back, one.iter().map(|e| e.0).collect::<Vec<_>>());
    }

    fn copy(t: u8, s: u8, end: u64) -> IdxSpan {
        IdxSpan {
            trace_id: [t; 16],
            span_id: [s; 8],
            start: 10,
            end,
            ..Default::default()
        }
    }

    fn batch(spans: Vec<IdxSpan>) -> BatchIndex {
        BatchIndex {
            terms: vec![],
            spans,
        }
    }

    #[test]
    fn fold_prefers_the_first_ended_copy() {
        let b0 = batch(vec![copy(1, 1, 0), copy(1, 2, 5), copy(2, 1, 0)]);
        let b1 = batch(vec![
            copy(1, 1, 7),
            copy(1, 2, 9),
            copy(1, 1, 8),
            copy(1, 3, 0),
        ]);
        let w = fold(&[1; 16], [&b0, &b1]);
        assert_eq!(
            w,
            vec![([1; 8], (1, 0)), ([2; 8], (0, 1)), ([3; 8], (1, 3))],
            "span 1: open then ended (first ended wins); span 2: ended first stays"
        );
        let s = summarize(w.iter().map(|(_, (bi, pi))| {
            let b = if *bi == 0 { &b0 } else { &b1 };
            (b, &b.spans[*pi])
        }))
        .unwrap();
        assert_eq!((s.spans, s.open, s.end), (3, 1, 7));
    }

    #[test]
    fn sorted_lists_and_batch_ids_round_trip() {
        let idx = batch(vec![copy(3, 1, 1), copy(1, 1, 1), copy(3, 2, 1)]);
        let traces = super::super::encode::encode_index_by_trace(&idx).1;
        let list = batch_trace_ids(&traces, &[true; 3]);
        assert_eq!(list.len(), 32);
        assert!(list[..16] < list[16..], "sorted");
        assert!(list_contains(&list, &[1; 16]));
        assert!(list_contains(&list, &[3; 16]));
        assert!(!list_contains(&list, &[2; 16]));
        // a trace whose copies are all dropped is not listed; one with a copy kept is
        assert_eq!(batch_trace_ids(&traces, &[true, false, false]), vec![3; 16]);
        assert_eq!(batch_trace_ids(&traces, &[false, true, false]), vec![1; 16]);
        assert_eq!(batch_trace_ids(&traces, &[false, false, true]), vec![3; 16]);
        assert_eq!(
            decode_batches(&encode_batches(&[1, i64::MAX, 7])),
            vec![1, i64::MAX, 7]
        );
    }
}
