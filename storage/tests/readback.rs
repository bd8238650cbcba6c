//! Reading logs and metrics back (issue 13) on real SQLite files: log search filters,
//! cursor paging and the live tail's reads; the instrument list and points per series per
//! step with histogram quantiles; trace search with several attribute filters, a duration
//! range and per-operation percentiles.

#![allow(missing_docs, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use stallwatch_storage::model::*;
use stallwatch_storage::telemetry::{LogQuery, PointsQuery, TraceQuery};
use stallwatch_storage::{Storage, StorageConfig};

fn open(dir: &tempfile::TempDir) -> Storage {
    let mut c = StorageConfig::new(dir.path().join("stallwatch.db"));
    c.retention_interval = Duration::from_secs(3600);
    Storage::open(c).unwrap()
}

fn s(v: &str) -> AnyValue {
    AnyValue::String(v.into())
}

fn resource(service: &str, runner: Option<&str>) -> Resource {
    let mut attributes = vec![KeyValue::new("service.name", s(service))];
    if let Some(r) = runner {
        attributes.push(KeyValue::new("stallwatch.runner.id", s(r)));
    }
    Resource {
        attributes,
        ..Default::default()
    }
}

fn log(time: u64, sev: i32, body: &str, attrs: Vec<KeyValue>) -> LogRecord {
    LogRecord {
        time_unix_nano: time,
        severity_number: sev,
        body: s(body),
        attributes: attrs,
        ..Default::default()
    }
}

fn logs(service: &str, runner: Option<&str>, records: Vec<LogRecord>) -> Arc<LogBatch> {
    Arc::new(LogBatch {
        resource_logs: vec![ResourceLogs {
            resource: resource(service, runner),
            scope_logs: vec![ScopeLogs {
                scope: Scope {
                    name: "test.logs".into(),
                    ..Default::default()
                },
                log_records: records,
            }],
        }],
    })
}

