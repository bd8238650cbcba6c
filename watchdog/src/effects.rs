//! The watchdog's two helper tasks, so its loop never waits on a disk: the *effects* task
//! records each incident through [`EventBus::publish`] and only then sends its [`Trip`]
//! (an incident is written before anything acts on it), and the *persister* task writes
//! open-span ledger changes in batches (one control transaction per batch).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use stallwatch_storage::control::Trip;
use stallwatch_storage::ledger::LedgerWrite;
use stallwatch_storage::model::NewIncident;
use stallwatch_storage::{EventBus, Storage};
use tokio::sync::mpsc;

use crate::stats::WatchdogStats;

/// Bound of the effects queue (incidents and trips waiting to be recorded).
pub(crate) const EFFECTS_CAPACITY: usize = 4096;
/// Bound of the ledger persistence queue, in batches.
pub(crate) const PERSIST_CAPACITY: usize = 16;
/// Most ledger rows written in one control transaction.
const PERSIST_CHUNK: usize = 1024;
/// Most unwritten ledger rows kept for retry while storage fails.
const PERSIST_CARRY_MAX: usize = 1_000_000;

/// A side effect of the loop, performed in order by [`run_effects`].
pub(crate) enum Effect {
    Incident(NewIncident),
    IncidentThenTrip(NewIncident, Trip),
}

/// Records incidents in order; a trip is sent only after its incident is recorded (or
/// failed to record: the watchdog acts anyway, docs/design.md Durability levels).
pub(crate) async fn run_effects(
    events: EventBus,
    trips: mpsc::Sender<Trip>,
    mut rx: mpsc::Receiver<Effect>,
    stats: Arc<WatchdogStats>,
) {
    while let Some(e) = rx.recv().await {
        let (inc, trip) = match e {
            Effect::Incident(i) => (i, None),
            Effect::IncidentThenTrip(i, t) => (i, Some(t)),
        };
        let kind = inc.kind;
        let id = match events.publish(inc).await {
            Ok(Some(recorded)) => (recorded.id != 0).then_some(recorded.id),
            Ok(None) => None,
            Err(e) => {
                stats.incident_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%kind, "incident not recorded: {e}");
                None
            }
        };
        if let Some(mut t) = trip {
            t.incident_id = id;
            if trips.send(t).await.is_err() {
                tracing::warn!("trip not delivered: the reaper's channel is closed");
            }
        }
    }
}

/// Writes ledger batches, merging whatever queued up meanwhile; each transaction carries
/// at most [`PERSIST_CHUNK`] rows so an incident waiting for the same control connection
/// never waits long. A failed chunk is kept and retried with the next batch (at most
/// [`PERSIST_CARRY_MAX`] rows are kept; beyond that the oldest are dropped and counted).
pub(crate) async fn run_persister(
    storage: Storage,
    mut rx: mpsc::Receiver<Vec<LedgerWrite>>,
    stats: Arc<WatchdogStats>,
) {
    let mut pending: Vec<LedgerWrite> = Vec::new();
    while let Some(batch) = rx.recv().await {
        pending.extend(batch);
        while let Ok(more) = rx.try_recv() {
            pending.extend(more);
        }
        let mut failed: Vec<LedgerWrite> = Vec::new();
        let mut rest = std::mem::take(&mut pending).into_iter().peekable();
        while rest.peek().is_some() {
            let chunk: Arc<Vec<LedgerWrite>> =
                Arc::new(rest.by_ref().take(PERSIST_CHUNK).collect());
            let n = chunk.len() as u64;
            match storage.ledger_apply(chunk.clone()).await {
                Ok(()) => {
                    stats.ledger_rows_written.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.ledger_write_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        "open-span ledger chunk of {n} rows not written (kept for retry): {e}"
                    );
                    failed.extend(Arc::try_unwrap(chunk).unwrap_or_else(|a| (*a).clone()));
                }
            }
        }
        if failed.len() > PERSIST_CARRY_MAX {
            let drop_n = failed.len() - PERSIST_CARRY_MAX;
            failed.drain(..drop_n);
            stats.ledger_write_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("open-span ledger: dropped {drop_n} unwritten rows (storage failing)");
        }
        pending = failed;
    }
}
