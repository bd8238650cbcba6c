//! Retention: by age ([`crate::StorageConfig::retention`]) and by size (oldest batches go
//! while telemetry uses more than ~90% of its budget, `max_db_bytes` minus
//! [`crate::config::CONTROL_RESERVE_BYTES`]), then `PRAGMA incremental_vacuum`.
//!
//! Runs on the writer thread (a periodic tick, a size alarm after a commit, or
//! [`crate::Storage::run_retention`]), in small transactions; queued writes are served
//! between chunks so ingest keeps flowing.

use std::sync::atomic::Ordering;

use rusqlite::{params, OptionalExtension};

use super::traceidx::{encode_batches, indexed_batches};
use super::writer::Writer;
use super::RetentionReport;
use crate::error::StorageError;
use crate::model::now_unix_nano;

/// Batches deleted per transaction.
const BATCH_CHUNK: usize = 64;
/// Log records / metric points deleted per transaction.
const ROW_CHUNK: i64 = 5000;
/// Pages returned to the file system per `incremental_vacuum` step.
const VACUUM_STEP_PAGES: i64 = 2048;

impl Writer {
    /// One full retention pass.
    pub(super) fn retention_pass(&mut self) -> Result<RetentionReport, StorageError> {
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
            self.delete_batches(&ids, &mut report)?;
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
        while self.refresh_used()? > self.size_target() {
            let ids = self.oldest_batches(None)?;
            if !ids.is_empty() {
                let last = *ids.last().unwrap_or(&0);
                let received: Option<i64> = self
                    .conn
                    .query_row(
                        "SELECT received_unix_nano FROM span_batches WHERE id = ?1",
                        [last],
                        |r| r.get(0),
                    )
                    .optional()?;
                self.delete_batches(&ids, &mut report)?;
                if let Some(t) = received {
                    loop {
                        let (logs, points) = self.delete_rows_before(t.saturating_add(1))?;
                        report.logs_deleted += logs;
                        report.points_deleted += points;
                        if logs + points == 0 {
                            break;
                        }
                    }
                }
            } else {
                let (logs, points) = self.delete_oldest_rows()?;
                report.logs_deleted += logs;
                report.points_deleted += points;
                if logs + points == 0 {
                    break;
                }
            }
            self.serve_pending();
        }

        if report.points_deleted > 0 {
            super::metrics_read::recompute_instruments(&self.conn)?;
        }

        // give free pages back
        loop {
            let free: i64 = self
                .conn
                .pragma_query_value(None, "freelist_count", |r| r.get(0))?;
            if free == 0 {
                break;
            }
            self.conn
                .execute_batch(&format!("PRAGMA incremental_vacuum({VACUUM_STEP_PAGES})"))?;
            self.serve_pending();
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

    /// Deletes batches (the oldest ones, in id order) with their trace entries and
    /// postings, in one transaction.
    fn delete_batches(
        &mut self,
        ids: &[i64],
        report: &mut RetentionReport,
    ) -> Result<(), StorageError> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let out = self.delete_batches_tx(ids, report);
        match out {
            Ok(()) => {
                self.conn.execute_batch("COMMIT")?;
                self.term_cache.clear();
                Ok(())
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                let _ = self.reload_l0();
                Err(e)
            }
        }
    }

    fn delete_batches_tx(
        &mut self,
        ids: &[i64],
        report: &mut RetentionReport,
    ) -> Result<(), StorageError> {
        for &id in ids {
            let row: Option<(Vec<u8>, i64)> = self
                .conn
                .prepare_cached("SELECT traces, span_count FROM span_batches WHERE id = ?1")?
                .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let Some((list, count)) = row else { continue };
            for c in list.chunks_exact(16) {
                let mut t = [0u8; 16];
                t.copy_from_slice(c);
                let mut l0_emptied = false;
                if let Some(l) = self.l0.get_mut(&t) {
                    l.retain(|b| *b != id);
                    if l.is_empty() {
                        self.l0.remove(&t);
                        l0_emptied = true;
                    }
                }
                let mut batches = indexed_batches(&self.conn, &t)?;
                let before = batches.len();
                batches.retain(|b| *b != id);
                if batches.len() == before {
                    if l0_emptied && before == 0 {
                        report.traces_deleted += 1;
                    }
                    continue;
                }
                if batches.is_empty() {
                    self.conn
                        .prepare_cached("DELETE FROM trace_index WHERE trace_id = ?1")?
                        .execute([&t[..]])?;
                    report.traces_deleted += 1;
                } else {
                    self.conn
                        .prepare_cached("UPDATE trace_index SET batches = ?2 WHERE trace_id = ?1")?
                        .execute(params![&t[..], encode_batches(&batches)])?;
                }
            }
            self.conn
                .prepare_cached("DELETE FROM span_batches WHERE id = ?1")?
                .execute([id])?;
            if id > self.merged_upto {
                self.l0_batches = self.l0_batches.saturating_sub(1);
            }
            report.batches_deleted += 1;
            report.spans_deleted += count.max(0) as u64;
        }
        if let Some(max_id) = ids.iter().max() {
            let term_ids: Vec<i64> = {
                let mut st = self.conn.prepare_cached("SELECT id FROM terms")?;
                let rows = st.query_map([], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            for tid in term_ids {
                self.conn
                    .prepare_cached(
                        "DELETE FROM batch_terms WHERE term_id = ?1 AND batch_id <= ?2",
                    )?
                    .execute(params![tid, max_id])?;
            }
            self.conn.execute(
                "DELETE FROM terms WHERE NOT EXISTS
                    (SELECT 1 FROM batch_terms WHERE batch_terms.term_id = terms.id)",
                [],
            )?;
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
            let points = self.conn.execute(
                "DELETE FROM metric_points WHERE id IN
                    (SELECT id FROM metric_points WHERE received_unix_nano < ?1 LIMIT ?2)",
                params![cutoff, ROW_CHUNK],
            )?;
            Ok((logs as u64, points as u64))
        })();
        self.finish(out)
    }

    /// Deletes the [`ROW_CHUNK`] oldest logs and points (size retention with no batches).
    fn delete_oldest_rows(&mut self) -> Result<(u64, u64), rusqlite::Error> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let out = (|| {
            let logs = self.conn.execute(
                "DELETE FROM logs WHERE id IN (SELECT id FROM logs ORDER BY id LIMIT ?1)",
                [ROW_CHUNK],
            )?;
            let points = self.conn.execute(
                "DELETE FROM metric_points WHERE id IN
                    (SELECT id FROM metric_points ORDER BY id LIMIT ?1)",
                [ROW_CHUNK],
            )?;
            Ok((logs as u64, points as u64))
        })();
        self.finish(out)
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
}
