//! Trace storage inside a group: deduplication of (trace id, span id) against
//! `trace_index` and the unmerged map `l0`, the trace-id filter, and the merge of `l0`
//! into `trace_index`.

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, OptionalExtension};

use crate::telemetry::bloom::TraceBloom;
use crate::telemetry::encode::{decode_index, BatchIndex, IdxSpan, PreparedTraces};
use crate::telemetry::schema::META_MERGED_UPTO;
use crate::telemetry::traceidx::{
    batch_trace_ids, encode_batches, fold, indexed_batches, merged_upto, unmerged_map,
};

use super::Writer;

impl Writer {
    /// Loads (cached) the index of a stored batch.
    pub(super) fn load_idx(&mut self, id: i64) -> Result<Option<Arc<BatchIndex>>, rusqlite::Error> {
        if let Some(i) = self.idx_cache.get(&id) {
            return Ok(Some(i.clone()));
        }
        let blob: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT idx FROM span_batches WHERE id = ?1")?
            .query_row([id], |r| r.get(0))
            .optional()?;
        let Some(blob) = blob else { return Ok(None) };
        let idx = Arc::new(
            decode_index(&blob).map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?,
        );
        if self.idx_cache.len() >= 64 {
            self.idx_cache.clear();
        }
        self.idx_cache.insert(id, idx.clone());
        Ok(Some(idx))
    }

    /// Drops the cached indexes of batches up to `upto` (deleted by retention), so
    /// deduplication never sees spans that are no longer stored.
    pub(in crate::telemetry) fn idx_cache_forget(&mut self, upto: i64) {
        self.idx_cache.retain(|id, _| *id > upto);
    }

    /// Re-reads the unmerged trace map after a rollback.
    pub(in crate::telemetry) fn reload_l0(&mut self) -> Result<(), rusqlite::Error> {
        self.idx_cache.clear();
        self.l0_new.clear();
        self.merged_upto = merged_upto(&self.conn)?;
        self.l0 = unmerged_map(&self.conn, self.merged_upto)?;
        self.l0_batches = self.conn.query_row(
            "SELECT count(*) FROM span_batches WHERE id > ?1",
            [self.merged_upto],
            |r| r.get::<_, i64>(0),
        )? as usize;
        Ok(())
    }

