//! Exit monitors: a spawned runner's pidfd becoming readable (its group's leftovers ended,
//! the leader reaped, `runner.exited` / `runner.crashed`, maybe a restart), and an attached
//! runner seen gone. docs/design.md: Runners, Reaper.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use stallwatch_storage::control::{RunnerChange, RunnerLifecycle};
use stallwatch_storage::keys::{self, StopCause};
use stallwatch_storage::model::{now_unix_nano, EventKind};
use stallwatch_storage::runners::RunnerRowState;
use tokio::task::JoinHandle;

use super::restart::RestartPlan;
use super::{Entry, ReaperHandle, OWNED_PIDS};
use crate::ends::EndCause;
use crate::platform::{self, ExitInfo};
use crate::terminate::{self, Target};

impl ReaperHandle {
    pub(super) fn start_monitor(&self, entry: Arc<Entry>) {
        let h = self.clone();
        stallwatch_vocabulary::task::spawn_boxed(async move {
            let fd = {
                let st = entry.proc.lock().await;
                st.pidfd.as_ref().and_then(|f| f.try_clone().ok())
            };
            let Some(fd) = fd else { return };
            let Ok(afd) = platform::async_pidfd(fd) else {
                return;
            };
            tokio::select! {
                _ = afd.readable() => {}
                _ = h.inner.shutdown.cancelled() => return,
            }
            h.on_spawned_exit(entry).await;
        });
    }

    pub(super) fn start_attached_monitor(&self, entry: Arc<Entry>, fd: OwnedFd) {
        let h = self.clone();
        stallwatch_vocabulary::task::spawn_boxed(async move {
            let Ok(afd) = platform::async_pidfd(fd) else {
                return;
            };
            tokio::select! {
                _ = afd.readable() => {}
                _ = h.inner.shutdown.cancelled() => return,
            }
            let mut st = entry.proc.lock().await;
            entry.alive.store(false, Ordering::SeqCst);
            if st.finished || st.stopping {
                return;
            }
            st.finished = true;
            drop(st);
            let id = entry.id.clone();
            let now = now_unix_nano();
            let why = format!("attached runner {id} exited");
            h.end_runner_spans(
                &id,
                Some(entry.pid),
                EndCause::Exited,
                &why,
                None,
                now,
                Vec::new(),
                &[],
            )
            .await;
            let _ = h
                .inner
                .storage
                .set_runner_state(
                    id.clone(),
                    RunnerRowState::Exited,
                    serde_json::json!({"reason": "attached process exited"}),
                    now,
                )
                .await;
            h.incident(
                EventKind::RunnerExited,
                &id,
                format!(
                    "attached runner {id} (pid {}) exited; not probed again until re-registered",
                    entry.pid
                ),
                serde_json::json!({"pid": entry.pid}),
                keys::runner_instance(EventKind::RunnerExited, &id, &entry.instance_id),
            )
            .await;
            h.notify(RunnerChange::Gone {
                id,
                removed: false,
                pid: Some(entry.pid),
            })
            .await;
            entry.settle();
        });
    }

    async fn on_spawned_exit(&self, entry: Arc<Entry>) {
        let exit_at = now_unix_nano();
        let mut st = entry.proc.lock().await;
        if st.finished || st.stopping {
            return;
        }
        // Leftover members of its group would outlive it: end them while the leader is
        // still an unreaped child (the group id stays pinned).
        let spare = self.other_leaders(&entry.id);
        let leftovers = {
            let table = platform::ProcTable::snapshot();
            let spared = table.trees_of(&spare);
            let mut l = table.descendants(entry.pid, entry.mark());
            l.retain(|p| !spared.contains(&p.pid));
            l
        };
        let mut report = None;
        if !leftovers.is_empty() {
            // Its heartbeat is gone with it while the leftovers get their grace period:
            // the runner is stopping, not stuck (it was tripped as unresponsive, its breaker
            // left OPEN after a clean exit).
            self.lifecycle(&entry.id, RunnerLifecycle::Stopping).await;
            let r = terminate::terminate(
                &self.inner.storage,
                &self.inner.stats,
                self.inner.config.grace,
                Target {
                    runner_id: &entry.id,
                    mark: entry.mark(),
                    pid: entry.pid,
                    pidfd: st.pidfd.as_ref(),
                    own_child_group: true,
                    hurry: Some(&self.inner.hurry),
                    spare: &spare,
                },
                &StopCause::ExitCleanup,
                None,
            )
            .await;
            report = Some(r);
        }
        let exit = match &report {
            Some(r) => r.exit,
            None => platform::reap_child(entry.pid).ok().flatten(),
        };
        st.finished = true;
        entry.alive.store(false, Ordering::SeqCst);
        if let Ok(mut o) = OWNED_PIDS.lock() {
            o.remove(&entry.pid);
        }
        drop(st);
        self.wait_readers(&entry).await;
        let id = entry.id.clone();
        let exit = exit.unwrap_or(ExitInfo {
            code: None,
            signal: None,
        });
        let stderr = entry.tail.lines("stderr");
        let stdout = entry.tail.lines("stdout");
        let success = exit.success();
        // Decided before the incident, so a give-up is said in it (not in a second one).
        let plan = if success {
            RestartPlan::None
        } else {
            self.plan_restart(&entry)
        };
        let gave_up = (plan == RestartPlan::GiveUp).then(|| self.gave_up_note());
        let (kind, state) = if success {
            (EventKind::RunnerExited, RunnerRowState::Exited)
        } else {
            (EventKind::RunnerCrashed, RunnerRowState::Crashed)
        };
        let mut evidence = serde_json::json!({
            "pid": entry.pid, "exit": exit, "last_stderr": stderr, "last_stdout": stdout,
            "leftovers": report,
        });
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
        let mut reason = match (success, stderr.last()) {
            (true, _) => format!("runner {id} exited cleanly"),
            (false, Some(last)) => format!("runner {id} exited with {}: {last}", exit.describe()),
            (false, None) => format!("runner {id} exited with {}", exit.describe()),
        };
        // Its processes end with it (docs/design.md, Reaper): say so, not only in the
        // evidence.
        reason.push_str(&super::stop::processes_note(
            leftovers.iter().map(|p| p.pid),
            "it left running stopped with it",
        ));
        if let Some((tail, _)) = &gave_up {
            reason.push_str(tail);
        }
        let cause = EndCause::of_exit(&exit);
        self.end_runner_spans(
            &id,
            Some(entry.pid),
            cause,
            &reason,
            Some(&exit),
            exit_at,
            Vec::new(),
            &[],
        )
        .await;
        self.incident(
            kind,
            &id,
            reason,
            evidence,
            keys::runner_instance(kind, &id, &entry.instance_id),
        )
        .await;
        self.notify(RunnerChange::Gone {
            id: id.clone(),
            removed: false,
            pid: Some(entry.pid),
        })
        .await;
        entry.settle();
        self.apply_restart(&entry, plan, &format!("exited with {}", exit.describe()))
            .await;
    }

    pub(super) async fn wait_readers(&self, entry: &Entry) {
        let readers: Vec<JoinHandle<()>> = entry
            .readers
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default();
        for r in readers {
            // A grandchild may hold the pipe open; do not wait for it forever.
            let _ = tokio::time::timeout(Duration::from_millis(500), r).await;
        }
    }
}
