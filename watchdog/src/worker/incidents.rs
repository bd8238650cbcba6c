//! The incidents the watchdog raises and the trips it sends: breaker moves (HALF_OPEN and
//! its probe, CLOSED, OPEN again), `verdict.suspect`, the trip itself, `sidecar.degraded`,
//! and the evidence each carries. Every incident leaves through the effects task, which
//! records it before the trip it belongs to is sent (`docs/design.md`, Durability levels).

use super::*;
use stallwatch_storage::keys;

impl Worker {
    /// Raises `sidecar.degraded` (at most once per [`DEGRADED_INCIDENT_EVERY`]): stallwatch's
    /// own trouble hid a heartbeat; no runner is blamed (issue 17 #11).
    pub(super) async fn degraded(&mut self, now: Instant, runner: Option<&str>, why: String) {
        tracing::error!(runner = runner.unwrap_or("-"), "stallwatch degraded: {why}");
        if self
            .degraded_at
            .is_some_and(|t| now.saturating_duration_since(t) < DEGRADED_INCIDENT_EVERY)
        {
            return;
        }
        self.degraded_at = Some(now);
        self.stats.sidecar_degraded.fetch_add(1, Ordering::Relaxed);
        let at = now_unix_nano();
        self.emit(Effect::Incident(NewIncident {
            kind: EventKind::SidecarDegraded,
            runner_id: None,
            tool_name: None,
            trace_id: None,
            span_id: None,
            reason: format!("stallwatch itself is degraded: {why}; heartbeats count as unknown, no runner is tripped for them"),
            evidence: json!({"runner": runner, "why": why}),
            idempotency_key: keys::sidecar_degraded(at),
            at_unix_nano: at,
        }))
        .await;
    }

    /// Raises one `sidecar.degraded` incident per registered runner whose tool spans the
    /// open-span ledger did not track at its bound, once per burst (`UntrackedBurst`): a
    /// stall among them may go undetected, and the runner is not tripped on a view that
    /// may lack one of them (`Ledger::partial_view`). Counted in
    /// `stallwatch_watchdog_ledger_untracked_total`, not in `sidecar_degraded_total`
    /// (heartbeats are not affected). Each incident's time, and so its idempotency key, is
    /// distinct even when several are raised within one nanosecond tick.
    pub(super) async fn untracked_incidents(&mut self) {
        let Some(b) = self.untracked_burst.as_mut() else {
            return;
        };
        if b.pending.is_empty() {
            return;
        }
        let ids = std::mem::take(&mut b.pending);
        b.named.extend(ids.iter().cloned());
        let max = self.cfg.max_open_spans;
        let open = self.ledger.len();
        let (max_sla, cap) = (
            self.cfg.sla.max_sla.as_millis(),
            self.cfg.suspect_cap.as_millis(),
        );
        let mut last_at = 0;
        for id in ids {
            let why = format!(
                "the open-span ledger is at its bound (max_open_spans = {max}): tool spans of runner {id} are not tracked, so a stall among them may go undetected; until {max_sla} ms after the last one the runner is tripped only for a tracked span over its SLA, or a heartbeat lost for {cap} ms"
            );
            tracing::warn!(runner = %id, "stallwatch degraded: {why}");
            let at = now_unix_nano().max(last_at + 1);
            last_at = at;
            self.emit(Effect::Incident(NewIncident {
                kind: EventKind::SidecarDegraded,
                runner_id: Some(id.clone()),
                tool_name: None,
                trace_id: None,
                span_id: None,
                reason: format!("stallwatch itself is degraded: {why}"),
                evidence: json!({
                    "runner": id,
                    "why": "open_span_ledger_full",
                    "max_open_spans": max,
                    "open_spans": open,
                    "untracked_registered_runner_spans": self.ledger.untracked(crate::ledger::UntrackedSource::RegisteredRunner),
                }),
                idempotency_key: keys::sidecar_degraded(at),
                at_unix_nano: at,
            }))
            .await;
        }
    }

    /// After → CLOSED: drop the open spans of the tripped process, clear the verdict,
    /// record `breaker.closed`.
    pub(super) async fn after_close(&mut self, id: &str, now: Instant, why: &str) {
        let Some(r) = self.runners.get_mut(id) else {
            return;
        };
        let tripped_at = r.tripped_at.take();
        r.fused = HEALTHY;
        r.worst = None;
        r.restarted_since_trip = false;
        if let Some(t) = tripped_at {
            for k in self.ledger.runner_spans_before(id, t) {
                self.ledger.close(k);
            }
        }
        let ev = self.evidence(id, now);
        self.sync_breaker(id);
        self.emit(Effect::Incident(incident(
            EventKind::BreakerClosed,
            id,
            None,
            format!("breaker of runner {id} CLOSED: {why}"),
            ev,
            keys::breaker_closed(id, now_unix_nano()),
        )))
        .await;
    }

