//! One group commit: every request of the group in one `BEGIN IMMEDIATE` transaction,
//! each answered only after COMMIT returned; log records deduplicated by payload
//! ([`RecentLogs`]).

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rusqlite::{params, OptionalExtension};

use crate::error::{transient_kind, Transient, WriteError};
use crate::model::now_unix_nano;
use crate::telemetry::checkpoint;
use crate::telemetry::encode::PreparedTraces;
use crate::telemetry::schema::MERGE_BATCHES;
use crate::telemetry::stats::RefusedReason;

use super::{panic_error, Degraded, Prepared, WriteRequest, Writer};

/// Longest the writer waits for the WAL to be checkpointed before committing more while the
/// `-wal` file is past its bound ([`Writer::checkpoint_tail`]).
pub(in crate::telemetry) const WAL_WAIT: Duration = Duration::from_secs(2);
/// Retry interval of that wait.
pub(in crate::telemetry) const WAL_RETRY: Duration = Duration::from_millis(2);

/// What one group committed.
#[derive(Default)]
pub(super) struct Committed {
    pub(super) spans: u64,
    pub(super) duplicates: u64,
    pub(super) logs: u64,
    pub(super) log_duplicates: u64,
    pub(super) points: u64,
    /// The trace requests written, dropped only after the group is answered: freeing
    /// their index entries and payloads (~1.3% of ingest CPU, on this thread) is then
    /// off the exporter's wait.
    pub(super) spent: Vec<PreparedTraces>,
}

/// Log records remembered for deduplication (by payload hash): an exporter retry arrives
/// within seconds to minutes, long before this many other records.
pub(super) const RECENT_LOGS: usize = 262_144;

/// Hash → row id of recently stored log records, bounded FIFO.
#[derive(Default)]
pub(super) struct RecentLogs {
    by_hash: HashMap<u64, i64>,
    order: VecDeque<u64>,
}

impl RecentLogs {
    pub(super) fn hash(payload: &[u8]) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        payload.hash(&mut h);
        h.finish()
    }

    pub(super) fn remember(&mut self, hash: u64, row: i64) {
        if self.by_hash.insert(hash, row).is_none() {
            self.order.push_back(hash);
            while self.order.len() > RECENT_LOGS {
                if let Some(old) = self.order.pop_front() {
                    self.by_hash.remove(&old);
                }
            }
        }
    }
}

