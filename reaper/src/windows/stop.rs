//! How a Windows runner ends: its own exit, a trip, a `DELETE` or the ordered shutdown
//! (`CTRL_BREAK_EVENT`, the grace period, `TerminateJobObject`), and what is recorded after.

use super::*;

impl ReaperHandle {
    /// The runner exited by itself: end what is left of its job (the tree goes with its
    /// leader), close its spans, record the exit.
    pub(super) async fn on_exit(&self, entry: Arc<Entry>) {
        if entry.stopping.load(Ordering::SeqCst) || entry.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(d) = crate::failpoint::delay("reaper.exit_record") {
            tokio::time::sleep(d).await;
        }
        let at = now_unix_nano();
        let code = entry.exit_code();
        let leftovers = entry.job.pids().unwrap_or_default();
        if !leftovers.is_empty() {
            let _ = entry.job.terminate();
        }
        let (state, kind, cause) = if code == Some(0) {
            (
                RunnerRowState::Exited,
                EventKind::RunnerExited,
                "runner_exited",
            )
        } else {
            (
                RunnerRowState::Crashed,
                EventKind::RunnerCrashed,
                "runner_crashed",
            )
        };
        let id = entry.id.clone();
        let why = format!("runner {id} exited with code {}", code.unwrap_or(-1));
        let events = vec![EndEvent {
            name: "runner.exit".into(),
            at_unix_nano: at,
        }];
        let closed = self
            .close_spans(&id, entry.pid, cause, &why, code, at, &events, &[])
            .await;
        let evidence = serde_json::json!({
            "exit_code": code, "job_members_ended": leftovers, "spans_closed": closed,
            "last_stderr": entry.stderr_tail(),
        });
        let _ = self
            .inner
            .storage
            .set_runner_state(id.clone(), state, evidence.clone(), at)
            .await;
        self.incident(
            kind,
            &id,
            why,
            evidence,
            stallwatch_storage::keys::runner_instance(kind, &id, &entry.instance_id),
        )
        .await;
        self.notify(RunnerChange::Gone {
            id,
            removed: false,
            pid: Some(entry.pid),
        })
        .await;
        entry.settled.settle();
    }

