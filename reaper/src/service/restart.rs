//! Restart policy: at most `max_restarts` restarts of a spawned runner within `window`
//! (the intensity limit of an OTP supervisor), else the runner is `gave_up`
//! (docs/design.md: Runners).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use stallwatch_storage::control::RunnerLifecycle;
use stallwatch_storage::keys;
use stallwatch_storage::model::{now_unix_nano, EventKind};
use stallwatch_storage::runners::RunnerRowState;

use super::{Entry, ReaperHandle};
use crate::config::RestartPolicy;

/// Decides whether one more restart fits the policy (pure; `now` given). Drops entries older
/// than the window from `history` and records `now` when the answer is yes.
pub fn allow_restart(history: &mut VecDeque<Instant>, now: Instant, policy: RestartPolicy) -> bool {
    while history
        .front()
        .is_some_and(|t| now.saturating_duration_since(*t) >= policy.window)
    {
        history.pop_front();
    }
    if history.len() as u32 >= policy.max_restarts {
        return false;
    }
    history.push_back(now);
    true
}

impl ReaperHandle {
    pub(super) async fn maybe_restart(&self, entry: &Arc<Entry>, why: &str) {
        if !entry.spawned
            || self.inner.stopping_all.load(Ordering::SeqCst)
            || self.inner.shutdown.is_cancelled()
        {
            return;
        }
        let id = entry.id.clone();
        let policy = self.inner.config.restart;
        let allowed = self
            .inner
            .restarts
            .lock()
            .map(|mut m| allow_restart(m.entry(id.clone()).or_default(), Instant::now(), policy))
            .unwrap_or(false);
        if !allowed {
            if policy.max_restarts > 0 {
                self.lifecycle(&id, RunnerLifecycle::GaveUp).await;
            }
            let _ = self
                .inner
                .storage
                .set_runner_state(
                    id.clone(),
                    RunnerRowState::GaveUp,
                    serde_json::json!({"reason": why}),
                    now_unix_nano(),
                )
                .await;
            if policy.max_restarts == 0 {
                // Restarts are off: nothing was given up, and the trip or exit already has
                // its own incident. A "crashed" here would misname a deliberate stop.
                return;
            }
            self.incident(
                EventKind::RunnerCrashed,
                &id,
                format!(
                    "runner {id} {why}; gave up: the restart policy allows {} restarts in {} ms",
                    policy.max_restarts,
                    policy.window.as_millis()
                ),
                serde_json::json!({"gave_up": true, "max_restarts": policy.max_restarts, "window_ms": policy.window.as_millis() as u64, "last_stderr": entry.tail.lines("stderr")}),
                keys::runner_gave_up(&id, &entry.instance_id),
            )
            .await;
            return;
        }
        // Still the current entry? (a DELETE or a new registration may have replaced it)
        if !self.is_current(&id, Some(&entry.instance_id)) {
            return;
        }
        self.inner
            .stats
            .runners_restarted
            .fetch_add(1, Ordering::Relaxed);
        self.lifecycle(&id, RunnerLifecycle::Restarting).await;
        if let Err(e) = self.spawn_runner(entry.spec.clone(), true).await {
            tracing::error!(runner = %id, "restart failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn restart_intensity_limit() {
        let p = RestartPolicy {
            max_restarts: 2,
            window: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        let mut h = VecDeque::new();
        assert!(allow_restart(&mut h, t0, p));
        assert!(allow_restart(&mut h, t0 + Duration::from_secs(1), p));
        assert!(!allow_restart(&mut h, t0 + Duration::from_secs(2), p));
        assert!(allow_restart(&mut h, t0 + Duration::from_secs(11), p));
    }
}
