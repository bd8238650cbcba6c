//! Retention: by age ([`crate::StorageConfig::retention`]) and by size (docs/design.md,
//! Durability levels).
//!
//! Size: telemetry has a budget ([`crate::config::telemetry_budget_bytes`]: `max_db_bytes`
//! minus the WAL's share and [`crate::config::CONTROL_RESERVE_BYTES`]). Once a commit
//! leaves more than the high watermark (85%) of it in use, the writer deletes the oldest
//! telemetry at once, before it takes the next group, down to the low watermark (75%):
//! oldest first across signals, by the time each item was received: each step takes, of
//! each signal, the oldest items whose stored bytes make up what is still to be freed (at
//! most [`CHUNK_BYTES`]; span batches, and at most [`ROW_CHUNK`] logs or metric points), and
//! deletes everything received no later than the earliest of the three sets' newest items: the batches by id range
//! (with the trace index runs they wholly cover and their term postings, merged or still
//! pending), the logs and the points, the queued groups served between steps. So a signal
//! with few, small items (a trickle of 1-span traces beside a flood of logs) keeps its newer
//! items while older items of another go, and no signal is thinned by count. The
//! pages freed stay in the file's freelist and the next commits reuse them, so the file
//! neither shrinks nor grows and nothing waits for `incremental_vacuum`. A group that
//! would pass the budget runs the same step first; only what still does not fit is
//! refused (503 / UNAVAILABLE, counted as `storage_full`).
//!
//! Age: the periodic pass (every `retention_interval`, when the queue is idle) and
//! [`crate::Storage::run_retention`] delete what is older than the retention, run the size
//! step if needed, then return free pages to the file system with `PRAGMA
//! incremental_vacuum`, keeping those below the high watermark while telemetry is near its
//! budget (they would be reused within moments).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use rusqlite::params;

use super::log_body::drop_dead_generations;
use super::metrics_read::{forget_points, PointsGone};
use super::traceidx::{count_unlisted_after, unmerged_postings};
use super::writer::ids::{record_next_id, IdTable};
use super::writer::{Writer, WAL_RETRY, WAL_WAIT};
use super::RetentionReport;
use crate::error::StorageError;
use crate::model::now_unix_nano;

/// Batches deleted by age per transaction.
const BATCH_CHUNK: usize = 64;
/// Stored bytes (index, trace list and payload) of the batches one size-retention
/// transaction deletes, at most: 8 MiB (a fifth of the telemetry budget at the smallest
/// cap; a few milliseconds of work).
pub(super) const CHUNK_BYTES: u64 = 8 * 1024 * 1024;
/// Most batches one size-retention transaction deletes.
const CHUNK_MAX_BATCHES: i64 = 1024;
/// Log records / metric points deleted per transaction.
const ROW_CHUNK: i64 = 5000;
/// A log record's or metric point's bytes besides its payload, counted by the size step:
/// its other columns and its entries in the table's indexes (an estimate; the step
/// measures the bytes in use again after each transaction).
const ROW_OVERHEAD_BYTES: u64 = 64;
/// Pages one `incremental_vacuum` transaction returns to the file system: a quarter of
/// the WAL's share of the cap (each page freed at the end of the file moves an in-use one
/// into a free slot, so the WAL takes a few pages per page freed), from 16 to 2048.
const VACUUM_STEP_WAL_SHARE: u64 = 4;
/// Fewest pages per `incremental_vacuum` transaction.
const MIN_VACUUM_STEP_PAGES: u64 = 16;
/// Longest a truncating checkpoint after a retention pass waits for readers.
const TRUNCATE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);
/// Most pages per `incremental_vacuum` transaction.
const MAX_VACUUM_STEP_PAGES: u64 = 2048;

/// The tables whose rows size retention deletes one by one.
#[derive(Clone, Copy)]
enum RowTable {
    Logs,
    MetricPoints,
}

