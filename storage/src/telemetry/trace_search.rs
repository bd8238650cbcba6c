//! Trace search over the per-batch postings (`GET /api/v1/traces`): candidate batches
//! from the term postings (service, span name, tool, status ERROR, indexed attributes),
//! newest received first, each trace summarized from its batches; duration filters,
//! several attribute filters at once (AND), and per-operation duration percentiles over
//! the result set.

use std::collections::HashMap;
use std::rc::Rc;

use rusqlite::{params, Connection, OptionalExtension};

use super::encode::{
    decode_header, decode_index, decode_span, payload_owned, value_text, BatchIndex, IdxSpan,
};
use super::read::{corrupt, snapshot};
use super::schema::{INDEXED_ATTRIBUTE_KEYS, TERM_SERVICE, TERM_SPAN_NAME, TERM_STATUS, TERM_TOOL};
use super::traceidx::{
    fold, indexed_batches, merged_upto, summarize, unmerged_map, unmerged_postings, L0Map,
};
use super::{
    OperationStats, QueryError, StatusFilter, TracePage, TraceQuery, TraceSummary,
    DEFAULT_SEARCH_LIMIT, MAX_SEARCH_LIMIT,
};
use crate::error::StorageError;
use crate::model::{attr, Resource, TraceId};

/// Encodes a search cursor: the batch and trace of the last row shown.
fn encode_cursor(batch: i64, trace: &[u8; 16]) -> String {
    format!("{batch:x}.{}", hex::encode(trace))
}

fn decode_cursor(s: &str) -> Result<(i64, [u8; 16]), QueryError> {
    let (b, t) = s.split_once('.').ok_or(QueryError::BadCursor)?;
    let batch = i64::from_str_radix(b, 16).map_err(|_| QueryError::BadCursor)?;
    let mut trace = [0u8; 16];
    hex::decode_to_slice(t, &mut trace).map_err(|_| QueryError::BadCursor)?;
    if batch <= 0 {
        return Err(QueryError::BadCursor);
    }
    Ok((batch, trace))
}

/// A batch as searches see it: index, and the payload only when an attribute must be
/// scanned.
struct SearchBatch {
    index: BatchIndex,
    payload: Option<Vec<u8>>,
    resources: Option<Vec<Resource>>,
    scope_res: Vec<usize>,
}

struct Search<'q> {
    q: &'q TraceQuery,
    terms: Vec<(String, String)>,
    scan_attrs: Vec<(String, String)>,
    /// Durations of the ended winning spans of the traces shown, per (service, name).
    ops: HashMap<(String, String), Vec<u64>>,
    cache: HashMap<i64, Rc<SearchBatch>>,
    l0: Option<L0Map>,
}