impl Writer {
    pub(super) fn commit_group(&mut self, reqs: Vec<WriteRequest>) {
        // The file's identity is checked after every COMMIT, before acknowledging (below):
        // that check is what keeps an answer honest. Before the commit it is checked only
        // while degraded, so a file known gone is not written to again; a healthy commit
        // pays one `stat` instead of two (the two were 1.6% of the CPU at HTTP/protobuf
        // c=1, `perf record`, on the export's own thread since exports commit as leaders).
        if self.degraded_tx.borrow().is_some() {
            if let Some(gone) = self.moved_away() {
                self.refuse_unavailable(reqs, gone);
                return;
            }
        }
        let need: u64 = reqs.iter().map(|r| r.prepared.bytes() as u64).sum();
        if self.used_bytes.saturating_add(need) > self.budget_bytes {
            // The group would pass the budget: delete the oldest first (unless this group
            // is being served from inside that very step).
            let _ = self.refresh_used();
            // A request larger than the whole budget cannot fit: it is refused below (or by
            // SQLite) without deleting anything for it.
            if self.used_bytes.saturating_add(need) > self.budget_bytes && need <= self.budget_bytes
            {
                self.retain_size(need);
            }
            if self.used_bytes >= self.budget_bytes {
                let reason = self.full_reason();
                self.set_full(Some(reason.clone()));
                self.schedule_retention();
                self.stats
                    .count_refused(RefusedReason::StorageFull, reqs.len() as u64);
                for r in reqs {
                    let _ = r.reply.send(Err(WriteError::Full(reason.clone())));
                }
                return;
            }
        }
        // A leader never waits for the WAL (the flag went up after it was allowed to
        // lead): the writer thread does before its next group, and no export leads while
        // the flag is up.
        if !self.leading && self.ckpt.writer_should_checkpoint.load(Ordering::Acquire) {
            self.checkpoint_tail();
        }
        let started = Instant::now();
        let saved_next = self.next_batch_id;
        let saved_ids = (
            self.next_log_id,
            self.next_point_id,
            self.body_index.clone(),
        );
        let mut replies = Vec::with_capacity(reqs.len());
        let mut preps = Vec::with_capacity(reqs.len());
        for r in reqs {
            replies.push(r.reply);
            preps.push(r.prepared);
        }
        // A panic while writing is a bug; it is contained here like a failed commit: the
        // transaction is rolled back, the in-memory index state re-read, and the group's
        // requests answered as failed (500), so the writer thread, and with it every later
        // export, lives on (see `Writer::run` for a panic elsewhere).
        let outcome = match catch_unwind(AssertUnwindSafe(|| self.write_all(preps))) {
            Ok(outcome) => outcome,
            Err(payload) => Err(panic_error(payload.as_ref())),
        };
        match outcome {
            Ok(c) => {
                self.stats.observe_commit(started.elapsed());
                for (k, id) in self.pending_terms.drain(..) {
                    self.term_cache.insert(k, id);
                }
                if self.term_cache.len() > 200_000 {
                    self.term_cache.clear();
                }
                self.stats
                    .spans_committed
                    .fetch_add(c.spans, Ordering::Relaxed);
                self.stats
                    .spans_deduplicated
                    .fetch_add(c.duplicates, Ordering::Relaxed);
                self.stats
                    .logs_committed
                    .fetch_add(c.logs, Ordering::Relaxed);
                if c.log_duplicates > 0 {
                    tracing::debug!(
                        "{} re-sent log records already stored (kept once)",
                        c.log_duplicates
                    );
                }
                self.stats
                    .points_committed
                    .fetch_add(c.points, Ordering::Relaxed);
                // Checked again before acknowledging: a commit into a file unlinked meanwhile
                // is not durable, so the exporter must retry (against the next instance).
                if let Some(gone) = self.moved_away() {
                    tracing::error!(detail = %gone.detail, "storage gone; not acknowledging");
                    self.stats
                        .count_refused(RefusedReason::StorageGone, replies.len() as u64);
                    for r in replies {
                        let _ = r.send(Err(WriteError::Unavailable {
                            kind: gone.kind,
                            detail: gone.detail.clone(),
                        }));
                    }
                    self.set_degraded(Some(gone));
                    return;
                }
                for r in replies {
                    let _ = r.send(Ok(()));
                }
                drop(c.spent);
                if self.degraded_tx.borrow().is_some() && self.full_tx.borrow().is_none() {
                    self.set_degraded(None);
                }
                if self.l0_batches >= MERGE_BATCHES {
                    self.merge_now();
                }
                self.ckpt.note_commit(need);
                if self.wal_file_bytes() > self.wal_budget {
                    self.ckpt
                        .writer_should_checkpoint
                        .store(true, Ordering::Release);
                }
                let _ = self.refresh_used();
                if self.used_bytes < self.budget_bytes {
                    self.set_full(None);
                }
                if self.used_bytes > self.size_high() {
                    // Past the high watermark: the oldest go now, before the next group
                    // (a leader leaves it to the writer thread, and no export leads
                    // until it is done).
                    self.retain_now(0);
                }
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                self.next_batch_id = saved_next;
                (self.next_log_id, self.next_point_id, self.body_index) = saved_ids;
                self.pending_terms.clear();
                if let Err(e) = self.reload_l0() {
                    tracing::error!(error = %e, "cannot reload the unmerged trace map");
                }
                self.stats.commit_failures.fetch_add(1, Ordering::Relaxed);
                let err = match transient_kind(&e) {
                    Some(Transient::Full) => {
                        self.stats
                            .count_refused(RefusedReason::StorageFull, replies.len() as u64);
                        let _ = self.refresh_used();
                        // The file's page limit (telemetry's share of `max_db_bytes`), not
                        // the disk: the group needed more pages than its estimate (`need`
                        // counts payloads; indexes, the log body index's merges and page
                        // splits come on top) and more than were free. The oldest go now,
                        // room for twice the estimate, and the group is answered as a
                        // moment's refusal (retry in 1 s, no `storage.full` episode): a
                        // 20 ms condition answered "retry in 10 s" stalled exporters that
                        // honour it, and with `used` under the high watermark nothing was
                        // deleted, so the same group failed again on every retry.
                        if self.used_bytes.saturating_add(need) <= self.budget_bytes
                            && self.near_page_limit()
                        {
                            // at least `need` more than is in use now, so a group whose
                            // true cost is several times its estimate fits after a few
                            // retries
                            let room = need
                                .saturating_mul(2)
                                .max(self.budget_bytes.saturating_sub(self.used_bytes) + need);
                            self.retain_now(room);
                            WriteError::AtCap(format!(
                                "telemetry reached its share of max_db_bytes during the commit ({e}); the oldest telemetry was deleted to make room"
                            ))
                        } else {
                            let reason = format!("disk full or size cap reached: {e}");
                            self.set_full(Some(reason.clone()));
                            if self.used_bytes > self.size_high() {
                                self.retain_now(0);
                            }
                            self.schedule_retention();
                            WriteError::Full(reason)
                        }
                    }
                    Some(kind) => {
                        let degraded = Degraded {
                            kind,
                            detail: e.to_string(),
                        };
                        self.stats
                            .count_refused(RefusedReason::from(kind), replies.len() as u64);
                        self.set_degraded(Some(degraded));
                        WriteError::Unavailable {
                            kind,
                            detail: e.to_string(),
                        }
                    }
                    None => {
                        tracing::error!(error = %e, "telemetry commit failed");
                        WriteError::Failed(e.to_string())
                    }
                };
                for r in replies {
                    let _ = r.send(Err(match &err {
                        WriteError::Full(s) => WriteError::Full(s.clone()),
                        WriteError::AtCap(s) => WriteError::AtCap(s.clone()),
                        WriteError::Unavailable { kind, detail } => WriteError::Unavailable {
                            kind: *kind,
                            detail: detail.clone(),
                        },
                        other => WriteError::Failed(other.to_string()),
                    }));
                }
            }
        }
    }

