//! Every way a runner ends closes its open spans (issue 12 #1; `docs/design.md`, Runner
//! lifecycle: "every end of a runner closes its open spans with ERROR and an `error.type`
//! naming the cause").
//!
//! The spans to close are the runner's open (not inferred) spans in the watchdog's durable
//! open-span ledger, plus any the caller already knows (a trip names its own). Each gets a
//! stored end: status ERROR, `error.type` = [`EndCause::error_type`], end time = the exit
//! time, a `runner.exit` span event at that time, and the exit code or signal as
//! attributes. The keys whose end is now stored go back to the watchdog as
//! `RunnerChange::SpansEnded`, so the ledger (and the Now page) learns of them at once.

use std::sync::atomic::Ordering;

use stallwatch_storage::control::{RunnerChange, RunnerLifecycle};
use stallwatch_storage::model::{SpanId, TraceId};
use stallwatch_storage::Storage;

use crate::platform::ExitInfo;
use crate::service::ReaperHandle;
use crate::spans::{self, EndEvent, ExitAttrs};

/// Why a runner's spans were ended by stallwatch: the `error.type` of their ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndCause {
    /// It exited on its own with code 0 while a span was open: `runner_exited`.
    Exited,
    /// It exited with a non-zero code or a signal other than SIGKILL: `runner_crashed`.
    Crashed,
    /// SIGKILL from outside stallwatch (the OOM killer, a person), or a DELETE: `killed`.
    Killed,
    /// Found dead by the orphan sweep after a restart of stallwatch: `orphaned`.
    Orphaned,
    /// Stopped by stallwatch after a trip: `timeout`.
    Timeout,
}

impl EndCause {
    /// `runner_exited`, `runner_crashed`, `killed`, `orphaned` or `timeout`.
    pub fn error_type(&self) -> &'static str {
        match self {
            EndCause::Exited => "runner_exited",
            EndCause::Crashed => "runner_crashed",
            EndCause::Killed => "killed",
            EndCause::Orphaned => "orphaned",
            EndCause::Timeout => "timeout",
        }
    }

    /// The cause of an exit stallwatch did not ask for: code 0 → [`EndCause::Exited`],
    /// SIGKILL → [`EndCause::Killed`], anything else → [`EndCause::Crashed`].
    pub fn of_exit(exit: &ExitInfo) -> Self {
        match (exit.code, exit.signal) {
            (Some(0), _) => EndCause::Exited,
            (_, Some(9)) => EndCause::Killed,
            _ => EndCause::Crashed,
        }
    }
}

impl ReaperHandle {
    /// The hook every end of a runner calls: closes its open spans
    /// ([`close_runner_spans`]), counts them, and tells the watchdog which ends are now
    /// stored (`RunnerChange::SpansEnded`). Answers how many ends were written.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn end_runner_spans(
        &self,
        runner_id: &str,
        pid: Option<u32>,
        cause: EndCause,
        reason: &str,
        exit: Option<&ExitInfo>,
        at_unix_nano: u64,
        events: Vec<EndEvent>,
        known: &[(TraceId, SpanId)],
    ) -> usize {
        let (written, ended) = close_runner_spans(
            self.storage(),
            runner_id,
            pid,
            cause,
            reason,
            exit,
            at_unix_nano,
            events,
            known,
        )
        .await;
        self.stats_ref()
            .spans_closed
            .fetch_add(written as u64, Ordering::Relaxed);
        if !ended.is_empty() {
            self.notify(RunnerChange::SpansEnded {
                id: runner_id.to_string(),
                spans: ended,
            })
            .await;
        }
        written
    }

    /// Tells the watchdog the runner's new lifecycle state (one only the reaper knows).
    pub(crate) async fn lifecycle(&self, runner_id: &str, lifecycle: RunnerLifecycle) {
        self.notify(RunnerChange::Lifecycle {
            id: runner_id.to_string(),
            lifecycle,
        })
        .await;
    }
}

/// Writes the ends of `runner_id`'s open spans (the durable ledger's, plus `known`) for an
/// end at `at_unix_nano` (the exit time); with `pid`, only those of that process or of no
/// known process. Answers the keys whose end is now stored. A
/// failed ledger read is logged and only `known` is closed.
#[allow(clippy::too_many_arguments)]
pub async fn close_runner_spans(
    storage: &Storage,
    runner_id: &str,
    pid: Option<u32>,
    cause: EndCause,
    reason: &str,
    exit: Option<&ExitInfo>,
    at_unix_nano: u64,
    mut events: Vec<EndEvent>,
    known: &[(TraceId, SpanId)],
) -> (usize, Vec<(TraceId, SpanId)>) {
    let mut keys: Vec<(TraceId, SpanId)> = known.to_vec();
    match storage.ledger_runner_open(runner_id.to_string(), pid).await {
        Ok(rows) => keys.extend(rows),
        Err(e) => tracing::warn!(runner = runner_id, "open spans not read: {e}"),
    }
    keys.sort();
    keys.dedup();
    if keys.is_empty() {
        return (0, Vec::new());
    }
    if events.is_empty() {
        // an end nobody signalled: the exit itself is the event (a stop by stallwatch
        // already carries its SIGTERM / SIGKILL / rollback events)
        events.push(EndEvent {
            name: "runner.exit".into(),
            at_unix_nano,
        });
    }
    let attrs = exit.map(|x| ExitAttrs {
        code: x.code,
        signal: x.signal,
    });
    spans::close_spans_with(
        storage,
        runner_id,
        &keys,
        cause.error_type(),
        reason,
        at_unix_nano,
        &events,
        attrs,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_name_the_end() {
        let e = |code, signal| EndCause::of_exit(&ExitInfo { code, signal });
        assert_eq!(e(Some(0), None).error_type(), "runner_exited");
        assert_eq!(e(Some(3), None).error_type(), "runner_crashed");
        assert_eq!(e(None, Some(11)).error_type(), "runner_crashed");
        assert_eq!(e(None, Some(9)).error_type(), "killed");
        assert_eq!(EndCause::Timeout.error_type(), "timeout");
        assert_eq!(EndCause::Orphaned.error_type(), "orphaned");
    }
}
