//! Stopping runners: one runner (trip, DELETE, resumed termination) under its lock, what
//! follows a stop (checkpoint rollback, span ends, `runner.terminated`, row, watchdog notice),
//! and every spawned runner at ordered shutdown, together (issue 17 #10). docs/design.md:
//! Reaper, Termination.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stallwatch_storage::control::{
    RunnerChange, RunnerDeleted, RunnerError, RunnerLifecycle, Trip,
};
use stallwatch_storage::keys::{self, StopCause};
use stallwatch_storage::model::{now_unix_nano, EventKind, SpanId, TraceId};
use stallwatch_storage::runners::{ActionRecord, RunnerRowState};

use super::restart::RestartPlan;
use super::{Entry, ReaperHandle, OWNED_PIDS};

/// At most this many runners go through their after-stop work (checkpoint rollback, span
/// ends, `runner.terminated`, row) at once at shutdown: enough to fill the storage
/// writer's group commits, few enough that thousands of runners never queue thousands
/// of transactions at once ahead of everything else.
const AFTER_STOP_PARALLEL: usize = 64;
/// How long [`ReaperHandle::kill_all_registered`] waits for the lock of a runner whose
/// hurried termination is running: SIGKILL follows within a poll (10 ms); the wait for the
/// processes' exit after it is what takes longer.
pub const HURRIED_LOCK_WAIT: Duration = Duration::from_secs(3);
use crate::ends::EndCause;
use crate::platform::{self};
use crate::spans::EndEvent;
use crate::terminate::{self, Resume, Target, TerminationReport};

impl ReaperHandle {
    /// Stops every spawned runner at shutdown, including spawned runners of an earlier run
    /// re-adopted by the orphan sweep; attached runners are left alone. All are stopped
    /// together (`shutdown::stop_all`: SIGTERM to all, one grace period, SIGKILL
    /// to survivors), so this takes about one grace period whatever the count (issue 17
    /// #10). A runner whose lock a DELETE or trip holds finishes its own sequence
    /// concurrently. Answers the reports. No restarts happen afterwards.
    pub async fn stop_spawned_runners(&self) -> Vec<TerminationReport> {
        self.inner.stopping_all.store(true, Ordering::SeqCst);
        let entries: Vec<Arc<Entry>> = self
            .entries()
            .into_iter()
            .filter(|e| e.stop_at_shutdown)
            .collect();
        for e in &entries {
            e.stop_begun.store(true, Ordering::SeqCst);
        }
        let permits = Arc::new(tokio::sync::Semaphore::new(AFTER_STOP_PARALLEL));
        let mut others = tokio::task::JoinSet::new();
        let mut held = Vec::new();
        for e in &entries {
            match e.proc.try_lock() {
                Ok(g) if g.finished => {}
                Ok(g) if g.pidfd.is_some() => held.push((e, g)),
                _ => {
                    let (h, e, permits) = (self.clone(), e.clone(), permits.clone());
                    others.spawn(async move {
                        let r = h.stop(&e, &StopCause::Shutdown, None).await;
                        let _permit = permits.acquire_owned().await;
                        if let Some(r) = &r {
                            h.after_stop(&e, r, &StopCause::Shutdown, &[], None).await;
                        }
                        r
                    });
                }
            }
        }
        // Stopping, as one stopped alone is: a runner that exits on its SIGTERM is not then
        // tripped for the heartbeat it took with it (a false breaker.opened at every
        // shutdown).
        for (e, _) in &held {
            self.lifecycle(&e.id, RunnerLifecycle::Stopping).await;
        }
        let owned: Vec<bool> = held
            .iter()
            .map(|(e, _)| e.spawned && self.owns(e.pid))
            .collect();
        let members: Vec<crate::shutdown::Member<'_>> = held
            .iter()
            .zip(&owned)
            .filter_map(|((e, g), own)| {
                Some(crate::shutdown::Member {
                    runner_id: &e.id,
                    pid: e.pid,
                    pidfd: g.pidfd.as_ref()?,
                    mark: e.mark(),
                    own_child_group: *own,
                })
            })
            .collect();
        let reports = crate::shutdown::stop_all(
            &self.inner.storage,
            &self.inner.stats,
            self.inner.config.grace,
            &members,
            &StopCause::Shutdown,
            Some(&self.inner.hurry),
        )
        .await;
        drop(members);
        let mut after = tokio::task::JoinSet::new();
        let mut out = Vec::new();
        for ((e, mut g), r) in held.into_iter().zip(reports) {
            g.stopping = true;
            g.finished = true;
            g.last_report = Some(r.clone());
            e.alive.store(false, Ordering::SeqCst);
            if let Ok(mut o) = OWNED_PIDS.lock() {
                o.remove(&e.pid);
            }
            drop(g);
            let (h, e, r2) = (self.clone(), e.clone(), r.clone());
            let permits = permits.clone();
            after.spawn(async move {
                let _permit = permits.acquire_owned().await;
                h.wait_readers(&e).await;
                h.after_stop(&e, &r2, &StopCause::Shutdown, &[], None).await;
            });
            out.push(r);
        }
        while let Some(r) = others.join_next().await {
            if let Ok(Some(r)) = r {
                out.push(r);
            }
        }
        while after.join_next().await.is_some() {}
        out
    }