    /// Stores ends for the open spans of the runner's process `pid` (the ledger's, those of
    /// no known process included, plus `known`); answers how many were written.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn close_spans(
        &self,
        runner_id: &str,
        pid: u32,
        error_type: &str,
        reason: &str,
        code: Option<i32>,
        at: u64,
        events: &[EndEvent],
        known: &[(TraceId, SpanId)],
    ) -> usize {
        let mut keys = known.to_vec();
        match self
            .inner
            .storage
            .ledger_runner_open(runner_id.to_string(), Some(pid))
            .await
        {
            Ok(rows) => keys.extend(rows),
            Err(e) => tracing::warn!(runner = runner_id, "open spans not read: {e}"),
        }
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            return 0;
        }
        let attrs = Some(ExitAttrs { code, signal: None });
        let (written, ended) = spans::close_spans_with(
            &self.inner.storage,
            runner_id,
            &keys,
            error_type,
            reason,
            at,
            events,
            attrs,
        )
        .await;
        self.inner
            .stats
            .spans_closed
            .fetch_add(written as u64, Ordering::Relaxed);
        if !ended.is_empty() {
            self.notify(RunnerChange::SpansEnded {
                id: runner_id.to_string(),
                spans: ended,
            })
            .await;
        }
        written
    }

    /// `CTRL_BREAK_EVENT` to the runner's group, the grace period, `TerminateJobObject`;
    /// then any job member left after the leader's exit is ended too. `None` when the runner
    /// had already ended (nothing was sent).
    pub(super) async fn stop(&self, entry: &Arc<Entry>, cause: &str) -> Option<Report> {
        let _g = entry.stop_lock.lock().await;
        if entry.finished.load(Ordering::SeqCst) {
            return None;
        }
        entry.stopping.store(true, Ordering::SeqCst);
        self.notify(RunnerChange::Lifecycle {
            id: entry.id.clone(),
            lifecycle: RunnerLifecycle::Stopping,
        })
        .await;
        self.inner
            .stats
            .terminations
            .fetch_add(1, Ordering::Relaxed);
        let tid = uuid::Uuid::new_v4().to_string();
        let started = Instant::now();
        let mut steps = Vec::new();
        let break_at = now_unix_nano();
        let mut ended_by = "ctrl_break";
        if entry.exit_code().is_some() {
            ended_by = "already_exited";
        } else {
            let sent = process::ctrl_break(entry.pid);
            let detail = serde_json::json!({
                "pgid": entry.pid, "grace_ms": self.inner.config.grace.as_millis() as u64,
                "error": sent.as_ref().err().map(|e| e.to_string()),
            });
            self.action(
                entry,
                &tid,
                "ctrl_break",
                if sent.is_ok() { "sent" } else { "failed" },
                detail.clone(),
            )
            .await;
            steps.push(serde_json::json!({"step": "ctrl_break", "at_unix_nano": break_at, "detail": detail}));
            if sent.is_ok() {
                self.inner
                    .stats
                    .sigterm_sent
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut terminate_at = None;
        if entry.wait_exit(self.inner.config.grace).await.is_none() {
            ended_by = "terminate_job";
            let at = now_unix_nano();
            terminate_at = Some(at);
            let r = entry.job.terminate();
            self.inner
                .stats
                .sigkill_sent
                .fetch_add(1, Ordering::Relaxed);
            let detail = serde_json::json!({"error": r.as_ref().err().map(|e| e.to_string())});
            self.action(
                entry,
                &tid,
                "terminate_job",
                if r.is_ok() { "sent" } else { "failed" },
                detail.clone(),
            )
            .await;
            steps.push(
                serde_json::json!({"step": "terminate_job", "at_unix_nano": at, "detail": detail}),
            );
            entry.wait_exit(KILL_WAIT).await;
        }
        // The leader is gone; members of its job (escaped children) must not outlive it.
        let left = entry.job.pids().unwrap_or_default();
        if !left.is_empty() {
            let at = now_unix_nano();
            let r = entry.job.terminate();
            let detail = serde_json::json!({"members": left, "error": r.as_ref().err().map(|e| e.to_string())});
            self.action(entry, &tid, "terminate_job_members", "sent", detail.clone())
                .await;
            steps.push(serde_json::json!({"step": "terminate_job_members", "at_unix_nano": at, "detail": detail}));
            let deadline = Instant::now() + KILL_WAIT;
            while Instant::now() < deadline && !entry.job.pids().unwrap_or_default().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let survivors = entry.job.pids().unwrap_or_default();
        let exit_code = entry.exit_code();
        self.action(
            entry,
            &tid,
            "exit",
            "done",
            serde_json::json!({"exit_code": exit_code, "ended_by": ended_by, "survivors": survivors}),
        )
        .await;
        entry.finished.store(true, Ordering::SeqCst);
        Some(Report {
            termination_id: tid,
            cause: cause.to_string(),
            ended_by: ended_by.to_string(),
            ctrl_break_unix_nano: break_at,
            terminate_unix_nano: terminate_at,
            exit_code,
            duration_ms: started.elapsed().as_millis() as u64,
            steps,
            survivors,
        })
    }

    /// After a stop: roll back the runner's open checkpoints (as on Linux), close its
    /// spans, record the end, write the incident.
    pub(super) async fn after_stop(
        &self,
        entry: &Arc<Entry>,
        report: &Report,
        open_spans: &[(TraceId, SpanId)],
    ) {
        let id = entry.id.clone();
        let cause = report.cause.as_str();
        let batch = self.inner.config.sweep_batch;
        let (rolled, errors) = self
            .inner
            .checkpoints
            .settle_stopped(&id, cause, batch)
            .await;
        let mut events = vec![EndEvent {
            name: "CTRL_BREAK".into(),
            at_unix_nano: report.ctrl_break_unix_nano,
        }];
        if let Some(k) = report.terminate_unix_nano {
            events.push(EndEvent {
                name: "TerminateJobObject".into(),
                at_unix_nano: k,
            });
        }
        if !rolled.is_empty() {
            events.push(EndEvent {
                name: "rollback".into(),
                at_unix_nano: now_unix_nano(),
            });
        }
        let error_type = if cause == "delete" {
            "killed"
        } else {
            "timeout"
        };
        let why = format!("runner {id} stopped by stallwatch ({cause})");
        let closed = self
            .close_spans(
                &id,
                entry.pid,
                error_type,
                &why,
                report.exit_code,
                report.ctrl_break_unix_nano,
                &events,
                open_spans,
            )
            .await;
        let state = if cause == "delete" {
            RunnerRowState::Removed
        } else {
            RunnerRowState::Terminated
        };
        let evidence = serde_json::json!({
            "cause": cause, "report": report, "checkpoints_rolled_back": rolled,
            "checkpoint_errors": errors, "spans_closed": closed,
            "last_stderr": entry.stderr_tail(),
        });
        let _ = self
            .inner
            .storage
            .set_runner_state(id.clone(), state, evidence.clone(), now_unix_nano())
            .await;
        self.incident(
            EventKind::RunnerTerminated,
            &id,
            format!(
                "runner {id} stopped ({cause}): ended by {} after {} ms{}",
                report.ended_by,
                report.duration_ms,
                if report.survivors.is_empty() {
                    String::new()
                } else {
                    format!(", {} survivors", report.survivors.len())
                }
            ),
            evidence,
            stallwatch_storage::keys::runner_terminated(&id, &report.termination_id),
        )
        .await;
        self.notify(RunnerChange::Gone {
            id,
            removed: cause == "delete",
            pid: Some(entry.pid),
        })
        .await;
        entry.settled.settle();
    }

    pub(super) async fn on_trip(&self, trip: Trip) {
        let Some(entry) = self.entry(&trip.runner_id) else {
            tracing::warn!(runner = %trip.runner_id, "trip for an unknown runner ignored");
            return;
        };
        let tid =
            stallwatch_storage::keys::trip_termination_id(&entry.instance_id, trip.at_unix_nano);
        self.action(
            &entry,
            &tid,
            "open_spans",
            "done",
            serde_json::json!({
                "verdict": trip.verdict, "reason": trip.reason, "incident_id": trip.incident_id,
                "spans": trip.open_spans.iter().map(|(t, s)| [t.to_hex(), s.to_hex()]).collect::<Vec<_>>(),
            }),
        )
        .await;
        let cause = stallwatch_storage::keys::StopCause::trip(trip.verdict.as_str()).to_string();
        match self.stop(&entry, &cause).await {
            Some(report) => self.after_stop(&entry, &report, &trip.open_spans).await,
            // Exited on its own before the trip could stop it: what it staged is still
            // rolled back, as for a stopped runner (the same rule as on Linux), unless it
            // was registered again meanwhile (the id's checkpoints are then the new one's).
            None if self
                .entry(&entry.id)
                .is_some_and(|current| Arc::ptr_eq(&current, &entry)) =>
            {
                let id = &entry.id;
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
                if !rolled.is_empty() || !errors.is_empty() {
                    self.action(
                        &entry,
                        &tid,
                        "checkpoints_rolled_back",
                        "done",
                        serde_json::json!({
                            "why": "exited before it was stopped",
                            "checkpoints_rolled_back": rolled, "checkpoint_errors": errors,
                        }),
                    )
                    .await;
                }
            }
            None => {}
        }
    }

    pub(super) async fn delete(&self, id: &str) -> Result<RunnerDeleted, RunnerError> {
        let Some(entry) = self.entry(id) else {
            return Err(RunnerError::NotFound(format!("no runner {id}")));
        };
        let report = self.stop(&entry, "delete").await;
        match &report {
            Some(r) => self.after_stop(&entry, r, &[]).await,
            None => {
                let _ = self
                    .inner
                    .storage
                    .set_runner_state(
                        id.to_string(),
                        RunnerRowState::Removed,
                        serde_json::json!({"cause": "delete"}),
                        now_unix_nano(),
                    )
                    .await;
                self.notify(RunnerChange::Gone {
                    id: id.to_string(),
                    removed: true,
                    pid: Some(entry.pid),
                })
                .await;
                entry.settled.settle();
            }
        }
        if let Ok(mut m) = self.inner.runners.lock() {
            if m.get(id).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                m.remove(id);
            }
        }
        let json = |v: &serde_json::Value| v.clone();
        let value = report
            .as_ref()
            .map(|r| serde_json::to_value(r).unwrap_or_default());
        Ok(RunnerDeleted {
            id: id.to_string(),
            removed: true,
            steps: report
                .as_ref()
                .map(|r| r.steps.iter().map(json).collect())
                .unwrap_or_default(),
            survivors: report
                .as_ref()
                .map(|r| {
                    r.survivors
                        .iter()
                        .map(|p| serde_json::json!({"pid": p}))
                        .collect()
                })
                .unwrap_or_default(),
            termination: value,
        })
    }
}
