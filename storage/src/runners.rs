//! The runners table and the append-only action ledger of the reaper.
//!
//! A runner row says who a runner is (spawned or attached, pid, start time in clock ticks,
//! boot id, process group) and where it stands (`running`, `stopping`, or a terminal
//! state). The orphan sweep reads the rows still active after a restart (docs/design.md, Orphan
//! sweep). Every termination step is written to `runner_actions` *before* and *after* it
//! happens under an idempotency key, so a restart never repeats a finished kill and finishes
//! a half-done one (docs/design.md, Reaper; issue 4, Termination). Both tables are written with
//! `synchronous=FULL` through `Storage::control`; `runner_actions` refuses UPDATE and
//! DELETE with triggers.

use rusqlite::{params, OptionalExtension, Row, Transaction};
use serde::{Deserialize, Serialize};

use crate::db::Storage;
use crate::error::StorageError;

/// DDL for the runners table and the action ledger (part of migration 1).
pub(crate) const SCHEMA: &str = "
CREATE TABLE runners (
    id                   TEXT PRIMARY KEY,
    kind                 TEXT NOT NULL,
    spec                 TEXT NOT NULL,
    pid                  INTEGER,
    start_time_ticks     INTEGER,
    boot_id              TEXT,
    pgid                 INTEGER,
    instance_id          TEXT,
    heartbeat_socket     TEXT,
    state                TEXT NOT NULL,
    detail               TEXT NOT NULL DEFAULT '{}',
    registered_unix_nano INTEGER NOT NULL,
    updated_unix_nano    INTEGER NOT NULL
);
CREATE INDEX runners_state ON runners(state, id);
CREATE TABLE runner_actions (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    runner_id       TEXT NOT NULL,
    termination_id  TEXT NOT NULL,
    step            TEXT NOT NULL,
    phase           TEXT NOT NULL,
    pid             INTEGER,
    detail          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    at_unix_nano    INTEGER NOT NULL
);
CREATE INDEX runner_actions_runner ON runner_actions(runner_id, id);
CREATE INDEX runner_actions_termination ON runner_actions(termination_id, id);
CREATE TRIGGER runner_actions_no_update BEFORE UPDATE ON runner_actions
BEGIN SELECT RAISE(ABORT, 'runner_actions is append-only'); END;
CREATE TRIGGER runner_actions_no_delete BEFORE DELETE ON runner_actions
BEGIN SELECT RAISE(ABORT, 'runner_actions is append-only'); END;
";

/// Where a runner stands. `Running` and `Stopping` are *active*: the orphan sweep looks at
/// them after a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunnerRowState {
    /// Alive and watched.
    Running,
    /// A termination is in progress.
    Stopping,
    /// Exited by itself with status 0 (or an attached runner that went away).
    Exited,
    /// Exited by itself with an error status or a signal.
    Crashed,
    /// Stopped by the reaper (trip, DELETE or shutdown).
    Terminated,
    /// Found dead or unidentifiable by the orphan sweep.
    Orphaned,
    /// The restart policy gave up.
    GaveUp,
    /// Removed by `DELETE /api/v1/runners/{id}`.
    Removed,
}

impl RunnerRowState {
    /// The stored name (`running`, `stopping`, `exited`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            RunnerRowState::Running => "running",
            RunnerRowState::Stopping => "stopping",
            RunnerRowState::Exited => "exited",
            RunnerRowState::Crashed => "crashed",
            RunnerRowState::Terminated => "terminated",
            RunnerRowState::Orphaned => "orphaned",
            RunnerRowState::GaveUp => "gave_up",
            RunnerRowState::Removed => "removed",
        }
    }
    /// Parses a stored name; unknown names read as `Orphaned` (never re-adopted).
    pub fn parse(s: &str) -> Self {
        match s {
            "running" => RunnerRowState::Running,
            "stopping" => RunnerRowState::Stopping,
            "exited" => RunnerRowState::Exited,
            "crashed" => RunnerRowState::Crashed,
            "terminated" => RunnerRowState::Terminated,
            "gave_up" => RunnerRowState::GaveUp,
            "removed" => RunnerRowState::Removed,
            _ => RunnerRowState::Orphaned,
        }
    }
    /// True for `running` and `stopping`.
    pub fn is_active(&self) -> bool {
        matches!(self, RunnerRowState::Running | RunnerRowState::Stopping)
    }
}

