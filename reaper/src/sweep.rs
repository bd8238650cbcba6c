//! The orphan sweep: on start, in the background and in capped batches, settle what the
//! previous run left active (docs/design.md, Orphan sweep; cases C31).
//!
//! A runner row still `running`/`stopping` is re-adopted only when its pid, start time and
//! boot id all still match a live process; a half-done termination is then finished from
//! the action ledger. Otherwise it is marked `orphaned` with an incident
//! (`runner.orphaned`, `orphaned = true`, the reason), its open tool spans get their end
//! written as errors (`error.type = "orphaned"`), and its checkpoints are rolled back (or a
//! commit in flight rolled forward). Nothing is ever signalled on this path. A probe that
//! errors skips its entry (never closes it); errors are collected and the sweep goes on.
//! Checkpoints left active by runners that are no longer active are settled the same way.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use serde::Serialize;
use stallwatch_storage::control::{AttachSpec, RunnerSpec};
use stallwatch_storage::ledger::LedgerWrite;
use stallwatch_storage::model::{now_unix_nano, EventKind, SpanId, TraceId};
use stallwatch_storage::runners::{RunnerRow, RunnerRowState};

use crate::platform;
use crate::service::ReaperHandle;
use crate::spans::{self, EndEvent};
use crate::terminate::Resume;

/// What the sweep did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SweepReport {
    /// Runner ids re-adopted (identity proven).
    pub adopted: Vec<String>,
    /// Runner ids marked orphaned, with the reason.
    pub orphaned: Vec<(String, String)>,
    /// Checkpoints settled (rolled back or forward).
    pub checkpoints: Vec<String>,
    /// Span ends written.
    pub spans_closed: usize,
    /// Errors met; their entries were skipped.
    pub errors: Vec<String>,
}

/// The probe's answer for one row.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// Same pid, same start time, same boot: the same process.
    Alive,
    /// Not the same process, with the reason.
    Gone(String),
}

/// Decides whether a stored runner is still the same live process (pure given the
/// current boot id and the pid's `/proc` stat; `stat` is `Ok(None)` when the pid is gone).
pub fn probe(
    row: &RunnerRow,
    boot_id: &str,
    stat: std::io::Result<Option<platform::ProcStat>>,
) -> std::io::Result<Probe> {
    let (Some(pid), Some(start)) = (row.pid, row.start_time_ticks) else {
        return Ok(Probe::Gone(
            "no pid and start time recorded: identity cannot be proven".into(),
        ));
    };
    if row.boot_id.as_deref() != Some(boot_id) {
        return Ok(Probe::Gone(format!(
            "the machine rebooted since pid {pid} was recorded (boot id changed)"
        )));
    }
    match stat? {
        None => Ok(Probe::Gone(format!("process {pid} is gone"))),
        Some(st) if st.start_time_ticks != start => Ok(Probe::Gone(format!(
            "pid {pid} now belongs to another process (start time {} ticks, recorded {start})",
            st.start_time_ticks
        ))),
        Some(st) if st.state == 'Z' => Ok(Probe::Gone(format!("process {pid} has exited"))),
        Some(_) => Ok(Probe::Alive),
    }
}

fn stat_of(pid: Option<u32>) -> std::io::Result<Option<platform::ProcStat>> {
    let Some(pid) = pid else { return Ok(None) };
    match platform::proc_stat(pid) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Settles a runner id that a `[[runner]]` config entry is about to register, when the
/// previous run left it active. If the old process is proven to be the same one (pid,
/// start time, boot id), it is re-adopted and then stopped with the normal termination
/// sequence: this run spawns and owns its own copy, so two never run side by side and the
/// old one is never left untracked. Otherwise it is marked orphaned, as the sweep would.
/// A probe error is logged and the entry left to the background sweep.
pub(crate) async fn settle_config_runner(h: &ReaperHandle, id: &str) {
    let row = match h.storage().runner_row(id.to_string()).await {
        Ok(Some(row)) => row,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(runner = id, "cannot read the previous run's row: {e}");
            return;
        }
    };
    if !row.state.is_active() || h.is_current(&row.id, row.instance_id.as_deref()) {
        return;
    }
    match probe(&row, h.boot_id(), stat_of(row.pid)) {
        Err(e) => tracing::warn!(runner = id, "probing the previous run's process: {e}"),
        Ok(Probe::Alive) => {
            if let Err(e) = adopt(h, &row).await {
                tracing::warn!(runner = id, "re-adopting the previous run's process: {e}");
                return;
            }
            tracing::info!(
                runner = id,
                pid = row.pid,
                "stopping the previous run's process before spawning the configured runner"
            );
            if let Err(e) = h.delete(id).await {
                tracing::warn!(runner = id, "stopping the previous run's process: {e}");
            }
        }
        Ok(Probe::Gone(reason)) => {
            let mut rep = SweepReport::default();
            orphan(h, &row, &reason, &mut rep).await;
        }
    }
}