    /// Past the shutdown deadline, or at a second stop signal: SIGKILL every spawned runner
    /// still registered (its group while it is our unreaped child, else through its pidfd)
    /// and reap our own, so stallwatch never exits with a spawned runner alive (issue 17
    /// #10). A runner whose termination is running (its lock held) is left to it: the
    /// sequence is hurried ([`ReaperHandle::hurry`], which this calls) and sends its own
    /// SIGKILL with its proofs; its lock is waited for up to `HURRIED_LOCK_WAIT` (3 s). Signalling
    /// its group from here, without the lock, hit an unrelated group that had reused the
    /// pid once the sequence had reaped the leader. Answers how many were signalled here.
    pub async fn kill_all_registered(&self) -> usize {
        self.hurry();
        let mut n = 0;
        let mut reap = Vec::new();
        for e in self.entries().into_iter().filter(|e| e.stop_at_shutdown) {
            let mut g = match e.proc.try_lock() {
                Ok(g) => g,
                Err(_) => match tokio::time::timeout(HURRIED_LOCK_WAIT, e.proc.lock()).await {
                    Ok(g) => g,
                    Err(_) => {
                        tracing::warn!(
                            runner = %e.id,
                            "its hurried termination still runs; not signalled from here"
                        );
                        continue;
                    }
                },
            };
            // Read under the lock: a holder that reaped the leader took the pid out of ours.
            let own = e.spawned && self.owns(e.pid);
            let Some(fd) = g.pidfd.as_ref() else { continue };
            if g.finished || platform::pidfd_exited(platform::borrow(fd)) {
                continue;
            }
            // Its exit is this SIGKILL, not a crash: the exit monitor, which waits for this
            // lock, leaves it to us (a half-done stop is settled by the next start's sweep).
            g.stopping = true;
            let Some(fd) = g.pidfd.as_ref() else { continue };
            let target = if own {
                platform::SignalTarget::Group { pgid: e.pid }
            } else {
                platform::SignalTarget::Pidfd {
                    fd: platform::borrow(fd),
                    pid: e.pid,
                }
            };
            n += usize::from(platform::send_signal(target, platform::Sig::Kill).is_ok());
            if own {
                reap.push(e.pid);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !reap.is_empty() && Instant::now() < deadline {
            // Ok(None): not exited yet. Reaped now, or already (ECHILD: the exit monitor of a
            // runner whose stop had begun reaped it): done, no need to wait out the 2 s.
            reap.retain(|pid| matches!(platform::reap_child(*pid), Ok(None)));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        n
    }
}

impl ReaperHandle {
    /// Runs the termination sequence on `entry` (holding its lock), unless it is already
    /// finished. Answers `None` when there was nothing to stop.
    pub(super) async fn stop(
        &self,
        entry: &Arc<Entry>,
        cause: &StopCause,
        resume: Option<Resume>,
    ) -> Option<TerminationReport> {
        entry.stop_begun.store(true, Ordering::SeqCst);
        let mut st = entry.proc.lock().await;
        if st.finished {
            return None;
        }
        st.stopping = true;
        self.lifecycle(&entry.id, RunnerLifecycle::Stopping).await;
        let _ = self
            .inner
            .storage
            .set_runner_state(
                entry.id.clone(),
                RunnerRowState::Stopping,
                serde_json::json!({"cause": cause}),
                now_unix_nano(),
            )
            .await;
        let own_child = entry.spawned && self.owns(entry.pid);
        let spare = self.other_leaders(&entry.id);
        let report = terminate::terminate(
            &self.inner.storage,
            &self.inner.stats,
            self.inner.config.grace,
            Target {
                runner_id: &entry.id,
                mark: entry.mark(),
                pid: entry.pid,
                pidfd: st.pidfd.as_ref(),
                own_child_group: own_child,
                hurry: Some(&self.inner.hurry),
                spare: &spare,
            },
            cause,
            resume,
        )
        .await;
        if report.ended_by == "not_signalled" {
            st.stopping = false;
            entry.stop_begun.store(false, Ordering::SeqCst);
            st.last_report = Some(report.clone());
            return Some(report);
        }
        st.finished = true;
        st.last_report = Some(report.clone());
        entry.alive.store(false, Ordering::SeqCst);
        if let Ok(mut o) = OWNED_PIDS.lock() {
            o.remove(&entry.pid);
        }
        drop(st);
        self.wait_readers(entry).await;
        Some(report)
    }
}

impl ReaperHandle {
    /// After a stop: roll back the runner's open checkpoints, write the missing span ends,
    /// record `runner.terminated`, update the row, tell the watchdog.
    pub(super) async fn after_stop(
        &self,
        entry: &Arc<Entry>,
        report: &TerminationReport,
        cause: &StopCause,
        open_spans: &[(TraceId, SpanId)],
        gave_up: Option<(String, serde_json::Value)>,
    ) {
        let id = entry.id.clone();
        let batch = self.inner.config.sweep_batch;
        // A runner that was never signalled (attached without a start time) still runs:
        // its staged files and its open spans are still its own, so nothing of it is ended
        // (its staging folder was deleted under the live process, its spans written as
        // ended while it went on).
        let signalled = report.ended_by != "not_signalled";
        let (rolled, errors) = if signalled {
            self.inner
                .checkpoints
                .settle_stopped(&id, &cause.to_string(), batch)
                .await
        } else {
            (Vec::new(), Vec::new())
        };
        let rollback_at = now_unix_nano();
        let mut events = vec![EndEvent {
            name: "SIGTERM".into(),
            at_unix_nano: report.sigterm_unix_nano,
        }];
        if let Some(k) = report.sigkill_unix_nano {
            events.push(EndEvent {
                name: "SIGKILL".into(),
                at_unix_nano: k,
            });
        }
        if !rolled.is_empty() {
            events.push(EndEvent {
                name: "rollback".into(),
                at_unix_nano: rollback_at,
            });
        }
        let end_cause = if cause.removes_runner() {
            EndCause::Killed
        } else {
            EndCause::Timeout
        };
        let why = format!("runner {id} stopped by stallwatch ({cause})");
        let exit = report.exit.as_ref();
        let at = report.sigterm_unix_nano;
        let closed = if signalled {
            self.end_runner_spans(
                &id,
                Some(entry.pid),
                end_cause,
                &why,
                exit,
                at,
                events,
                open_spans,
            )
            .await
        } else {
            0
        };
        if signalled && !open_spans.is_empty() {
            let _ = self
                .inner
                .storage
                .record_action(ActionRecord {
                    runner_id: id.clone(),
                    termination_id: report.termination_id.clone(),
                    step: "spans_closed".into(),
                    phase: "done".into(),
                    pid: None,
                    detail: serde_json::json!({"written": closed}),
                    at_unix_nano: now_unix_nano(),
                })
                .await;
        }
        let forensics = self.inner.forensics.take(&id).filter(|_| cause.is_trip());
        let state = if cause.removes_runner() {
            RunnerRowState::Removed
        } else if report.ended_by == "not_signalled" {
            // Watched, never signalled (no proof of identity): it may still be running.
            RunnerRowState::Running
        } else {
            RunnerRowState::Terminated
        };
        let mut evidence = serde_json::json!({
            "cause": cause, "report": report, "checkpoints_rolled_back": rolled,
            "checkpoint_errors": errors, "spans_closed": closed,
            "last_stderr": entry.tail.lines("stderr"),
        });
        if let (Some(fx), Some(obj)) = (&forensics, evidence.as_object_mut()) {
            obj.extend(fx.fields.clone());
        }
        if let (Some((_, fields)), Some(obj)) = (&gave_up, evidence.as_object_mut()) {
            if let Some(add) = fields.as_object() {
                obj.extend(add.clone());
            }
        }
        let _ = self
            .inner
            .storage
            .set_runner_state(id.clone(), state, evidence.clone(), now_unix_nano())
            .await;
        if report.ended_by != "not_signalled" {
            self.incident(
                EventKind::RunnerTerminated,
                &id,
                format!(
                    "runner {id} stopped ({cause}): ended by {} after {} ms{}{}{}{}",
                    report.ended_by,
                    report.duration_ms,
                    if report.survivors.is_empty() {
                        String::new()
                    } else {
                        format!(", {} survivors", report.survivors.len())
                    },
                    unproven_note(&report.unproven),
                    forensics
                        .map(|f| format!("; why: {}", f.reason_line))
                        .unwrap_or_default(),
                    gave_up
                        .as_ref()
                        .map(|(tail, _)| tail.as_str())
                        .unwrap_or_default()
                ),
                evidence,
                keys::runner_terminated(&id, &report.termination_id),
            )
            .await;
        }
        if report.ended_by == "not_signalled" && !cause.removes_runner() {
            // still running, never signalled: watched on, its breaker recovers as usual
            self.lifecycle(&id, RunnerLifecycle::Detached).await;
            return;
        }
        self.notify(RunnerChange::Gone {
            id,
            removed: cause.removes_runner(),
            pid: Some(entry.pid),
        })
        .await;
        entry.settle();
    }

    #[tracing::instrument(name = "reaper.trip", level = "info", skip_all, fields(runner_id = %trip.runner_id, verdict = %trip.verdict))]
    pub(super) async fn on_trip(&self, trip: Trip) {
        let Some(entry) = self.entry(&trip.runner_id) else {
            tracing::warn!(runner = %trip.runner_id, "trip for an unknown runner ignored");
            return;
        };
        // From now on its checkpoints are for rolling back, not committing.
        entry.stop_begun.store(true, Ordering::SeqCst);
        let _ = self
            .inner
            .storage
            .record_action(ActionRecord {
                runner_id: entry.id.clone(),
                termination_id: keys::trip_termination_id(&entry.instance_id, trip.at_unix_nano),
                step: "open_spans".into(),
                phase: "done".into(),
                pid: Some(entry.pid),
                detail: serde_json::json!({
                    "verdict": trip.verdict, "reason": trip.reason, "incident_id": trip.incident_id,
                    "spans": trip.open_spans.iter().map(|(t, s)| [t.to_hex(), s.to_hex()]).collect::<Vec<_>>(),
                }),
                at_unix_nano: now_unix_nano(),
            })
            .await;
        let cause = StopCause::trip(trip.verdict.as_str());
        let fx = self.inner.forensics.enabled();
        if let Some(subject) = self.forensics_subject(&entry.id).await.filter(|_| fx) {
            self.inner
                .forensics
                .before_kill(&self.inner.storage, &trip, subject)
                .await;
        }
        let stopped = self.stop(&entry, &cause, None).await;
        if stopped
            .as_ref()
            .is_none_or(|r| r.ended_by == "not_signalled")
        {
            self.inner.forensics.take(&entry.id);
        }
        match stopped {
            Some(report) => {
                // Decided before `runner.terminated` is recorded, so a give-up is said in
                // it (a second incident, a `runner.crashed`, misnamed a deliberate stop).
                let plan = if report.ended_by != "not_signalled" {
                    self.plan_restart(&entry)
                } else {
                    RestartPlan::None
                };
                let gave_up = (plan == RestartPlan::GiveUp).then(|| self.gave_up_note());
                self.after_stop(&entry, &report, &cause, &trip.open_spans, gave_up)
                    .await;
                self.apply_restart(
                    &entry,
                    plan,
                    &format!("was stopped by a trip ({})", trip.verdict),
                )
                .await;
            }
            None => self.settle_tripped_exit(&entry, &trip).await,
        }
    }

    /// A tripped runner that exited on its own before the trip could stop it (its exit is
    /// recorded as `runner.exited` / `runner.crashed`): its open checkpoints are still
    /// rolled back, as for a stopped one. From the trip on, their commits were refused as
    /// being rolled back; left open, they were refused forever and their staging kept.
    /// Not when the runner was restarted or registered again meanwhile: its id's open
    /// checkpoints are then the new instance's too, and that one was not tripped.
    pub(super) async fn settle_tripped_exit(&self, entry: &Arc<Entry>, trip: &Trip) {
        let id = &entry.id;
        if !self.is_current(id, Some(&entry.instance_id)) {
            return;
        }
        let (rolled, errors) = self
            .inner
            .checkpoints
            .settle_runner(
                Some(id),
                &format!(
                    "runner {id} tripped ({}) and exited before it was stopped",
                    trip.verdict
                ),
                self.inner.config.sweep_batch,
            )
            .await;
        if rolled.is_empty() && errors.is_empty() {
            return;
        }
        let _ = self
            .inner
            .storage
            .record_action(ActionRecord {
                runner_id: id.clone(),
                termination_id: keys::trip_termination_id(&entry.instance_id, trip.at_unix_nano),
                step: "checkpoints_rolled_back".into(),
                phase: "done".into(),
                pid: Some(entry.pid),
                detail: serde_json::json!({
                    "why": "exited before it was stopped",
                    "checkpoints_rolled_back": rolled, "checkpoint_errors": errors,
                }),
                at_unix_nano: now_unix_nano(),
            })
            .await;
    }

    pub(crate) async fn delete(&self, id: &str) -> Result<RunnerDeleted, RunnerError> {
        let Some(entry) = self.entry(id) else {
            return Err(RunnerError::NotFound(format!("no runner {id}")));
        };
        let report = self.stop(&entry, &StopCause::Delete, None).await;
        if let Some(r) = &report {
            self.after_stop(&entry, r, &StopCause::Delete, &[], None)
                .await;
        } else {
            let _ = self
                .inner
                .storage
                .set_runner_state(
                    id.to_string(),
                    RunnerRowState::Removed,
                    serde_json::json!({"cause": StopCause::Delete}),
                    now_unix_nano(),
                )
                .await;
            self.notify(RunnerChange::Gone {
                id: id.to_string(),
                removed: true,
                pid: Some(entry.pid),
            })
            .await;
        }
        if let Ok(mut m) = self.inner.runners.lock() {
            if m.get(id).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                m.remove(id);
            }
        }
        Ok(deleted_answer(id, report.as_ref()))
    }
}

/// The DELETE answer: the termination report travels as its serialized JSON (its types are
/// the termination module's own).
fn deleted_answer(id: &str, report: Option<&TerminationReport>) -> RunnerDeleted {
    fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
        serde_json::to_value(v).unwrap_or_default()
    }
    RunnerDeleted {
        id: id.to_string(),
        removed: true,
        termination: report.map(json),
        steps: report
            .map(|r| r.steps.iter().map(json).collect())
            .unwrap_or_default(),
        survivors: report
            .map(|r| r.survivors.iter().map(json).collect())
            .unwrap_or_default(),
    }
}

/// `; N process(es) below it without its instance mark left alone (pid a, b)`, or nothing:
/// what a termination found but could not prove was the runner's (docs/design.md, Reaper).
pub(crate) fn unproven_note(unproven: &[crate::terminate::ProcRef]) -> String {
    processes_note(
        unproven.iter().map(|p| p.pid),
        "below it without its instance mark left alone",
    )
}

/// `; N process(es) <what> (pid a, b)` for an incident's reason, or nothing when `pids`
/// is empty.
pub(crate) fn processes_note(pids: impl Iterator<Item = u32>, what: &str) -> String {
    let pids: Vec<String> = pids.map(|p| p.to_string()).collect();
    if pids.is_empty() {
        return String::new();
    }
    format!(
        "; {} process{} {what} (pid {})",
        pids.len(),
        if pids.len() == 1 { "" } else { "es" },
        pids.join(", ")
    )
}