/// One row of the runners table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunnerRow {
    /// Runner id.
    pub id: String,
    /// True when stallwatch spawned it, false when attached.
    pub spawned: bool,
    /// The registration (`RunnerSpec`) as JSON.
    pub spec: serde_json::Value,
    /// Current pid, when known.
    pub pid: Option<u32>,
    /// Field 22 of `/proc/PID/stat` (clock ticks since boot), when known.
    pub start_time_ticks: Option<u64>,
    /// `/proc/sys/kernel/random/boot_id` when the row was written.
    pub boot_id: Option<String>,
    /// Process group id (spawned runners lead their own group).
    pub pgid: Option<u32>,
    /// `service.instance.id` given to this incarnation.
    pub instance_id: Option<String>,
    /// Heartbeat socket path.
    pub heartbeat_socket: Option<String>,
    /// Where it stands.
    pub state: RunnerRowState,
    /// Free-form JSON object: exit status, reason, last stderr lines, ...
    pub detail: serde_json::Value,
    /// First registration, ns since the Unix epoch.
    pub registered_unix_nano: u64,
    /// Last change, ns since the Unix epoch.
    pub updated_unix_nano: u64,
}

/// One step of a termination in the action ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActionRecord {
    /// Runner id.
    pub runner_id: String,
    /// One termination (uuid); all its steps share it.
    pub termination_id: String,
    /// Step name: `descendants_recorded`, `sigterm_sent`, `exited`, `sigkill_sent`, `reaped`,
    /// `survivors`, `finished`, ...
    pub step: String,
    /// `intent` (written before the step) or `done` (written after).
    pub phase: String,
    /// The pid (or process group) the step acted on, when any.
    pub pid: Option<u32>,
    /// JSON object with the step's details.
    pub detail: serde_json::Value,
    /// When, ns since the Unix epoch.
    pub at_unix_nano: u64,
}

impl ActionRecord {
    /// The idempotency key: `{termination_id}:{step}:{phase}`.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}:{}", self.termination_id, self.step, self.phase)
    }
}

const RUNNER_COLUMNS: &str = "id, kind, spec, pid, start_time_ticks, boot_id, pgid, instance_id, heartbeat_socket, state, detail, registered_unix_nano, updated_unix_nano";

fn json_col(s: String) -> serde_json::Value {
    serde_json::from_str(&s).unwrap_or(serde_json::Value::Null)
}

fn row_to_runner(r: &Row<'_>) -> rusqlite::Result<RunnerRow> {
    let kind: String = r.get(1)?;
    let state: String = r.get(9)?;
    Ok(RunnerRow {
        id: r.get(0)?,
        spawned: kind == "spawned",
        spec: json_col(r.get(2)?),
        pid: r.get::<_, Option<i64>>(3)?.map(|p| p as u32),
        start_time_ticks: r.get::<_, Option<i64>>(4)?.map(|t| t as u64),
        boot_id: r.get(5)?,
        pgid: r.get::<_, Option<i64>>(6)?.map(|p| p as u32),
        instance_id: r.get(7)?,
        heartbeat_socket: r.get(8)?,
        state: RunnerRowState::parse(&state),
        detail: json_col(r.get(10)?),
        registered_unix_nano: r.get::<_, i64>(11)? as u64,
        updated_unix_nano: r.get::<_, i64>(12)? as u64,
    })
}

