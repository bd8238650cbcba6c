//! The checkpoint table and the commit intent journal.
//!
//! Each checkpoint has one owner at a time, a state machine kept in this table (issue 17 #2):
//! `open → committing → committed` and `open → rolling_back → rolled_back`. A request
//! claims the checkpoint by moving it out of `open` in one transaction
//! ([`Storage::claim_checkpoint`]); a second request sees the new state and is refused
//! without touching a file. A commit that fails validation goes back to `open`
//! ([`Storage::reopen_checkpoint`]). Its point of no return is the journal
//! ([`Storage::write_checkpoint_journal`]): a `committing` checkpoint without a journal had
//! changed nothing and is reopened after a crash; one with a journal is rolled forward.
//!
//! A checkpoint is a staging folder `{workspace}/.workbench/checkpoints/{id}/` that a tool
//! writes into (docs/design.md, Checkpoints). Committing one first writes, in one `synchronous=FULL`
//! transaction, the list of files it will rename (the intent journal) and the state
//! `committing`; only then are the files renamed into the workspace. After a crash, a
//! checkpoint found `committing` is rolled *forward* from its journal: an entry whose staging
//! file still exists has not been renamed yet (rename is atomic), so finishing is idempotent.
//! Paths are stored as raw bytes (Unix paths need not be UTF-8).

use rusqlite::{params, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::db::Storage;
use crate::error::StorageError;

/// DDL for the checkpoint table and its journal (part of migration 1).
pub(crate) const SCHEMA: &str = "
CREATE TABLE checkpoints (
    id                TEXT PRIMARY KEY,
    runner_id         TEXT NOT NULL,
    workspace         BLOB NOT NULL,
    staging           BLOB NOT NULL,
    state             TEXT NOT NULL,
    detail            TEXT NOT NULL DEFAULT '{}',
    created_unix_nano INTEGER NOT NULL,
    updated_unix_nano INTEGER NOT NULL
);
CREATE INDEX checkpoints_state ON checkpoints(state, id);
CREATE INDEX checkpoints_runner ON checkpoints(runner_id, state);
CREATE TABLE checkpoint_journal (
    checkpoint_id TEXT NOT NULL REFERENCES checkpoints(id),
    seq           INTEGER NOT NULL,
    rel_path      BLOB NOT NULL,
    PRIMARY KEY (checkpoint_id, seq)
);
";

/// Where a checkpoint stands. `Open`, `Committing` and `RollingBack` are *active* (the
/// orphan sweep, the start-up recovery and the automatic rollback on a trip look at them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointState {
    /// Staging folder exists; the tool may write into it.
    Open,
    /// The intent journal is written; renames are in progress (roll forward after a crash).
    Committing,
    /// Every file was renamed into the workspace.
    Committed,
    /// A rollback owns it: the staging folder is being removed.
    RollingBack,
    /// The staging folder was removed; the workspace is unchanged.
    RolledBack,
}

impl CheckpointState {
    /// The stored name.
    pub fn as_str(&self) -> &'static str {
        match self {
            CheckpointState::Open => "open",
            CheckpointState::Committing => "committing",
            CheckpointState::Committed => "committed",
            CheckpointState::RollingBack => "rolling_back",
            CheckpointState::RolledBack => "rolled_back",
        }
    }
    /// Parses a stored name (unknown names read as `RolledBack`, never touched again).
    pub fn parse(s: &str) -> Self {
        match s {
            "open" => CheckpointState::Open,
            "committing" => CheckpointState::Committing,
            "committed" => CheckpointState::Committed,
            "rolling_back" => CheckpointState::RollingBack,
            _ => CheckpointState::RolledBack,
        }
    }
}

/// One checkpoint row.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointRow {
    /// Transaction id (also the staging folder's name).
    pub id: String,
    /// Runner that owns it.
    pub runner_id: String,
    /// Workspace root (absolute path bytes).
    pub workspace: Vec<u8>,
    /// Staging folder (absolute path bytes).
    pub staging: Vec<u8>,
    /// Where it stands.
    pub state: CheckpointState,
    /// JSON object: file count, bytes, reason of a rollback, ...
    pub detail: serde_json::Value,
    /// Created, ns since the Unix epoch.
    pub created_unix_nano: u64,
    /// Last change, ns since the Unix epoch.
    pub updated_unix_nano: u64,
}