    /// Rebuilds the trace-id filter from `trace_index` and `l0`, sized for at least
    /// `min_capacity` ids.
    pub(super) fn rebuild_bloom(&mut self, min_capacity: usize) -> Result<(), rusqlite::Error> {
        let rows: i64 = self
            .conn
            .query_row("SELECT count(*) FROM trace_index", [], |r| r.get(0))?;
        let want = (rows.max(0) as usize + self.l0.len()) * 2;
        let mut bloom = TraceBloom::with_capacity(want.max(min_capacity));
        {
            let mut st = self.conn.prepare("SELECT trace_id FROM trace_index")?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                if let Ok(t) = <[u8; 16]>::try_from(r.get_ref(0)?.as_blob()?) {
                    bloom.insert(&t);
                }
            }
        }
        for t in self.l0.keys() {
            bloom.insert(t);
        }
        self.bloom = bloom;
        Ok(())
    }

    /// Stores one trace request; answers (spans stored, copies dropped as duplicates).
    pub(super) fn apply_traces(
        &mut self,
        mut p: PreparedTraces,
        received: i64,
    ) -> Result<(u64, u64), rusqlite::Error> {
        let n = p.index.spans.len();
        if n == 0 {
            return Ok((0, p.duplicates));
        }
        let b = self.next_batch_id;
        let mut keep = vec![true; n];
        let mut dups = p.duplicates;
        let traces = std::mem::take(&mut p.traces);
        for (t, positions) in &traces {
            if !self.bloom.may_contain(t) {
                self.l0_new.insert(*t);
                continue; // a new trace: every copy stays
            }
            let mut batches = indexed_batches(&self.conn, t)?;
            if let Some(l) = self.l0.get(t) {
                batches.extend_from_slice(l);
            }
            if batches.is_empty() {
                continue; // a new trace: every copy stays
            }
            batches.sort_unstable();
            batches.dedup();
            let mut idxs = Vec::with_capacity(batches.len());
            for id in batches {
                if let Some(i) = self.load_idx(id)? {
                    idxs.push(i);
                }
            }
            let mut known: HashMap<[u8; 8], bool> = fold(t, idxs.iter().map(|a| a.as_ref()))
                .into_iter()
                .map(|(sid, (bi, pi))| (sid, idxs[bi].spans[pi].ended()))
                .collect();
            for &pos in positions {
                let c = &p.index.spans[pos as usize];
                match known.get(&c.span_id).copied() {
                    None => {
                        known.insert(c.span_id, c.ended());
                    }
                    Some(false) if c.ended() => {
                        known.insert(c.span_id, true);
                    }
                    Some(_) => {
                        keep[pos as usize] = false;
                        dups += 1;
                    }
                }
            }
        }
        let kept = keep.iter().filter(|k| **k).count();
        if kept == 0 {
            return Ok((0, dups));
        }
        if kept < n {
            p.retain(&keep);
        }
        let idx = &p.index;
        let min_start = idx.spans.iter().map(|s| s.start).min().unwrap_or(0);
        let max_start = idx.spans.iter().map(|s| s.start).max().unwrap_or(0);
        let max_duration = idx.spans.iter().map(IdxSpan::duration).max().unwrap_or(0);
        let trace_list = batch_trace_ids(idx);
        let idx_blob = postcard::to_allocvec(idx)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        self.conn
            .prepare_cached(
                "INSERT INTO span_batches(id, received_unix_nano, min_start, max_start, max_duration,
                    span_count, traces, idx, payload)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                b,
                received,
                min_start as i64,
                max_start as i64,
                max_duration.min(i64::MAX as u64) as i64,
                kept as i64,
                trace_list,
                idx_blob,
                p.payload
            ])?;
        let terms = std::mem::take(&mut p.index.terms);
        for (k, v) in &terms {
            let tid = self.term_id(k, v)?;
            self.conn
                .prepare_cached(
                    "INSERT OR IGNORE INTO batch_terms(term_id, batch_id) VALUES (?1, ?2)",
                )?
                .execute(params![tid, b])?;
        }
        for c in trace_list.chunks_exact(16) {
            let mut t = [0u8; 16];
            t.copy_from_slice(c);
            self.l0.entry(t).or_default().push(b);
            self.bloom.insert(&t);
        }
        if self.bloom.overfull() {
            let want = self.bloom.inserted() * 4;
            if let Err(e) = self.rebuild_bloom(want) {
                // Keep the old one (still has every id); retry at the next batch.
                tracing::warn!(error = %e, "rebuilding the trace-id filter failed");
            }
        }
        self.l0_batches += 1;
        self.next_batch_id += 1;
        Ok((kept as u64, dups))
    }

    /// Merges the unmerged batches' traces into `trace_index` in one transaction.
    pub(in crate::telemetry) fn merge_l0(&mut self) -> Result<(), rusqlite::Error> {
        if self.l0_batches == 0 {
            return Ok(());
        }
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let out = (|| -> Result<(), rusqlite::Error> {
            let mut keys: Vec<[u8; 16]> = self.l0.keys().copied().collect();
            keys.sort_unstable();
            for t in keys {
                let mut list = if self.l0_new.contains(&t) {
                    Vec::new()
                } else {
                    indexed_batches(&self.conn, &t)?
                };
                if let Some(l) = self.l0.get(&t) {
                    list.extend_from_slice(l);
                }
                list.sort_unstable();
                list.dedup();
                self.conn
                    .prepare_cached(
                        "INSERT OR REPLACE INTO trace_index(trace_id, batches) VALUES (?1, ?2)",
                    )?
                    .execute(params![&t[..], encode_batches(&list)])?;
            }
            self.conn.execute(
                "INSERT OR REPLACE INTO telemetry_meta(key, value) VALUES (?1, ?2)",
                params![META_MERGED_UPTO, self.next_batch_id - 1],
            )?;
            Ok(())
        })();
        match out.and_then(|()| self.conn.execute_batch("COMMIT")) {
            Ok(()) => {
                self.merged_upto = self.next_batch_id - 1;
                self.l0.clear();
                self.l0_new.clear();
                self.l0_batches = 0;
                Ok(())
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                let _ = self.reload_l0();
                Err(e)
            }
        }
    }
}