impl Writer {
    /// One full retention pass: by age, by size, then `incremental_vacuum`.
    pub(super) fn retention_pass(&mut self) -> Result<RetentionReport, StorageError> {
        #[cfg(test)]
        super::writer::inject::hit(&self.db_path, "retention");
        let mut report = RetentionReport {
            bytes_before: self.refresh_used()?,
            ..Default::default()
        };
        let cutoff = now_unix_nano().saturating_sub(self.retention.as_nanos() as u64) as i64;

        // by age
        loop {
            let ids = self.oldest_batches(Some(cutoff))?;
            if ids.is_empty() {
                break;
            }
            self.delete_batches(&ids, &mut report, true)?;
            self.serve_pending();
        }
        loop {
            let (logs, points) = self.delete_rows_before(cutoff)?;
            report.logs_deleted += logs;
            report.points_deleted += points;
            if logs + points == 0 {
                break;
            }
            self.serve_pending();
        }

        // by size
        if self.refresh_used()? > self.size_high() {
            self.retaining = true;
            let out = self.size_retention(&mut report);
            self.retaining = false;
            out?;
        }

        // give free pages back, keeping those below the high watermark while telemetry is
        // near its budget (the next commits reuse them)
        self.refresh_used()?;
        let keep_pages = if self.used_bytes >= self.size_low() {
            self.size_high().saturating_sub(self.used_bytes) / self.page_size
        } else {
            0
        };
        let mut vacuumed = false;
        let step_pages = (self.wal_budget / self.page_size / VACUUM_STEP_WAL_SHARE)
            .clamp(MIN_VACUUM_STEP_PAGES, MAX_VACUUM_STEP_PAGES) as i64;
        loop {
            let free: i64 = self
                .conn
                .pragma_query_value(None, "freelist_count", |r| r.get(0))?;
            let extra = free - keep_pages as i64;
            if extra <= 0 {
                break;
            }
            // One statement, one transaction, stepped until done: each step of
            // `incremental_vacuum` frees one page (`execute_batch` steps once).
            let mut st = self.conn.prepare(&format!(
                "PRAGMA incremental_vacuum({})",
                extra.min(step_pages)
            ))?;
            let mut rows = st.query([])?;
            while rows.next()?.is_some() {}
            drop(rows);
            drop(st);
            vacuumed = true;
            self.after_retention_commit();
            self.serve_pending();
        }
        if vacuumed || self.wal_file_bytes() > self.wal_budget {
            self.checkpoint_truncate();
        }
        report.bytes_after = self.refresh_used()?;
        if self.used_bytes < self.budget_bytes {
            self.set_full(None);
        }
        self.stats
            .retention_batches_deleted
            .fetch_add(report.batches_deleted, Ordering::Relaxed);
        if report.batches_deleted + report.logs_deleted + report.points_deleted > 0 {
            tracing::info!(?report, "telemetry retention pass");
        }
        Ok(report)
    }

    /// The size step on its own (after a commit passed the high watermark, or before a
    /// group that would not fit): deletes the oldest telemetry down to the low watermark,
    /// or further when the group of `need` bytes would still not fit. Failures are logged;
    /// the commit that follows reports the condition.
    pub(super) fn retain_size(&mut self, need: u64) {
        if self.retaining {
            return;
        }
        self.retaining = true;
        let mut report = RetentionReport {
            bytes_before: self.used_bytes,
            ..Default::default()
        };
        let floor = self.size_low().min(self.budget_bytes.saturating_sub(need));
        let out = self.size_retention_to(floor, &mut report, false);
        self.retaining = false;
        report.bytes_after = self.used_bytes;
        self.stats
            .retention_batches_deleted
            .fetch_add(report.batches_deleted, Ordering::Relaxed);
        match out {
            Ok(()) => tracing::debug!(?report, "telemetry size retention"),
            Err(e) => tracing::warn!(error = %e, "telemetry size retention failed; will retry"),
        }
    }

    fn size_retention(&mut self, report: &mut RetentionReport) -> Result<(), StorageError> {
        let low = self.size_low();
        self.size_retention_to(low, report, true)
    }