const COLUMNS: &str =
    "id, runner_id, workspace, staging, state, detail, created_unix_nano, updated_unix_nano";

fn row_to_checkpoint(r: &Row<'_>) -> rusqlite::Result<CheckpointRow> {
    let state: String = r.get(4)?;
    let detail: String = r.get(5)?;
    Ok(CheckpointRow {
        id: r.get(0)?,
        runner_id: r.get(1)?,
        workspace: r.get(2)?,
        staging: r.get(3)?,
        state: CheckpointState::parse(&state),
        detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
        created_unix_nano: r.get::<_, i64>(6)? as u64,
        updated_unix_nano: r.get::<_, i64>(7)? as u64,
    })
}

impl Storage {
    /// Records a new checkpoint (state `open`).
    pub async fn create_checkpoint(&self, row: CheckpointRow) -> Result<(), StorageError> {
        self.control(move |tx| {
            tx.execute(
                &format!(
                    "INSERT INTO checkpoints ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
                ),
                params![
                    row.id,
                    row.runner_id,
                    row.workspace,
                    row.staging,
                    row.state.as_str(),
                    row.detail.to_string(),
                    row.created_unix_nano as i64,
                    row.updated_unix_nano as i64,
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// One checkpoint.
    pub async fn checkpoint(&self, id: String) -> Result<Option<CheckpointRow>, StorageError> {
        self.read(move |c| {
            Ok(c.query_row(
                &format!("SELECT {COLUMNS} FROM checkpoints WHERE id = ?1"),
                [id],
                row_to_checkpoint,
            )
            .optional()?)
        })
        .await
    }

    /// Writes the intent journal (`rel_paths` in order) and moves the checkpoint from `open`
    /// to `committing`, in one `synchronous=FULL` transaction. Answers false (and writes
    /// nothing) when the checkpoint is not `open`.
    pub async fn begin_checkpoint_commit(
        &self,
        id: String,
        rel_paths: Vec<Vec<u8>>,
        at_unix_nano: u64,
    ) -> Result<bool, StorageError> {
        self.control(move |tx| {
            let n = tx.execute(
                "UPDATE checkpoints SET state = 'committing', updated_unix_nano = ?2
                 WHERE id = ?1 AND state = 'open'",
                params![id, at_unix_nano as i64],
            )?;
            if n == 0 {
                return Ok(false);
            }
            let mut st = tx.prepare_cached(
                "INSERT INTO checkpoint_journal (checkpoint_id, seq, rel_path) VALUES (?1, ?2, ?3)",
            )?;
            for (seq, p) in rel_paths.iter().enumerate() {
                st.execute(params![id, seq as i64, p])?;
            }
            Ok(true)
        })
        .await
    }

    /// The intent journal of a checkpoint, in order.
    pub async fn checkpoint_journal(&self, id: String) -> Result<Vec<Vec<u8>>, StorageError> {
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT rel_path FROM checkpoint_journal WHERE checkpoint_id = ?1 ORDER BY seq",
            )?;
            let rows = st.query_map([id], |r| r.get::<_, Vec<u8>>(0))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Moves a checkpoint to a terminal state (`committed` or `rolled_back`) with `detail`,
    /// only from one of `from`. Answers false when it was not in one of them. Its files are
    /// already settled when this is called, so while storage cannot be written the move is
    /// held in order with the other control records (`held.rs`) and answers true: after a
    /// full disk and a restart the checkpoint is never settled (or rolled back) twice.
    pub async fn finish_checkpoint(
        &self,
        id: String,
        from: Vec<CheckpointState>,
        to: CheckpointState,
        detail: serde_json::Value,
        at_unix_nano: u64,
    ) -> Result<bool, StorageError> {
        self.control_or_hold(crate::held::Held::CheckpointFinish {
            id,
            from,
            to,
            detail,
            at_unix_nano,
        })
        .await
    }

    /// Moves checkpoint `id` from `from` to `to` in one transaction: the claim that makes a
    /// request the checkpoint's only owner. Answers `Ok(Ok(()))` when it moved,
    /// `Ok(Err(Some(state)))` when it stood elsewhere (nothing written), `Ok(Err(None))`
    /// when there is no such checkpoint.
    pub async fn claim_checkpoint(
        &self,
        id: String,
        from: CheckpointState,
        to: CheckpointState,
        at_unix_nano: u64,
    ) -> Result<Result<(), Option<CheckpointState>>, StorageError> {
        self.control(move |tx| {
            let cur: Option<String> = tx
                .query_row("SELECT state FROM checkpoints WHERE id = ?1", [&id], |r| {
                    r.get(0)
                })
                .optional()?;
            match cur.map(|s| CheckpointState::parse(&s)) {
                None => return Ok(Err(None)),
                Some(s) if s != from => return Ok(Err(Some(s))),
                Some(_) => {}
            }
            tx.execute(
                "UPDATE checkpoints SET state = ?2, updated_unix_nano = ?3 WHERE id = ?1",
                params![id, to.as_str(), at_unix_nano as i64],
            )?;
            Ok(Ok(()))
        })
        .await
    }

    /// Writes the intent journal of a `committing` checkpoint that has none yet (`rel_paths`
    /// in order) and stores `detail` (the commit plan: inode of each entry, ...), in one
    /// `synchronous=FULL` transaction: the commit's point of no return. Answers false (and
    /// writes nothing) when it is not `committing` or already has a journal.
    pub async fn write_checkpoint_journal(
        &self,
        id: String,
        rel_paths: Vec<Vec<u8>>,
        detail: serde_json::Value,
        at_unix_nano: u64,
    ) -> Result<bool, StorageError> {
        self.control(move |tx| {
            let has: i64 = tx.query_row(
                "SELECT COUNT(*) FROM checkpoint_journal WHERE checkpoint_id = ?1",
                [&id],
                |r| r.get(0),
            )?;
            let n = tx.execute(
                "UPDATE checkpoints SET detail = ?2, updated_unix_nano = ?3
                 WHERE id = ?1 AND state = 'committing'",
                params![id, detail.to_string(), at_unix_nano as i64],
            )?;
            if n == 0 || has > 0 {
                return Ok(false);
            }
            let mut st = tx.prepare_cached(
                "INSERT INTO checkpoint_journal (checkpoint_id, seq, rel_path) VALUES (?1, ?2, ?3)",
            )?;
            for (seq, p) in rel_paths.iter().enumerate() {
                st.execute(params![id, seq as i64, p])?;
            }
            Ok(true)
        })
        .await
    }

    /// Gives a `committing` checkpoint back to `open`, dropping its journal and plan: its
    /// commit failed validation or was undone, so the workspace is as it was. Answers false
    /// when it was not `committing`.
    pub async fn reopen_checkpoint(
        &self,
        id: String,
        at_unix_nano: u64,
    ) -> Result<bool, StorageError> {
        self.control(move |tx| {
            let n = tx.execute(
                "UPDATE checkpoints SET state = 'open', detail = '{}', updated_unix_nano = ?2
                 WHERE id = ?1 AND state = 'committing'",
                params![id, at_unix_nano as i64],
            )?;
            if n > 0 {
                tx.execute(
                    "DELETE FROM checkpoint_journal WHERE checkpoint_id = ?1",
                    [&id],
                )?;
            }
            Ok(n > 0)
        })
        .await
    }

    /// Active checkpoints (`open`, `committing`, `rolling_back`) with id greater than `after_id`, optionally
    /// of one runner, by id, at most `limit` (capped at 1000).
    pub async fn active_checkpoints(
        &self,
        runner_id: Option<String>,
        after_id: String,
        limit: usize,
    ) -> Result<Vec<CheckpointRow>, StorageError> {
        let limit = limit.clamp(1, 1000) as i64;
        self.read(move |c| {
            let mut st = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM checkpoints
                 WHERE state IN ('open', 'committing', 'rolling_back') AND (?1 IS NULL OR runner_id = ?1)
                   AND id > ?2 ORDER BY id LIMIT ?3"
            ))?;
            let rows = st.query_map(params![runner_id, after_id, limit], row_to_checkpoint)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

/// The terminal move of [`Storage::finish_checkpoint`], inside a control transaction.
pub(crate) fn finish_checkpoint_tx(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    from: &[CheckpointState],
    to: CheckpointState,
    detail: &serde_json::Value,
    at_unix_nano: u64,
) -> Result<bool, StorageError> {
    let cur: Option<String> = tx
        .query_row("SELECT state FROM checkpoints WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .optional()?;
    match cur {
        Some(s) if from.contains(&CheckpointState::parse(&s)) => {}
        _ => return Ok(false),
    }
    tx.execute(
        "UPDATE checkpoints SET state = ?2, detail = ?3, updated_unix_nano = ?4 WHERE id = ?1",
        params![id, to.as_str(), detail.to_string(), at_unix_nano as i64],
    )?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StorageConfig;

    #[tokio::test]
    async fn journal_is_written_once_and_only_from_open() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::open(StorageConfig::new(dir.path().join("db"))).unwrap();
        s.create_checkpoint(CheckpointRow {
            id: "t1".into(),
            runner_id: "r".into(),
            workspace: b"/w".to_vec(),
            staging: b"/w/.workbench/checkpoints/t1".to_vec(),
            state: CheckpointState::Open,
            detail: serde_json::json!({}),
            created_unix_nano: 1,
            updated_unix_nano: 1,
        })
        .await
        .unwrap();
        let paths = vec![b"a.json".to_vec(), b"d/b.csv".to_vec()];
        assert!(s
            .begin_checkpoint_commit("t1".into(), paths.clone(), 2)
            .await
            .unwrap());
        assert!(!s
            .begin_checkpoint_commit("t1".into(), paths.clone(), 3)
            .await
            .unwrap());
        assert_eq!(s.checkpoint_journal("t1".into()).await.unwrap(), paths);
        let active = s
            .active_checkpoints(Some("r".into()), String::new(), 10)
            .await
            .unwrap();
        assert_eq!(active[0].state, CheckpointState::Committing);
        assert!(!s
            .finish_checkpoint(
                "t1".into(),
                vec![CheckpointState::Open],
                CheckpointState::RolledBack,
                serde_json::json!({}),
                4
            )
            .await
            .unwrap());
        assert!(s
            .finish_checkpoint(
                "t1".into(),
                vec![CheckpointState::Committing],
                CheckpointState::Committed,
                serde_json::json!({}),
                4
            )
            .await
            .unwrap());
        assert!(s
            .active_checkpoints(None, String::new(), 10)
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn one_owner_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::open(StorageConfig::new(dir.path().join("db"))).unwrap();
        s.create_checkpoint(CheckpointRow {
            id: "t2".into(),
            runner_id: "r".into(),
            workspace: b"/w".to_vec(),
            staging: b"/w/.workbench/checkpoints/t2".to_vec(),
            state: CheckpointState::Open,
            detail: serde_json::json!({}),
            created_unix_nano: 1,
            updated_unix_nano: 1,
        })
        .await
        .unwrap();
        use CheckpointState::*;
        assert_eq!(
            s.claim_checkpoint("t2".into(), Open, Committing, 2)
                .await
                .unwrap(),
            Ok(())
        );
        // The rollback that comes second sees the commit's claim and writes nothing.
        assert_eq!(
            s.claim_checkpoint("t2".into(), Open, RollingBack, 3)
                .await
                .unwrap(),
            Err(Some(Committing))
        );
        assert_eq!(
            s.claim_checkpoint("nope".into(), Open, RollingBack, 3)
                .await
                .unwrap(),
            Err(None)
        );
        let paths = vec![b"a".to_vec()];
        assert!(s
            .write_checkpoint_journal("t2".into(), paths.clone(), serde_json::json!({"x": 1}), 4)
            .await
            .unwrap());
        assert!(
            !s.write_checkpoint_journal("t2".into(), paths.clone(), serde_json::json!({}), 5)
                .await
                .unwrap(),
            "one journal per commit"
        );
        assert!(s.reopen_checkpoint("t2".into(), 6).await.unwrap());
        assert!(s.checkpoint_journal("t2".into()).await.unwrap().is_empty());
        let row = s.checkpoint("t2".into()).await.unwrap().unwrap();
        assert_eq!(row.state, Open);
        assert_eq!(
            s.claim_checkpoint("t2".into(), Open, RollingBack, 7)
                .await
                .unwrap(),
            Ok(())
        );
        assert_eq!(
            s.active_checkpoints(None, String::new(), 10).await.unwrap()[0].state,
            RollingBack
        );
        assert_eq!(CheckpointState::parse("rolling_back"), RollingBack);
    }
}
