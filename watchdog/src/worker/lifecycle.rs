//! How the watchdog task follows its runners: lifecycle notices from the reaper
//! (registered, restarted, gone, stopping, spans ended) and the heartbeat pings it starts
//! and whose results it feeds to each runner's tracker and breaker. The decisions are the
//! pure ones in `runner.rs` (`probe_outcome`) and `heartbeat.rs`; this file moves their
//! inputs and outputs.

use super::*;

impl Worker {
    pub(super) async fn runner_change(&mut self, ch: RunnerChange) {
        let now = Instant::now();
        let (id_of, removed_now) = match &ch {
            RunnerChange::Gone { id, removed, .. } => (id.clone(), *removed),
            RunnerChange::Registered { id, .. }
            | RunnerChange::Lifecycle { id, .. }
            | RunnerChange::SpansEnded { id, .. } => (id.clone(), false),
        };
        match ch {
            RunnerChange::Registered {
                id,
                pid,
                heartbeat_socket,
                spawned,
                restarted,
            } => {
                let existed = self.runners.contains_key(&id);
                if let Some(r) = self.runners.get(&id) {
                    if let Some(old) = r.pid {
                        self.pids.remove(&old);
                    }
                }
                let r = self.runners.entry(id.clone()).or_insert_with(|| {
                    Runner::new(id.clone(), pid, heartbeat_socket.clone(), spawned, now)
                });
                if existed {
                    // a restart or a re-registration: same breaker, new process
                    if let Some(old) = r.pid.filter(|old| Some(*old) != pid) {
                        r.remember_past_pid(old);
                    }
                    let configured = heartbeat_socket_usable(&heartbeat_socket);
                    r.socket_problem = heartbeat_socket
                        .as_deref()
                        .and_then(|p| check_path(p).err());
                    r.socket = heartbeat_socket;
                    r.pid = pid;
                    r.past_pids.retain(|p| Some(*p) != pid);
                    r.spawned = spawned;
                    r.hb.restart(configured, now);
                    r.dead = false;
                    r.probed_dead = false;
                    r.incarnation += 1;
                    r.restarted_since_trip = true;
                    r.stopping_since = None;
                    r.stopping_by = None;
                    r.lifecycle = if configured {
                        RunnerLifecycle::Starting
                    } else {
                        RunnerLifecycle::Running
                    };
                    if r.breaker.state() == BreakerState::Closed {
                        r.fused = HEALTHY;
                    }
                }
                if existed || restarted {
                    // the old process's open spans died with it; the new process's own
                    // (sent before it was registered) are its own
                    let new = pid;
                    for k in self
                        .ledger
                        .runner_spans_before_where(&id, now, |p| p.is_none() || p != new)
                    {
                        self.ledger.close(k);
                    }
                }
                if let Some(p) = pid {
                    self.pids.insert(p, id.clone());
                    self.ledger.bind_pid(p, &id);
                }
                self.ledger
                    .runner_registered(&id, now, self.cfg.sla.max_sla);
                self.sync_breaker(&id);
            }
            RunnerChange::Gone { id, removed, pid } => {
                if removed {
                    if let Some(r) = self.runners.remove(&id) {
                        if let Some(p) = r.pid {
                            self.pids.remove(&p);
                        }
                    }
                    self.ledger.runner_removed(&id);
                    if let Ok(mut m) = self.breakers.write() {
                        m.remove(&id);
                    }
                } else if let Some(r) = self.runners.get_mut(&id) {
                    r.dead = true;
                    r.stopping_since = None;
                    r.stopping_by = None;
                    r.worst = None;
                    if r.lifecycle != RunnerLifecycle::GaveUp {
                        r.lifecycle = RunnerLifecycle::Exited;
                    }
                }
                // its process is gone: none of its spans can still be running, and the
                // reaper has written the ends it could (the ledger learns of every end); a
                // span of another known process of the same id is not its
                let gone = pid;
                for k in self.ledger.runner_spans_before_where(&id, now, |p| {
                    gone.is_none() || p.is_none() || p == gone
                }) {
                    self.ledger.close(k);
                }
                self.ledger_changed();
            }
            RunnerChange::Lifecycle { id, lifecycle } => {
                if let Some(r) = self.runners.get_mut(&id) {
                    r.lifecycle = lifecycle;
                    match lifecycle {
                        RunnerLifecycle::Stopping => {
                            r.stopping_since.get_or_insert(now);
                            r.stopping_by = None;
                        }
                        _ => {
                            r.stopping_since = None;
                            r.stopping_by = None;
                            r.stopping_by = None;
                        }
                    }
                }
            }
            RunnerChange::SpansEnded { id, spans } => {
                for (trace_id, span_id) in spans {
                    self.ledger.close(SpanKey { trace_id, span_id });
                }
                if let Some(r) = self.runners.get_mut(&id) {
                    r.worst = None;
                }
                self.ledger_changed();
            }
        }
        self.stats
            .runners
            .store(self.runners.len() as u64, Ordering::Relaxed);
        if !removed_now {
            self.due_now(&id_of, now);
        } else {
            self.due.remove(&id_of);
            self.board_dirty.insert(id_of);
        }
        self.publish_board(now);
    }

