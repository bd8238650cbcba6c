//! The durable open-span ledger on a real SQLite file: the open-span list a page at a time
//! (order, cursor, filter, refusals, the index each page walks), and the bound at start
//! (trim, bounded load).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use super::*;
use crate::config::StorageConfig;

/// A row of span `i`: first seen at `first` (ties on purpose), bound to `runner`.
fn row(i: u32, first: u64, runner: Option<&str>, state: SpanState, last: u64) -> LedgerRow {
    let mut t = [0u8; 16];
    t[12..].copy_from_slice(&(i % 7).to_be_bytes());
    LedgerRow {
        trace_id: TraceId(t),
        span_id: SpanId(u64::from(i).to_be_bytes()),
        parent_span_id: None,
        name: format!("execute_tool t{i}"),
        tool_name: Some(format!("t{i}")),
        runner_id: runner.map(str::to_string),
        service_name: "svc".into(),
        pid: None,
        state,
        boot_id: "boot".into(),
        first_seen_mono_ns: first,
        last_seen_mono_ns: last,
        refreshes: 0,
        first_seen_unix_nano: first,
        last_seen_unix_nano: last,
        sla_ms: Some(60_000),
        sla_override_ms: None,
    }
}

async fn store(s: &Storage, rows: Vec<LedgerRow>) {
    let writes = rows
        .into_iter()
        .map(|r| LedgerWrite::Upsert(Box::new(r)))
        .collect();
    s.ledger_apply(Arc::new(writes)).await.unwrap();
}

fn key(r: &OpenSpanRow) -> (u64, TraceId, SpanId) {
    (r.first_seen_unix_nano, r.trace_id, r.span_id)
}

/// Every page of `q` walked with its cursors: the rows, and the size of each page.
async fn walk(s: &Storage, mut q: OpenSpanQuery) -> (Vec<OpenSpanRow>, Vec<usize>) {
    let (mut all, mut sizes) = (Vec::new(), Vec::new());
    loop {
        let page = s.open_spans(q.clone()).await.unwrap();
        sizes.push(page.items.len());
        all.extend(page.items);
        match page.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => return (all, sizes),
        }
        assert!(sizes.len() < 1000, "paging does not end");
    }
}

/// The open-span list in pages: oldest first (first arrival, then trace id, then span id),
/// each span exactly once across the pages, no empty last page, a runner's spans alone
/// with `runner_id`, and a cursor this server did not issue refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_spans_page_oldest_first_each_span_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(StorageConfig::new(dir.path().join("t.db"))).unwrap();
    // 250 spans, first arrivals with ties (i / 3), runners a and b, and some of nobody
    let rows: Vec<LedgerRow> = (0..250u32)
        .map(|i| {
            let runner = match i % 3 {
                0 => Some("a"),
                1 => Some("b"),
                _ => None,
            };
            row(
                i,
                1_000 + u64::from((250 - i) / 3),
                runner,
                SpanState::Open,
                5,
            )
        })
        .collect();
    store(&s, rows).await;
    let q = |limit: usize, runner: Option<&str>| OpenSpanQuery {
        runner_id: runner.map(str::to_string),
        limit,
        cursor: None,
    };
    let (all, sizes) = walk(&s, q(100, None)).await;
    assert_eq!(sizes, vec![100, 100, 50]);
    let mut sorted: Vec<_> = all.iter().map(key).collect();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 250, "each span once");
    assert_eq!(
        all.iter().map(key).collect::<Vec<_>>(),
        sorted,
        "oldest first"
    );
    // a last page that ends exactly at the limit has no cursor (no empty page after it)
    let (_, sizes) = walk(&s, q(125, None)).await;
    assert_eq!(sizes, vec![125, 125]);
    // one runner's spans only, in the same order
    let (a, _) = walk(&s, q(7, Some("a"))).await;
    assert_eq!(a.len(), 84);
    assert!(a.iter().all(|r| r.runner_id.as_deref() == Some("a")));
    assert!(a.windows(2).all(|w| key(&w[0]) < key(&w[1])));
    let (none, sizes) = walk(&s, q(7, Some("none"))).await;
    assert!(none.is_empty());
    assert_eq!(sizes, vec![0]);
    // limits are held to 1..=MAX_OPEN_SPANS_PAGE
    let page = s.open_spans(q(0, None)).await.unwrap();
    assert_eq!(page.items.len(), 1);
    // a cursor survives the rows before it ending: the next page goes on after its key
    let first = s.open_spans(q(10, None)).await.unwrap();
    let gone: Vec<LedgerWrite> = first
        .items
        .iter()
        .map(|r| LedgerWrite::Remove(r.trace_id, r.span_id))
        .collect();
    s.ledger_apply(Arc::new(gone)).await.unwrap();
    let next = s
        .open_spans(OpenSpanQuery {
            cursor: first.next_cursor.clone(),
            ..q(10, None)
        })
        .await
        .unwrap();
    assert_eq!(
        next.items.iter().map(key).collect::<Vec<_>>(),
        sorted[10..20].to_vec()
    );
    // refused: cursors this server did not issue
    for bad in [
        "",
        "zz",
        "1f.",
        "1f.0123",
        "xyz.000000000000000000000000000000000000000000000000",
        "ffffffffffffffff.000000000000000000000000000000000000000000000000",
        "1f.00000000000000000000000000000000000000000000000g",
        "1f.0000000000000000000000000000000000000000000000é",
        // 48 bytes with a character across the trace id's end
        &format!("1f.{}é{}", "0".repeat(31), "0".repeat(15)),
    ] {
        let r = s
            .open_spans(OpenSpanQuery {
                cursor: Some(bad.into()),
                ..q(10, None)
            })
            .await;
        assert!(matches!(r, Err(QueryError::BadCursor)), "{bad:?}: {r:?}");
    }
    s.shutdown().await;
}

