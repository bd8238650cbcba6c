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
}

/// Handler state type.
pub(crate) type Shared = Arc<Ctx>;