    pub(super) fn spawn_ping(&mut self, id: &str, probe: Option<u64>) {
        let Some(r) = self.runners.get_mut(id) else {
            return;
        };
        let Some(path) = r.socket.clone() else { return };
        self.stats.heartbeats_sent.fetch_add(1, Ordering::Relaxed);
        let timeout = self.cfg.heartbeat_timeout;
        let runner = id.to_string();
        let incarnation = r.incarnation;
        self.pings.spawn(async move {
            let sent = Instant::now();
            let result = ping(&path, timeout).await;
            PingDone {
                runner,
                incarnation,
                sent,
                probe,
                result,
            }
        });
    }

    pub(super) async fn ping_done(&mut self, d: PingDone) {
        let now = Instant::now();
        match &d.result {
            Ok(_) => self.stats.heartbeats_ok.fetch_add(1, Ordering::Relaxed),
            Err(f) => {
                self.stats.heartbeat_failed(f);
                0
            }
        };
        let cooldown = self.cfg.breaker_cooldown;
        let Some(r) = self.runners.get_mut(&d.runner) else {
            return;
        };
        match d.probe {
            None => {
                if d.incarnation == r.incarnation {
                    r.hb.ping_finished(d.sent, now, &d.result, now_unix_nano() / 1_000_000);
                    let had_pong = r.hb.last_pong().is_some();
                    match &d.result {
                        Ok(_) if r.lifecycle == RunnerLifecycle::Starting => {
                            r.lifecycle = RunnerLifecycle::Running;
                        }
                        Ok(_) if r.stopping_by.is_some() => {
                            // It answered after all (a socket re-created, a goodbye taken
                            // back): alive, so no longer stopping.
                            tracing::info!(runner = %d.runner, "runner answered again: no longer stopping");
                            r.stopping_since = None;
                            r.stopping_by = None;
                            r.stopping_by = None;
                            r.lifecycle = RunnerLifecycle::Running;
                            self.board_dirty.insert(d.runner.clone());
                        }
                        Err(HeartbeatFailure::Goodbye) => {
                            self.begin_stopping(&d.runner, now, SelfStop::Goodbye)
                        }
                        Err(HeartbeatFailure::SocketMissing)
                            if had_pong
                                && self.ledger.runner_tool_spans(&d.runner).is_empty()
                                && !self.ledger.partial_view(
                                    &d.runner,
                                    now,
                                    self.cfg.sla.max_sla,
                                ) =>
                        {
                            // (with a partial view "no tool span open" is not known)
                            // the kits remove the socket first at exit
                            self.begin_stopping(&d.runner, now, SelfStop::SocketGone)
                        }
                        Err(HeartbeatFailure::OwnFault(e)) => {
                            let why = format!("heartbeat of runner {} not sent: {e}", d.runner);
                            self.degraded(now, Some(&d.runner), why).await;
                        }
                        _ => {}
                    }
                    let Some(r) = self.runners.get_mut(&d.runner) else {
                        return;
                    };
                    let at = r.hb.next_ping().max(now);
                    self.due.set_by(&d.runner, at);
                    self.sched.wake_by(at);
                    return;
                } else {
                    // a ping of a previous incarnation: only release its in-flight slot
                    r.hb.ping_finished(d.sent, now, &Err(HeartbeatFailure::Timeout), 0);
                }
                // a freed in-flight slot may make a ping due at once
                let at = r.hb.next_ping().max(now);
                self.due.set_by(&d.runner, at);
                self.sched.wake_by(at);
            }
            Some(probe) => {
                let answer = d.result.as_ref().map(|_| ()).map_err(|f| f.to_string());
                let worst = r.tripped_at.and_then(|t| {
                    self.ledger
                        .worst_first_seen_after(&d.runner, t, now, self.cfg.staleness)
                });
                let outcome = probe_outcome(
                    answer,
                    HeartbeatState::Ok,
                    worst.as_ref(),
                    self.ledger
                        .partial_view(&d.runner, now, self.cfg.sla.max_sla),
                    now,
                    self.cfg.suspect_cap,
                );
                let failure = outcome.err().unwrap_or_default();
                let ok = failure.is_empty();
                let t = r.breaker.probe_result(now, probe, ok, cooldown, &failure);
                match t {
                    Some(Transition::Closed) => {
                        r.hb.restart(r.hb.configured(), now);
                        r.hb.pong_at(now);
                        if r.lifecycle == RunnerLifecycle::Detached
                            || r.lifecycle == RunnerLifecycle::Starting
                        {
                            r.lifecycle = RunnerLifecycle::Running;
                        }
                        self.after_close(&d.runner, now, "probe answered PONG")
                            .await;
                    }
                    Some(Transition::Opened) => {
                        let reason = format!("HALF_OPEN probe failed: {failure}");
                        self.reopened(&d.runner, now, &reason).await;
                    }
                    _ => {}
                }
                self.board_dirty.insert(d.runner.clone());
                self.publish_board(now);
            }
        }
    }
}
