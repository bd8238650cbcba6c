//! Telemetry storage tests on real SQLite files: round trips, deduplication, search,
//! logs, metrics, back-pressure, size cap, retention, durability before ack.

#![allow(missing_docs, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use stallwatch_storage::config::CONTROL_RESERVE_BYTES;
use stallwatch_storage::model::*;
use stallwatch_storage::telemetry::{QueryError, RefusedReason, StatusFilter, TraceQuery};
use stallwatch_storage::{MetricsSource, Storage, StorageConfig, StorageError, WriteError};

fn config(dir: &tempfile::TempDir) -> StorageConfig {
    let mut c = StorageConfig::new(dir.path().join("stallwatch.db"));
    c.retention_interval = Duration::from_secs(3600);
    c
}

fn tid(n: u8) -> TraceId {
    TraceId([n; 16])
}
fn sid(n: u8) -> SpanId {
    SpanId([n; 8])
}

fn span(t: TraceId, s: SpanId, name: &str, start: u64, end: u64) -> Span {
    Span {
        trace_id: t,
        span_id: s,
        name: name.into(),
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        ..Default::default()
    }
}

fn resource(service: Option<&str>) -> Resource {
    Resource {
        attributes: service
            .map(|s| vec![KeyValue::new("service.name", AnyValue::String(s.into()))])
            .unwrap_or_default(),
        ..Default::default()
    }
}

fn batch(service: Option<&str>, spans: Vec<Span>) -> Arc<TraceBatch> {
    Arc::new(TraceBatch {
        resource_spans: vec![ResourceSpans {
            resource: resource(service),
            scope_spans: vec![ScopeSpans {
                scope: Scope {
                    name: "test".into(),
                    ..Default::default()
                },
                spans,
            }],
        }],
    })
}

/// Byte-exact comparison (NaN == NaN when the bits agree).
fn same<T: serde::Serialize>(a: &T, b: &T) -> bool {
    postcard::to_allocvec(a).unwrap() == postcard::to_allocvec(b).unwrap()
}

fn rich_span() -> Span {
    let nested = AnyValue::KvList(vec![
        KeyValue::new(
            "arr",
            AnyValue::Array(vec![
                AnyValue::Int(i64::MIN),
                AnyValue::Double(f64::NAN),
                AnyValue::Array(vec![AnyValue::Empty, AnyValue::Bool(false)]),
            ]),
        ),
        KeyValue::new("bytes", AnyValue::Bytes(vec![0, 255, 7])),
    ]);
    Span {
        trace_id: TraceId([0xab; 16]),
        span_id: SpanId([0xcd; 8]),
        parent_span_id: Some(SpanId([0xef; 8])),
        trace_state: "vendor=1,other=2".into(),
        flags: 0x301,
        name: "tools/call run_notebook".into(),
        kind: 3,
        start_time_unix_nano: u64::MAX - 5,
        end_time_unix_nano: 1000, // end before start: kept raw
        attributes: vec![
            KeyValue::new("gen_ai.tool.name", AnyValue::String("run_notebook".into())),
            KeyValue::new("nan", AnyValue::Double(f64::NAN)),
            KeyValue::new("inf", AnyValue::Double(f64::INFINITY)),
            KeyValue::new("ninf", AnyValue::Double(f64::NEG_INFINITY)),
            KeyValue::new("max", AnyValue::Int(i64::MAX)),
            KeyValue::new("min", AnyValue::Int(i64::MIN)),
            KeyValue::new("nested", nested),
            KeyValue::new("empty", AnyValue::Empty),
        ],
        dropped_attributes_count: 3,
        events: vec![Event {
            time_unix_nano: 42,
            name: "exception".into(),
            attributes: vec![KeyValue::new(
                "exception.type",
                AnyValue::String("E".into()),
            )],
            dropped_attributes_count: 1,
        }],
        dropped_events_count: 4,
        links: vec![Link {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([2; 8]),
            trace_state: "k=v".into(),
            attributes: vec![KeyValue::new("l", AnyValue::Int(-1))],
            dropped_attributes_count: 5,
            flags: 0x101,
        }],
        dropped_links_count: 6,
        status: Status {
            code: 77,
            message: "odd code kept raw".into(),
        },
    }
}

#[tokio::test]
async fn rich_span_round_trips_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(config(&dir)).unwrap();
    let s = rich_span();
    let b = Arc::new(TraceBatch {
        resource_spans: vec![ResourceSpans {
            resource: Resource {
                attributes: vec![KeyValue::new("host.name", AnyValue::String("h".into()))],
                dropped_attributes_count: 9,
                schema_url: "https://opentelemetry.io/schemas/1.37.0".into(),
            },
            scope_spans: vec![ScopeSpans {
                scope: Scope {
                    name: "scope".into(),
                    version: "1.2".into(),
                    attributes: vec![KeyValue::new("sa", AnyValue::Double(-0.0))],
                    dropped_attributes_count: 2,
                    schema_url: "https://example.com/scope-schema".into(),
                },
                spans: vec![s.clone()],
            }],
        }],
    });
    storage.write_traces(b.clone()).await.unwrap();
    let view = storage.trace(s.trace_id).await.unwrap().unwrap();
    assert_eq!(view.spans.len(), 1);
    let got = &view.spans[0];
    assert!(same(&got.span, &s), "span differs: {:?}", got.span);
    assert!(same(&*got.resource, &b.resource_spans[0].resource));
    assert!(same(&*got.scope, &b.resource_spans[0].scope_spans[0].scope));
    assert_eq!(got.state, SpanState::Ended);
    assert!(got.received_unix_nano > 0);
    assert_eq!(got.span.duration_ns(), Some(0));
    let one = storage.span(s.trace_id, s.span_id).await.unwrap().unwrap();
    assert!(same(&one.span, &s));
    assert!(storage.span(s.trace_id, sid(99)).await.unwrap().is_none());

    // a resource without service.name is unknown_service in summaries
    let page = storage
        .search_traces(TraceQuery {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].root_service, UNKNOWN_SERVICE);
    assert_eq!(
        storage.services(None, 1000).await.unwrap().items,
        vec![UNKNOWN_SERVICE.to_string()]
    );
    assert_eq!(
        storage.integrity_check().await.unwrap(),
        vec!["ok".to_string()]
    );
    storage.shutdown().await;
}

/// Stored trace payloads are zstd frames (issue 16); rows written by earlier versions hold
/// the same bytes uncompressed, and every read (trace view, one span, a search that scans
/// span attributes) answers the same from either.
#[tokio::test]
async fn payloads_stored_compressed_and_uncompressed_read_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let t = tid(0x51);
    let spans: Vec<Span> = (0..300u16)
        .map(|i| {
            let mut s = span(
                t,
                SpanId([i as u8, (i >> 8) as u8, 5, 5, 5, 5, 5, 5]),
                "cell",
                10,
                20,
            );
            s.attributes = vec![KeyValue::new(
                "workbench.cell",
                AnyValue::String(format!("c-{i}")),
            )];
            s
        })
        .collect();
    let storage = Storage::open(cfg.clone()).unwrap();
    storage
        .write_traces(batch(Some("kernel"), spans))
        .await
        .unwrap();
    let reads = |storage: Storage| async move {
        let view = storage.trace(t).await.unwrap().unwrap();
        let mut names: Vec<(Vec<u8>, String)> = view
            .spans
            .iter()
            .map(|s| (s.span.span_id.0.to_vec(), postcard_hex(&s.span)))
            .collect();
        names.sort();
        let one = storage
            .span(t, SpanId([7, 0, 5, 5, 5, 5, 5, 5]))
            .await
            .unwrap()
            .unwrap();
        let found = cell_traces(&storage, "c-299").await;
        let missing = cell_traces(&storage, "c-300").await;
        storage.shutdown().await;
        (names, postcard_hex(&one.span), found, missing)
    };
    let compressed = reads(storage).await;
    assert_eq!(compressed.0.len(), 300);
    assert_eq!((compressed.2, compressed.3), (1, 0));

    // rewrite the row as an earlier version stored it: the raw payload
    let conn = rusqlite::Connection::open(&cfg.path).unwrap();
    let stored: Vec<u8> = conn
        .query_row("SELECT payload FROM span_batches", [], |r| r.get(0))
        .unwrap();
    assert_eq!(stored[..4], [0x28, 0xB5, 0x2F, 0xFD], "a zstd frame");
    let raw = zstd::decode_all(stored.as_slice()).unwrap();
    assert!(
        stored.len() * 2 < raw.len(),
        "{} bytes stored for {} raw",
        stored.len(),
        raw.len()
    );
    conn.execute("UPDATE span_batches SET payload = ?1", [&raw])
        .unwrap();
    drop(conn);
    let uncompressed = reads(Storage::open(cfg).unwrap()).await;
    assert_eq!(uncompressed, compressed);
}

