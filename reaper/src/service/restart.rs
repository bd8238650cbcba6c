//! Restart policy: at most `max_restarts` restarts of a spawned runner within `window`
//! (the intensity limit of an OTP supervisor), else the runner is `gave_up`
//! (docs/design.md: Runners).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use stallwatch_storage::control::RunnerLifecycle;
use stallwatch_storage::model::now_unix_nano;
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

/// What the restart policy decided for a runner that ended ([`ReaperHandle::plan_restart`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RestartPlan {
    /// Not for the policy: an attached runner, or stallwatch is stopping.
    None,
    /// Start it again (the restart is counted in the window).
    Restart,
    /// Restarts are off (`max_restarts = 0`): it stays gone, nothing was given up.
    Off,
    /// The intensity limit refused another restart: it stays gone, given up on.
    GiveUp,
}

impl ReaperHandle {
    /// Decides, once, whether a spawned runner that just ended is restarted: before its
    /// end's incident is recorded, so a give-up is said in that incident (`reason` ending
    /// in [`ReaperHandle::gave_up_note`], `evidence.gave_up = true`), not in a second
    /// `runner.crashed` after it.
    pub(super) fn plan_restart(&self, entry: &Entry) -> RestartPlan {
        if !entry.spawned
            || self.inner.stopping_all.load(Ordering::SeqCst)
            || self.inner.shutdown.is_cancelled()
        {
            return RestartPlan::None;
        }
        let policy = self.inner.config.restart;
        let allowed = self
            .inner
            .restarts
            .lock()
            .map(|mut m| {
                allow_restart(
                    m.entry(entry.id.clone()).or_default(),
                    Instant::now(),
                    policy,
                )
            })
            .unwrap_or(false);
        match (allowed, policy.max_restarts) {
            (true, _) => RestartPlan::Restart,
            (false, 0) => RestartPlan::Off,
            (false, _) => RestartPlan::GiveUp,
        }
    }

    /// What a give-up adds to the end's incident: its reason's tail and evidence fields.
    pub(super) fn gave_up_note(&self) -> (String, serde_json::Value) {
        let policy = self.inner.config.restart;
        (
            format!(
                "; gave up: the restart policy allows {} restarts in {} ms",
                policy.max_restarts,
                policy.window.as_millis()
            ),
            serde_json::json!({"gave_up": true, "max_restarts": policy.max_restarts, "window_ms": policy.window.as_millis() as u64}),
        )
    }

    /// Carries out `plan` for a runner whose end (`why`) was recorded: restarts it, or
    /// records that it stays gone (`gave_up` lifecycle and row).
    pub(super) async fn apply_restart(&self, entry: &Arc<Entry>, plan: RestartPlan, why: &str) {
        let id = entry.id.clone();
        match plan {
            RestartPlan::None => {}
            RestartPlan::Off | RestartPlan::GiveUp => {
                if plan == RestartPlan::GiveUp {
                    self.lifecycle(&id, RunnerLifecycle::GaveUp).await;
                }
                let _ = self
                    .inner
                    .storage
                    .set_runner_state(
                        id,
                        RunnerRowState::GaveUp,
                        serde_json::json!({"reason": why}),
                        now_unix_nano(),
                    )
                    .await;
            }
            RestartPlan::Restart => {
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