fn bodies(items: &[stallwatch_storage::telemetry::LogEntry]) -> Vec<String> {
    items
        .iter()
        .map(|e| e.log.record.body.as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn log_search_filters_and_pages_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    let st = open(&dir);
    let mut with_trace = log(5_000, 17, "e5 Disk FULL", vec![]);
    with_trace.trace_id = Some(TraceId([7; 16]));
    with_trace.span_id = Some(SpanId([8; 8]));
    st.write_logs(logs(
        "api",
        Some("r1"),
        vec![
            log(1_000, 9, "i1 started", vec![KeyValue::new("k", s("a"))]),
            log(2_000, 13, "w2 slow", vec![KeyValue::new("k", s("b"))]),
            log(3_000, 9, "i3 again", vec![KeyValue::new("k", s("a"))]),
            with_trace,
        ],
    ))
    .await
    .unwrap();
    st.write_logs(logs(
        "worker",
        None,
        vec![log(4_000, 21, "f4 fatal", vec![])],
    ))
    .await
    .unwrap();

    let q = |f: fn(&mut LogQuery)| {
        let mut q = LogQuery::default();
        f(&mut q);
        q
    };
    let all = st.search_logs(LogQuery::default()).await.unwrap();
    assert_eq!(
        bodies(&all.items),
        [
            "e5 Disk FULL",
            "f4 fatal",
            "i3 again",
            "w2 slow",
            "i1 started"
        ]
    );
    assert_eq!(all.next_cursor, None);
    assert_eq!(all.items[0].log.resource.service_name(), "api");
    assert_eq!(all.items[0].log.scope.name, "test.logs");
    assert_eq!(all.items[0].log.record.span_id, Some(SpanId([8; 8])));

    let by = |qq| {
        let st = st.clone();
        async move { bodies(&st.search_logs(qq).await.unwrap().items) }
    };
    assert_eq!(
        by(q(|q| q.service = Some("api".into()))).await,
        ["e5 Disk FULL", "i3 again", "w2 slow", "i1 started"]
    );
    assert_eq!(
        by(q(|q| q.min_severity = Some(13))).await,
        ["e5 Disk FULL", "f4 fatal", "w2 slow"]
    );
    assert_eq!(
        by(q(|q| {
            q.service = Some("api".into());
            q.min_severity = Some(10);
        }))
        .await,
        ["e5 Disk FULL", "w2 slow"]
    );
    assert_eq!(
        by(q(|q| q.body_contains = Some("disk full".into()))).await,
        ["e5 Disk FULL"],
        "body search is case-insensitive"
    );
    assert_eq!(
        by(q(|q| q.attributes = vec![("k".into(), "a".into())])).await,
        ["i3 again", "i1 started"]
    );
    assert_eq!(
        by(q(
            |q| q.attributes = vec![("service.name".into(), "worker".into())]
        ))
        .await,
        ["f4 fatal"],
        "attributes match on the resource too"
    );
    assert_eq!(
        by(q(|q| q.trace_id = Some(TraceId([7; 16])))).await,
        ["e5 Disk FULL"]
    );
    assert_eq!(by(q(|q| q.runner_id = Some("r1".into()))).await.len(), 4);
    assert_eq!(
        by(q(|q| {
            q.from_unix_nano = Some(2_000);
            q.to_unix_nano = Some(4_000);
        }))
        .await,
        ["i3 again", "w2 slow"],
        "from is inclusive, to exclusive"
    );
    assert!(by(q(|q| q.service = Some("nobody".into())))
        .await
        .is_empty());

    // cursor paging, with and without a driving index
    for base in [
        LogQuery::default(),
        q(|q| q.service = Some("api".into())),
        q(|q| q.min_severity = Some(1)),
    ] {
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = st
                .search_logs(LogQuery {
                    limit: 2,
                    cursor: cursor.clone(),
                    ..base.clone()
                })
                .await
                .unwrap();
            seen.extend(bodies(&page.items));
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        let full = bodies(&st.search_logs(base.clone()).await.unwrap().items);
        assert_eq!(seen, full, "paging {base:?}");
    }
    assert!(st
        .search_logs(LogQuery {
            cursor: Some("nonsense".into()),
            ..Default::default()
        })
        .await
        .is_err());

    // live tail: rows after an id, oldest first, filtered
    let (tail, last) = st.logs_after(LogQuery::default(), 0, 100).await.unwrap();
    assert_eq!(tail.len(), 5);
    assert_eq!(last, tail[4].id);
    assert_eq!(st.newest_log_id().await.unwrap(), last);
    let (none, again) = st.logs_after(LogQuery::default(), last, 100).await.unwrap();
    assert!(none.is_empty());
    assert_eq!(again, last);
    let (warn, _) = st
        .logs_after(q(|q| q.min_severity = Some(13)), 0, 100)
        .await
        .unwrap();
    assert_eq!(bodies(&warn), ["w2 slow", "e5 Disk FULL", "f4 fatal"]);
    st.shutdown().await;
}

fn point(name: &str, kind: MetricKind, time: u64, attrs: &[(&str, &str)]) -> MetricPoint {
    MetricPoint {
        name: name.into(),
        description: format!("{name} description"),
        unit: "ms".into(),
        kind,
        start_time_unix_nano: 1,
        time_unix_nano: time,
        value: None,
        count: None,
        sum: None,
        attributes: attrs.iter().map(|(k, v)| KeyValue::new(*k, s(v))).collect(),
        detail: "{}".into(),
    }
}

fn metrics(service: &str, points: Vec<MetricPoint>) -> Arc<MetricBatch> {
    Arc::new(MetricBatch {
        resource_metrics: vec![ResourceMetrics {
            resource: resource(service, None),
            scope_metrics: vec![ScopeMetrics {
                scope: Scope {
                    name: "test.metrics".into(),
                    ..Default::default()
                },
                points,
            }],
        }],
    })
}

#[tokio::test]
async fn metric_points_aggregate_per_series_and_step() {
    let dir = tempfile::tempdir().unwrap();
    let st = open(&dir);
    let sec = 1_000_000_000u64;
    let mut pts = Vec::new();
    // cumulative counter, two attribute sets, points at 1 s .. 4 s
    for (i, v) in [1.0, 3.0, 6.0, 10.0].iter().enumerate() {
        for (set, scale) in [("a", 1.0), ("b", 100.0)] {
            let mut p = point(
                "requests",
                MetricKind::Sum,
                (i as u64 + 1) * sec,
                &[("set", set)],
            );
            p.value = Some(v * scale);
            p.detail = r#"{"aggregation_temporality":"AGGREGATION_TEMPORALITY_CUMULATIVE","is_monotonic":true}"#.into();
            pts.push(p);
        }
    }
    // delta sum: values add up within a step
    for (i, v) in [2.0, 5.0].iter().enumerate() {
        let mut p = point("bytes", MetricKind::Sum, (i as u64 + 1) * sec, &[]);
        p.value = Some(*v);
        p.detail = r#"{"aggregation_temporality":"AGGREGATION_TEMPORALITY_DELTA"}"#.into();
        pts.push(p);
    }
    // gauge: last value of the step
    for (i, v) in [7.0, 8.0, 9.0].iter().enumerate() {
        let mut p = point("temp", MetricKind::Gauge, (i as u64 + 1) * sec, &[]);
        p.value = Some(*v);
        pts.push(p);
    }
    // cumulative explicit histogram: the step shows what was observed during it
    for (i, counts) in [[2u64, 0, 0], [2, 4, 0]].iter().enumerate() {
        let mut p = point(
            "latency",
            MetricKind::Histogram,
            (i as u64 + 1) * 2 * sec,
            &[],
        );
        p.count = Some(counts.iter().sum());
        p.sum = Some(1.0 + i as f64);
        p.detail = format!(
            r#"{{"aggregation_temporality":"AGGREGATION_TEMPORALITY_CUMULATIVE","bucket_counts":{counts:?},"explicit_bounds":[10.0,20.0]}}"#
        );
        pts.push(p);
    }
    // delta exponential histogram at scale 0: bucket 1 = (2,4], bucket 2 = (4,8]
    let mut p = point("size", MetricKind::ExponentialHistogram, sec, &[]);
    p.count = Some(4);
    p.sum = Some(20.0);
    p.detail = r#"{"aggregation_temporality":"AGGREGATION_TEMPORALITY_DELTA","scale":0,"zero_count":0,"zero_threshold":0.0,"positive":{"offset":1,"bucket_counts":[2,2]},"min":3.0,"max":7.5}"#.into();
    pts.push(p);
    st.write_metrics(metrics("svc", pts)).await.unwrap();
    let mut other = point("temp", MetricKind::Gauge, 2 * sec, &[]);
    other.value = Some(-1.0);
    st.write_metrics(metrics("other", vec![other]))
        .await
        .unwrap();

    let inst = st.instruments(None, None, 1000).await.unwrap().items;
    let names: Vec<(String, String, String, u64)> = inst
        .iter()
        .map(|i| {
            (
                i.name.clone(),
                i.service.clone(),
                i.kind.clone(),
                i.point_count,
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("bytes".into(), "svc".into(), "sum".into(), 2),
            ("latency".into(), "svc".into(), "histogram".into(), 2),
            ("requests".into(), "svc".into(), "sum".into(), 8),
            (
                "size".into(),
                "svc".into(),
                "exponential_histogram".into(),
                1
            ),
            ("temp".into(), "other".into(), "gauge".into(), 1),
            ("temp".into(), "svc".into(), "gauge".into(), 3),
        ]
    );
    let req = inst.iter().find(|i| i.name == "requests").unwrap();
    assert_eq!(req.unit, "ms");
    assert_eq!(req.description, "requests description");
    assert_eq!(
        (req.first_time_unix_nano, req.last_time_unix_nano),
        (sec, 4 * sec)
    );
    assert_eq!(
        st.instruments(Some("other".into()), None, 1000)
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    // a page at a time: pages of 2 walk the same list, each instrument once, and a
    // cursor this server did not issue is refused
    let mut walked = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    for _ in 0..10 {
        let page = st.instruments(None, cursor, 2).await.unwrap();
        pages += 1;
        walked.extend(page.items);
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(walked, inst);
    assert_eq!(pages, 3, "no empty last page");
    assert!(st
        .instruments(None, None, 1000)
        .await
        .unwrap()
        .next_cursor
        .is_none());
    for bad in ["zz", "zz.00", "61", "ff.61"] {
        assert!(
            matches!(
                st.instruments(None, Some(bad.into()), 2).await,
                Err(stallwatch_storage::telemetry::QueryError::BadCursor)
            ),
            "{bad}"
        );
    }
    assert!(st.instrument_known("temp".into()).await.unwrap());
    assert!(!st.instrument_known("tem".into()).await.unwrap());

    let q = |name: &str, step: u64| PointsQuery {
        name: name.into(),
        service: Some("svc".into()),
        from_unix_nano: 0,
        to_unix_nano: 10 * sec,
        step_ns: step,
    };
    let req = st.metric_series(q("requests", 2 * sec)).await.unwrap();
    assert_eq!(req.len(), 2, "one series per attribute set");
    let a = req
        .iter()
        .find(|s| s.attributes == vec![KeyValue::new("set", s_("a"))])
        .unwrap();
    let steps: Vec<(u64, Option<f64>, u64)> = a
        .steps
        .iter()
        .map(|x| (x.start_unix_nano, x.value, x.points))
        .collect();
    // steps [0,2s) [2s,4s) [4s,6s): the last cumulative value in each
    assert_eq!(
        steps,
        [
            (0, Some(1.0), 1),
            (2 * sec, Some(6.0), 2),
            (4 * sec, Some(10.0), 1)
        ]
    );
    assert_eq!(a.resource.service_name(), "svc");
    assert_eq!(a.scope.name, "test.metrics");
    assert_eq!(a.unit, "ms");

    let bytes = st.metric_series(q("bytes", 10 * sec)).await.unwrap();
    assert_eq!(bytes[0].steps[0].value, Some(7.0), "delta sums add up");
    let temp = st.metric_series(q("temp", 10 * sec)).await.unwrap();
    assert_eq!(temp.len(), 1, "the other service is filtered out");
    assert_eq!(
        temp[0].steps[0].value,
        Some(9.0),
        "a gauge shows its last value"
    );
    let both = st
        .metric_series(PointsQuery {
            service: None,
            ..q("temp", 10 * sec)
        })
        .await
        .unwrap();
    assert_eq!(both.len(), 2);

    let lat = st.metric_series(q("latency", 2 * sec)).await.unwrap();
    let l = &lat[0].steps;
    assert_eq!(l.len(), 2);
    // step 1: the first cumulative point as it is, 2 in (0,10]
    assert_eq!(l[0].count, Some(2));
    assert_eq!(l[0].p50, Some(5.0));
    // step 2: minus the previous point: 4 observations in (10,20]
    assert_eq!(l[1].count, Some(4));
    assert_eq!(l[1].p50, Some(15.0));
    assert_eq!(l[1].p99, Some(19.9));
    // one step holding both cumulative points: the last one as it is (only it is decoded)
    let one = st.metric_series(q("latency", 10 * sec)).await.unwrap();
    let o = &one[0].steps;
    assert_eq!(o.len(), 1);
    assert_eq!((o[0].points, o[0].count, o[0].sum), (2, Some(6), Some(2.0)));

    let size = st.metric_series(q("size", 10 * sec)).await.unwrap();
    let z = &size[0].steps[0];
    assert_eq!((z.count, z.sum), (Some(4), Some(20.0)));
    assert_eq!(z.p50, Some(4.0));
    assert!(z.p90.unwrap() > 4.0 && z.p90.unwrap() <= 7.5, "{z:?}");
    assert_eq!(z.p99, Some(7.5), "clamped to max");
    st.shutdown().await;
}

fn s_(v: &str) -> AnyValue {
    s(v)
}

#[tokio::test]
async fn trace_search_and_filters_several_attributes_and_a_duration_range() {
    let dir = tempfile::tempdir().unwrap();
    let st = open(&dir);
    let ms = 1_000_000u64;
    let span = |t: u8, sp: u8, name: &str, dur_ms: u64, attrs: &[(&str, &str)]| Span {
        trace_id: TraceId([t; 16]),
        span_id: SpanId([sp; 8]),
        name: name.into(),
        start_time_unix_nano: 1_000 * ms,
        end_time_unix_nano: 1_000 * ms + dur_ms * ms,
        attributes: attrs.iter().map(|(k, v)| KeyValue::new(*k, s(v))).collect(),
        ..Default::default()
    };
    let batch = Arc::new(TraceBatch {
        resource_spans: vec![ResourceSpans {
            resource: resource("svc", None),
            scope_spans: vec![ScopeSpans {
                scope: Scope::default(),
                spans: vec![
                    span(
                        1,
                        1,
                        "op",
                        10,
                        &[("gen_ai.tool.name", "t"), ("error.type", "x")],
                    ),
                    span(2, 2, "op", 20, &[("gen_ai.tool.name", "t")]),
                    span(
                        3,
                        3,
                        "op",
                        30,
                        &[("gen_ai.tool.name", "t"), ("error.type", "x")],
                    ),
                    span(3, 4, "other", 5, &[]),
                ],
            }],
        }],
    });
    st.write_traces(batch).await.unwrap();
    let ids = |p: &stallwatch_storage::telemetry::TracePage| {
        let mut v: Vec<u8> = p.items.iter().map(|i| i.trace_id.0[0]).collect();
        v.sort();
        v
    };
    let both = st
        .search_traces(TraceQuery {
            attribute: Some(("gen_ai.tool.name".into(), "t".into())),
            attributes: vec![("error.type".into(), "x".into())],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(&both), [1, 3]);
    let ranged = st
        .search_traces(TraceQuery {
            attributes: vec![("gen_ai.tool.name".into(), "t".into())],
            min_duration_ns: Some(15 * ms),
            max_duration_ns: Some(25 * ms),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(&ranged), [2]);
    let all = st.search_traces(TraceQuery::default()).await.unwrap();
    assert_eq!(all.operations.len(), 2);
    let op = &all.operations[0];
    assert_eq!((op.service.as_str(), op.span_name.as_str()), ("svc", "op"));
    assert_eq!(op.count, 3);
    assert_eq!(
        (op.p50_ns, op.p90_ns, op.max_ns),
        (20 * ms, 30 * ms, 30 * ms)
    );
    assert_eq!(all.operations[1].span_name, "other");
    st.shutdown().await;
}

/// An attribute search matches a span's number and bool values by their text (decimal,
/// `true`/`false`, Rust's float text), as it does resource attributes, though the stored
/// span holds them in binary; a value the span does not carry still matches nothing.
#[tokio::test]
async fn trace_search_matches_number_and_bool_span_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let st = open(&dir);
    let ms = 1_000_000u64;
    let span = |t: u8, attrs: Vec<KeyValue>| Span {
        trace_id: TraceId([t; 16]),
        span_id: SpanId([t; 8]),
        name: "op".into(),
        start_time_unix_nano: 1_000 * ms,
        end_time_unix_nano: 1_010 * ms,
        attributes: attrs,
        ..Default::default()
    };
    let batch = Arc::new(TraceBatch {
        resource_spans: vec![ResourceSpans {
            resource: resource("svc", None),
            scope_spans: vec![ScopeSpans {
                scope: Scope::default(),
                spans: vec![
                    span(
                        1,
                        vec![
                            KeyValue::new("n", AnyValue::Int(42)),
                            KeyValue::new("ok", AnyValue::Bool(true)),
                            KeyValue::new("f", AnyValue::Double(1.5)),
                            KeyValue::new("neg", AnyValue::Int(-7)),
                            KeyValue::new("s", s("x")),
                        ],
                    ),
                    span(
                        2,
                        vec![
                            KeyValue::new("n", AnyValue::Int(43)),
                            KeyValue::new("ok", AnyValue::Bool(false)),
                            KeyValue::new("s", s("42")),
                        ],
                    ),
                ],
            }],
        }],
    });
    st.write_traces(batch).await.unwrap();
    let find = |k: &str, v: &str| {
        // an attribute that is not an indexed term is scanned for, in a time range
        let q = TraceQuery {
            attributes: vec![(k.into(), v.into())],
            start_min_unix_nano: Some(0),
            start_max_unix_nano: Some(2_000 * ms),
            ..Default::default()
        };
        let st = &st;
        async move {
            let mut v: Vec<u8> = st
                .search_traces(q)
                .await
                .unwrap()
                .items
                .iter()
                .map(|i| i.trace_id.0[0])
                .collect();
            v.sort();
            v
        }
    };
    assert_eq!(find("n", "42").await, [1]);
    assert_eq!(find("n", "43").await, [2]);
    assert_eq!(find("ok", "true").await, [1]);
    assert_eq!(find("ok", "false").await, [2]);
    assert_eq!(find("f", "1.5").await, [1]);
    assert_eq!(find("neg", "-7").await, [1]);
    assert_eq!(find("s", "x").await, [1]);
    assert_eq!(
        find("s", "42").await,
        [2],
        "a string that reads as a number"
    );
    assert!(find("n", "44").await.is_empty());
    assert!(find("f", "2.5").await.is_empty());
    assert!(find("missing", "42").await.is_empty());
    st.shutdown().await;
}

/// Migration 4 replaces the `(name, service, time, …)` point index of migration 3 by
/// `metric_points_series` `(name, service, series, time, …)` on a file an older stallwatch
/// left, and the points query reads the points stored before it.
#[tokio::test]
async fn migration_4_moves_the_point_index_to_series_then_time() {
    let dir = tempfile::tempdir().unwrap();
    let st = open(&dir);
    let sec = 1_000_000_000u64;
    let mut pts = Vec::new();
    for (i, set) in ["a", "b", "a"].iter().enumerate() {
        let mut p = point(
            "temp",
            MetricKind::Gauge,
            (i as u64 + 1) * sec,
            &[("set", set)],
        );
        p.value = Some(i as f64);
        pts.push(p);
    }
    st.write_metrics(metrics("svc", pts)).await.unwrap();
    st.shutdown().await;
    drop(st);
    let path = dir.path().join("stallwatch.db");
    let indexes = || -> Vec<String> {
        let c = rusqlite::Connection::open(&path).unwrap();
        let mut q = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'metric_points' AND name LIKE 'metric_points_series%' ORDER BY name")
            .unwrap();
        q.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    assert_eq!(indexes(), ["metric_points_series"]);
    // back to schema 3, as an older stallwatch left it
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "DROP INDEX metric_points_series;
             CREATE INDEX metric_points_series_time
                 ON metric_points(name, service, time_unix_nano, series, value, count, sum);
             CREATE TABLE v4 (trace_id BLOB PRIMARY KEY, batches BLOB NOT NULL) WITHOUT ROWID;
             DROP TABLE trace_index;
             DROP TABLE trace_runs;
             ALTER TABLE v4 RENAME TO trace_index;
             DROP TABLE pending_terms;
             DROP TABLE log_body_generations;
             ALTER TABLE logs_body_1 RENAME TO logs_body;
             CREATE TRIGGER logs_body_delete AFTER DELETE ON logs BEGIN
                 DELETE FROM logs_body WHERE rowid = old.id;
             END;
             PRAGMA user_version = 3;",
        )
        .unwrap();
    assert_eq!(indexes(), ["metric_points_series_time"]);
    let st = open(&dir);
    assert_eq!(indexes(), ["metric_points_series"]);
    let series = st
        .metric_series(PointsQuery {
            name: "temp".into(),
            service: Some("svc".into()),
            from_unix_nano: 0,
            to_unix_nano: 10 * sec,
            step_ns: 10 * sec,
        })
        .await
        .unwrap();
    let got: Vec<(u64, Option<f64>)> = series
        .iter()
        .map(|s| (s.steps[0].points, s.steps[0].value))
        .collect();
    assert_eq!(
        got,
        [(2, Some(2.0)), (1, Some(1.0))],
        "set a first, as it arrived"
    );
    st.shutdown().await;
}