/// Runs the sweep to the end.
pub async fn sweep(h: &ReaperHandle) -> SweepReport {
    let mut rep = SweepReport::default();
    let batch = h.config().sweep_batch;
    let mut after = String::new();
    loop {
        let rows = match h.storage().active_runners(after.clone(), batch).await {
            Ok(r) => r,
            Err(e) => {
                rep.errors.push(format!("listing runners: {e}"));
                break;
            }
        };
        let Some(last) = rows.last() else { break };
        after = last.id.clone();
        for row in rows {
            if h.is_current(&row.id, row.instance_id.as_deref()) {
                continue; // registered by this run
            }
            match probe(&row, h.boot_id(), stat_of(row.pid)) {
                Err(e) => rep.errors.push(format!("probing runner {}: {e}", row.id)),
                Ok(Probe::Alive) => match adopt(h, &row).await {
                    Ok(()) => rep.adopted.push(row.id.clone()),
                    Err(e) => rep.errors.push(format!("adopting runner {}: {e}", row.id)),
                },
                Ok(Probe::Gone(reason)) => {
                    orphan(h, &row, &reason, &mut rep).await;
                }
            }
        }
        tokio::task::yield_now().await;
    }
    // Checkpoints of runners that are no longer active, from before this run.
    let live: HashSet<String> = rep.adopted.iter().cloned().collect();
    let mut after = String::new();
    loop {
        let rows = match h
            .storage()
            .active_checkpoints(None, after.clone(), batch)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                rep.errors.push(format!("listing checkpoints: {e}"));
                break;
            }
        };
        let Some(last) = rows.last() else { break };
        after = last.id.clone();
        for cp in rows {
            if cp.created_unix_nano >= h.started_unix_nano() || live.contains(&cp.runner_id) {
                continue;
            }
            let r = match cp.state {
                stallwatch_storage::checkpoints::CheckpointState::Committing => {
                    h.checkpoints().roll_forward(&cp.id).await
                }
                _ => {
                    h.checkpoints()
                        .rollback(&cp.id, "left open by a previous run (orphan sweep)")
                        .await
                }
            };
            match r {
                Ok(_) => rep.checkpoints.push(cp.id),
                Err(e) => rep.errors.push(format!("checkpoint {}: {e}", cp.id)),
            }
        }
    }
    rep
}

