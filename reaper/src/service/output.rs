//! Runner output → OTLP logs: each spawned runner's stdout and stderr, line by line, kept
//! in its tail (for incidents) and stored as OTLP log records in small batches
//! (docs/design.md: Runners).

use std::sync::Arc;
use std::time::Duration;

use stallwatch_storage::model::{
    now_unix_nano, AnyValue, KeyValue, LogBatch, LogRecord, Resource, ResourceLogs, Scope,
    ScopeLogs,
};
use stallwatch_storage::Storage;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinHandle;

use crate::runner::OutputTail;

/// Lines per OTLP log batch written from a runner's output.
const LOG_BATCH_LINES: usize = 64;
/// Longest a captured line waits before its batch is written.
const LOG_FLUSH: Duration = Duration::from_millis(250);

/// Reads a runner's stdout or stderr line by line: keeps the tail for incidents and stores
/// the lines as OTLP log records (`log.iostream` = `stdout`/`stderr`, resource
/// `service.name`, `stallwatch.runner.id`, `service.instance.id`), in small batches.
pub(super) fn spawn_reader<R>(
    r: R,
    stream: &'static str,
    tail: OutputTail,
    id: String,
    instance_id: String,
    storage: Storage,
) -> JoinHandle<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    stallwatch_vocabulary::task::spawn_boxed(async move {
        let mut lines = BufReader::new(r).lines();
        let mut pending: Vec<LogRecord> = Vec::new();
        loop {
            let next = if pending.is_empty() {
                Ok(lines.next_line().await)
            } else {
                tokio::time::timeout(LOG_FLUSH, lines.next_line()).await
            };
            let eof = match next {
                Ok(Ok(Some(line))) => {
                    tail.push(stream, line.clone());
                    let now = now_unix_nano();
                    pending.push(LogRecord {
                        time_unix_nano: now,
                        observed_time_unix_nano: now,
                        severity_number: if stream == "stderr" { 13 } else { 9 },
                        severity_text: if stream == "stderr" { "WARN" } else { "INFO" }.into(),
                        body: AnyValue::String(line),
                        attributes: vec![KeyValue::new(
                            "log.iostream",
                            AnyValue::String(stream.into()),
                        )],
                        ..Default::default()
                    });
                    if pending.len() < LOG_BATCH_LINES {
                        continue;
                    }
                    false
                }
                Ok(_) => true,   // EOF or read error
                Err(_) => false, // flush timer
            };
            if !pending.is_empty() {
                let batch = output_batch(&id, &instance_id, std::mem::take(&mut pending));
                if let Err(e) = storage.write_logs(Arc::new(batch)).await {
                    tracing::debug!(runner = %id, stream, "runner output not stored as logs: {e}");
                }
            }
            if eof {
                break;
            }
        }
    })
}

fn output_batch(id: &str, instance_id: &str, records: Vec<LogRecord>) -> LogBatch {
    let s = |v: &str| AnyValue::String(v.to_string());
    LogBatch {
        resource_logs: vec![ResourceLogs {
            resource: Resource {
                attributes: vec![
                    KeyValue::new("service.name", s(id)),
                    KeyValue::new("stallwatch.runner.id", s(id)),
                    KeyValue::new("service.instance.id", s(instance_id)),
                ],
                ..Default::default()
            },
            scope_logs: vec![ScopeLogs {
                scope: Scope {
                    name: crate::spans::SCOPE_NAME.into(),
                    ..Default::default()
                },
                log_records: records,
            }],
        }],
    }
}
