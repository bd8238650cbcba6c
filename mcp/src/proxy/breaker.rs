//! What the sidecar says about the runner's breaker (`breaker.opened`, `breaker.half_open`,
//! `breaker.closed`, the runner's stop), and what the relay does about it.

use super::*;

impl Relay {
    pub(super) async fn on_news(&mut self, news: BreakerNews) {
        match news {
            BreakerNews::Tripped {
                verdict,
                reason,
                retry_after_ms,
            } => {
                // A `runner.terminated` after the `breaker.opened` keeps the trip's verdict.
                let (verdict, reason) = match &self.breaker {
                    Breaker::Open {
                        verdict, reason, ..
                    } => (verdict.clone(), reason.clone()),
                    Breaker::Closed => (verdict, reason),
                };
                self.breaker = Breaker::Open {
                    verdict: verdict.clone(),
                    reason: reason.clone(),
                    retry_after_ms,
                    heard: Instant::now(),
                };
                let _ = self.want_admission.send(true);
                self.fail_inflight(&verdict, &reason, false).await;
            }
            BreakerNews::Refused {
                state,
                reason,
                retry_after_ms,
            } => {
                let verdict = match &self.breaker {
                    Breaker::Open { verdict, .. } => verdict.clone(),
                    Breaker::Closed => state.to_lowercase(),
                };
                self.breaker = Breaker::Open {
                    verdict,
                    reason,
                    retry_after_ms,
                    heard: Instant::now(),
                };
            }
            BreakerNews::Closed => {
                self.breaker = Breaker::Closed;
                let _ = self.want_admission.send(false);
            }
        }
    }
}

/// `"<verdict>: <reason>"`, without repeating a verdict the reason already starts with.
pub(super) fn verdict_and_reason(verdict: &str, reason: &str) -> String {
    if reason.starts_with(verdict) {
        reason.to_string()
    } else {
        format!("{verdict}: {reason}")
    }
}