fn row_to_action(r: &Row<'_>) -> rusqlite::Result<ActionRecord> {
    Ok(ActionRecord {
        runner_id: r.get(0)?,
        termination_id: r.get(1)?,
        step: r.get(2)?,
        phase: r.get(3)?,
        pid: r.get::<_, Option<i64>>(4)?.map(|p| p as u32),
        detail: json_col(r.get(5)?),
        at_unix_nano: r.get::<_, i64>(6)? as u64,
    })
}

impl Storage {
    /// Inserts or replaces the row of `row.id` (a registration or a restart).
    pub async fn upsert_runner(&self, row: RunnerRow) -> Result<(), StorageError> {
        self.control_or_hold(crate::held::Held::Runner(row))
            .await
            .map(|_| ())
    }

    /// Sets a runner's state and detail. Answers false when no row has that id (true while
    /// the change is held in memory for a locked, full or failing file).
    pub async fn set_runner_state(
        &self,
        id: String,
        state: RunnerRowState,
        detail: serde_json::Value,
        at_unix_nano: u64,
    ) -> Result<bool, StorageError> {
        // Held like every control record of the watchdog and reaper: a locked file must
        // not delay a termination (docs/design.md, Durability levels).
        self.control_or_hold(crate::held::Held::RunnerState {
            id,
            state,
            detail,
            at_unix_nano,
        })
        .await
    }

    /// One runner row.
    pub async fn runner_row(&self, id: String) -> Result<Option<RunnerRow>, StorageError> {
        self.read(move |c| {
            Ok(c.query_row(
                &format!("SELECT {RUNNER_COLUMNS} FROM runners WHERE id = ?1"),
                [id],
                row_to_runner,
            )
            .optional()?)
        })
        .await
    }