    /// Deletes the oldest telemetry until at most `floor` bytes are in use (or nothing is
    /// left), serving queued groups between transactions; `count_traces` as for
    /// [`Writer::delete_batches`].
    fn size_retention_to(
        &mut self,
        floor: u64,
        report: &mut RetentionReport,
        count_traces: bool,
    ) -> Result<(), StorageError> {
        while self.refresh_used()? > floor {
            let want = (self.used_bytes - floor).min(CHUNK_BYTES);
            let batches = self.oldest_batches_by_size(want)?;
            // Everything received up to the earliest candidate goes: at least that
            // candidate's signal's oldest item, so every step makes progress.
            let cutoff = [
                batches.last().map(|b| b.1),
                self.oldest_rows_received(RowTable::Logs, want)?,
                self.oldest_rows_received(RowTable::MetricPoints, want)?,
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(cutoff) = cutoff else { break };
            let ids: Vec<i64> = batches
                .iter()
                .take_while(|b| b.1 <= cutoff)
                .map(|b| b.0)
                .collect();
            let mut deleted = ids.len() as u64;
            if !ids.is_empty() {
                self.delete_batches(&ids, report, count_traces)?;
            }
            loop {
                let (logs, points) = self.delete_rows_before(cutoff.saturating_add(1))?;
                report.logs_deleted += logs;
                report.points_deleted += points;
                deleted += logs + points;
                if logs < ROW_CHUNK as u64 && points < ROW_CHUNK as u64 {
                    break;
                }
            }
            if deleted == 0 {
                break;
            }
            self.serve_pending();
        }
        Ok(())
    }

    /// The oldest batches, in id order, whose stored bytes add up to at least `want` (at
    /// least one, at most [`CHUNK_MAX_BATCHES`]): `(id, received_unix_nano)` each. Blob
    /// lengths come from the record headers; no payload is read.
    fn oldest_batches_by_size(&mut self, want: u64) -> Result<Vec<(i64, i64)>, rusqlite::Error> {
        let mut st = self.conn.prepare_cached(
            "SELECT id, received_unix_nano, length(traces) + length(idx) + length(payload)
             FROM span_batches ORDER BY id LIMIT ?1",
        )?;
        let mut rows = st.query([CHUNK_MAX_BATCHES])?;
        let mut out = Vec::new();
        let mut sum = 0u64;
        while let Some(r) = rows.next()? {
            out.push((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?));
            sum += r.get::<_, i64>(2)?.max(0) as u64;
            if sum >= want {
                break;
            }
        }
        Ok(out)
    }

    /// Up to [`BATCH_CHUNK`] oldest batch ids, only those received before `cutoff` when
    /// given.
    fn oldest_batches(&mut self, cutoff: Option<i64>) -> Result<Vec<i64>, rusqlite::Error> {
        let mut st = self.conn.prepare_cached(
            "SELECT id, received_unix_nano FROM span_batches INDEXED BY span_batches_scan
             ORDER BY id LIMIT ?1",
        )?;
        let rows = st.query_map([BATCH_CHUNK as i64], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, received) = row?;
            if cutoff.is_some_and(|c| received >= c) {
                break;
            }
            out.push(id);
        }
        Ok(out)
    }

    /// Deletes the oldest batches `ids` (ascending, every stored batch between the first
    /// and the last) with their trace entries and postings, in one transaction.
    /// `count_traces`: count the traces deleted whole into the report
    /// ([`RetentionReport::traces_deleted`]), which reads every trace-index run newer than
    /// the deleted batches: a retention pass counts them, the size step a commit starts at
    /// the high watermark does not: its report is only a debug log line, and at a 2 GiB cap
    /// that read cost a quarter of the CPU per span (3.08 → 2.31 CPU-s per million spans,
    /// 345k → 532k spans/s accepted at the cap, `benches/side-by-side --retention 90
    /// --max-db-bytes 2147483648`).
    fn delete_batches(
        &mut self,
        ids: &[i64],
        report: &mut RetentionReport,
        count_traces: bool,
    ) -> Result<(), StorageError> {
        let (Some(&lo), Some(&hi)) = (ids.first(), ids.last()) else {
            return Ok(());
        };
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let mut r = RetentionReport::default();
        let out = self.delete_batches_tx(lo, hi, &mut r, count_traces);
        match out.and_then(|()| Ok(self.conn.execute_batch("COMMIT")?)) {
            Ok(()) => {
                self.after_retention_commit();
                self.term_cache.clear();
                // the deleted batches' cached indexes too, so deduplication never sees
                // spans that are no longer stored (retention by age and by size alike)
                self.idx_cache_forget(hi);
                report.batches_deleted += r.batches_deleted;
                report.spans_deleted += r.spans_deleted;
                report.traces_deleted += r.traces_deleted;
                Ok(())
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                let _ = self.reload_l0();
                Err(e)
            }
        }
    }