    /// Merges the trace index's unmerged batches now, on the writer thread (a failure is
    /// retried after the next commit); a leader leaves it to the thread
    /// ([`Writer::housekeep`]).
    fn merge_now(&mut self) {
        if self.leading {
            self.housekeeping = true;
            return;
        }
        if let Err(e) = self.merge_l0() {
            tracing::warn!(error = %e, "merging the trace index failed; will retry");
        }
    }

    /// Size retention making `room` bytes (0: down to the low watermark) now, on the
    /// writer thread; a leader leaves it to the thread ([`Writer::housekeep`]), since
    /// retention deletes in chunks and waits for the WAL between them.
    fn retain_now(&mut self, room: u64) {
        if self.leading {
            self.housekeeping = true;
            self.retain_room = Some(self.retain_room.unwrap_or(0).max(room));
        } else {
            self.retain_size(room);
        }
    }

    /// What a leader's commit left to the writer thread ([`Writer::housekeeping`]): the
    /// trace index merge, and retention past the high watermark or for the room a commit
    /// that met the page limit asked for, as after the thread's own commits.
    pub(super) fn housekeep(&mut self) {
        if self.l0_batches >= MERGE_BATCHES {
            self.merge_now();
        }
        match self.retain_room.take() {
            Some(room) => self.retain_size(room),
            None if self.used_bytes > self.size_high() => self.retain_size(0),
            None => {}
        }
    }

