//! The reaper's counters, rendered for `GET /metrics` (STYLE point 10: names
//! `stallwatch_<name>_<unit>_total`).

use std::sync::atomic::{AtomicU64, Ordering};

use stallwatch_storage::prometheus::counter;
use stallwatch_storage::MetricsSource;

/// Counters of the reaper. All monotonic.
#[derive(Debug, Default)]
pub struct ReaperStats {
    /// Runner processes spawned (restarts included).
    pub runners_spawned: AtomicU64,
    /// Restarts under the restart policy.
    pub runners_restarted: AtomicU64,
    /// Termination sequences run.
    pub terminations: AtomicU64,
    /// SIGTERMs sent (groups and single processes).
    pub sigterm_sent: AtomicU64,
    /// SIGKILLs sent.
    pub sigkill_sent: AtomicU64,
    /// Signals not sent because identity did not match (a recycled or gone pid).
    pub identity_mismatches: AtomicU64,
    /// Zombie children reaped that no runner owned (re-parented descendants).
    pub zombies_reaped: AtomicU64,
    /// Checkpoints committed (roll-forwards included).
    pub checkpoints_committed: AtomicU64,
    /// Checkpoints rolled back.
    pub checkpoints_rolled_back: AtomicU64,
    /// Runners marked orphaned by the sweep.
    pub orphans: AtomicU64,
    /// Span ends written by stallwatch.
    pub spans_closed: AtomicU64,
}

impl MetricsSource for ReaperStats {
    fn render_prometheus(&self, out: &mut String) {
        let rows: [(&str, &str, &AtomicU64); 11] = [
            (
                "runners_spawned",
                "runner processes spawned",
                &self.runners_spawned,
            ),
            (
                "runner_restarts",
                "runner restarts",
                &self.runners_restarted,
            ),
            (
                "terminations",
                "termination sequences run",
                &self.terminations,
            ),
            (
                "sigterm_signals",
                "SIGTERM signals sent",
                &self.sigterm_sent,
            ),
            (
                "sigkill_signals",
                "SIGKILL signals sent",
                &self.sigkill_sent,
            ),
            (
                "identity_mismatches",
                "signals withheld: identity did not match",
                &self.identity_mismatches,
            ),
            (
                "zombies_reaped",
                "unowned zombie children reaped",
                &self.zombies_reaped,
            ),
            (
                "checkpoints_committed",
                "checkpoints committed",
                &self.checkpoints_committed,
            ),
            (
                "checkpoints_rolled_back",
                "checkpoints rolled back",
                &self.checkpoints_rolled_back,
            ),
            (
                "orphaned_runners",
                "runners found orphaned by the sweep",
                &self.orphans,
            ),
            (
                "spans_closed",
                "span ends written by stallwatch",
                &self.spans_closed,
            ),
        ];
        for (name, help, v) in rows {
            counter(
                out,
                &format!("stallwatch_reaper_{name}_total"),
                help,
                v.load(Ordering::Relaxed),
            );
        }
    }
}