    /// The body of [`Writer::delete_batches`] for the batches with ids in `lo..=hi`. The
    /// rows go first (their pages are free for what follows in the same transaction, so a
    /// file at its page limit can still be cleaned), then the `trace_index` runs that
    /// cover only deleted batches, then each affected trace once, in trace id order: its
    /// unmerged entries in `l0`, and, when `count_traces`, whether any batch of it is left
    /// (for the report).
    fn delete_batches_tx(
        &mut self,
        lo: i64,
        hi: i64,
        report: &mut RetentionReport,
        count_traces: bool,
    ) -> Result<(), StorageError> {
        // trace id -> (deleted batches, any of them merged)
        let mut traces: BTreeMap<[u8; 16], (Vec<i64>, bool)> = BTreeMap::new();
        {
            let mut st = self.conn.prepare_cached(
                "SELECT id, traces, span_count FROM span_batches WHERE id BETWEEN ?1 AND ?2",
            )?;
            let mut rows = st.query(params![lo, hi])?;
            while let Some(row) = rows.next()? {
                let id: i64 = row.get(0)?;
                let list: Vec<u8> = row.get(1)?;
                let count: i64 = row.get(2)?;
                for c in list.chunks_exact(16) {
                    let mut t = [0u8; 16];
                    t.copy_from_slice(c);
                    let e = traces.entry(t).or_default();
                    e.0.push(id);
                    e.1 |= id <= self.merged_upto;
                }
                if id > self.merged_upto {
                    self.l0_batches = self.l0_batches.saturating_sub(1);
                }
                report.batches_deleted += 1;
                report.spans_deleted += count.max(0) as u64;
            }
        }
        self.conn
            .prepare_cached("DELETE FROM span_batches WHERE id BETWEEN ?1 AND ?2")?
            .execute(params![lo, hi])?;
        record_next_id(&self.conn, IdTable::SpanBatches, self.next_batch_id)?;
        // Runs whose every batch is gone are deleted whole (one key range each); a run
        // partly deleted keeps stale ids (`schema::TRACE_RUNS_SCHEMA`).
        let dead_runs: Vec<i64> = {
            let mut st = self
                .conn
                .prepare_cached("SELECT run FROM trace_runs WHERE hi <= ?1")?;
            let rows = st.query_map([hi], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        for run in dead_runs {
            self.conn
                .prepare_cached("DELETE FROM trace_index WHERE run = ?1")?
                .execute([run])?;
            self.conn
                .prepare_cached("DELETE FROM trace_runs WHERE run = ?1")?
                .execute([run])?;
        }
        // Traces whose runs must tell whether a batch of them is left, ascending.
        let mut check: Vec<[u8; 16]> = Vec::new();
        for (t, (gone, any_merged)) in traces {
            let mut l0_left = 0;
            if let Some(l) = self.l0.get_mut(&t) {
                l.retain(|b| !gone.contains(b));
                l0_left = l.len();
                if l0_left == 0 {
                    self.l0.remove(&t);
                }
            }
            if l0_left > 0 || !count_traces {
                continue;
            }
            // Gone when nothing is left in l0 and no run lists a batch newer than `hi`
            // (known without a read when the trace was new since the last merge). Batches
            // are deleted oldest first, so every id up to `hi` is gone.
            if !any_merged && self.l0_new.contains(&t) {
                report.traces_deleted += 1;
            } else {
                check.push(t);
            }
        }
        report.traces_deleted += count_unlisted_after(&self.conn, &check, hi)?;
        let term_ids: Vec<i64> = {
            let mut st = self.conn.prepare_cached("SELECT id FROM terms")?;
            let rows = st.query_map([], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        for tid in &term_ids {
            self.conn
                .prepare_cached("DELETE FROM batch_terms WHERE term_id = ?1 AND batch_id <= ?2")?
                .execute(params![tid, hi])?;
        }
        // Postings not merged yet (schema::POSTINGS_SCHEMA) go with their batches; a term
        // still named by one of them is kept even with no batch_terms row.
        self.conn
            .prepare_cached("DELETE FROM pending_terms WHERE batch_id BETWEEN ?1 AND ?2")?
            .execute(params![lo, hi])?;
        let pending: std::collections::HashSet<i64> = unmerged_postings(&self.conn)?
            .into_iter()
            .flat_map(|(_, terms)| terms)
            .collect();
        for tid in term_ids {
            if pending.contains(&tid) {
                continue;
            }
            self.conn
                .prepare_cached(
                    "DELETE FROM terms WHERE id = ?1 AND NOT EXISTS
                        (SELECT 1 FROM batch_terms WHERE term_id = ?1)",
                )?
                .execute([tid])?;
        }
        Ok(())
    }

    /// Deletes up to [`ROW_CHUNK`] logs and points received before `cutoff`.
    fn delete_rows_before(&mut self, cutoff: i64) -> Result<(u64, u64), rusqlite::Error> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let out = (|| {
            let logs = self.conn.execute(
                "DELETE FROM logs WHERE id IN
                    (SELECT id FROM logs WHERE received_unix_nano < ?1 LIMIT ?2)",
                params![cutoff, ROW_CHUNK],
            )?;
            // The oldest points received before `cutoff`, in (received, id) order, and what
            // each instrument loses: `metric_instruments` stays exact in this transaction.
            let mut gone: PointsGone = PointsGone::new();
            let mut last: Option<(i64, i64)> = None;
            let mut points = 0usize;
            {
                let mut st = self.conn.prepare_cached(
                    "SELECT received_unix_nano, id, name, service, time_unix_nano
                     FROM metric_points INDEXED BY metric_points_received
                     WHERE received_unix_nano < ?1
                     ORDER BY received_unix_nano, id LIMIT ?2",
                )?;
                let mut rows = st.query(params![cutoff, ROW_CHUNK])?;
                while let Some(r) = rows.next()? {
                    last = Some((r.get(0)?, r.get(1)?));
                    let t: i64 = r.get(4)?;
                    let e = gone
                        .entry((r.get(2)?, r.get(3)?))
                        .or_insert((0, i64::MAX, i64::MIN));
                    e.0 += 1;
                    e.1 = e.1.min(t);
                    e.2 = e.2.max(t);
                    points += 1;
                }
            }
            if let Some((received, id)) = last {
                // exactly the rows read: every row before the last one in that order
                self.conn
                    .prepare_cached(
                        "DELETE FROM metric_points WHERE received_unix_nano <= ?1
                             AND (received_unix_nano < ?1 OR id <= ?2)",
                    )?
                    .execute(params![received, id])?;
                forget_points(&self.conn, &gone)?;
            }
            if logs > 0 {
                record_next_id(&self.conn, IdTable::Logs, self.next_log_id)?;
                // the body index generations whose rows are all gone (log_body.rs)
                drop_dead_generations(&self.conn)?;
            }
            if points > 0 {
                record_next_id(&self.conn, IdTable::MetricPoints, self.next_point_id)?;
            }
            Ok((logs as u64, points as u64))
        })();
        let out = self.finish(out);
        if matches!(out, Ok((logs, points)) if logs + points > 0) {
            self.after_retention_commit();
        }
        out
    }

    /// The newest receive time among the oldest rows of `table` whose stored bytes (payload
    /// plus [`ROW_OVERHEAD_BYTES`] each) add up to at least `want` (at least one row, at most
    /// [`ROW_CHUNK`]), ns; `None` when the table is empty. Rows are read in id (commit)
    /// order from the table's own B-tree, and blob lengths from the record headers.
    fn oldest_rows_received(
        &mut self,
        table: RowTable,
        want: u64,
    ) -> Result<Option<i64>, rusqlite::Error> {
        let sql = match table {
            RowTable::Logs => {
                "SELECT received_unix_nano, length(payload) FROM logs ORDER BY id LIMIT ?1"
            }
            RowTable::MetricPoints => {
                "SELECT received_unix_nano, length(payload) FROM metric_points ORDER BY id LIMIT ?1"
            }
        };
        let mut st = self.conn.prepare_cached(sql)?;
        let mut rows = st.query([ROW_CHUNK])?;
        let (mut newest, mut sum) = (None, 0u64);
        while let Some(r) = rows.next()? {
            let received: i64 = r.get(0)?;
            newest = Some(newest.map_or(received, |n: i64| n.max(received)));
            sum += r.get::<_, i64>(1)?.max(0) as u64 + ROW_OVERHEAD_BYTES;
            if sum >= want {
                break;
            }
        }
        Ok(newest)
    }

    fn finish<T>(&mut self, out: Result<T, rusqlite::Error>) -> Result<T, rusqlite::Error> {
        match out {
            Ok(v) => {
                self.conn.execute_batch("COMMIT")?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    /// After each retention transaction: wakes the checkpointer (no group commit does it
    /// while a pass runs between groups), and once the `-wal` file is past its bound copies
    /// its tail (`commit::checkpoint_tail`) so the next transaction rewinds it. Without it
    /// the WAL took every transaction of a pass: deleting a full store by age at a 64 MiB
    /// cap left a 60 MiB WAL.
    pub(super) fn after_retention_commit(&mut self) {
        self.ckpt.note_commit(0);
        if self.wal_file_bytes() > self.wal_budget {
            self.checkpoint_tail();
        }
    }

    /// At the end of a pass that gave pages back or left the WAL past its bound (the pass
    /// runs while idle): checkpoints the whole WAL and truncates it (`PRAGMA
    /// wal_checkpoint(TRUNCATE)`), so the database file shrinks to the pages
    /// `incremental_vacuum` kept now (in WAL mode the file shrinks only when a checkpoint
    /// copies the commit that shrank it) and an idle sidecar is not left with a WAL that
    /// only its next write would rewind.
    ///
    /// The checkpointer stands aside meanwhile (as for [`Writer::checkpoint_tail`]), and a
    /// checkpoint of its own already running is waited for: it held the lock this one
    /// needs, and with slow `fsync`s (a loaded machine) it outlasted one 100 ms busy wait,
    /// so the file stayed at its full size after the pass (a flaky
    /// `age_retention_of_a_full_store_stays_within_the_cap`). While the answer is busy it
    /// tries again every [`WAL_RETRY`], each try waiting at most [`TRUNCATE_WAIT`], until
    /// [`WAL_WAIT`] has passed (so the writer thread waits at most that long); after a wait
    /// that timed out (a long read) it tries once only for the next [`WAL_WAIT`], as
    /// [`Writer::checkpoint_tail`] does, and the checkpointer and the next write finish it.
    fn checkpoint_truncate(&mut self) {
        let busy = self.busy_timeout;
        let now = std::time::Instant::now();
        let insist = now >= self.wal_wait_again_at;
        let deadline = now + WAL_WAIT;
        let was_asked = self
            .ckpt
            .writer_should_checkpoint
            .swap(true, Ordering::AcqRel);
        let out = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let _ = self
                .conn
                .busy_timeout(TRUNCATE_WAIT.min(left).max(WAL_RETRY));
            let out = self
                .conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    r.get::<_, i64>(0)
                });
            let busy_now = match &out {
                Ok(b) => *b != 0,
                Err(e) => matches!(
                    e.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                ),
            };
            if !busy_now || !insist || std::time::Instant::now() >= deadline {
                break out;
            }
            std::thread::sleep(WAL_RETRY);
        };
        let truncated = matches!(out, Ok(0));
        if insist && !truncated {
            self.wal_wait_again_at = std::time::Instant::now() + WAL_WAIT;
        }
        // A WAL truncated needs no checkpoint. Otherwise the request stands as it was, or
        // is made now if the WAL is past its bound (the checkpointer may have asked while
        // the flag was up, which did not show).
        let ask = !truncated && (was_asked || self.wal_file_bytes() > self.wal_budget);
        self.ckpt
            .writer_should_checkpoint
            .store(ask, Ordering::Release);
        let _ = self.conn.busy_timeout(busy);
        match out {
            Ok(0) => {}
            Ok(_) => tracing::debug!("readers held the WAL; it is rewound by the next write"),
            Err(e) => tracing::debug!(error = %e, "WAL truncation after retention failed"),
        }
    }
}