    /// The WAL outgrew its bound: copies its tail so the next transaction rewinds it. The
    /// checkpointer stands aside while the flag is up, but a checkpoint of its own may still
    /// be running (this one then answers busy), or a reader may still use old frames. While
    /// the `-wal` file is past its bound the writer waits for them (up to [`WAL_WAIT`],
    /// retrying every [`WAL_RETRY`]) instead of committing more: when the disk cannot take
    /// the full rate, exporters see slower answers, not a WAL growing past the size cap
    /// (issue 16: at the cap, at ~280k spans/s, the WAL reached 66 MiB against a 4 MiB
    /// bound). After a wait that timed out it does not wait again for [`WAL_WAIT`], so a
    /// long read slows ingest for moments only.
    pub(in crate::telemetry) fn checkpoint_tail(&mut self) {
        let now = Instant::now();
        let insist = now >= self.wal_wait_again_at;
        let deadline = now + WAL_WAIT;
        let waited = |s: &Self| {
            let ns = now.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
            s.stats.wal_wait_ns.fetch_add(ns, Ordering::Relaxed);
        };
        loop {
            match checkpoint::passive(&self.conn) {
                Ok((0, log, done)) if done >= log => {
                    self.ckpt
                        .writer_should_checkpoint
                        .store(false, Ordering::Release);
                    waited(self);
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "writer-side WAL checkpoint failed");
                    waited(self);
                    return;
                }
            }
            if !insist || self.wal_file_bytes() <= self.wal_budget {
                waited(self);
                return;
            }
            if Instant::now() >= deadline {
                waited(self);
                self.wal_wait_again_at = Instant::now() + WAL_WAIT;
                self.stats
                    .wal_waits_timed_out
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!("the WAL stayed past its bound for {WAL_WAIT:?}; committing on");
                return;
            }
            std::thread::sleep(WAL_RETRY);
        }
    }

    /// Whether a commit that failed with `SQLITE_FULL` more likely met the file's page
    /// limit (`max_page_count`, telemetry's share of the cap) than a full disk: the file
    /// (free pages included) holds at least the low watermark. Taken for the cap on a disk
    /// that is full too, the answer is the same: the oldest are deleted, and once the file
    /// is below the low watermark a failure is a full disk.
    fn near_page_limit(&self) -> bool {
        let pages: Result<i64, _> = self
            .conn
            .prepare_cached("PRAGMA page_count")
            .and_then(|mut st| st.query_row([], |r| r.get(0)));
        pages.is_ok_and(|p| p.max(0) as u64 * self.page_size >= self.size_low())
    }

    pub(super) fn write_all(&mut self, preps: Vec<Prepared>) -> Result<Committed, rusqlite::Error> {
        // A leader began the transaction itself, without waiting for the lock
        // (`TelemetryWriter::lead`).
        if !std::mem::take(&mut self.begun) {
            self.conn.execute_batch("BEGIN IMMEDIATE")?;
        }
        #[cfg(test)]
        super::inject::hit(&self.db_path, "write");
        let received = now_unix_nano() as i64;
        let mut c = Committed::default();
        for p in preps {
            match p {
                Prepared::Traces(mut t) => {
                    let (stored, dups) = self.apply_traces(&mut t, received)?;
                    c.spans += stored;
                    c.duplicates += dups;
                    c.spent.push(*t);
                }
                Prepared::TraceChunks(chunks) => {
                    for mut t in chunks {
                        let (stored, dups) = self.apply_traces(&mut t, received)?;
                        c.spans += stored;
                        c.duplicates += dups;
                        c.spent.push(t);
                    }
                }
                Prepared::Logs(rows) => {
                    // the body index's newest generation, in the same transaction
                    // (log_body.rs)
                    self.body_index
                        .before_insert(&self.conn, self.next_log_id)?;
                    let mut st = self.conn.prepare_cached(
                        "INSERT INTO logs(id, received_unix_nano, time_unix_nano, trace_id,
                                          span_id, payload, service, severity, runner_id)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    )?;
                    let mut same = self
                        .conn
                        .prepare_cached("SELECT payload = ?2 FROM logs WHERE id = ?1")?;
                    let mut body = self.conn.prepare_cached(self.body_index.insert_sql())?;
                    for r in &rows {
                        let hash = RecentLogs::hash(&r.payload);
                        if let Some(&row) = self.recent_logs.by_hash.get(&hash) {
                            let dup: Option<bool> = same
                                .query_row(params![row, r.payload], |x| x.get(0))
                                .optional()?;
                            if dup == Some(true) {
                                c.log_duplicates += 1;
                                continue;
                            }
                        }
                        let id = self.next_log_id;
                        st.execute(params![
                            id,
                            received,
                            r.time as i64,
                            r.trace_id.as_ref().map(|t| &t[..]),
                            r.span_id.as_ref().map(|s| &s[..]),
                            r.payload,
                            r.service,
                            r.severity,
                            r.runner_id,
                        ])?;
                        self.next_log_id += 1;
                        body.execute(params![id, r.body])?;
                        self.body_index.added(r.payload.len());
                        self.recent_logs.remember(hash, id);
                        c.logs += 1;
                    }
                }
                Prepared::Metrics(rows) => {
                    let mut st = self.conn.prepare_cached(
                        "INSERT INTO metric_points(id, received_unix_nano, name, time_unix_nano,
                                                   payload, service, series, value, count, sum)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                    )?;
                    for r in &rows {
                        st.execute(params![
                            self.next_point_id,
                            received,
                            r.name,
                            r.time as i64,
                            r.payload,
                            r.service,
                            r.series,
                            r.value,
                            r.count.map(|c| c as i64),
                            r.sum,
                        ])?;
                        self.next_point_id += 1;
                    }
                    crate::telemetry::metrics_read::upsert_instruments(&self.conn, &rows)?;
                    c.points += rows.len() as u64;
                }
            }
        }
        self.conn.execute_batch("COMMIT")?;
        Ok(c)
    }

    /// The id of term `k` (key, value) in `terms`, inserted when new: from the cache, the
    /// group's pending terms, or SQL. Takes the batch's own strings, so a cached term costs
    /// a foldhash lookup and no copy (issue 16: two `String`s and SipHash per term of every
    /// export, on the writer thread).
    pub(super) fn term_id(&mut self, k: (String, String)) -> Result<i64, rusqlite::Error> {
        if let Some(id) = self.term_cache.get(&k) {
            return Ok(*id);
        }
        if let Some((_, id)) = self.pending_terms.iter().find(|(p, _)| *p == k) {
            return Ok(*id);
        }
        self.conn
            .prepare_cached("INSERT INTO terms(key, value) VALUES (?1, ?2) ON CONFLICT DO NOTHING")?
            .execute(params![k.0, k.1])?;
        let id: i64 = self
            .conn
            .prepare_cached("SELECT id FROM terms WHERE key = ?1 AND value = ?2")?
            .query_row(params![k.0, k.1], |r| r.get(0))?;
        self.pending_terms.push((k, id));
        Ok(id)
    }
}