/// Each page is read along an index in its order, up to its limit: no sort of the whole
/// ledger, for every shape of the query (all runners or one, first page or a later one).
#[test]
fn every_page_walks_an_index_without_a_sort() {
    let mut c = rusqlite::Connection::open_in_memory().unwrap();
    crate::schema::migrate(&mut c).unwrap();
    for (runner, after, index) in [
        (false, false, "open_spans_age"),
        (false, true, "open_spans_age"),
        (true, false, "open_spans_runner_age"),
        (true, true, "open_spans_runner_age"),
    ] {
        let sql = format!("EXPLAIN QUERY PLAN {}", page_sql(runner, after));
        let mut st = c.prepare(&sql).unwrap();
        let n = st.parameter_count();
        let args: Vec<rusqlite::types::Value> =
            (0..n).map(|_| rusqlite::types::Value::Integer(1)).collect();
        let plan: Vec<String> = st
            .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let plan = plan.join(" | ");
        assert!(
            plan.contains(index),
            "runner {runner}, after {after}: {plan}"
        );
        assert!(
            !plan.contains("TEMP B-TREE"),
            "runner {runner}, after {after}: {plan}"
        );
        // the range of a later page is a seek in the index, not a scan of all of it
        if after {
            assert!(plan.contains('>'), "runner {runner}, after {after}: {plan}");
        }
    }
}

/// At start the durable ledger is cut down to the watchdog's bound, keeping what matters
/// (spans of runners, open before inferred, latest seen), and the load reads at most the
/// bound; under the bound nothing is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_and_load_hold_the_bound_keeping_runners_spans_first() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(StorageConfig::new(dir.path().join("t.db"))).unwrap();
    let mut rows = Vec::new();
    for i in 0..10u32 {
        rows.push(row(i, 1, Some("r"), SpanState::Open, 1)); // oldest, but a runner's
        rows.push(row(100 + i, 1, None, SpanState::Inferred, 900)); // newest, inferred
        rows.push(row(200 + i, 1, None, SpanState::Open, 100 + u64::from(i)));
    }
    store(&s, rows).await;
    // healthy: under the bound nothing goes, and the load reads every row
    assert_eq!(s.ledger_trim(30).await.unwrap(), 0);
    assert_eq!(s.ledger_load(1000).await.unwrap().len(), 30);
    // the load alone holds the bound, the same rows the trim keeps
    let loaded = s.ledger_load(15).await.unwrap();
    assert_eq!(loaded.len(), 15);
    assert_eq!(s.ledger_trim(15).await.unwrap(), 15);
    let left = s.ledger_load(1000).await.unwrap();
    assert_eq!(left.len(), 15);
    let ids = |rows: &[LedgerRow]| {
        let mut v: Vec<u64> = rows
            .iter()
            .map(|r| u64::from_be_bytes(r.span_id.0))
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids(&left), ids(&loaded));
    let want: Vec<u64> = (0..10).chain(205..210).collect();
    assert_eq!(
        ids(&left),
        want,
        "runners' spans, then the latest open ones"
    );
    s.shutdown().await;
}
