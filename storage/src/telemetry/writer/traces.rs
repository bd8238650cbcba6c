//! Trace storage inside a group: deduplication of (trace id, span id) against
//! `trace_index` and the unmerged map `l0`, the trace-id filter, and the merge of `l0`
//! into `trace_index` as sorted runs, compacted like the levels of an LSM tree.

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, OptionalExtension};

use crate::telemetry::bloom::TraceBloom;
use crate::telemetry::encode::{decode_index, BatchIndex, IdxSpan, PreparedTraces};
use crate::telemetry::schema::{MAX_RUN_UNITS, META_MERGED_UPTO, RUN_FANOUT};
use crate::telemetry::traceidx::{
    batch_trace_ids, decode_batches, encode_batches, fold, indexed_batches, merged_upto,
    unmerged_map, unmerged_postings,
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

    /// Rebuilds the trace-id filter from `trace_index` and `l0`, sized for twice the ids
    /// they hold (and at least `min_capacity`), so it fills again only once as many new
    /// traces arrived as are stored.
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
            p.retain(&keep)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        }
        let idx = &p.index;
        let min_start = idx.spans.iter().map(|s| s.start).min().unwrap_or(0);
        let max_start = idx.spans.iter().map(|s| s.start).max().unwrap_or(0);
        let max_duration = idx.spans.iter().map(IdxSpan::duration).max().unwrap_or(0);
        let trace_list = batch_trace_ids(idx);
        // The batch's postings go to batch_terms at the next merge (migration 6).
        let terms = std::mem::take(&mut p.index.terms);
        let mut term_ids = Vec::with_capacity(terms.len());
        for (k, v) in &terms {
            term_ids.push(self.term_id(k, v)?);
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

    /// Merges the unmerged batches' traces into `trace_index` as a new run and inserts
    /// their term postings into `batch_terms` (`schema::POSTINGS_SCHEMA`), in one
    /// transaction, then leaves the compaction of the newest runs to the writer's loop
    /// (`compaction_due`, [`Writer::compact_runs`]). The run's rows are
    /// written in key order after every existing row, so the merge appends pages instead
    /// of dirtying one random leaf per trace (`schema::TRACE_RUNS_SCHEMA`).
    pub(in crate::telemetry) fn merge_l0(&mut self) -> Result<(), rusqlite::Error> {
        if self.l0_batches == 0 {
            return Ok(());
        }
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let out = (|| -> Result<(), rusqlite::Error> {
            let mut keys: Vec<[u8; 16]> = self.l0.keys().copied().collect();
            keys.sort_unstable();
            if !keys.is_empty() {
                let run = self.next_run()?;
                {
                    let mut ins = self.conn.prepare_cached(
                        "INSERT INTO trace_index(run, trace_id, batches) VALUES (?1, ?2, ?3)",
                    )?;
                    for t in &keys {
                        if let Some(l) = self.l0.get(t) {
                            let mut list = l.clone();
                            list.sort_unstable();
                            list.dedup();
                            ins.execute(params![run, &t[..], encode_batches(&list)])?;
                        }
                    }
                }
                self.conn
                    .prepare_cached(
                        "INSERT INTO trace_runs(run, lo, hi, units, entries)
                         VALUES (?1, ?2, ?3, 1, ?4)",
                    )?
                    .execute(params![
                        run,
                        self.merged_upto + 1,
                        self.next_batch_id - 1,
                        keys.len() as i64
                    ])?;
                // compacted by the writer's loop, in transactions of its own
                self.compaction_due = true;
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
                let _ = self.reload_l0();
                Err(e)
            }
        }
    }

    /// While the newest [`RUN_FANOUT`] runs have the same `units`, below
    /// [`MAX_RUN_UNITS`], merges them into one run (`units` summed, the union of their
    /// batch ranges), in transactions of at most
    /// [`COMPACTION_SLICE_ROWS`] rows with the queued writes served between them
    /// ([`Writer::serve_pending`]), so a compaction (four merges' worth of traces, ~65k
    /// rows of otlp-blast's) never holds ingest for its whole length (issue 16, "the same
    /// rate with 10M spans stored"). Only the writer's main loop calls it, after a merge
    /// asked for it (`compaction_due`): never inside another transaction, and never nested
    /// (the groups served between slices only set `compaction_due`).
    ///
    /// The new run's rows are written under a run id above every existing one, but its
    /// `trace_runs` row is inserted only in the transaction that deletes the inputs' rows
    /// from `trace_runs`: until then readers (which join `trace_runs`) see the inputs and
    /// not the partial output, and after it the output and not the inputs. The inputs'
    /// `trace_index` rows are then deleted in slices too. A crash leaves rows of a run
    /// `trace_runs` does not name, which [`drop_orphan_runs`] deletes at the next start.
    pub(in crate::telemetry) fn compact_runs(&mut self) -> Result<(), rusqlite::Error> {
        self.compaction_due = false;
        loop {
            let newest: Vec<(i64, i64, i64, i64)> = {
                let mut st = self.conn.prepare_cached(
                    "SELECT run, lo, hi, units FROM trace_runs ORDER BY run DESC LIMIT ?1",
                )?;
                let rows = st.query_map([RUN_FANOUT as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?;
                rows.collect::<Result<_, _>>()?
            };
            if newest.len() < RUN_FANOUT
                || newest.iter().any(|r| r.3 != newest[0].3)
                || newest[0].3 >= MAX_RUN_UNITS
            {
                return Ok(());
            }
            let from: Vec<i64> = newest.iter().map(|r| r.0).collect();
            let into = self.next_run()?;
            let mut after: Option<Vec<u8>> = None;
            let mut entries = 0i64;
            loop {
                let slice = self.in_transaction(|conn| {
                    let oldest_live: i64 = conn.query_row(
                        "SELECT coalesce(min(id), 9223372036854775807) FROM span_batches",
                        [],
                        |r| r.get(0),
                    )?;
                    merge_runs(
                        conn,
                        &from,
                        into,
                        oldest_live,
                        after.as_deref(),
                        COMPACTION_SLICE_ROWS,
                    )
                })?;
                entries += slice.written;
                match slice.last {
                    Some(last) if !slice.done => after = Some(last),
                    _ => break,
                }
                self.serve_pending();
            }
            let lo = newest.iter().map(|r| r.1).min().unwrap_or(0);
            let hi = newest.iter().map(|r| r.2).max().unwrap_or(0);
            let units: i64 = newest.iter().map(|r| r.3).sum();
            self.in_transaction(|conn| {
                for r in &from {
                    conn.prepare_cached("DELETE FROM trace_runs WHERE run = ?1")?
                        .execute([r])?;
                }
                conn.prepare_cached(
                    "INSERT INTO trace_runs(run, lo, hi, units, entries)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![into, lo, hi, units, entries])?;
                Ok(())
            })?;
            for r in &from {
                loop {
                    let deleted = self.in_transaction(|conn| {
                        conn.prepare_cached(
                            "DELETE FROM trace_index WHERE run = ?1 AND trace_id IN
                               (SELECT trace_id FROM trace_index WHERE run = ?1
                                ORDER BY trace_id LIMIT ?2)",
                        )?
                        .execute(params![r, COMPACTION_SLICE_ROWS as i64])
                    })?;
                    if deleted < COMPACTION_SLICE_ROWS {
                        break;
                    }
                    self.serve_pending();
                }
            }
        }
    }

    /// Runs `f` in its own `BEGIN IMMEDIATE` transaction: committed when it succeeds,
    /// rolled back when it or the commit fails.
    fn in_transaction<T>(
        &mut self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T, rusqlite::Error>,
    ) -> Result<T, rusqlite::Error> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let v = f(&tx)?;
        tx.commit()?;
        Ok(v)
    }

    /// The id of a new run: after every run in `trace_runs` and in `trace_index`, so its
    /// rows sort after every row. That covers a compaction in progress: queued writes
    /// (and so merges) are served only after a slice that wrote rows of its output (a
    /// slice that is not the last wrote [`COMPACTION_SLICE_ROWS`]) or once its output is
    /// named in `trace_runs`.
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

/// Rows a compaction writes (or deletes) per transaction: about one merge's worth of
/// traces, a few ms of the writer's time, so queued writes wait at most that long.
pub(in crate::telemetry) const COMPACTION_SLICE_ROWS: usize = 16_384;

/// Deletes the `trace_index` rows of runs `trace_runs` does not name: what a compaction
/// interrupted by a crash had written, or the inputs it had not deleted yet (their
/// `trace_runs` rows went in the same transaction as the output's). Runs are found by
/// seeking from one to the next (a dozen seeks, not a scan).
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

/// What one slice of a compaction wrote.
struct Slice {
    /// Rows written.
    written: i64,
    /// The last trace id taken from the inputs (written or dropped), if any.
    last: Option<Vec<u8>>,
    /// True when every input is read to its end.
    done: bool,
}

/// Writes into run `into` the union of runs `from` (a k-way merge of their key-ordered
/// rows) for trace ids after `after`, dropping batch ids below `oldest_live`, until
/// `max_rows` rows are written or the inputs end.
fn merge_runs(
    conn: &rusqlite::Connection,
    from: &[i64],
    into: i64,
    oldest_live: i64,
    after: Option<&[u8]>,
    max_rows: usize,
) -> Result<Slice, rusqlite::Error> {
    let mut stmts = Vec::with_capacity(from.len());
    for _ in from {
        stmts.push(conn.prepare_cached(
            "SELECT trace_id, batches FROM trace_index WHERE run = ?1 AND trace_id > ?2
             ORDER BY trace_id",
        )?);
    }
    let after = after.unwrap_or(&[]);
    let mut cursors = Vec::with_capacity(from.len());
    for (st, run) in stmts.iter_mut().zip(from) {
        cursors.push(st.query(params![run, after])?);
    }
    // the current row of each cursor
    let mut heads: Vec<Option<RunRow>> = Vec::with_capacity(cursors.len());
    for c in cursors.iter_mut() {
        heads.push(next_row(c)?);
    }
    let mut ins =
        conn.prepare_cached("INSERT INTO trace_index(run, trace_id, batches) VALUES (?1, ?2, ?3)")?;
    let mut slice = Slice {
        written: 0,
        last: None,
        done: false,
    };
    let mut list: Vec<i64> = Vec::new();
    while let Some(min) = heads.iter().flatten().map(|h| h.0.clone()).min() {
        if slice.written as usize >= max_rows {
            return Ok(slice);
        }
        list.clear();
        for (h, c) in heads.iter_mut().zip(cursors.iter_mut()) {
            if h.as_ref().is_some_and(|x| x.0 == min) {
                if let Some((_, b)) = h.take() {
                    list.extend(decode_batches(&b).into_iter().filter(|&i| i >= oldest_live));
                }
                *h = next_row(c)?;
            }
        }
        if !list.is_empty() {
            list.sort_unstable();
            list.dedup();
            ins.execute(params![into, min, encode_batches(&list)])?;
            slice.written += 1;
        }
        slice.last = Some(min);
    }
    slice.done = true;
    Ok(slice)
}

/// One `trace_index` row of a run being compacted: (trace id, batches blob).
type RunRow = (Vec<u8>, Vec<u8>);

fn next_row(rows: &mut rusqlite::Rows<'_>) -> Result<Option<RunRow>, rusqlite::Error> {
    Ok(match rows.next()? {
        Some(r) => Some((r.get(0)?, r.get(1)?)),
        None => None,
    })
}