    /// Active rows (`running`, `stopping`) with id greater than `after_id`, by id, at most
    /// `limit` (capped at 1000): one batch of the orphan sweep.
    pub async fn active_runners(
        &self,
        after_id: String,
        limit: usize,
    ) -> Result<Vec<RunnerRow>, StorageError> {
        let limit = limit.clamp(1, 1000) as i64;
        self.read(move |c| {
            let mut st = c.prepare_cached(&format!(
                "SELECT {RUNNER_COLUMNS} FROM runners
                 WHERE state IN ('running', 'stopping') AND id > ?1 ORDER BY id LIMIT ?2"
            ))?;
            let rows = st.query_map(params![after_id, limit], row_to_runner)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Appends a step to the action ledger. Answers false when its idempotency key
    /// (`{termination_id}:{step}:{phase}`) was already recorded (nothing written).
    pub async fn record_action(&self, action: ActionRecord) -> Result<bool, StorageError> {
        self.control_or_hold(crate::held::Held::Action(action))
            .await
    }

    /// Appends many ledger records in one transaction (the ordered shutdown of thousands of
    /// runners writes each phase once, not once per runner). Records already present (same
    /// idempotency key) are skipped. Answers how many were written.
    pub async fn record_actions(&self, actions: Vec<ActionRecord>) -> Result<usize, StorageError> {
        self.control(move |tx| {
            let mut st = tx.prepare_cached(
                "INSERT INTO runner_actions (runner_id, termination_id, step, phase, pid, detail, idempotency_key, at_unix_nano)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT(idempotency_key) DO NOTHING",
            )?;
            let mut n = 0;
            for a in &actions {
                n += st.execute(params![
                    a.runner_id,
                    a.termination_id,
                    a.step,
                    a.phase,
                    a.pid.map(i64::from),
                    a.detail.to_string(),
                    a.idempotency_key(),
                    a.at_unix_nano as i64,
                ])?;
            }
            Ok(n)
        })
        .await
    }

    /// The last `limit` actions of a runner (capped at 1000), oldest first.
    pub async fn runner_actions(
        &self,
        runner_id: String,
        limit: usize,
    ) -> Result<Vec<ActionRecord>, StorageError> {
        let limit = limit.clamp(1, 1000) as i64;
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT runner_id, termination_id, step, phase, pid, detail, at_unix_nano FROM (
                   SELECT * FROM runner_actions WHERE runner_id = ?1 ORDER BY id DESC LIMIT ?2
                 ) ORDER BY id",
            )?;
            let rows = st.query_map(params![runner_id, limit], row_to_action)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

/// The runner row upsert, inside a control transaction.
pub(crate) fn set_runner_state_tx(
    tx: &Transaction<'_>,
    id: &str,
    state: RunnerRowState,
    detail: &serde_json::Value,
    at_unix_nano: u64,
) -> Result<bool, StorageError> {
    let n = tx.execute(
        "UPDATE runners SET state = ?2, detail = ?3, updated_unix_nano = ?4 WHERE id = ?1",
        params![id, state.as_str(), detail.to_string(), at_unix_nano as i64],
    )?;
    Ok(n > 0)
}

pub(crate) fn upsert_runner_tx(tx: &Transaction<'_>, row: &RunnerRow) -> Result<(), StorageError> {
    tx.execute(
        &format!(
            "INSERT OR REPLACE INTO runners ({RUNNER_COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
        ),
        params![
            row.id,
            if row.spawned { "spawned" } else { "attached" },
            row.spec.to_string(),
            row.pid.map(i64::from),
            row.start_time_ticks.map(|t| t as i64),
            row.boot_id,
            row.pgid.map(i64::from),
            row.instance_id,
            row.heartbeat_socket,
            row.state.as_str(),
            row.detail.to_string(),
            row.registered_unix_nano as i64,
            row.updated_unix_nano as i64,
        ],
    )?;
    Ok(())
}

/// The action ledger insert, inside a control transaction; false when its idempotency key
/// was already recorded.
pub(crate) fn insert_action_tx(
    tx: &Transaction<'_>,
    action: &ActionRecord,
) -> Result<bool, StorageError> {
    let n = tx.execute(
        "INSERT INTO runner_actions (runner_id, termination_id, step, phase, pid, detail, idempotency_key, at_unix_nano)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT(idempotency_key) DO NOTHING",
        params![
            action.runner_id,
            action.termination_id,
            action.step,
            action.phase,
            action.pid.map(i64::from),
            action.detail.to_string(),
            action.idempotency_key(),
            action.at_unix_nano as i64,
        ],
    )?;
    Ok(n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StorageConfig;

    fn row(id: &str, state: RunnerRowState) -> RunnerRow {
        RunnerRow {
            id: id.into(),
            spawned: true,
            spec: serde_json::json!({"id": id}),
            pid: Some(42),
            start_time_ticks: Some(7),
            boot_id: Some("b".into()),
            pgid: Some(42),
            instance_id: None,
            heartbeat_socket: None,
            state,
            detail: serde_json::json!({}),
            registered_unix_nano: 1,
            updated_unix_nano: 1,
        }
    }

    #[tokio::test]
    async fn active_rows_and_append_only_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::open(StorageConfig::new(dir.path().join("db"))).unwrap();
        s.upsert_runner(row("a", RunnerRowState::Running))
            .await
            .unwrap();
        s.upsert_runner(row("b", RunnerRowState::Exited))
            .await
            .unwrap();
        s.upsert_runner(row("c", RunnerRowState::Stopping))
            .await
            .unwrap();
        let active = s.active_runners(String::new(), 10).await.unwrap();
        let ids: Vec<_> = active.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a", "c"]);
        let a = ActionRecord {
            runner_id: "a".into(),
            termination_id: "t1".into(),
            step: "sigterm_sent".into(),
            phase: "intent".into(),
            pid: Some(42),
            detail: serde_json::json!({}),
            at_unix_nano: 5,
        };
        assert!(s.record_action(a.clone()).await.unwrap());
        assert!(!s.record_action(a).await.unwrap(), "same key stored once");
        let upd = s
            .control(|tx| Ok(tx.execute("UPDATE runner_actions SET step = 'x'", [])?))
            .await;
        assert!(upd.is_err(), "ledger must refuse updates");
        assert_eq!(s.runner_actions("a".into(), 10).await.unwrap().len(), 1);
    }
}
