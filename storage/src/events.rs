//! The event bus: record an incident durably, then broadcast it in-process.
//!
//! Every incident, whichever crate raises it, goes through [`EventBus::publish`]: first a
//! `synchronous=FULL` insert (idempotent by key), then a `tokio::sync::broadcast` that the
//! dashboard's SSE stream and the webhook outbox follow. On a full disk the incident is
//! still broadcast and held in memory, then written once space returns, so the watchdog and
//! reaper act anyway (docs/design.md, Durability levels). The same holds for every
//! transient condition (another process holding the lock, an I/O error, the file deleted):
//! the incident joins the storage's ordered queue of held control records (`held.rs`),
//! behind any action or runner row held before it.

use tokio::sync::broadcast;

use crate::db::Storage;
use crate::error::StorageError;
use crate::model::{Incident, NewIncident};

/// Broadcast capacity: a subscriber that falls this far behind re-reads from the table.
pub const EVENT_BUS_CAPACITY: usize = 1024;

/// Records incidents and fans them out. Cheap to clone.
#[derive(Clone)]
pub struct EventBus {
    storage: Storage,
    tx: broadcast::Sender<Incident>,
}

impl EventBus {
    /// A bus writing to `storage`.
    pub fn new(storage: Storage) -> Self {
        let (tx, _) = broadcast::channel(EVENT_BUS_CAPACITY);
        Self { storage, tx }
    }

    /// Follows every incident published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Incident> {
        self.tx.subscribe()
    }

    /// Records `incident` and broadcasts it. Answers `Ok(None)` when an incident with the
    /// same idempotency key was already recorded (nothing is broadcast then).
    ///
    /// On a full disk or another transient condition the incident is held in memory (id 0
    /// until written) in the one ordered queue of held control records, behind any ledger
    /// step, runner row or checkpoint move held before it, and broadcast; other errors are
    /// returned.
    pub async fn publish(&self, incident: NewIncident) -> Result<Option<Incident>, StorageError> {
        log_incident(&incident);
        if self.storage.holding() {
            // Records are held (or the file is locked): queue behind them, act now.
            self.storage
                .hold(crate::held::Held::Incident(incident.clone()));
            let held = crate::held::held_incident(incident);
            let _ = self.tx.send(held.clone());
            return Ok(Some(held));
        }
        match self.storage.record_incident(incident.clone()).await {
            Ok(Some(recorded)) => {
                let _ = self.tx.send(recorded.clone());
                Ok(Some(recorded))
            }
            Ok(None) => Ok(None),
            Err(e) if e.transient().is_some() => {
                tracing::error!(kind = %incident.kind, reason = %incident.reason, "incident held in memory: {e}");
                self.storage
                    .hold(crate::held::Held::Incident(incident.clone()));
                let held = crate::held::held_incident(incident);
                let _ = self.tx.send(held.clone());
                Ok(Some(held))
            }
            Err(e) => Err(e),
        }
    }

    /// Writes the control records held in memory (incidents among them), oldest first;
    /// keeps those that still fail.
    pub async fn flush_pending(&self) {
        self.storage.flush_held().await;
    }

    /// Number of control records held in memory awaiting storage.
    pub fn pending_len(&self) -> usize {
        self.storage.held_len()
    }
}

/// The one log line of every incident (operators read logs first): WARN for trips, kills,
/// crashes, orphans, rollbacks and a full disk; INFO for the rest. key=value fields name the
/// runner, the event and the reason.
fn log_incident(i: &NewIncident) {
    use crate::model::EventKind as K;
    let runner = i.runner_id.as_deref().unwrap_or("-");
    let tool = i.tool_name.as_deref().unwrap_or("-");
    match i.kind {
        K::VerdictSuspect
        | K::BreakerOpened
        | K::RunnerCrashed
        | K::RunnerTerminated
        | K::RunnerOrphaned
        | K::CheckpointRolledBack
        | K::StorageFull => tracing::warn!(
            target: "stallwatch::incident",
            event = %i.kind,
            runner,
            tool,
            reason = %i.reason,
            "incident"
        ),
        _ => tracing::info!(
            target: "stallwatch::incident",
            event = %i.kind,
            runner,
            tool,
            reason = %i.reason,
            "incident"
        ),
    }
}
