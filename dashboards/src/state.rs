//! What the dashboard's handlers share: the [`AppState`] that `src/` builds, wrapped with
//! the dashboard's own counters.

use std::sync::Arc;

use stallwatch_storage::control::{ControlRequest, RunnerBoard};
use stallwatch_storage::{EventBus, MetricsSource, Storage};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::DashboardConfig;
use crate::metrics::HttpMetrics;
use crate::routes::OtlpImport;

/// Everything the dashboard reads from and writes to; `src/` builds it once.
#[derive(Clone)]
pub struct AppState {
    /// The database (reads; the webhook outbox).
    pub storage: Storage,
    /// The incident bus (SSE follows it).
    pub events: EventBus,
    /// Every runner's status, from the watchdog (breakers, admission, the Now page).
    pub board: watch::Receiver<RunnerBoard>,
    /// Control requests to the reaper and watchdog (the one reverse edge, ARCHITECTURE.md).
    pub control: mpsc::Sender<ControlRequest>,
    /// The bearer token of the control endpoints (64 hex characters, from `<data_dir>/token`).
    pub token: String,
    /// Counters of the other stages, rendered at `GET /metrics` before the dashboard's own.
    pub metrics: Vec<Arc<dyn MetricsSource>>,
    /// True once every listener is bound and storage is open (`GET /readyz`).
    pub ready: watch::Receiver<bool>,
    /// The validated configuration.
    pub config: Arc<DashboardConfig>,
    /// The OTLP/HTTP ingest behind `POST /api/v1/import/traces` (the collector's router);
    /// `None` answers that route with 404.
    pub otlp_import: Option<OtlpImport>,
}

/// The shutdown token [`crate::serve`] puts in every request's extensions: open SSE streams
/// end when it is cancelled, so the graceful shutdown does not wait on them.
#[derive(Clone)]
pub(crate) struct ShutdownSignal(pub(crate) CancellationToken);

/// The state handlers see: [`AppState`] plus the dashboard's own counters.
pub(crate) struct Ctx {
    pub(crate) app: AppState,
    pub(crate) http: Arc<HttpMetrics>,
    /// Permits of open event streams (`/api/v1/events`, `/api/v1/logs/stream`):
    /// [`stream_cap`] of them.
    pub(crate) streams: Arc<tokio::sync::Semaphore>,
}

/// Event streams open at once at most: three quarters of the listener's
/// `max_connections` (384 of 512 by default), at least 1. A stream holds its connection
/// for as long as it is open, so without a cap of its own any local process opening
/// streams filled every connection slot and locked out `/healthz` and the control API,
/// shutdown and `DELETE` included; the last quarter is kept for requests that end.
pub(crate) fn stream_cap(max_connections: usize) -> usize {
    (max_connections / 4 * 3).max(1)
}

/// Holds one of the [`Ctx::streams`] permits for as long as a stream is open.
///
/// Errors: [`crate::DashboardError::TooManyStreams`] (503 + `Retry-After`) when all are
/// taken.
pub(crate) fn stream_permit(
    ctx: &Ctx,
) -> Result<tokio::sync::OwnedSemaphorePermit, crate::DashboardError> {
    ctx.streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| crate::DashboardError::TooManyStreams {
            limit: stream_cap(ctx.app.config.listen_limits.max_connections),
        })
}

/// Handler state type.
pub(crate) type Shared = Arc<Ctx>;
