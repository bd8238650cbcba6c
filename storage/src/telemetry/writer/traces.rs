//! Trace storage inside a group: deduplication of (trace id, span id) against
//! `trace_index` and the unmerged map `l0`, the trace-id filter, and the merge of `l0`
//! into `trace_index` as sorted runs (`schema::TRACE_RUNS_SCHEMA`).

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, OptionalExtension};

use crate::telemetry::bloom::TraceBloom;
use crate::telemetry::encode::{decode_index, BatchIndex, IdxSpan, PreparedTraces};
use crate::telemetry::schema::META_MERGED_UPTO;
use crate::telemetry::traceidx::{
    batch_trace_ids, block_trace_ids, blocks, encode_batches, encode_block, fold, indexed_batches,
    merged_upto, unmerged_map, unmerged_postings,
};

use super::{Writer, KNOWN_SPANS_MAX};

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

    /// Drops the cached indexes of batches up to `upto` (deleted by retention), and the
    /// span ids known per trace ([`Writer::known_spans`]), so deduplication never sees
    /// spans that are no longer stored.
    pub(in crate::telemetry) fn idx_cache_forget(&mut self, upto: i64) {
        self.idx_cache.retain(|id, _| *id > upto);
        self.forget_known_spans();
    }

    /// Empties [`Writer::known_spans`].
    pub(super) fn forget_known_spans(&mut self) {
        self.known_spans.clear();
        self.known_spans_len = 0;
    }

    /// Re-reads the unmerged trace map after a rollback.
    pub(in crate::telemetry) fn reload_l0(&mut self) -> Result<(), rusqlite::Error> {
        self.idx_cache.clear();
        self.l0_new.clear();
        self.forget_known_spans();
        self.merged_upto = merged_upto(&self.conn)?;
        self.l0 = unmerged_map(&self.conn, self.merged_upto)?;
        self.l0_batches = self.conn.query_row(
            "SELECT count(*) FROM span_batches WHERE id > ?1",
            [self.merged_upto],
            |r| r.get::<_, i64>(0),
        )? as usize;
        Ok(())
    }

    /// Rebuilds the trace-id filter from `trace_index` and `l0`, sized for twice the ids
    /// they hold (and at least `min_capacity`), so it fills again only once as many new
    /// traces arrived as are stored.
    pub(super) fn rebuild_bloom(&mut self, min_capacity: usize) -> Result<(), rusqlite::Error> {
        let rows: i64 = self.conn.query_row(
            "SELECT coalesce((SELECT sum(entries) FROM trace_runs), 0)",
            [],
            |r| r.get(0),
        )?;
        let want = (rows.max(0) as usize + self.l0.len()) * 2;
        let mut bloom = TraceBloom::with_capacity(want.max(min_capacity));
        {
            // A form-2 row holds a block of trace ids; a row of a run trace_runs does not
            // name (dropped at start) counts as form 1.
            let mut st = self.conn.prepare(
                "SELECT coalesce(r.form, 1), t.trace_id, t.batches
                 FROM trace_index t LEFT JOIN trace_runs r ON r.run = t.run",
            )?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                if r.get::<_, i64>(0)? == 2 {
                    for t in block_trace_ids(r.get_ref(2)?.as_blob()?) {
                        bloom.insert(&t);
                    }
                } else if let Ok(t) = <[u8; 16]>::try_from(r.get_ref(1)?.as_blob()?) {
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
        p: &mut PreparedTraces,
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
            let mut known = match self.known_spans.remove(t) {
                Some(k) => {
                    self.known_spans_len -= k.len();
                    k
                }
                None => match self.stored_spans_of(t)? {
                    Some(k) => k,
                    None => continue, // a new trace: every copy stays
                },
            };
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
            // Kept for the trace's next export, with this one's kept spans in it (they are
            // stored below, or the group rolls back, which forgets them all).
            if known.len() <= KNOWN_SPANS_MAX {
                if self.known_spans_len + known.len() > KNOWN_SPANS_MAX {
                    self.forget_known_spans();
                }
                self.known_spans_len += known.len();
                self.known_spans.insert(*t, known);
            }
        }
        let kept = keep.iter().filter(|k| **k).count();
        if kept == 0 {
            return Ok((0, dups));
        }
        if kept < n {
            p.retain(&keep)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        }
        let idx = &p.index;
        let min_start = idx.spans.iter().map(|s| s.start).min().unwrap_or(0);
        let max_start = idx.spans.iter().map(|s| s.start).max().unwrap_or(0);
        let max_duration = idx.spans.iter().map(IdxSpan::duration).max().unwrap_or(0);
        let trace_list = batch_trace_ids(&traces, &keep);
        // The batch's postings go to batch_terms at the next merge (migration 6).
        let terms = std::mem::take(&mut p.index.terms);
        let mut term_ids = Vec::with_capacity(terms.len());
        for term in terms {
            term_ids.push(self.term_id(term)?);
        }
        term_ids.sort_unstable();
        term_ids.dedup();
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
                p.index_blob,
                p.payload
            ])?;
        self.conn
            .prepare_cached("INSERT INTO pending_terms(batch_id, term_ids) VALUES (?1, ?2)")?
            .execute(params![b, encode_batches(&term_ids)])?;
        for c in trace_list.chunks_exact(16) {
            let mut t = [0u8; 16];
            t.copy_from_slice(c);
            self.l0.entry(t).or_default().push(b);
            self.bloom.insert(&t);
        }
        if self.bloom.overfull() {
            // Sized for the ids stored now, not for every id ever inserted: at the size
            // cap retention deletes as fast as ingest adds, and a filter grown from the
            // insert count alone grew without bound (issue 16, retention at the cap).
            if let Err(e) = self.rebuild_bloom(0) {
                // Keep the old one (still has every id); retry at the next batch.
                tracing::warn!(error = %e, "rebuilding the trace-id filter failed");
            }
        }
        self.l0_batches += 1;
        self.next_batch_id += 1;
        Ok((kept as u64, dups))
    }

    /// Every span id stored of trace `t` and whether a stored copy of it ended, read from
    /// the batches the trace index and `l0` list for it; `None` when no batch holds the
    /// trace (a new trace).
    fn stored_spans_of(
        &mut self,
        t: &[u8; 16],
    ) -> Result<Option<HashMap<[u8; 8], bool>>, rusqlite::Error> {
        // A trace first stored in `l0` without a `trace_index` row has none yet (rows
        // come only from merges, which clear `l0_new`; a rollback clears it too): its
        // copies are all in `l0`, so the runs are not searched. Issue 16: each trace
        // continued by a later export cost a seek and a block read in every run;
        // exports continuing 8 traces each, ~70 runs: 630 → 190 µs per export
        // (`cargo bench -p stallwatch-storage --bench telemetry -- --continued 24000`).
        let mut batches = if self.l0_new.contains(t) {
            Vec::new()
        } else {
            let b = indexed_batches(&self.conn, t)?;
            if b.is_empty() {
                self.l0_new.insert(*t);
            }
            b
        };
        if let Some(l) = self.l0.get(t) {
            batches.extend_from_slice(l);
        }
        if batches.is_empty() {
            return Ok(None);
        }
        batches.sort_unstable();
        batches.dedup();
        let mut idxs = Vec::with_capacity(batches.len());
        for id in batches {
            if let Some(i) = self.load_idx(id)? {
                idxs.push(i);
            }
        }
        Ok(Some(
            fold(t, idxs.iter().map(|a| a.as_ref()))
                .into_iter()
                .map(|(sid, (bi, pi))| (sid, idxs[bi].spans[pi].ended()))
                .collect(),
        ))
    }

    /// Merges the unmerged batches' traces into `trace_index` as a new run and inserts
    /// their term postings into `batch_terms` (`schema::POSTINGS_SCHEMA`), in one
    /// transaction. The run's rows are written in key order after every existing row, so
    /// the merge appends pages instead of dirtying one random leaf per trace, and they are
    /// written once: runs are not compacted (`schema::TRACE_RUNS_SCHEMA`).
    pub(in crate::telemetry) fn merge_l0(&mut self) -> Result<(), rusqlite::Error> {
        if self.l0_batches == 0 {
            return Ok(());
        }
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        // The map's entries are moved out and sorted by trace id (walking its keys sorted
        // and looking each one up again was a cache miss per trace, issue 16); put back if
        // the merge fails.
        let mut entries: Vec<([u8; 16], Vec<i64>)> =
            std::mem::take(&mut self.l0).into_iter().collect();
        entries.sort_unstable_by_key(|e| e.0);
        let out = (|| -> Result<(), rusqlite::Error> {
            if !entries.is_empty() {
                let run = self.next_run()?;
                // Form 2: one row per block of traces (schema::TRACE_BLOCKS_SCHEMA).
                for (_, list) in entries.iter_mut() {
                    list.sort_unstable();
                    list.dedup();
                }
                {
                    let mut ins = self.conn.prepare_cached(
                        "INSERT INTO trace_index(run, trace_id, batches) VALUES (?1, ?2, ?3)",
                    )?;
                    for block in blocks(&entries) {
                        let first = &block[0].0;
                        ins.execute(params![run, &first[..], encode_block(block)])?;
                    }
                }
                self.conn
                    .prepare_cached(
                        "INSERT INTO trace_runs(run, lo, hi, units, entries, form)
                         VALUES (?1, ?2, ?3, 1, ?4, 2)",
                    )?
                    .execute(params![
                        run,
                        self.merged_upto + 1,
                        self.next_batch_id - 1,
                        entries.len() as i64
                    ])?;
            }
            // term postings, in key order: each term's leaf written once per merge
            let mut postings: Vec<(i64, i64)> = unmerged_postings(&self.conn)?
                .into_iter()
                .flat_map(|(b, terms)| terms.into_iter().map(move |t| (t, b)))
                .collect();
            postings.sort_unstable();
            {
                let mut ins = self.conn.prepare_cached(
                    "INSERT OR IGNORE INTO batch_terms(term_id, batch_id) VALUES (?1, ?2)",
                )?;
                for (t, b) in &postings {
                    ins.execute(params![t, b])?;
                }
            }
            self.conn
                .prepare_cached("DELETE FROM pending_terms")?
                .execute([])?;
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
                self.l0 = entries.into_iter().collect();
                let _ = self.reload_l0();
                Err(e)
            }
        }
    }

    /// The id of a new run: after every run in `trace_runs` and in `trace_index`, so its
    /// rows sort after every row.
    pub(super) fn next_run(&self) -> Result<i64, rusqlite::Error> {
        let stored: i64 = self
            .conn
            .prepare_cached(
                "SELECT max(coalesce((SELECT max(run) FROM trace_runs), 0),
                            coalesce((SELECT max(run) FROM trace_index), 0))",
            )?
            .query_row([], |r| r.get(0))?;
        Ok(stored + 1)
    }
}

/// Deletes the `trace_index` rows of runs `trace_runs` does not name: what a compaction
/// of an earlier version (which compacted runs) left when a crash cut it short, or the
/// inputs it had not deleted yet (their `trace_runs` rows went in the same transaction as
/// the output's). A merge writes its run in one transaction and leaves none. Runs are
/// found by seeking from one to the next (one seek per run, not a scan).
pub(in crate::telemetry) fn drop_orphan_runs(
    conn: &rusqlite::Connection,
) -> Result<u64, rusqlite::Error> {
    let mut run = i64::MIN;
    let mut dropped = 0u64;
    loop {
        let next: Option<i64> = conn
            .query_row(
                "SELECT run FROM trace_index WHERE run > ?1 ORDER BY run LIMIT 1",
                [run],
                |r| r.get(0),
            )
            .optional()?;
        let Some(r) = next else {
            return Ok(dropped);
        };
        let named: bool = conn.query_row(
            "SELECT EXISTS(SELECT 1 FROM trace_runs WHERE run = ?1)",
            [r],
            |x| x.get(0),
        )?;
        if !named {
            dropped += conn.execute("DELETE FROM trace_index WHERE run = ?1", [r])? as u64;
        }
        run = r;
    }
}