    pub(super) async fn reopened(&mut self, id: &str, now: Instant, reason: &str) {
        let open_spans: Vec<_> = self
            .ledger
            .runner_tool_spans(id)
            .into_iter()
            .map(|k| (k.trace_id, k.span_id))
            .collect();
        if let Some(r) = self.runners.get_mut(id) {
            r.tripped_at = Some(now);
        }
        let ev = self.evidence(id, now);
        self.sync_breaker(id);
        let at = now_unix_nano();
        let inc = incident(
            EventKind::BreakerOpened,
            id,
            None,
            format!("breaker of runner {id} OPEN again: {reason}"),
            ev,
            keys::breaker_reopened(id, at),
        );
        let trip = Trip {
            runner_id: id.to_string(),
            verdict: "probe_failed".into(),
            reason: reason.to_string(),
            incident_id: None,
            open_spans,
            at_unix_nano: at,
        };
        self.emit(Effect::IncidentThenTrip(inc, trip)).await;
    }

    pub(super) fn sync_breaker(&self, id: &str) {
        if let (Some(r), Ok(mut m)) = (self.runners.get(id), self.breakers.write()) {
            m.insert(id.to_string(), r.breaker.clone());
        }
    }

    pub(super) async fn emit(&self, e: Effect) {
        if self.effects.send(e).await.is_err() {
            self.stats.incident_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn evidence(&self, id: &str, now: Instant) -> serde_json::Value {
        let Some(r) = self.runners.get(id) else {
            return json!({});
        };
        let hb =
            r.hb.state(now, self.cfg.heartbeat_timeout, self.cfg.startup_grace);
        let span = r.worst.as_ref().map(|w| {
            json!({
                "trace_id": w.key.trace_id.to_hex(),
                "span_id": w.key.span_id.to_hex(),
                "tool_name": w.tool,
                "elapsed_ms": w.elapsed.as_millis() as u64,
                "sla_ms": w.sla.as_millis() as u64,
                "stale": w.stale,
                "since_last_seen_ms": w.since_last_seen.as_millis() as u64,
            })
        });
        json!({
            "verdict": r.fused.verdict.as_str(),
            "cause": r.fused.cause.as_str(),
            "heartbeat": hb.as_str(),
            "heartbeat_failure": r.socket_problem.as_ref().or(r.hb.current_failure()).map(|f| f.as_str()),
            "last_pong_age_ms": r.hb.last_pong().map(|p| now.saturating_duration_since(p).as_millis() as u64),
            "rtt_us": r.hb.last_rtt_us(),
            "pid": r.pid,
            "span": span,
        })
    }

    pub(super) async fn half_open(&mut self, id: &str, probe: u64, now: Instant) {
        let ev = self.evidence(id, now);
        self.sync_breaker(id);
        self.emit(Effect::Incident(incident(
            EventKind::BreakerHalfOpen,
            id,
            None,
            format!("breaker of runner {id} HALF_OPEN after its cooldown: sending one probe ping"),
            ev,
            keys::breaker_half_open(id, now_unix_nano()),
        )))
        .await;
        let Some(r) = self.runners.get_mut(id) else {
            return;
        };
        if r.socket.is_some() && r.socket_problem.is_none() {
            self.spawn_ping(id, Some(probe));
        } else {
            // no heartbeat socket to probe: only a restart since the trip counts as an answer
            let answer = if r.restarted_since_trip && !r.dead {
                Ok(())
            } else {
                Err("no heartbeat socket and no restart since the trip".to_string())
            };
            let worst = r.tripped_at.and_then(|t| {
                self.ledger
                    .worst_first_seen_after(id, t, now, self.cfg.staleness)
            });
            let outcome = probe_outcome(
                answer,
                HeartbeatState::NotConfigured,
                worst.as_ref(),
                self.ledger.partial_view(id, now, self.cfg.sla.max_sla),
                now,
                self.cfg.suspect_cap,
            );
            let failure = outcome.err().unwrap_or_default();
            let ok = failure.is_empty();
            let cooldown = self.cfg.breaker_cooldown;
            match r.breaker.probe_result(now, probe, ok, cooldown, &failure) {
                Some(Transition::Closed) => {
                    r.hb.restart(r.hb.configured(), now);
                    self.after_close(id, now, "runner restarted since the trip")
                        .await
                }
                Some(Transition::Opened) => self.reopened(id, now, &failure).await,
                _ => {}
            }
        }
    }

    pub(super) async fn suspect(&mut self, id: &str, now: Instant, hb: HeartbeatState) {
        let Some(r) = self.runners.get(id) else {
            return;
        };
        let Some(w) = r.worst.clone() else { return };
        let reason = match r.fused.cause {
            Cause::StaleSpan => format!(
                "tool span {} of runner {id} is stale: no refresh for {} ms (limit {} ms)",
                w.tool,
                w.since_last_seen.as_millis(),
                self.cfg.staleness.as_millis()
            ),
            _ => format!(
                "runner {id} lost its heartbeat ({}) while tool span {} is within its SLA of {} ms: a native call may hold the GIL; trips after {} ms",
                hb.as_str(),
                w.tool,
                w.sla.as_millis(),
                w.sla.min(self.cfg.suspect_cap).as_millis()
            ),
        };
        let ev = self.evidence(id, now);
        let key = keys::verdict_suspect(id, r.fused.cause.as_str(), w.key.trace_id, w.key.span_id);
        let mut inc = incident(EventKind::VerdictSuspect, id, Some(&w), reason, ev, key);
        inc.tool_name = Some(w.tool.clone());
        self.emit(Effect::Incident(inc)).await;
    }

    pub(super) async fn trip(&mut self, id: &str, now: Instant) {
        let cooldown = self.cfg.breaker_cooldown;
        let Some(r) = self.runners.get_mut(id) else {
            return;
        };
        let f = r.fused;
        let reason = match (&r.worst, f.cause) {
            (_, Cause::StoppingTimeout) => format!(
                "{}: runner {id} {} but did not exit within stopping_timeout_ms ({} ms)",
                f.verdict.as_str(),
                match r.stopping_by {
                    Some(SelfStop::SocketGone) => "removed its heartbeat socket (as a kit does at exit) and never answered again,",
                    Some(SelfStop::Goodbye) => "said goodbye",
                    None => "was being stopped",
                },
                self.cfg.stopping_timeout.as_millis()
            ),
            (Some(w), Cause::OverSla) => format!(
                "{}: tool span {} of runner {id} ran {} ms, over its SLA of {} ms",
                f.verdict.as_str(),
                w.tool,
                w.elapsed.as_millis(),
                w.sla.as_millis()
            ),
            (Some(w), Cause::StaleSpan) => format!(
                "{}: tool span {} of runner {id} stopped refreshing {} ms ago",
                f.verdict.as_str(),
                w.tool,
                w.since_last_seen.as_millis()
            ),
            (Some(w), Cause::LostHeartbeat) => format!(
                "{}: runner {id} answered no PONG for {} ms while tool span {} ran",
                f.verdict.as_str(),
                r.hb.last_pong()
                    .map_or(0, |p| now.saturating_duration_since(p).as_millis()),
                w.tool
            ),
            _ => format!(
                "{}: runner {id} answered no PONG within the heartbeat timeout ({} ms){}",
                f.verdict.as_str(),
                self.cfg.heartbeat_timeout.as_millis(),
                r.hb.current_failure()
                    .map(|e| format!(", last failure: {e}"))
                    .unwrap_or_default()
            ),
        };
        if r.breaker.trip(now, cooldown, &reason).is_none() {
            return;
        }
        r.tripped_at = Some(now);
        r.restarted_since_trip = false;
        self.stats.trips.fetch_add(1, Ordering::Relaxed);
        let worst = r.worst.clone();
        let open_spans: Vec<_> = self
            .ledger
            .runner_tool_spans(id)
            .into_iter()
            .map(|k| (k.trace_id, k.span_id))
            .collect();
        let ev = self.evidence(id, now);
        self.sync_breaker(id);
        let at = now_unix_nano();
        let key = match &worst {
            Some(w) if f.cause != Cause::LostNoSpan => {
                keys::breaker_opened_span(id, f.verdict.as_str(), w.key.trace_id, w.key.span_id)
            }
            _ => keys::breaker_opened_at(id, f.verdict.as_str(), at),
        };
        let mut inc = incident(
            EventKind::BreakerOpened,
            id,
            worst.as_ref(),
            reason.clone(),
            ev,
            key,
        );
        inc.at_unix_nano = at;
        let trip = Trip {
            runner_id: id.to_string(),
            verdict: f.verdict.as_str().to_string(),
            reason,
            incident_id: None,
            open_spans,
            at_unix_nano: at,
        };
        self.emit(Effect::IncidentThenTrip(inc, trip)).await;
    }
}

fn incident(
    kind: EventKind,
    runner: &str,
    span: Option<&WorstView>,
    reason: String,
    evidence: serde_json::Value,
    idempotency_key: String,
) -> NewIncident {
    NewIncident {
        kind,
        runner_id: Some(runner.to_string()),
        tool_name: span.map(|w| w.tool.clone()),
        trace_id: span.map(|w| w.key.trace_id),
        span_id: span.map(|w| w.key.span_id),
        reason,
        evidence,
        idempotency_key,
        at_unix_nano: now_unix_nano(),
    }
}
