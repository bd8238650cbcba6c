//! [`WatchdogHandle`]: the cheap, cloneable door to a running watchdog (board, admission,
//! manual breaker reset, counters).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use stallwatch_storage::control::RunnerBoard;
use tokio::sync::{mpsc, oneshot, watch};

use crate::breaker::{Admission, Breaker};
use crate::error::WatchdogError;
use crate::stats::WatchdogStats;

/// A cheap, cloneable handle to a running watchdog.
#[derive(Clone)]
pub struct WatchdogHandle {
    pub(crate) board: watch::Receiver<RunnerBoard>,
    pub(crate) breakers: Arc<RwLock<HashMap<String, Breaker>>>,
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) stats: Arc<WatchdogStats>,
}

/// A request to the watchdog task.
pub(crate) enum Command {
    Reset {
        id: String,
        reply: oneshot::Sender<Result<(), WatchdogError>>,
    },
}

impl WatchdogHandle {
    /// The runner board (breaker, heartbeat, verdict, worst span per runner), republished
    /// on every change and at least every `board_interval`.
    pub fn board(&self) -> watch::Receiver<RunnerBoard> {
        self.board.clone()
    }

    /// The admission answer for `runner_id` now (`GET /api/v1/runners/{id}/admit`: 200 when
    /// `admit`, 503 with `Retry-After` otherwise); `None` for an unknown runner (404).
    pub fn admit(&self, runner_id: &str) -> Option<Admission> {
        let map = self.breakers.read().ok()?;
        map.get(runner_id).map(|b| b.admission(Instant::now()))
    }

    /// Manual breaker reset (`POST /api/v1/runners/{id}/breaker/reset`): → CLOSED with a
    /// `breaker.closed` incident, heartbeat grace restarted. Errors:
    /// [`WatchdogError::UnknownRunner`], [`WatchdogError::Stopped`].
    pub async fn reset_breaker(&self, runner_id: &str) -> Result<(), WatchdogError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Reset {
                id: runner_id.to_string(),
                reply,
            })
            .await
            .map_err(|_| WatchdogError::Stopped)?;
        rx.await.map_err(|_| WatchdogError::Stopped)?
    }

    /// The counters (a [`stallwatch_storage::MetricsSource`]).
    pub fn stats(&self) -> Arc<WatchdogStats> {
        self.stats.clone()
    }
}
