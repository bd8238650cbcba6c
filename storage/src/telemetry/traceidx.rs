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

use super::encode::{BatchIndex, IdxSpan};
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

/// The sorted distinct trace ids of a batch, concatenated (`span_batches.traces`).
pub(crate) fn batch_trace_ids(idx: &BatchIndex) -> Vec<u8> {
    let mut ids: Vec<[u8; 16]> = idx.spans.iter().map(|s| s.trace_id).collect();
    ids.sort_unstable();
    ids.dedup();
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
    // CROSS JOIN keeps trace_runs as the outer loop: one (run, trace_id) seek per run.
    let mut st = conn.prepare_cached(
        "SELECT t.batches FROM trace_runs r CROSS JOIN trace_index t
         ON t.run = r.run AND t.trace_id = ?1",
    )?;
    let mut rows = st.query([&t[..]])?;
    let mut out = Vec::new();
    let mut runs = 0;
    while let Some(r) = rows.next()? {
        out.extend(decode_batches(r.get_ref(0)?.as_blob()?));
        runs += 1;
    }
    if runs > 1 {
        out.sort_unstable();
        out.dedup();
    }
    Ok(out)
}

/// Trace id → batches, for every batch newer than `merged_upto`.
pub(crate) fn unmerged_map(
    conn: &Connection,
    merged_upto: i64,
) -> Result<HashMap<[u8; 16], Vec<i64>>, rusqlite::Error> {
    let mut st =
        conn.prepare_cached("SELECT id, traces FROM span_batches WHERE id > ?1 ORDER BY id")?;
    let rows = st.query_map([merged_upto], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    let mut out: HashMap<[u8; 16], Vec<i64>> = HashMap::new();
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
        let list = batch_trace_ids(&idx);
        assert_eq!(list.len(), 32);
        assert!(list_contains(&list, &[1; 16]));
        assert!(list_contains(&list, &[3; 16]));
        assert!(!list_contains(&list, &[2; 16]));
        assert_eq!(
            decode_batches(&encode_batches(&[1, i64::MAX, 7])),
            vec![1, i64::MAX, 7]
        );
    }
}
