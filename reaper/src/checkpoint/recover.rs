//! Settling checkpoints that nobody will finish: on start, every journaled commit is rolled
//! forward and every other active checkpoint reopened ([`Checkpoints::recover`]); when a
//! runner stops, its open checkpoints are rolled back ([`Checkpoints::settle_runner`]).
//! Both walk the active rows page by page.

use super::*;

/// One platform's steps of a roll-forward for one journal entry; the loop and its rules
/// are [`roll_forward_entries`], shared by both arms of the seam.
pub(super) trait EntryMover {
    /// Makes the destination folder of `f` ready (created when missing) and says whether
    /// the destination already holds the validated file.
    fn landed(&mut self, f: &StagedFile) -> Result<bool, CheckpointError>;
    /// Moves `f` into the workspace if its staged name still holds the validated file;
    /// `Ok(false)` when it does not.
    fn move_staged(&mut self, f: &StagedFile) -> Result<bool, CheckpointError>;
}

/// The roll-forward rules (module docs of `commit.rs`): an entry whose destination holds
/// the validated file is done; one whose staged name holds it is moved; anything else is
/// skipped and reported as `"{path}: {why}"`. A journal entry that is not plain names, or
/// whose way into staging is a link, ends it with [`CheckpointError::PathEscape`].
/// Answers the files moved now and the entries skipped.
pub(super) fn roll_forward_entries(
    mover: &mut impl EntryMover,
    entries: &[StagedFile],
) -> Result<(usize, Vec<String>), CheckpointError> {
    let (mut moved, mut skipped) = (0, Vec::new());
    for f in entries {
        check_relative(&f.rel)?;
        let skip = |why: &dyn std::fmt::Display| format!("{}: {why}", f.rel.display());
        match mover.landed(f) {
            Ok(true) => continue, // moved before the crash
            Ok(false) => {}
            Err(e) => {
                skipped.push(skip(&e));
                continue;
            }
        }
        match mover.move_staged(f) {
            Ok(true) => moved += 1,
            Ok(false) => skipped.push(skip(
                &"neither the staged file nor the destination holds the validated file",
            )),
            Err(e @ CheckpointError::PathEscape { .. }) => return Err(e),
            Err(e) => skipped.push(skip(&e)),
        }
    }
    Ok((moved, skipped))
}

impl Checkpoints {
    /// Settles a `committing` checkpoint after a crash: with a journal it is rolled
    /// forward; without one (its commit had changed nothing) it is reopened.
    ///
    /// Errors: [`CheckpointError::NotOpen`] when it is not `committing`,
    /// [`CheckpointError::PathEscape`], [`CheckpointError::Io`].
    pub async fn roll_forward(&self, id: &str) -> Result<Settled, CheckpointError> {
        let row = self.row(id).await?;
        if row.state != CheckpointState::Committing {
            return Err(CheckpointError::NotOpen {
                id: id.to_string(),
                state: row.state.as_str(),
            });
        }
        let journal = self
            .storage
            .checkpoint_journal(id.to_string())
            .await
            .map_err(CheckpointError::storage)?;
        let inodes = row.detail.get("inodes").and_then(|v| v.as_array()).cloned();
        let Some(inodes) = inodes else {
            self.reopen(id).await;
            return Ok(Settled {
                id: id.to_string(),
                state: "open",
                files: None,
            });
        };
        let entries: Vec<StagedFile> = journal
            .iter()
            .zip(inodes.iter())
            .map(|(p, i)| StagedFile {
                rel: path_of(p),
                dev: i.get(0).and_then(|v| v.as_u64()).unwrap_or(0),
                ino: i.get(1).and_then(|v| v.as_u64()).unwrap_or(0),
                size: i.get(2).and_then(|v| v.as_u64()).unwrap_or(0),
                mtime_ns: i.get(3).and_then(|v| v.as_i64()).unwrap_or(0),
            })
            .collect();
        let n = entries.len();
        let (ws, cid, sp) = (
            path_of(&row.workspace),
            row.id.clone(),
            path_of(&row.staging),
        );
        let (_, skipped) = blocking(move || {
            let root = fs::open_root(&ws)?;
            let staging = fs::open_staging(&root, &ws, &cid)?;
            let r = fs::roll_forward(&root, &ws, staging.as_ref(), &sp, &entries)?;
            drop(staging);
            fs::remove_staging(&root, &ws, &cid)?;
            Ok(r)
        })
        .await?;
        if !skipped.is_empty() {
            tracing::warn!(checkpoint = id, ?skipped, "roll-forward skipped entries");
        }
        self.finish_commit(&row, n - skipped.len().min(n), skipped)
            .await
    }