async fn adopt(h: &ReaperHandle, row: &RunnerRow) -> Result<(), String> {
    let mut spec: RunnerSpec =
        serde_json::from_value(row.spec.clone()).map_err(|e| format!("stored spec: {e}"))?;
    spec.spawn = None;
    spec.attach = Some(AttachSpec {
        pid: row.pid.unwrap_or(0),
        start_time_ticks: row.start_time_ticks,
    });
    if let Some(s) = &row.heartbeat_socket {
        spec.heartbeat_socket = Some(s.into());
    }
    let resume = if row.state == RunnerRowState::Stopping {
        resume_from_ledger(h, &row.id).await
    } else {
        None
    };
    h.attach_runner(spec, Some((row.clone(), resume)))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The last unfinished termination of a runner, from the action ledger.
async fn resume_from_ledger(h: &ReaperHandle, id: &str) -> Option<Resume> {
    let actions = h
        .storage()
        .runner_actions(id.to_string(), 1000)
        .await
        .ok()?;
    let last = actions
        .iter()
        .rev()
        .find(|a| a.step == "descendants_recorded" || a.step == "sigterm_sent")?;
    let tid = last.termination_id.clone();
    let mine: Vec<_> = actions.iter().filter(|a| a.termination_id == tid).collect();
    if mine.iter().any(|a| a.step == "finished") {
        return None;
    }
    Some(Resume {
        termination_id: tid,
        done: mine
            .iter()
            .filter(|a| a.phase == "done")
            .map(|a| a.step.clone())
            .collect(),
        sigterm_unix_nano: mine
            .iter()
            .find(|a| a.step == "sigterm_sent")
            .map(|a| a.at_unix_nano),
    })
}

async fn orphan(h: &ReaperHandle, row: &RunnerRow, reason: &str, rep: &mut SweepReport) {
    let id = row.id.clone();
    let now = now_unix_nano();
    // Open spans of this runner (the watchdog's durable open-span ledger), by its runner
    // index: not the whole ledger read to keep one runner's rows.
    let spans: Vec<(TraceId, SpanId)> = match h.storage().ledger_runner_open(id.clone(), None).await
    {
        Ok(spans) => spans,
        Err(e) => {
            rep.errors.push(format!("open spans of {id}: {e}"));
            Vec::new()
        }
    };
    let (cps, cp_errors) = h
        .checkpoints()
        .settle_runner(
            Some(&id),
            &format!("runner {id} orphaned: {reason}"),
            h.config().sweep_batch,
        )
        .await;
    rep.errors.extend(cp_errors);
    let mut events = vec![EndEvent {
        name: "orphaned".into(),
        at_unix_nano: now,
    }];
    if !cps.is_empty() {
        events.push(EndEvent {
            name: "rollback".into(),
            at_unix_nano: now_unix_nano(),
        });
    }
    let closed = spans::close_spans(
        h.storage(),
        &id,
        &spans,
        "orphaned",
        &format!("runner {id} orphaned: {reason}"),
        now,
        &events,
    )
    .await;
    if !spans.is_empty() {
        let removes: Vec<LedgerWrite> = spans
            .iter()
            .map(|(t, s)| LedgerWrite::Remove(*t, *s))
            .collect();
        if let Err(e) = h.storage().ledger_apply(std::sync::Arc::new(removes)).await {
            rep.errors.push(format!("open-span ledger of {id}: {e}"));
        }
        // the watchdog reloaded these at start: it must learn of their ends too
        h.notify(stallwatch_storage::control::RunnerChange::SpansEnded {
            id: id.clone(),
            spans: spans.clone(),
        })
        .await;
    }
    rep.spans_closed += closed;
    let evidence = serde_json::json!({
        "orphaned": true, "reason": reason, "pid": row.pid,
        "start_time_ticks": row.start_time_ticks, "boot_id": row.boot_id,
        "previous_state": row.state.as_str(), "checkpoints": cps,
        "spans": spans.iter().map(|(t, s)| [t.to_hex(), s.to_hex()]).collect::<Vec<_>>(),
        "spans_closed": closed,
    });
    if let Err(e) = h
        .storage()
        .set_runner_state(id.clone(), RunnerRowState::Orphaned, evidence.clone(), now)
        .await
    {
        rep.errors.push(format!("marking {id} orphaned: {e}"));
        return;
    }
    h.stats_ref().orphans.fetch_add(1, Ordering::Relaxed);
    h.incident(
        EventKind::RunnerOrphaned,
        &id,
        format!("runner {id} orphaned: {reason}"),
        evidence,
        format!(
            "runner.orphaned:{id}:{}",
            row.instance_id.clone().unwrap_or_default()
        ),
    )
    .await;
    rep.orphaned.push((id, reason.to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: Option<u32>, start: Option<u64>, boot: &str) -> RunnerRow {
        RunnerRow {
            id: "r".into(),
            spawned: true,
            spec: serde_json::json!({}),
            pid,
            start_time_ticks: start,
            boot_id: Some(boot.into()),
            pgid: pid,
            instance_id: None,
            heartbeat_socket: None,
            state: RunnerRowState::Running,
            detail: serde_json::json!({}),
            registered_unix_nano: 0,
            updated_unix_nano: 0,
        }
    }
    fn st(start: u64, state: char) -> platform::ProcStat {
        platform::ProcStat {
            pid: 10,
            state,
            ppid: 1,
            pgid: 10,
            start_time_ticks: start,
            flags: 0,
        }
    }

    #[test]
    fn probe_table() {
        let r = row(Some(10), Some(5), "b1");
        assert_eq!(probe(&r, "b1", Ok(Some(st(5, 'S')))).unwrap(), Probe::Alive);
        assert!(
            matches!(probe(&r, "b2", Ok(Some(st(5, 'S')))).unwrap(), Probe::Gone(m) if m.contains("rebooted"))
        );
        assert!(
            matches!(probe(&r, "b1", Ok(Some(st(6, 'S')))).unwrap(), Probe::Gone(m) if m.contains("another process"))
        );
        assert!(matches!(probe(&r, "b1", Ok(None)).unwrap(), Probe::Gone(m) if m.contains("gone")));
        assert!(matches!(
            probe(&r, "b1", Ok(Some(st(5, 'Z')))).unwrap(),
            Probe::Gone(_)
        ));
        assert!(probe(&r, "b1", Err(std::io::Error::other("EACCES"))).is_err());
        let no_start = row(Some(10), None, "b1");
        assert!(matches!(
            probe(&no_start, "b1", Ok(Some(st(5, 'S')))).unwrap(),
            Probe::Gone(_)
        ));
    }
}
