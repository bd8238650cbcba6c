//! Tests of the forwarding cursor reads on a real SQLite file: batches regrouped, gaps, trim.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use super::*;
use crate::config::StorageConfig;
use crate::model::{KeyValue, SpanId, TraceId};

fn batch(service: &str, trace: u8, spans: u8) -> Arc<TraceBatch> {
    let resource = Resource {
        attributes: vec![KeyValue::new(
            "service.name",
            crate::model::AnyValue::String(service.into()),
        )],
        ..Default::default()
    };
    Arc::new(TraceBatch {
        resource_spans: vec![ResourceSpans {
            resource,
            scope_spans: vec![ScopeSpans {
                scope: Scope::default(),
                spans: (1..=spans)
                    .map(|i| Span {
                        trace_id: TraceId([trace; 16]),
                        span_id: SpanId([i; 8]),
                        name: format!("s{i}"),
                        start_time_unix_nano: 1,
                        end_time_unix_nano: 2,
                        ..Default::default()
                    })
                    .collect(),
            }],
        }],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_reads_regrouping_gaps_and_trim() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let s = Storage::open(StorageConfig::new(&path)).unwrap();
    let cursors = s.forward_cursors().await.unwrap();
    assert_eq!(cursors[0], ForwardCursor::default());
    for t in 1..=4u8 {
        let service = if t.is_multiple_of(2) { "even" } else { "odd" };
        s.write_traces(batch(service, t, 3)).await.unwrap();
    }
    // Rows 1..=4, 3 spans each; 7 spans max → two whole rows (6 spans).
    let c = s.forward_read_traces(0, 7).await.unwrap().unwrap();
    assert_eq!((c.last_id, c.rows, c.items, c.missing_rows), (2, 2, 6, 0));
    assert_eq!(c.data.resource_spans.len(), 2, "one group per resource");
    // A single row bigger than the limit is read alone.
    let c = s.forward_read_traces(0, 1).await.unwrap().unwrap();
    assert_eq!((c.last_id, c.items), (1, 3));
    // Rows 1 and 3 regroup under the same resource.
    let c = s.forward_read_traces(0, 100).await.unwrap().unwrap();
    assert_eq!(c.data.resource_spans.len(), 2);
    assert_eq!(c.data.resource_spans[0].scope_spans[0].spans.len(), 6);

    s.forward_advance(
        Signal::Traces,
        0,
        1,
        ForwardCursor {
            sent: 3,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        s.forward_advance(Signal::Traces, 0, 2, ForwardCursor::default())
            .await
            .is_err(),
        "a stale cursor is refused"
    );
    let b = s.forward_backlog(Signal::Traces, 1).await.unwrap();
    assert_eq!((b.rows, b.items), (3, 9));
    assert!(b.bytes > 0);

    // A row deleted behind the forwarder's back (as retention would) is a gap.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute("DELETE FROM span_batches WHERE id = 2", [])
        .unwrap();
    let c = s.forward_read_traces(1, 100).await.unwrap().unwrap();
    assert_eq!((c.last_id, c.rows, c.items, c.missing_rows), (4, 2, 6, 1));

    // Trim sheds whole rows, oldest first, until the excess is covered.
    let one = s.forward_backlog(Signal::Traces, 3).await.unwrap().bytes;
    let t = s.forward_trim(Signal::Traces, 1, 1).await.unwrap().unwrap();
    assert_eq!((t.last_id, t.rows, t.items), (3, 1, 3));
    let t = s
        .forward_trim(Signal::Traces, 1, t.bytes + one)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((t.last_id, t.rows), (4, 2));
    assert_eq!(s.forward_max_id(Signal::Traces).await.unwrap(), 4);
    let stored = s.forward_cursor(Signal::Traces).await.unwrap().unwrap();
    assert_eq!((stored.last_id, stored.sent), (1, 3));
    assert!(s.forward_read_logs(0, 10).await.unwrap().is_none());
    s.shutdown().await;
}