impl Search<'_> {
    fn batch(
        &mut self,
        conn: &Connection,
        id: i64,
    ) -> Result<Option<Rc<SearchBatch>>, StorageError> {
        if let Some(b) = self.cache.get(&id) {
            return Ok(Some(b.clone()));
        }
        let need_payload = !self.scan_attrs.is_empty();
        let row: Option<(Vec<u8>, Option<Vec<u8>>)> = conn
            .prepare_cached(
                "SELECT idx, CASE WHEN ?2 THEN payload END FROM span_batches WHERE id = ?1",
            )?
            .query_row(params![id, need_payload], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((idx, payload)) = row else {
            return Ok(None);
        };
        let index = decode_index(&idx).map_err(corrupt)?;
        let payload = payload.map(payload_owned).transpose().map_err(corrupt)?;
        let (resources, scope_res) = match &payload {
            Some(p) => {
                let h = decode_header(p).map_err(corrupt)?;
                (
                    Some(h.resources),
                    h.scopes.iter().map(|(r, _)| *r as usize).collect(),
                )
            }
            None => (None, vec![]),
        };
        let b = Rc::new(SearchBatch {
            index,
            payload,
            resources,
            scope_res,
        });
        if self.cache.len() > 256 {
            self.cache.clear();
        }
        self.cache.insert(id, b.clone());
        Ok(Some(b))
    }

    /// Local indices of the required terms in `b`, `None` when one is absent.
    fn local_terms(&self, b: &SearchBatch) -> Option<Vec<u32>> {
        self.terms
            .iter()
            .map(|t| b.index.terms.iter().position(|x| x == t).map(|p| p as u32))
            .collect()
    }

    fn span_matches(
        &self,
        b: &SearchBatch,
        local: &[u32],
        s: &IdxSpan,
    ) -> Result<bool, StorageError> {
        let q = self.q;
        if !local.iter().all(|t| s.terms.contains(t)) {
            return Ok(false);
        }
        if let Some(st) = q.status {
            let want = match st {
                StatusFilter::Unset => 0,
                StatusFilter::Ok => 1,
                StatusFilter::Error => 2,
            };
            if s.status != want {
                return Ok(false);
            }
        }
        if let Some(min) = q.min_duration_ns {
            if !s.ended() || s.duration() < min {
                return Ok(false);
            }
        }
        if let Some(max) = q.max_duration_ns {
            if !s.ended() || s.duration() > max {
                return Ok(false);
            }
        }
        if q.start_min_unix_nano.is_some_and(|m| s.start < m)
            || q.start_max_unix_nano.is_some_and(|m| s.start >= m)
        {
            return Ok(false);
        }
        for (k, v) in &self.scan_attrs {
            let (Some(payload), Some(resources)) = (&b.payload, &b.resources) else {
                return Ok(false);
            };
            let body = payload
                .get(s.off as usize..(s.off as usize).saturating_add(s.len as usize))
                .unwrap_or_default();
            let maybe = body_may_carry(body, k, v);
            let on_span = if maybe {
                let span = decode_span(payload, s.off, s.len).map_err(corrupt)?;
                attr(&span.attributes, k).and_then(value_text)
            } else {
                None
            };
            let found = if on_span.as_deref() == Some(v.as_str()) {
                true
            } else {
                let res = b
                    .scope_res
                    .get(s.scope as usize)
                    .and_then(|r| resources.get(*r));
                res.and_then(|r| attr(&r.attributes, k))
                    .and_then(value_text)
                    .as_deref()
                    == Some(v.as_str())
            };
            if !found {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// True when one of the winning copies at `positions` of batch `id` matches.
    fn winner_matches_in(
        &mut self,
        conn: &Connection,
        id: i64,
        positions: &[usize],
    ) -> Result<bool, StorageError> {
        let Some(b) = self.batch(conn, id)? else {
            return Ok(false);
        };
        let Some(local) = self.local_terms(&b) else {
            return Ok(false);
        };
        for &p in positions {
            if let Some(s) = b.index.spans.get(p) {
                if self.span_matches(&b, &local, s)? {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The batches of a trace (index plus unmerged batches), ascending.
    fn trace_batches(&mut self, conn: &Connection, t: &[u8; 16]) -> Result<Vec<i64>, StorageError> {
        if self.l0.is_none() {
            let upto = merged_upto(conn)?;
            self.l0 = Some(unmerged_map(conn, upto)?);
        }
        let mut out = indexed_batches(conn, t)?;
        if let Some(l) = self.l0.as_ref().and_then(|m| m.get(t)) {
            out.extend_from_slice(l);
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// Trace search, newest (most recently received) first.
pub(super) fn search(conn: &Connection, q: &TraceQuery) -> Result<TracePage, QueryError> {
    let limit = if q.limit == 0 {
        DEFAULT_SEARCH_LIMIT
    } else {
        q.limit.min(MAX_SEARCH_LIMIT)
    };
    let cursor = q.cursor.as_deref().map(decode_cursor).transpose()?;
    let mut terms: Vec<(String, String)> = Vec::new();
    if let Some(s) = &q.service {
        terms.push((TERM_SERVICE.into(), s.clone()));
    }
    if let Some(n) = &q.span_name {
        terms.push((TERM_SPAN_NAME.into(), n.clone()));
    }
    if let Some(t) = &q.tool_name {
        terms.push((TERM_TOOL.into(), t.clone()));
    }
    if q.status == Some(StatusFilter::Error) {
        terms.push((TERM_STATUS.into(), "error".into()));
    }
    let mut scan_attrs = Vec::new();
    for (k, v) in q.attribute.iter().chain(&q.attributes) {
        if INDEXED_ATTRIBUTE_KEYS.contains(&k.as_str()) {
            terms.push((k.clone(), v.clone()));
        } else if q.start_min_unix_nano.is_some() && q.start_max_unix_nano.is_some() {
            scan_attrs.push((k.clone(), v.clone()));
        } else {
            return Err(QueryError::NeedsTimeRange(k.clone()));
        }
    }
    terms.sort();
    terms.dedup();
    snapshot(conn, |conn| {
        let mut s = Search {
            q,
            terms,
            scan_attrs,
            ops: HashMap::new(),
            cache: HashMap::new(),
            l0: None,
        };
        let mut page = search_in(conn, &mut s, limit, cursor)?;
        page.operations = operation_stats(std::mem::take(&mut s.ops));
        Ok(page)
    })
}

fn search_in(
    conn: &Connection,
    s: &mut Search<'_>,
    limit: usize,
    cursor: Option<(i64, [u8; 16])>,
) -> Result<TracePage, QueryError> {
    let q = s.q;
    // term ids as (postings, id); a term never seen means no match
    let mut term_ids: Vec<(i64, i64)> = Vec::new();
    // postings not in batch_terms yet (schema::POSTINGS_SCHEMA): batch id → its term ids,
    // newest first, all newer than every batch in batch_terms
    let unmerged = if s.terms.is_empty() {
        Vec::new()
    } else {
        unmerged_postings(conn)?
    };
    let holds = |b: i64, term: i64| -> Result<bool, rusqlite::Error> {
        if let Some((_, t)) = unmerged.iter().find(|(id, _)| *id == b) {
            return Ok(t.binary_search(&term).is_ok());
        }
        Ok(conn
            .prepare_cached("SELECT 1 FROM batch_terms WHERE term_id = ?1 AND batch_id = ?2")?
            .query_row(params![term, b], |r| r.get::<_, i64>(0))
            .optional()?
            .is_some())
    };
    for (k, v) in &s.terms {
        let id: Option<i64> = conn
            .prepare_cached("SELECT id FROM terms WHERE key = ?1 AND value = ?2")?
            .query_row(params![k, v], |r| r.get(0))
            .optional()?;
        let Some(id) = id else {
            return Ok(TracePage {
                items: vec![],
                next_cursor: None,
                operations: vec![],
            });
        };
        let n: i64 = conn
            .prepare_cached("SELECT count(*) FROM batch_terms WHERE term_id = ?1")?
            .query_row([id], |r| r.get(0))?;
        let pending = unmerged
            .iter()
            .filter(|(_, t)| t.binary_search(&id).is_ok())
            .count() as i64;
        term_ids.push((n + pending, id));
    }
    term_ids.sort();
    let upper = cursor.map(|c| c.0).unwrap_or(i64::MAX);

    // candidate batches, newest first, with their meta
    let mut candidates: Vec<i64> = Vec::new();
    // traces whose place in this scan is decided (scan order is newest batch first)
    let mut settled: std::collections::HashSet<[u8; 16]> = std::collections::HashSet::new();
    let mut items: Vec<TraceSummary> = Vec::new();
    let mut next_from = upper;
    loop {
        candidates.clear();
        // fetch candidate ids in chunks of 256
        if let Some(&(_, driver)) = term_ids.first() {
            // the driver's postings newest first: unmerged batches, then batch_terms
            let mut ids: Vec<i64> = unmerged
                .iter()
                .filter(|(b, t)| *b <= next_from && t.binary_search(&driver).is_ok())
                .map(|(b, _)| *b)
                .take(256)
                .collect();
            if ids.len() < 256 {
                let mut st = conn.prepare_cached(
                    "SELECT bt.batch_id FROM batch_terms bt WHERE bt.term_id = ?1 AND bt.batch_id <= ?2
                     ORDER BY bt.batch_id DESC LIMIT ?3",
                )?;
                let rows = st
                    .query_map(params![driver, next_from, 256 - ids.len() as i64], |r| {
                        r.get::<_, i64>(0)
                    })?;
                for r in rows {
                    ids.push(r?);
                }
            }
            for id in ids {
                let mut all = true;
                for &(_, other) in &term_ids[1..] {
                    if !holds(id, other)? {
                        all = false;
                        break;
                    }
                }
                candidates.push(if all { id } else { -id });
            }
        } else {
            let mut st = conn.prepare_cached(
                "SELECT id FROM span_batches INDEXED BY span_batches_scan WHERE id <= ?1
                 ORDER BY id DESC LIMIT 256",
            )?;
            let rows = st.query_map([next_from], |r| r.get::<_, i64>(0))?;
            for r in rows {
                candidates.push(r?);
            }
        }
        if candidates.is_empty() {
            return Ok(TracePage {
                items,
                next_cursor: None,
                operations: vec![],
            });
        }
        next_from = candidates.iter().map(|c| c.abs()).min().unwrap_or(1) - 1;
        for &cand in &candidates {
            if cand < 0 {
                continue;
            }
            let b = cand;
            // prune by batch meta
            let meta: Option<(i64, i64, i64)> = conn
                .prepare_cached(
                    "SELECT min_start, max_start, max_duration FROM span_batches
                     INDEXED BY span_batches_scan WHERE id = ?1",
                )?
                .query_row([b], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            let Some((min_start, max_start, max_duration)) = meta else {
                continue;
            };
            if q.start_min_unix_nano
                .is_some_and(|m| (max_start as u64) < m)
                || q.start_max_unix_nano
                    .is_some_and(|m| (min_start as u64) >= m)
                || q.min_duration_ns.is_some_and(|m| (max_duration as u64) < m)
            {
                continue;
            }
            let Some(batch) = s.batch(conn, b)? else {
                continue;
            };
            let Some(local) = s.local_terms(&batch) else {
                continue;
            };
            let mut matched: HashMap<[u8; 16], Vec<usize>> = HashMap::new();
            for (pi, sp) in batch.index.spans.iter().enumerate() {
                if let Some((cb, ct)) = cursor {
                    if b == cb && sp.trace_id >= ct {
                        continue;
                    }
                }
                if s.span_matches(&batch, &local, sp)? {
                    matched.entry(sp.trace_id).or_default().push(pi);
                }
            }
            let mut traces: Vec<([u8; 16], Vec<usize>)> = matched.into_iter().collect();
            traces.sort_by_key(|x| std::cmp::Reverse(x.0));
            for (t, positions) in traces {
                if settled.contains(&t) {
                    continue; // already shown, or shown at a newer batch
                }
                let mut ids = s.trace_batches(conn, &t)?;
                if !ids.contains(&b) {
                    ids.push(b);
                    ids.sort_unstable();
                }
                let mut loaded = Vec::with_capacity(ids.len());
                for id in &ids {
                    if let Some(x) = s.batch(conn, *id)? {
                        loaded.push((*id, x));
                    }
                }
                let winners = fold(&t, loaded.iter().map(|(_, x)| &x.index));
                // winning positions per batch id
                let mut win_pos: HashMap<i64, Vec<usize>> = HashMap::new();
                for (_, (bi, pi)) in &winners {
                    win_pos.entry(loaded[*bi].0).or_default().push(*pi);
                }
                let here = win_pos.get(&b).cloned().unwrap_or_default();
                if !positions.iter().any(|p| here.contains(p)) {
                    continue;
                }
                // shown at the newest batch where a winning copy matches
                let mut shown_newer = false;
                for (nb, pos) in win_pos.iter().filter(|(id, _)| **id > b) {
                    if s.winner_matches_in(conn, *nb, pos)? {
                        shown_newer = true;
                        break;
                    }
                }
                if shown_newer {
                    settled.insert(t);
                    continue;
                }
                settled.insert(t);
                let Some(sum) = summarize(winners.iter().map(|(_, (bi, pi))| {
                    let x = &loaded[*bi].1.index;
                    (x, &x.spans[*pi])
                })) else {
                    continue;
                };
                for (_, (bi, pi)) in &winners {
                    let x = &loaded[*bi].1.index;
                    let sp = &x.spans[*pi];
                    if sp.ended() {
                        let term = |i: u32| {
                            x.terms
                                .get(i as usize)
                                .map(|t| t.1.clone())
                                .unwrap_or_default()
                        };
                        s.ops
                            .entry((term(sp.service), term(sp.name)))
                            .or_default()
                            .push(sp.duration());
                    }
                }
                let (ri, rs) = sum.root;
                let term = |i: u32| {
                    ri.terms
                        .get(i as usize)
                        .map(|x| x.1.clone())
                        .unwrap_or_default()
                };
                items.push(TraceSummary {
                    trace_id: TraceId(t),
                    root_service: term(rs.service),
                    root_name: term(rs.name),
                    start_time_unix_nano: sum.start,
                    end_time_unix_nano: sum.end,
                    span_count: sum.spans,
                    error_count: sum.errors,
                    open_count: sum.open,
                });
                if items.len() == limit {
                    return Ok(TracePage {
                        items,
                        next_cursor: Some(encode_cursor(b, &t)),
                        operations: vec![],
                    });
                }
            }
        }
        if next_from < 1 {
            return Ok(TracePage {
                items,
                next_cursor: None,
                operations: vec![],
            });
        }
    }
}

/// Percentiles per operation, by span count descending then (service, name).
fn operation_stats(ops: HashMap<(String, String), Vec<u64>>) -> Vec<OperationStats> {
    let mut out: Vec<OperationStats> = ops
        .into_iter()
        .map(|((service, span_name), mut d)| {
            d.sort_unstable();
            OperationStats {
                service,
                span_name,
                count: d.len() as u64,
                p50_ns: OperationStats::nearest_rank(&d, 50),
                p90_ns: OperationStats::nearest_rank(&d, 90),
                p99_ns: OperationStats::nearest_rank(&d, 99),
                max_ns: d.last().copied().unwrap_or(0),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| (&a.service, &a.span_name).cmp(&(&b.service, &b.span_name)))
    });
    out
}
/// A cheap prefilter for an attribute `key` = `value` on a span of stored body `body`:
/// false only when the span cannot carry it. The body holds the key's bytes as they are
/// (a postcard string) and a string value's too; a number or bool value is stored in
/// binary (zigzag varint, 8 bytes, one byte), so a `value` that is the text of one
/// ([`crate::model::AnyValue::index_text`]: decimal, `true`/`false`, Rust's float text)
/// is left to the decoded span.
fn body_may_carry(body: &[u8], key: &str, value: &str) -> bool {
    let holds = |t: &str| t.is_empty() || body.windows(t.len()).any(|w| w == t.as_bytes());
    let binary_text = matches!(value, "true" | "false")
        || value.parse::<i64>().is_ok()
        || value.parse::<f64>().is_ok();
    holds(key) && (binary_text || holds(value))
}