/// Traces found by the attribute `workbench.cell` = `cell` (a search that scans span
/// payloads: the key is not an indexed term).
async fn cell_traces(storage: &Storage, cell: &str) -> usize {
    storage
        .search_traces(TraceQuery {
            attributes: vec![("workbench.cell".into(), cell.into())],
            start_min_unix_nano: Some(0),
            start_max_unix_nano: Some(1_000),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .items
        .len()
}

fn postcard_hex<T: serde::Serialize>(v: &T) -> String {
    hex::encode(postcard::to_allocvec(v).unwrap())
}

#[tokio::test]
async fn committed_before_ack_is_visible_from_a_fresh_connection() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let storage = Storage::open(cfg.clone()).unwrap();
    for i in 0..20u8 {
        storage
            .write_traces(batch(
                Some("svc"),
                vec![span(tid(i + 1), sid(1), "a", 10, 20)],
            ))
            .await
            .unwrap();
        let conn = rusqlite::Connection::open(&cfg.path).unwrap();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM span_batches", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, i as i64 + 1);
    }
    assert_eq!(storage.telemetry_stats().spans_committed(), 20);
    // no shutdown: the data must already be on disk for a new process
    drop(storage);
    let again = Storage::open(cfg).unwrap();
    assert_eq!(again.trace(tid(20)).await.unwrap().unwrap().spans.len(), 1);
    again.shutdown().await;
}

async fn names_of(storage: &Storage, t: TraceId) -> Vec<(String, SpanState)> {
    storage
        .trace(t)
        .await
        .unwrap()
        .unwrap()
        .spans
        .iter()
        .map(|s| (s.span.name.clone(), s.state))
        .collect()
}

#[tokio::test]
async fn dedup_rules() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(config(&dir)).unwrap();
    let t = tid(1);
    // open then ended: ended wins
    storage
        .write_traces(batch(Some("s"), vec![span(t, sid(1), "open", 10, 0)]))
        .await
        .unwrap();
    assert_eq!(
        names_of(&storage, t).await,
        vec![("open".into(), SpanState::Open)]
    );
    storage
        .write_traces(batch(Some("s"), vec![span(t, sid(1), "ended", 10, 50)]))
        .await
        .unwrap();
    assert_eq!(
        names_of(&storage, t).await,
        vec![("ended".into(), SpanState::Ended)]
    );
    // ended then open: ended stays
    storage
        .write_traces(batch(Some("s"), vec![span(t, sid(1), "late open", 10, 0)]))
        .await
        .unwrap();
    // two ended: the first wins
    storage
        .write_traces(batch(
            Some("s"),
            vec![span(t, sid(1), "second ended", 10, 70)],
        ))
        .await
        .unwrap();
    assert_eq!(
        names_of(&storage, t).await,
        vec![("ended".into(), SpanState::Ended)]
    );
    // inside one request: open + ended copies → ended; two ended → first
    storage
        .write_traces(batch(
            Some("s"),
            vec![
                span(t, sid(2), "o", 11, 0),
                span(t, sid(2), "e1", 11, 30),
                span(t, sid(2), "e2", 11, 40),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        names_of(&storage, t).await,
        vec![
            ("ended".into(), SpanState::Ended),
            ("e1".into(), SpanState::Ended)
        ]
    );
    // whole re-send: nothing new
    let req = batch(
        Some("s"),
        vec![
            span(t, sid(3), "x", 12, 20),
            span(tid(2), sid(1), "y", 5, 6),
        ],
    );
    storage.write_traces(req.clone()).await.unwrap();
    let page = |s: Storage| async move {
        s.search_traces(TraceQuery {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
    };
    let before = page(storage.clone()).await;
    let committed = storage.telemetry_stats().spans_committed();
    let conn = rusqlite::Connection::open(storage.path()).unwrap();
    let batches = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT count(*) FROM span_batches", [], |r| r.get(0))
            .unwrap()
    };
    let nb = batches(&conn);
    storage.write_traces(req.clone()).await.unwrap();
    storage.write_traces(req).await.unwrap();
    assert_eq!(batches(&conn), nb, "a re-sent request stored a batch");
    assert_eq!(storage.telemetry_stats().spans_committed(), committed);
    assert!(storage.telemetry_stats().spans_deduplicated() >= 4);
    let after = page(storage.clone()).await;
    assert_eq!(before, after);
    let t1 = after.items.iter().find(|i| i.trace_id == t).unwrap();
    assert_eq!((t1.span_count, t1.open_count), (3, 0));
    storage.shutdown().await;
}

/// A request written in chunks (issue 17 #14) is one request: every chunk is its own
/// `span_batches` row, all committed in one transaction, deduplicated across chunks as
/// across requests, and a re-send of the whole request stores nothing.
#[tokio::test]
async fn a_request_in_chunks_is_stored_whole_and_deduplicated_across_chunks() {
    use stallwatch_storage::telemetry::TraceChunk;
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(config(&dir)).unwrap();
    let t = tid(7);
    let chunks = |names: [&str; 3]| {
        vec![
            // sid(1) open here, ended in the next chunk: the ended copy wins
            TraceChunk::encode(&batch(
                Some("s"),
                vec![
                    span(t, sid(1), names[0], 10, 0),
                    span(t, sid(2), "two", 10, 20),
                ],
            ))
            .unwrap(),
            TraceChunk::encode(&batch(
                Some("s"),
                vec![
                    span(t, sid(1), names[1], 10, 30),
                    span(t, sid(3), "three", 10, 20),
                ],
            ))
            .unwrap(),
            // sid(2) again, ended: the first ended copy (chunk 1) wins
            TraceChunk::encode(&batch(Some("s"), vec![span(t, sid(2), names[2], 10, 40)])).unwrap(),
        ]
    };
    let conn = rusqlite::Connection::open(storage.path()).unwrap();
    let batches = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT count(*) FROM span_batches", [], |r| r.get(0))
            .unwrap()
    };
    storage
        .write_trace_chunks(chunks(["open", "ended", "two again"]))
        .await
        .unwrap();
    assert_eq!(batches(&conn), 2, "chunk 3 held only a duplicate");
    let mut names = names_of(&storage, t).await;
    names.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        names,
        vec![
            ("ended".into(), SpanState::Ended),
            ("three".into(), SpanState::Ended),
            ("two".into(), SpanState::Ended),
        ]
    );
    let committed = storage.telemetry_stats().spans_committed();
    storage
        .write_trace_chunks(chunks(["open", "ended", "two again"]))
        .await
        .unwrap();
    assert_eq!(
        batches(&conn),
        2,
        "a re-sent chunked request stored a batch"
    );
    assert_eq!(storage.telemetry_stats().spans_committed(), committed);
    // An empty request stores nothing and answers at once.
    storage.write_trace_chunks(Vec::new()).await.unwrap();
    storage.shutdown().await;
}

fn tool_span(t: TraceId, s: SpanId, tool: &str, start: u64, dur: u64, error: bool) -> Span {
    let mut sp = span(t, s, &format!("tools/call {tool}"), start, start + dur);
    sp.attributes = vec![
        KeyValue::new("gen_ai.tool.name", AnyValue::String(tool.into())),
        KeyValue::new("custom.key", AnyValue::String(format!("v-{tool}"))),
    ];
    if error {
        sp.status.code = STATUS_ERROR;
        sp.attributes.push(KeyValue::new(
            "error.type",
            AnyValue::String("timeout".into()),
        ));
    }
    sp
}

#[tokio::test]
async fn search_filters_and_paging() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(config(&dir)).unwrap();
    // trace 1: svc-a read_file ok, 10 ns; trace 2: svc-b run_notebook error 1000 ns;
    // trace 3: svc-a run_notebook ok 500 ns, pid 42
    storage
        .write_traces(batch(
            Some("svc-a"),
            vec![tool_span(tid(1), sid(1), "read_file", 100, 10, false)],
        ))
        .await
        .unwrap();
    storage
        .write_traces(batch(
            Some("svc-b"),
            vec![tool_span(tid(2), sid(1), "run_notebook", 200, 1000, true)],
        ))
        .await
        .unwrap();
    let mut b3 = (*batch(
        Some("svc-a"),
        vec![tool_span(tid(3), sid(1), "run_notebook", 300, 500, false)],
    ))
    .clone();
    b3.resource_spans[0]
        .resource
        .attributes
        .push(KeyValue::new("process.pid", AnyValue::Int(42)));
    storage.write_traces(Arc::new(b3)).await.unwrap();

    let ids = |q: TraceQuery| {
        let storage = storage.clone();
        async move {
            let mut q = q;
            q.limit = 100;
            storage
                .search_traces(q)
                .await
                .unwrap()
                .items
                .iter()
                .map(|i| i.trace_id.0[0])
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(ids(TraceQuery::default()).await, vec![3, 2, 1]);
    assert_eq!(
        ids(TraceQuery {
            service: Some("svc-a".into()),
            ..Default::default()
        })
        .await,
        vec![3, 1]
    );
    assert_eq!(
        ids(TraceQuery {
            service: Some("nope".into()),
            ..Default::default()
        })
        .await,
        Vec::<u8>::new()
    );
    assert_eq!(
        ids(TraceQuery {
            tool_name: Some("run_notebook".into()),
            ..Default::default()
        })
        .await,
        vec![3, 2]
    );
    assert_eq!(
        ids(TraceQuery {
            span_name: Some("tools/call read_file".into()),
            ..Default::default()
        })
        .await,
        vec![1]
    );
    assert_eq!(
        ids(TraceQuery {
            status: Some(StatusFilter::Error),
            ..Default::default()
        })
        .await,
        vec![2]
    );
    assert_eq!(
        ids(TraceQuery {
            status: Some(StatusFilter::Unset),
            ..Default::default()
        })
        .await,
        vec![3, 1]
    );
    assert_eq!(
        ids(TraceQuery {
            status: Some(StatusFilter::Ok),
            ..Default::default()
        })
        .await,
        Vec::<u8>::new()
    );
    assert_eq!(
        ids(TraceQuery {
            min_duration_ns: Some(500),
            ..Default::default()
        })
        .await,
        vec![3, 2]
    );
    assert_eq!(
        ids(TraceQuery {
            start_min_unix_nano: Some(150),
            start_max_unix_nano: Some(300),
            ..Default::default()
        })
        .await,
        vec![2]
    );
    assert_eq!(
        ids(TraceQuery {
            attribute: Some(("process.pid".into(), "42".into())),
            ..Default::default()
        })
        .await,
        vec![3]
    );
    assert_eq!(
        ids(TraceQuery {
            attribute: Some(("error.type".into(), "timeout".into())),
            ..Default::default()
        })
        .await,
        vec![2]
    );
    // combined filters must all hold on one span
    assert_eq!(
        ids(TraceQuery {
            service: Some("svc-a".into()),
            tool_name: Some("run_notebook".into()),
            ..Default::default()
        })
        .await,
        vec![3]
    );
    assert_eq!(
        ids(TraceQuery {
            service: Some("svc-b".into()),
            tool_name: Some("read_file".into()),
            ..Default::default()
        })
        .await,
        Vec::<u8>::new()
    );
    // non-indexed key: needs a time range
    let err = storage
        .search_traces(TraceQuery {
            attribute: Some(("custom.key".into(), "v-read_file".into())),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, QueryError::NeedsTimeRange(k) if k == "custom.key"));
    assert_eq!(
        ids(TraceQuery {
            attribute: Some(("custom.key".into(), "v-read_file".into())),
            start_min_unix_nano: Some(0),
            start_max_unix_nano: Some(1000),
            ..Default::default()
        })
        .await,
        vec![1]
    );
    let bad = storage
        .search_traces(TraceQuery {
            cursor: Some("zz".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(bad, QueryError::BadCursor));
    // summary fields
    let page = storage
        .search_traces(TraceQuery {
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let s = &page.items[0];
    assert_eq!(
        (s.root_service.as_str(), s.root_name.as_str()),
        ("svc-a", "tools/call run_notebook")
    );
    assert_eq!(
        (
            s.start_time_unix_nano,
            s.end_time_unix_nano,
            s.span_count,
            s.error_count
        ),
        (300, 800, 1, 0)
    );

    // services and span names, a page at a time
    let all = storage.services(None, 1000).await.unwrap();
    assert_eq!(all.items, vec!["svc-a".to_string(), "svc-b".to_string()]);
    assert_eq!(all.next_cursor, None);
    let first = storage.services(None, 1).await.unwrap();
    assert_eq!(first.items, vec!["svc-a".to_string()]);
    assert_eq!(first.next_cursor.as_deref(), Some("svc-a"));
    let second = storage.services(first.next_cursor, 1).await.unwrap();
    assert_eq!(
        (second.items, second.next_cursor),
        (vec!["svc-b".to_string()], None)
    );
    let names = storage
        .span_names(Some("svc-a".into()), None, 1000)
        .await
        .unwrap();
    assert_eq!(
        names.items,
        vec![
            "tools/call read_file".to_string(),
            "tools/call run_notebook".to_string()
        ]
    );
    // one service's names, paged: the cursor is the name, not the stored pair
    let one = storage
        .span_names(Some("svc-a".into()), None, 1)
        .await
        .unwrap();
    assert_eq!(one.next_cursor.as_deref(), Some("tools/call read_file"));
    let two = storage
        .span_names(Some("svc-a".into()), one.next_cursor, 1)
        .await
        .unwrap();
    assert_eq!(
        (two.items, two.next_cursor),
        (vec!["tools/call run_notebook".to_string()], None)
    );
    assert_eq!(
        storage
            .span_names(None, None, 1000)
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    storage.shutdown().await;
}

#[tokio::test]
async fn paging_walks_every_trace_once() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(config(&dir)).unwrap();
    // 30 traces over 10 requests, one trace also updated later (open → ended)
    for r in 0..10u8 {
        let spans = (0..3u8)
            .map(|k| {
                span(
                    tid(r * 3 + k + 1),
                    sid(1),
                    "op",
                    100,
                    if r * 3 + k == 4 { 0 } else { 200 },
                )
            })
            .collect();
        storage.write_traces(batch(Some("s"), spans)).await.unwrap();
    }
    storage
        .write_traces(batch(Some("s"), vec![span(tid(5), sid(1), "op", 100, 300)]))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = storage
            .search_traces(TraceQuery {
                limit: 4,
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.items.len() <= 4);
        seen.extend(page.items.iter().map(|i| i.trace_id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen.len(), 30, "{seen:?}");
    let mut uniq = seen.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), 30);
    assert_eq!(seen[0], tid(5), "the updated trace is the newest");
    storage.shutdown().await;
}

fn log(trace: Option<TraceId>, span: Option<SpanId>, body: &str, time: u64) -> LogRecord {
    LogRecord {
        time_unix_nano: time,
        observed_time_unix_nano: time + 1,
        severity_number: 9,
        severity_text: "INFO".into(),
        body: AnyValue::String(body.into()),
        attributes: vec![KeyValue::new("d", AnyValue::Double(f64::NAN))],
        trace_id: trace,
        span_id: span,
        event_name: "ev".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn logs_are_linked_to_their_trace() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(config(&dir)).unwrap();
    storage
        .write_traces(batch(Some("s"), vec![span(tid(1), sid(1), "a", 1, 2)]))
        .await
        .unwrap();
    let logs = Arc::new(LogBatch {
        resource_logs: vec![ResourceLogs {
            resource: resource(Some("s")),
            scope_logs: vec![ScopeLogs {
                scope: Scope::default(),
                log_records: vec![
                    log(Some(tid(1)), Some(sid(1)), "second", 20),
                    log(Some(tid(1)), Some(sid(1)), "first", 10),
                    log(None, None, "unlinked", 5),
                    log(Some(tid(9)), None, "log only trace", 7),
                ],
            }],
        }],
    });
    storage.write_logs(logs.clone()).await.unwrap();
    let view = storage.trace(tid(1)).await.unwrap().unwrap();
    let bodies: Vec<_> = view.logs.iter().map(|l| l.record.body.clone()).collect();
    assert_eq!(
        bodies,
        vec![
            AnyValue::String("first".into()),
            AnyValue::String("second".into())
        ]
    );
    assert!(same(
        &view.logs[0].record,
        &logs.resource_logs[0].scope_logs[0].log_records[1]
    ));
    assert_eq!(view.logs[0].resource.service_name(), "s");
    let only = storage.trace(tid(9)).await.unwrap().unwrap();
    assert!(only.spans.is_empty());
    assert_eq!(only.logs.len(), 1);
    assert!(storage.trace(tid(8)).await.unwrap().is_none());
    assert_eq!(storage.telemetry_stats().logs_committed(), 4);
    storage.shutdown().await;
}

#[tokio::test]
async fn metric_points_are_stored() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(config(&dir)).unwrap();
    let point = |name: &str, v: f64| MetricPoint {
        name: name.into(),
        description: "d".into(),
        unit: "ms".into(),
        kind: MetricKind::Gauge,
        start_time_unix_nano: 0,
        time_unix_nano: u64::MAX,
        value: Some(v),
        count: Some(u64::MAX),
        sum: Some(f64::NEG_INFINITY),
        attributes: vec![],
        detail: "{\"as_int\":\"9223372036854775807\"}".into(),
    };
    let b = Arc::new(MetricBatch {
        resource_metrics: vec![ResourceMetrics {
            resource: resource(Some("m")),
            scope_metrics: vec![ScopeMetrics {
                scope: Scope::default(),
                points: vec![
                    point("a", f64::NAN),
                    point("b", 1.5),
                    point("a", f64::INFINITY),
                ],
            }],
        }],
    });
    storage.write_metrics(b.clone()).await.unwrap();
    let a = storage.metric_points(Some("a".into()), 10).await.unwrap();
    assert_eq!(a.len(), 2);
    assert!(same(
        &a[0].point,
        &b.resource_metrics[0].scope_metrics[0].points[2]
    ));
    assert!(a[1].point.value.unwrap().is_nan());
    assert_eq!(a[1].point.count, Some(u64::MAX));
    assert_eq!(storage.metric_points(None, 10).await.unwrap().len(), 3);
    assert_eq!(storage.telemetry_stats().points_committed(), 3);
    storage.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_is_answered_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.queue_capacity = 2;
    cfg.busy_timeout = Duration::from_secs(120);
    let storage = Storage::open(cfg.clone()).unwrap();
    // hold the write lock from another connection: the writer blocks in BEGIN IMMEDIATE
    let blocker = rusqlite::Connection::open(&cfg.path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let send = |i: u8| {
        let s = storage.clone();
        tokio::spawn(async move {
            s.write_traces(batch(Some("s"), vec![span(tid(i), sid(1), "a", 1, 2)]))
                .await
        })
    };
    let wait_depth = |n: usize| {
        let s = storage.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while s.queue_depth() != n {
                assert!(Instant::now() < deadline, "queue depth never reached {n}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let first = send(1);
    // the writer took the first one and is stuck on the lock
    tokio::time::sleep(Duration::from_millis(50)).await;
    wait_depth(0).await;
    let second = send(2);
    let third = send(3);
    wait_depth(2).await;
    let t0 = Instant::now();
    let refused = storage
        .write_traces(batch(Some("s"), vec![span(tid(4), sid(1), "a", 1, 2)]))
        .await;
    assert!(
        matches!(refused, Err(WriteError::QueueFull { capacity: 2 })),
        "{refused:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(
        storage.telemetry_stats().refused(RefusedReason::QueueFull),
        1
    );
    blocker.execute_batch("COMMIT").unwrap();
    for h in [first, second, third] {
        h.await.unwrap().unwrap();
    }
    assert_eq!(storage.telemetry_stats().spans_committed(), 3);
    let mut text = String::new();
    storage.telemetry_stats().render_prometheus(&mut text);
    assert!(
        text.contains("stallwatch_storage_writes_refused_total{reason=\"queue_full\"} 1"),
        "{text}"
    );
    assert!(text.contains("stallwatch_storage_spans_committed_total 3"));
    assert!(text.contains("stallwatch_storage_commit_duration_seconds_count"));
    storage.shutdown().await;
}

fn big_batch(seed: u8, n: usize) -> Arc<TraceBatch> {
    let spans = (0..n)
        .map(|i| {
            let mut s = span(
                TraceId([
                    seed,
                    (i / 8) as u8,
                    (i / 2048) as u8,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                ]),
                SpanId([(i % 256) as u8, (i / 256) as u8, seed, 1, 1, 1, 1, 1]),
                "bulk",
                1_000 + i as u64,
                2_000 + i as u64,
            );
            s.attributes = vec![KeyValue::new("blob", AnyValue::Bytes(noise(seed, i, 400)))];
            s
        })
        .collect();
    batch(Some("bulk"), spans)
}

/// `n` bytes no compressor shrinks (xorshift64 from `seed` and `i`): stored payloads are
/// zstd frames, and a repeated filler would take almost no room.
fn noise(seed: u8, i: usize, n: usize) -> Vec<u8> {
    let mut x = (u64::from(seed) << 32 | i as u64) ^ 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test]
async fn size_cap_refuses_then_recovers_after_retention() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.max_db_bytes = CONTROL_RESERVE_BYTES + 6 * 1024 * 1024;
    let budget = stallwatch_storage::config::telemetry_budget_bytes(cfg.max_db_bytes);
    let storage = Storage::open(cfg).unwrap();
    let mut full = storage.storage_full();
    assert!(full.borrow().is_none());
    // At the cap the oldest batches make room: every request that fits is accepted.
    for i in 0..20u8 {
        storage.write_traces(big_batch(i, 512)).await.unwrap();
    }
    assert!(storage
        .trace(big_batch(0, 1).resource_spans[0].scope_spans[0].spans[0].trace_id)
        .await
        .unwrap()
        .is_none());
    // A request larger than telemetry's whole budget cannot fit: refused, nothing deleted for it.
    let huge = big_batch(200, 8192);
    let mut got_full = false;
    match storage.write_traces(huge).await {
        Ok(()) => {}
        Err(WriteError::Full(reason)) => {
            assert!(!reason.is_empty());
            got_full = true;
        }
        Err(e) => panic!("unexpected {e}"),
    }
    assert!(got_full, "the size cap never refused a write");
    assert!(full.borrow_and_update().is_some());
    assert!(
        storage
            .telemetry_stats()
            .refused(RefusedReason::StorageFull)
            >= 1
    );
    let newest = big_batch(19, 1).resource_spans[0].scope_spans[0].spans[0].trace_id;
    assert!(
        storage.trace(newest).await.unwrap().is_some(),
        "the refusal deleted stored data"
    );
    let report = storage.run_retention().await.unwrap();
    assert!(report.bytes_after <= budget, "{report:?}");
    assert!(
        report.bytes_after <= (6 * 1024 * 1024) / 100 * 90 + 16384,
        "{report:?}"
    );
    storage.write_traces(big_batch(250, 64)).await.unwrap();
    assert!(full.borrow().is_none());
    assert_eq!(
        storage.integrity_check().await.unwrap(),
        vec!["ok".to_string()]
    );
    storage.shutdown().await;
}

#[tokio::test]
async fn retention_by_age_removes_everything_old() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.retention = Duration::from_millis(300);
    let storage = Storage::open(cfg).unwrap();
    storage
        .write_traces(batch(Some("old"), vec![span(tid(1), sid(1), "a", 1, 2)]))
        .await
        .unwrap();
    storage
        .write_logs(Arc::new(LogBatch {
            resource_logs: vec![ResourceLogs {
                resource: resource(Some("old")),
                scope_logs: vec![ScopeLogs {
                    scope: Scope::default(),
                    log_records: vec![log(Some(tid(1)), None, "l", 1)],
                }],
            }],
        }))
        .await
        .unwrap();
    // retention compares stored receive times with the wall clock: wait past the limit
    tokio::time::sleep(Duration::from_millis(600)).await;
    storage
        .write_traces(batch(Some("new"), vec![span(tid(2), sid(1), "b", 1, 2)]))
        .await
        .unwrap();
    let report = storage.run_retention().await.unwrap();
    assert_eq!(
        (
            report.batches_deleted,
            report.spans_deleted,
            report.logs_deleted
        ),
        (1, 1, 1),
        "{report:?}"
    );
    assert_eq!(report.traces_deleted, 1, "{report:?}");
    assert!(storage.trace(tid(1)).await.unwrap().is_none());
    assert!(storage.trace(tid(2)).await.unwrap().is_some());
    assert_eq!(
        storage.services(None, 1000).await.unwrap().items,
        vec!["new".to_string()]
    );
    let page = storage
        .search_traces(TraceQuery {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(
        storage.integrity_check().await.unwrap(),
        vec!["ok".to_string()]
    );
    storage.shutdown().await;
}

/// A trace first stored after the last merge is deduplicated against the unmerged batches
/// alone (no run can hold it, issue 16); once a merge moved it into a run, copies sent
/// again are found in the run, and so is every later copy.
#[tokio::test]
async fn a_trace_continued_after_the_index_merge_is_deduplicated_against_its_run() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(config(&dir)).unwrap();
    let x = TraceId([7; 16]);
    let dups = || storage.telemetry_stats().spans_deduplicated();
    storage
        .write_traces(batch(Some("m"), vec![span(x, sid(1), "first", 5, 9)]))
        .await
        .unwrap();
    // Continued before the merge: a copy of span 1 is dropped, span 2 is new.
    storage
        .write_traces(batch(
            Some("m"),
            vec![
                span(x, sid(1), "again", 5, 9),
                span(x, sid(2), "second", 6, 9),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(dups(), 1);
    // 256 batches in all: the merge moves x into a run.
    for i in 0..254u32 {
        let b = i.to_le_bytes();
        let t = TraceId([b[0], b[1], 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]);
        storage
            .write_traces(batch(Some("m"), vec![span(t, sid(1), "other", 5, 9)]))
            .await
            .unwrap();
    }
    for round in 1..=3 {
        storage
            .write_traces(batch(
                Some("m"),
                vec![span(x, sid(1), "late", 5, 9), span(x, sid(2), "late", 6, 9)],
            ))
            .await
            .unwrap();
        assert_eq!(dups(), 1 + 2 * round, "round {round}");
    }
    assert_eq!(
        names_of(&storage, x).await,
        vec![
            ("first".into(), SpanState::Ended),
            ("second".into(), SpanState::Ended)
        ]
    );
    storage.shutdown().await;
}

/// A trace continued over many exports is deduplicated from what the writer keeps of it
/// (issue 16), and what it keeps goes with the batches retention deletes: a copy sent
/// again after its batches are gone is stored, not dropped as a duplicate.
#[tokio::test]
async fn a_continued_trace_is_stored_again_after_retention_deleted_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.retention = Duration::from_millis(300);
    let storage = Storage::open(cfg).unwrap();
    let y = TraceId([8; 16]);
    let dups = || storage.telemetry_stats().spans_deduplicated();
    for (s, name) in [(1, "a"), (2, "b"), (3, "c")] {
        storage
            .write_traces(batch(Some("m"), vec![span(y, sid(s), name, 5, 9)]))
            .await
            .unwrap();
    }
    storage
        .write_traces(batch(
            Some("m"),
            vec![span(y, sid(1), "dup", 5, 9), span(y, sid(4), "d", 5, 9)],
        ))
        .await
        .unwrap();
    assert_eq!(dups(), 1);
    assert_eq!(names_of(&storage, y).await.len(), 4);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let report = storage.run_retention().await.unwrap();
    assert_eq!(report.batches_deleted, 4);
    assert!(storage.trace(y).await.unwrap().is_none());
    storage
        .write_traces(batch(Some("m"), vec![span(y, sid(1), "again", 5, 9)]))
        .await
        .unwrap();
    assert_eq!(dups(), 1);
    assert_eq!(
        names_of(&storage, y).await,
        vec![("again".into(), SpanState::Ended)]
    );
    storage.shutdown().await;
}

#[tokio::test]
async fn traces_survive_the_index_merge_and_a_restart() {
    // more than one merge of the unmerged-batch map into trace_index (256 batches)
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let storage = Storage::open(cfg.clone()).unwrap();
    for i in 0..300u32 {
        let b = i.to_le_bytes();
        let t = TraceId([b[0], b[1], 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]);
        storage
            .write_traces(batch(Some("m"), vec![span(t, sid(1), "open", 5, 0)]))
            .await
            .unwrap();
    }
    let t0 = TraceId([0, 0, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]);
    // the ended copy of a merged trace still wins, a re-sent open copy is still dropped
    storage
        .write_traces(batch(Some("m"), vec![span(t0, sid(1), "ended", 5, 9)]))
        .await
        .unwrap();
    storage
        .write_traces(batch(Some("m"), vec![span(t0, sid(1), "open", 5, 0)]))
        .await
        .unwrap();
    assert_eq!(
        names_of(&storage, t0).await,
        vec![("ended".into(), SpanState::Ended)]
    );
    storage.shutdown().await;
    drop(storage);
    let storage = Storage::open(cfg).unwrap();
    storage
        .write_traces(batch(Some("m"), vec![span(t0, sid(1), "again", 5, 11)]))
        .await
        .unwrap();
    assert_eq!(
        names_of(&storage, t0).await,
        vec![("ended".into(), SpanState::Ended)]
    );
    let page = storage
        .search_traces(TraceQuery {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 300);
    assert_eq!(page.items[0].trace_id, t0);
    assert_eq!(page.items[0].open_count, 0);
    storage.shutdown().await;
}

/// The trace index as runs (schema migration 5): (run, lo, hi, units), oldest first.
fn trace_runs(path: &std::path::Path) -> Vec<(i64, i64, i64, i64)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut st = conn
        .prepare("SELECT run, lo, hi, units FROM trace_runs ORDER BY run")
        .unwrap();
    let rows = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap();
    rows.map(Result::unwrap).collect()
}

/// Every trace of the trace index as stored: (run, trace id, batch ids), in key order. A
/// form-1 row is one trace; a form-2 row (schema migration 7) is a block: `n` (u32 LE),
/// `n` trace ids, `n + 1` offsets (u32 LE) into the i64 LE batch lists that follow.
fn index_entries(conn: &rusqlite::Connection) -> Vec<(i64, [u8; 16], Vec<i64>)> {
    let le32 = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let list = |b: &[u8]| -> Vec<i64> {
        b.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let mut st = conn
        .prepare(
            "SELECT t.run, coalesce(r.form, 1), t.trace_id, t.batches
             FROM trace_index t LEFT JOIN trace_runs r ON r.run = t.run
             ORDER BY t.run, t.trace_id",
        )
        .unwrap();
    let rows: Vec<(i64, i64, Vec<u8>, Vec<u8>)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut out = Vec::new();
    for (run, form, first, b) in rows {
        if form != 2 {
            out.push((run, first.as_slice().try_into().unwrap(), list(&b)));
            continue;
        }
        let n = le32(&b, 0);
        let (offs, lists) = (4 + 16 * n, 4 + 16 * n + 4 * (n + 1));
        assert_eq!(
            &b[4..20],
            &first[..],
            "a block's row is keyed by its first trace"
        );
        for i in 0..n {
            let t: [u8; 16] = b[4 + 16 * i..20 + 16 * i].try_into().unwrap();
            let (a, z) = (le32(&b, offs + 4 * i), le32(&b, offs + 4 * i + 4));
            out.push((run, t, list(&b[lists + a..lists + z])));
        }
    }
    out
}

/// Batches whose term postings are not in `batch_terms` yet (schema migration 6).
fn pending_terms(path: &std::path::Path) -> Vec<i64> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut st = conn
        .prepare("SELECT batch_id FROM pending_terms ORDER BY batch_id")
        .unwrap();
    let rows = st.query_map([], |r| r.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

#[tokio::test]
async fn trace_index_runs_and_retention_drop_what_is_gone() {
    // one trace per batch, plus `long` with a span in every 50th batch
    fn own(i: u32) -> TraceId {
        let b = i.to_le_bytes();
        TraceId([b[0], b[1], 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7])
    }
    let long = TraceId([0xee; 16]);
    let req = |i: u32| {
        let mut spans = vec![span(own(i), sid(1), "own", 1, 2)];
        if i.is_multiple_of(50) {
            let b = i.to_le_bytes();
            spans.push(span(
                long,
                SpanId([b[0], b[1], 1, 1, 1, 1, 1, 1]),
                "long",
                1,
                2,
            ));
        }
        batch(Some("r"), spans)
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.retention = Duration::from_millis(1500);
    let storage = Storage::open(cfg.clone()).unwrap();
    for i in 0..200 {
        storage.write_traces(req(i)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1600)).await;
    for i in 200..300 {
        storage.write_traces(req(i)).await.unwrap();
    }
    // the first merge (256 batches) wrote run 1, covering old and new batches
    assert_eq!(trace_runs(&cfg.path), vec![(1, 1, 256, 1)]);
    let report = storage.run_retention().await.unwrap();
    assert_eq!(
        (report.batches_deleted, report.traces_deleted),
        (200, 200),
        "{report:?}"
    );
    // run 1 still covers live batches: kept, with the deleted batches' ids in it
    assert_eq!(trace_runs(&cfg.path), vec![(1, 1, 256, 1)]);
    // the term postings of batches 257..=300 still wait in pending_terms (migration 6)
    assert_eq!(pending_terms(&cfg.path), (257..=300).collect::<Vec<i64>>());
    assert!(storage.trace(own(0)).await.unwrap().is_none());
    assert!(storage.trace(own(199)).await.unwrap().is_none());
    assert!(storage.trace(own(200)).await.unwrap().is_some());
    assert_eq!(names_of(&storage, long).await.len(), 2);

    // three more merges: four runs of one merge each, none compacted
    for i in 300..1034 {
        storage.write_traces(req(i)).await.unwrap();
    }
    assert_eq!(
        trace_runs(&cfg.path),
        vec![
            (1, 1, 256, 1),
            (2, 257, 512, 1),
            (3, 513, 768, 1),
            (4, 769, 1024, 1)
        ]
    );
    assert_eq!(
        pending_terms(&cfg.path),
        (1025..=1034).collect::<Vec<i64>>()
    );
    let page = storage
        .search_traces(TraceQuery {
            service: Some("r".into()),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.items.len(),
        1034 - 200 + 1,
        "every live trace, by its service term"
    );
    {
        // each row written once: one per trace of a run's batches (`long` once per run);
        // run 1, partly deleted, keeps the deleted batches' ids, which readers skip
        let conn = rusqlite::Connection::open(&cfg.path).unwrap();
        let rows = index_entries(&conn);
        assert_eq!(
            rows.len(),
            4 * 257,
            "entries: 256 own traces and `long`, per run"
        );
        // in blocks: 257 traces of one batch each make 3 blocks (128 + 128 + 1) per run
        let stored: i64 = conn
            .query_row("SELECT count(*) FROM trace_index", [], |r| r.get(0))
            .unwrap();
        assert_eq!(stored, 4 * 3, "rows: blocks of at most 128 traces");
        let mut stale = 0;
        for (run, _, l) in &rows {
            for &id in l {
                let (lo, hi) = ((run - 1) * 256 + 1, run * 256);
                assert!((lo..=hi).contains(&id), "batch {id} in run {run}");
                stale += usize::from(id <= 200);
            }
        }
        assert_eq!(
            stale,
            200 + 4,
            "own(0..200) and `long` in 4 of those batches"
        );
    }
    // every copy of `long` is found across the runs and the unmerged batches, and a
    // re-sent copy from a merged batch is still a duplicate
    let long_spans = 2 + (300..1034u32).filter(|i| i.is_multiple_of(50)).count();
    assert_eq!(names_of(&storage, long).await.len(), long_spans);
    storage.write_traces(req(250)).await.unwrap();
    assert_eq!(names_of(&storage, long).await.len(), long_spans);
    assert_eq!(names_of(&storage, own(250)).await.len(), 1);
    storage.shutdown().await;
    drop(storage);

    let storage = Storage::open(cfg.clone()).unwrap();
    assert_eq!(names_of(&storage, long).await.len(), long_spans);
    // the trace-id filter rebuilt at start holds the traces of every run's blocks: a
    // re-sent merged batch is still found and dropped as duplicates
    let dups = storage.telemetry_stats().spans_deduplicated();
    storage.write_traces(req(250)).await.unwrap();
    assert_eq!(names_of(&storage, long).await.len(), long_spans);
    assert_eq!(names_of(&storage, own(250)).await.len(), 1);
    assert!(storage.telemetry_stats().spans_deduplicated() > dups);
    for i in [200, 600, 1023, 1024, 1033] {
        assert_eq!(names_of(&storage, own(i)).await.len(), 1, "trace {i}");
    }
    assert_eq!(
        storage.integrity_check().await.unwrap(),
        vec!["ok".to_string()]
    );
    storage.shutdown().await;
}

/// Four merges leave four runs, each row written once; rows of a run `trace_runs` does
/// not name (what a compaction of an earlier version left when a crash cut it short) are
/// deleted at the next start, and the next run id does not collide with them.
#[tokio::test]
async fn runs_of_merges_and_an_orphan_run_left_by_a_crash() {
    const PER_BATCH: u32 = 20;
    fn t(i: u32) -> TraceId {
        let b = i.to_le_bytes();
        TraceId([b[0], b[1], b[2], 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9])
    }
    let req = |b: u32| {
        let spans = (0..PER_BATCH)
            .map(|k| span(t(b * PER_BATCH + k), sid(1), "s", 1, 2))
            .collect();
        batch(Some("slices"), spans)
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let storage = Storage::open(cfg.clone()).unwrap();
    for b in 0..1030 {
        storage.write_traces(req(b)).await.unwrap();
    }
    storage.run_retention().await.unwrap();
    // four merges of 256 batches: four runs, none compacted
    let four = vec![
        (1, 1, 256, 1),
        (2, 257, 512, 1),
        (3, 513, 768, 1),
        (4, 769, 1024, 1),
    ];
    assert_eq!(trace_runs(&cfg.path), four);
    let conn = rusqlite::Connection::open(&cfg.path).unwrap();
    let entries: i64 = conn
        .query_row("SELECT sum(entries) FROM trace_runs", [], |r| r.get(0))
        .unwrap();
    let stored = index_entries(&conn);
    assert_eq!(
        (stored.len() as i64, entries),
        (1024 * 20, 1024 * 20),
        "each trace once"
    );
    drop(conn);
    for b in [0, 511, 1023, 1029] {
        assert_eq!(names_of(&storage, t(b * PER_BATCH)).await.len(), 1, "{b}");
        assert_eq!(
            names_of(&storage, t(b * PER_BATCH + PER_BATCH - 1))
                .await
                .len(),
            1,
            "{b}"
        );
    }
    storage.shutdown().await;
    drop(storage);

    // a compaction's partial output (run 5, never named in trace_runs) left by a crash
    // of an earlier version
    let conn = rusqlite::Connection::open(&cfg.path).unwrap();
    conn.execute(
        "INSERT INTO trace_index(run, trace_id, batches) VALUES (5, ?1, ?2)",
        rusqlite::params![&t(0).0[..], 7i64.to_le_bytes().to_vec()],
    )
    .unwrap();
    drop(conn);
    let storage = Storage::open(cfg.clone()).unwrap();
    let conn = rusqlite::Connection::open(&cfg.path).unwrap();
    let orphans: i64 = conn
        .query_row("SELECT count(*) FROM trace_index WHERE run = 5", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(
        orphans, 0,
        "the orphan run's rows are gone after the restart"
    );
    drop(conn);
    assert_eq!(names_of(&storage, t(0)).await.len(), 1);
    for b in 1030..1280 {
        storage.write_traces(req(b)).await.unwrap();
    }
    // the merge runs after the last write is answered
    storage.run_retention().await.unwrap();
    // the next merge gets run 5 again, now the only one of that id
    let mut five = four;
    five.push((5, 1025, 1280, 1));
    assert_eq!(trace_runs(&cfg.path), five);
    assert_eq!(names_of(&storage, t(1279 * PER_BATCH)).await.len(), 1);
    assert_eq!(
        storage.integrity_check().await.unwrap(),
        vec!["ok".to_string()]
    );
    storage.shutdown().await;
}

/// Runs are not compacted: four runs of 1 merge and four runs of 4 (as earlier versions,
/// which compacted, left them) are left as they are, a lookup seeking each.
#[tokio::test]
async fn runs_are_not_compacted() {
    for units in [1i64, 4] {
        let expect: Vec<(i64, i64, i64, i64)> = (1..=4).map(|r| (r, 0, 0, units)).collect();
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(&dir);
        let storage = Storage::open(cfg.clone()).unwrap();
        storage
            .write_traces(batch(Some("u"), vec![span(tid(1), sid(1), "s", 1, 2)]))
            .await
            .unwrap();
        storage.shutdown().await;
        drop(storage);
        // four runs of `units` merges each, as older merges would have left them; each
        // names trace tid(1) in batch 1
        let conn = rusqlite::Connection::open(&cfg.path).unwrap();
        for run in 1..=4i64 {
            conn.execute(
                "INSERT INTO trace_runs(run, lo, hi, units, entries) VALUES (?1, 0, 0, ?2, 1)",
                rusqlite::params![run, units],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO trace_index(run, trace_id, batches) VALUES (?1, ?2, ?3)",
                rusqlite::params![run, &tid(1).0[..], 1i64.to_le_bytes().to_vec()],
            )
            .unwrap();
        }
        drop(conn);
        let storage = Storage::open(cfg.clone()).unwrap();
        // served after the writer started
        storage.run_retention().await.unwrap();
        assert_eq!(trace_runs(&cfg.path), expect, "runs of {units} merges");
        assert_eq!(names_of(&storage, tid(1)).await.len(), 1);
        storage.shutdown().await;
    }
}

#[tokio::test]
async fn a_schema_4_trace_index_becomes_run_1() {
    fn own(i: u32) -> TraceId {
        let b = i.to_le_bytes();
        TraceId([b[0], b[1], 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8])
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let storage = Storage::open(cfg.clone()).unwrap();
    for i in 0..300 {
        storage
            .write_traces(batch(Some("m"), vec![span(own(i), sid(1), "open", 5, 0)]))
            .await
            .unwrap();
    }
    storage.shutdown().await;
    drop(storage);
    // back to schema 4, as an older stallwatch left it: one row per merged trace
    let conn = rusqlite::Connection::open(&cfg.path).unwrap();
    conn.execute_batch(
        "CREATE TABLE v4 (trace_id BLOB PRIMARY KEY, batches BLOB NOT NULL) WITHOUT ROWID;",
    )
    .unwrap();
    for (_, t, l) in index_entries(&conn) {
        let l: Vec<u8> = l.iter().flat_map(|b| b.to_le_bytes()).collect();
        conn.execute(
            "INSERT INTO v4 VALUES (?1, ?2)",
            rusqlite::params![&t[..], l],
        )
        .unwrap();
    }
    conn.execute_batch(
        "DROP TABLE trace_index;
             DROP TABLE trace_runs;
             ALTER TABLE v4 RENAME TO trace_index;
             DROP TABLE pending_terms;
             DROP TABLE log_body_generations;
             ALTER TABLE logs_body_1 RENAME TO logs_body;
             CREATE TRIGGER logs_body_delete AFTER DELETE ON logs BEGIN
                 DELETE FROM logs_body WHERE rowid = old.id;
             END;
             PRAGMA user_version = 4;",
    )
    .unwrap();
    drop(conn);
    let storage = Storage::open(cfg.clone()).unwrap();
    assert_eq!(trace_runs(&cfg.path), vec![(1, 0, 256, 1)]);
    // a merged trace's ended copy still wins over its open one; a re-sent open copy is
    // still a duplicate
    storage
        .write_traces(batch(Some("m"), vec![span(own(3), sid(1), "ended", 5, 9)]))
        .await
        .unwrap();
    storage
        .write_traces(batch(Some("m"), vec![span(own(3), sid(1), "open", 5, 0)]))
        .await
        .unwrap();
    assert_eq!(
        names_of(&storage, own(3)).await,
        vec![("ended".into(), SpanState::Ended)]
    );
    for i in [0, 255, 256, 299] {
        assert_eq!(names_of(&storage, own(i)).await.len(), 1, "trace {i}");
    }
    storage.shutdown().await;
}

#[tokio::test]
async fn term_postings_are_found_before_and_after_their_merge() {
    // 300 batches: the merge at 256 moves the postings of 1..=256 into batch_terms, those of
    // 257..=300 stay pending (schema migration 6); a search must see both, in order
    fn own(i: u32) -> TraceId {
        let b = i.to_le_bytes();
        TraceId([b[0], b[1], 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6])
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let storage = Storage::open(cfg.clone()).unwrap();
    for i in 0..300u32 {
        let mut s = span(own(i), sid(1), "op", 1, 2);
        if i == 10 || i == 290 {
            s.attributes = vec![KeyValue::new(
                "gen_ai.tool.name",
                AnyValue::String("rare_tool".into()),
            )];
        }
        let service = if i % 2 == 0 { "svc-a" } else { "svc-b" };
        storage
            .write_traces(batch(Some(service), vec![s]))
            .await
            .unwrap();
    }
    let found = |q: TraceQuery| {
        let storage = storage.clone();
        async move {
            let mut out = Vec::new();
            let mut q = q;
            loop {
                let page = storage.search_traces(q.clone()).await.unwrap();
                out.extend(page.items.iter().map(|t| t.trace_id));
                match page.next_cursor {
                    Some(c) => q.cursor = Some(c),
                    None => return out,
                }
            }
        }
    };
    let rare = TraceQuery {
        service: Some("svc-a".into()),
        tool_name: Some("rare_tool".into()),
        limit: 1,
        ..Default::default()
    };
    assert_eq!(found(rare.clone()).await, vec![own(290), own(10)]);
    let odd = TraceQuery {
        service: Some("svc-b".into()),
        limit: 40,
        ..Default::default()
    };
    let want: Vec<TraceId> = (0..300u32).rev().filter(|i| i % 2 == 1).map(own).collect();
    assert_eq!(found(odd.clone()).await, want);
    storage.shutdown().await;
    drop(storage);
    // after a restart the pending postings are read back from their batches
    let storage = Storage::open(cfg).unwrap();
    let found = |q: TraceQuery| {
        let storage = storage.clone();
        async move {
            let mut out = Vec::new();
            let mut q = q;
            loop {
                let page = storage.search_traces(q.clone()).await.unwrap();
                out.extend(page.items.iter().map(|t| t.trace_id));
                match page.next_cursor {
                    Some(c) => q.cursor = Some(c),
                    None => return out,
                }
            }
        }
    };
    assert_eq!(found(rare).await, vec![own(290), own(10)]);
    assert_eq!(found(odd).await, want);
    storage.shutdown().await;
}

#[tokio::test]
async fn shutdown_commits_and_then_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(config(&dir)).unwrap();
    storage
        .write_traces(batch(Some("s"), vec![span(tid(1), sid(1), "a", 1, 2)]))
        .await
        .unwrap();
    storage.shutdown().await;
    let r = storage
        .write_traces(batch(Some("s"), vec![span(tid(2), sid(1), "a", 1, 2)]))
        .await;
    assert!(matches!(r, Err(WriteError::Closed)));
    assert!(storage.trace(tid(1)).await.unwrap().is_some());
}

#[test]
fn schema_too_new_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    {
        let conn = rusqlite::Connection::open(&cfg.path).unwrap();
        conn.pragma_update(None, "user_version", 999).unwrap();
    }
    match Storage::open(cfg) {
        Err(StorageError::SchemaTooNew { found: 999, .. }) => {}
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("opened a database from the future"),
    }
}

mod prop {
    //! Property test: deduplication against a tiny reference model.
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn dedup_matches_the_reference(reqs in proptest::collection::vec(
            proptest::collection::vec((0u8..4, any::<bool>()), 1..5), 1..8)
        ) {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let storage = Storage::open(config(&dir)).unwrap();
                // reference: span → (name of the winning copy, ended)
                let mut model: HashMap<u8, (String, bool)> = HashMap::new();
                let mut n = 0u32;
                for req in &reqs {
                    let mut spans = Vec::new();
                    for (s, ended) in req {
                        n += 1;
                        let name = format!("copy{n}");
                        match model.get(s) {
                            None => { model.insert(*s, (name.clone(), *ended)); }
                            Some((_, false)) if *ended => { model.insert(*s, (name.clone(), true)); }
                            _ => {}
                        }
                        spans.push(span(tid(1), sid(*s + 1), &name, 100 + u64::from(*s), if *ended { 200 } else { 0 }));
                    }
                    storage.write_traces(batch(Some("p"), spans)).await.unwrap();
                }
                let view = storage.trace(tid(1)).await.unwrap().unwrap();
                let got: HashMap<u8, (String, bool)> = view.spans.iter()
                    .map(|s| (s.span.span_id.0[0] - 1, (s.span.name.clone(), s.state == SpanState::Ended)))
                    .collect();
                assert_eq!(got, model);
                let page = storage.search_traces(TraceQuery { limit: 10, ..Default::default() }).await.unwrap();
                assert_eq!(page.items.len(), 1);
                assert_eq!(page.items[0].span_count as usize, model.len());
                assert_eq!(page.items[0].open_count as usize, model.values().filter(|v| !v.1).count());
                storage.shutdown().await;
            });
        }
    }
}

#[tokio::test]
async fn forensics_evidence_is_added_to_an_incident_once_without_overwriting() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(config(&dir)).unwrap();
    let inc = storage
        .record_incident(NewIncident {
            kind: EventKind::BreakerOpened,
            runner_id: Some("r1".into()),
            tool_name: Some("run_notebook".into()),
            trace_id: None,
            span_id: None,
            reason: "tool_overrun: over its SLA".into(),
            evidence: serde_json::json!({"verdict": "tool_overrun"}),
            idempotency_key: "k1".into(),
            at_unix_nano: 1,
        })
        .await
        .unwrap()
        .unwrap();
    let mut extra = serde_json::Map::new();
    extra.insert("classification".into(), "busy loop".into());
    extra.insert("verdict".into(), "overwritten?".into());
    for _ in 0..2 {
        let got = storage
            .attach_incident_evidence(inc.id, extra.clone(), Some("busy loop; main at f".into()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            got.incident.reason,
            "tool_overrun: over its SLA; why: busy loop; main at f"
        );
    }
    let back = storage.incident(inc.id).await.unwrap().unwrap();
    assert_eq!(back.incident.evidence["classification"], "busy loop");
    assert_eq!(back.incident.evidence["verdict"], "tool_overrun");
    assert_eq!(
        back.incident.reason,
        "tool_overrun: over its SLA; why: busy loop; main at f"
    );
    assert!(storage
        .attach_incident_evidence(inc.id + 100, extra, None)
        .await
        .unwrap()
        .is_none());
}
