//! Spawning the tasks that run off the ingest path.

use std::future::Future;
use std::pin::Pin;

use tokio::task::JoinHandle;

/// `tokio::spawn` of `f` boxed as one future type per output type.
///
/// tokio compiles its task code (poll, completion, the join handle) once per spawned future
/// type: with every background task of the reaper, the dashboards, the MCP proxy, the
/// forwarder and the wiring spawned through here it is compiled once per output type
/// (issue 16, binary size: with storage's type-erased reads and control writes, 12.36 →
/// 11.79 MB). The box costs one allocation and an indirect poll per wake-up, so the
/// collector's tasks, on the ingest path, keep `tokio::spawn`.
///
/// Panics as `tokio::spawn` does: outside a tokio runtime.
#[track_caller]
pub fn spawn_boxed<T: Send + 'static>(
    f: impl Future<Output = T> + Send + 'static,
) -> JoinHandle<T> {
    let f: Pin<Box<dyn Future<Output = T> + Send>> = Box::pin(f);
    tokio::spawn(f)
}