    /// Start-up recovery, run before any runner is registered or swept (issue 17 #1):
    /// every `committing` checkpoint is rolled forward from its journal (or reopened when
    /// it had not reached it) and every `rolling_back` one finished, whether or not its
    /// runner lives. Answers the ids settled and the errors met.
    pub async fn recover(&self, batch: usize) -> (Vec<String>, Vec<String>) {
        self.for_each_active(None, batch, Settle::Recover).await
    }

    /// [`recover`](Self::recover) at a reaper's start, before any runner is registered,
    /// with one log line for what it settled (both reapers call it).
    pub async fn recover_at_start(&self, batch: usize) {
        let (recovered, errors) = self.recover(batch).await;
        if !recovered.is_empty() || !errors.is_empty() {
            tracing::info!(
                ?recovered,
                ?errors,
                "checkpoints interrupted by a crash settled"
            );
        }
    }

    /// Rolls back the open checkpoints of runner `id` after the reaper stopped it for
    /// `cause` (trip, `DELETE`, shutdown), on every platform. Answers as
    /// [`settle_runner`](Self::settle_runner).
    pub async fn settle_stopped(
        &self,
        id: &str,
        cause: &str,
        batch: usize,
    ) -> (Vec<String>, Vec<String>) {
        self.settle_runner(Some(id), &format!("runner {id} stopped ({cause})"), batch)
            .await
    }

    /// Settles every active checkpoint of `runner_id` (or of every runner): `open` ones are
    /// rolled back, `committing` ones rolled forward. Answers the ids handled and the
    /// errors met (the loop goes on after an error).
    pub async fn settle_runner(
        &self,
        runner_id: Option<&str>,
        reason: &str,
        batch: usize,
    ) -> (Vec<String>, Vec<String>) {
        self.for_each_active(runner_id, batch, Settle::Runner { reason })
            .await
    }

    /// Pages through the active checkpoints of `runner_id` (or of every runner), `batch`
    /// rows at a time in id order, and settles each as `how` says. Answers the ids settled
    /// and the errors met: a failed row is named and the loop goes on; a failed listing
    /// ends it. (An enum rather than a closure: the futures stay `Send` for the reaper's
    /// spawned tasks.)
    pub(super) async fn for_each_active(
        &self,
        runner_id: Option<&str>,
        batch: usize,
        how: Settle<'_>,
    ) -> (Vec<String>, Vec<String>) {
        let (mut done, mut errors) = (Vec::new(), Vec::new());
        let mut after = String::new();
        loop {
            let rows = match self
                .storage
                .active_checkpoints(runner_id.map(str::to_string), after.clone(), batch)
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    errors.push(format!("listing checkpoints: {e}"));
                    break;
                }
            };
            let Some(last) = rows.last() else { break };
            after = last.id.clone();
            for row in rows {
                let r = match (how, row.state) {
                    (_, CheckpointState::Committing) => self.roll_forward(&row.id).await,
                    (Settle::Recover, CheckpointState::RollingBack) => {
                        self.finish_rollback(&row, "interrupted by a restart").await
                    }
                    (Settle::Recover, _) => continue,
                    (Settle::Runner { reason }, _) => self.rollback(&row.id, reason).await,
                };
                match r {
                    Ok(_) => done.push(row.id),
                    Err(e) => errors.push(format!("checkpoint {}: {e}", row.id)),
                }
            }
        }
        (done, errors)
    }
}
