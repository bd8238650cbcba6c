//! The log body substring index (issue 13, migration 3; in generations since migration 8)
//! on real SQLite files: substring search in the middle of a word with the documented case
//! rule, paging through the index path, the fall-back for short and common texts, retention
//! dropping generations whose rows are gone and never answering a deleted row, and the
//! migrations back-filling rows stored before the index and keeping them after migration 8.

#![allow(missing_docs, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;
use stallwatch_storage::model::*;
use stallwatch_storage::telemetry::{LogQuery, MAX_INDEX_CANDIDATES};
use stallwatch_storage::{Storage, StorageConfig};

fn config(dir: &tempfile::TempDir) -> StorageConfig {
    let mut c = StorageConfig::new(dir.path().join("stallwatch.db"));
    c.retention_interval = Duration::from_secs(3600);
    c
}

fn batch(service: &str, bodies: &[(u64, &str)]) -> Arc<LogBatch> {
    Arc::new(LogBatch {
        resource_logs: vec![ResourceLogs {
            resource: Resource {
                attributes: vec![KeyValue::new(
                    "service.name",
                    AnyValue::String(service.into()),
                )],
                ..Default::default()
            },
            scope_logs: vec![ScopeLogs {
                scope: Scope::default(),
                log_records: bodies
                    .iter()
                    .map(|(t, b)| LogRecord {
                        time_unix_nano: *t,
                        severity_number: 9,
                        body: AnyValue::String((*b).into()),
                        ..Default::default()
                    })
                    .collect(),
            }],
        }],
    })
}

async fn found(st: &Storage, text: &str, service: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = st
            .search_logs(LogQuery {
                body_contains: Some(text.into()),
                service: service.map(str::to_string),
                limit: 1,
                cursor,
                ..Default::default()
            })
            .await
            .unwrap();
        out.extend(
            page.items
                .iter()
                .map(|e| e.log.record.body.as_str().unwrap_or("").to_string()),
        );
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

/// The generations of the body index, oldest first: `(gen, first_id)`.
fn generations(path: &std::path::Path) -> Vec<(i64, i64)> {
    let c = Connection::open(path).unwrap();
    let mut st = c
        .prepare("SELECT gen, first_id FROM log_body_generations ORDER BY gen")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Index rows whose body holds `trigram` in every generation, read straight from the file
/// (orphans of deleted rows included).
fn index_rows(path: &std::path::Path, trigram: &str) -> i64 {
    let c = Connection::open(path).unwrap();
    generations(path)
        .iter()
        .map(|(g, _)| {
            c.query_row(
                &format!("SELECT count(*) FROM logs_body_{g} WHERE logs_body_{g} MATCH ?1"),
                [format!("\"{trigram}\"")],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
        })
        .sum()
}

#[tokio::test]
async fn body_search_finds_substrings_inside_words_with_the_documented_case_rule() {
    let dir = tempfile::tempdir().unwrap();
    let st = Storage::open(config(&dir)).unwrap();
    st.write_logs(batch(
        "api",
        &[
            (1_000, "Connection REFUSED by upstream"),
            (2_000, "refusal noted"),
            (3_000, "ÄRGER im Büro"),
            (4_000, r#"said "hi" twice"#),
            (5_000, "all fine"),
        ],
    ))
    .await
    .unwrap();
    st.write_logs(batch("worker", &[(6_000, "worker REFUSED too")]))
        .await
        .unwrap();
    // the middle of a word, any case on either side; newest first, paged one by one
    assert_eq!(
        found(&st, "eFUSe", None).await,
        ["worker REFUSED too", "Connection REFUSED by upstream"]
    );
    assert_eq!(
        found(&st, "efuse", Some("api")).await,
        ["Connection REFUSED by upstream"]
    );
    // the index over-selects ("refusal" holds every trigram of "efus"), the body decides
    assert_eq!(
        found(&st, "efus", None).await,
        [
            "worker REFUSED too",
            "refusal noted",
            "Connection REFUSED by upstream"
        ]
    );
    assert_eq!(
        found(&st, "ed by up", None).await,
        ["Connection REFUSED by upstream"]
    );
    // Unicode lowercase mapping (Rust's to_lowercase), not ASCII only
    assert_eq!(found(&st, "ärger", None).await, ["ÄRGER im Büro"]);
    assert_eq!(found(&st, "BÜRO", None).await, ["ÄRGER im Büro"]);
    // FTS5 syntax in the text is text
    assert_eq!(found(&st, r#""hi" tw"#, None).await, [r#"said "hi" twice"#]);
    assert_eq!(found(&st, "fine OR all", None).await, Vec::<String>::new());
    // shorter than a trigram: checked row by row
    assert_eq!(
        found(&st, "Ü", None).await,
        ["ÄRGER im Büro"],
        "one character still matches"
    );
    assert_eq!(found(&st, "zzz", None).await, Vec::<String>::new());
    // NUL in the text (FTS5 reads its query as C text: it answered "unterminated string",
    // a 500): its trigrams are left out of the index query, the body still decides
    st.write_logs(batch("api", &[(7_000, "raw ab\0cd bytes")]))
        .await
        .unwrap();
    assert_eq!(found(&st, "ab\0cd", None).await, ["raw ab\0cd bytes"]);
    assert_eq!(found(&st, "b\0c", None).await, ["raw ab\0cd bytes"]);
    assert_eq!(found(&st, "abc\0", None).await, Vec::<String>::new());
    assert_eq!(found(&st, "\0\0\0", None).await, Vec::<String>::new());
    st.shutdown().await;
}

#[tokio::test]
async fn a_common_body_text_falls_back_to_the_time_walk_with_the_same_answer() {
    let dir = tempfile::tempdir().unwrap();
    let st = Storage::open(config(&dir)).unwrap();
    let n = MAX_INDEX_CANDIDATES as u64 + 500;
    let bodies: Vec<String> = (0..n).map(|i| format!("common text {i}")).collect();
    for chunk in bodies.chunks(2_000).enumerate() {
        let rows: Vec<(u64, &str)> = chunk
            .1
            .iter()
            .enumerate()
            .map(|(j, b)| ((chunk.0 * 2_000 + j) as u64 + 1, b.as_str()))
            .collect();
        st.write_logs(batch("api", &rows)).await.unwrap();
    }
    let page = st
        .search_logs(LogQuery {
            body_contains: Some("COMMON TEXT".into()),
            limit: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    let got: Vec<_> = page
        .items
        .iter()
        .map(|e| e.log.record.body.as_str().unwrap().to_string())
        .collect();
    let want: Vec<String> = (n - 3..n)
        .rev()
        .map(|i| format!("common text {i}"))
        .collect();
    assert_eq!(got, want);
    assert!(page.next_cursor.is_some());
    // a rare one among them goes through the index
    assert_eq!(found(&st, "text 10333", None).await, ["common text 10333"]);
    st.shutdown().await;
}

/// Bodies of ~1 KiB, `n` of them: enough records fill a generation (1 MiB at a 32 MiB
/// cap).
fn filler(word: &str, n: u64) -> Vec<(u64, String)> {
    (0..n)
        .map(|i| (i + 1, format!("{word} {i} {}", "x".repeat(1000))))
        .collect()
}

#[tokio::test]
async fn retention_drops_generations_whose_rows_are_gone_and_never_answers_a_deleted_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.retention = Duration::from_millis(300);
    cfg.max_db_bytes = 32 << 20;
    let path = cfg.path.clone();
    let st = Storage::open(cfg).unwrap();
    // ~1.1 MiB of old records fill generation 1; the next write opens generation 2
    let old = filler("ancient zebra", 1100);
    let old_ref: Vec<(u64, &str)> = old.iter().map(|(t, b)| (*t, b.as_str())).collect();
    st.write_logs(batch("old", &old_ref)).await.unwrap();
    assert_eq!(generations(&path), [(1, 1)]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    st.write_logs(batch("new", &[(3, "fresh zebra"), (4, "stale yak")]))
        .await
        .unwrap();
    assert_eq!(generations(&path), [(1, 1), (2, 1101)]);
    assert_eq!(index_rows(&path, "zeb"), 1101);
    let report = st.run_retention().await.unwrap();
    assert_eq!(report.logs_deleted, 1100, "{report:?}");
    // generation 1 held only deleted rows: dropped whole, with its FTS5 table
    assert_eq!(generations(&path), [(2, 1101)]);
    assert_eq!(index_rows(&path, "anc"), 0);
    let c = Connection::open(&path).unwrap();
    let gone: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name GLOB 'logs_body_1*'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(gone, 0, "generation 1's tables are dropped");
    assert_eq!(found(&st, "zebra", None).await, ["fresh zebra"]);
    // a deleted row of the newest generation keeps its index entry (an orphan) until the
    // generation goes, and is never a result
    tokio::time::sleep(Duration::from_millis(600)).await;
    st.write_logs(batch("new", &[(5, "fresh yak")]))
        .await
        .unwrap();
    let report = st.run_retention().await.unwrap();
    assert_eq!(report.logs_deleted, 2, "{report:?}");
    assert_eq!(
        index_rows(&path, "yak"),
        2,
        "the orphan stays in generation 2"
    );
    assert_eq!(found(&st, "yak", None).await, ["fresh yak"]);
    assert_eq!(found(&st, "zebra", None).await, Vec::<String>::new());
    assert_eq!(st.integrity_check().await.unwrap(), vec!["ok".to_string()]);
    st.shutdown().await;
}

#[tokio::test]
async fn migration_3_back_fills_the_body_index_from_stored_rows() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let path = cfg.path.clone();
    let st = Storage::open(cfg.clone()).unwrap();
    st.write_logs(batch(
        "api",
        &[(1, "stored before the index"), (2, "also before")],
    ))
    .await
    .unwrap();
    st.shutdown().await;
    drop(st);
    // take the file back to schema 2, as an older stallwatch left it
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "DROP TABLE log_body_generations;
             DROP TABLE logs_body_1;
             DROP INDEX metric_points_series;
             CREATE INDEX metric_points_name_time ON metric_points(name, time_unix_nano);
             CREATE TABLE v4 (trace_id BLOB PRIMARY KEY, batches BLOB NOT NULL) WITHOUT ROWID;
             DROP TABLE trace_index;
             DROP TABLE trace_runs;
             ALTER TABLE v4 RENAME TO trace_index;
             DROP TABLE pending_terms;
             PRAGMA user_version = 2;",
        )
        .unwrap();
    }
    let st = Storage::open(cfg).unwrap();
    assert_eq!(index_rows(&path, "bef"), 2, "back-filled");
    assert_eq!(
        found(&st, "ORE THE", None).await,
        ["stored before the index"]
    );
    let c = Connection::open(&path).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, stallwatch_storage::SCHEMA_VERSION);
    st.shutdown().await;
}

/// Migration 8 keeps the index of migration 3 as generation 1: rows stored before it are
/// still found, its delete trigger is gone, and retention drops it once its rows are gone.
#[tokio::test]
async fn migration_8_keeps_the_index_as_generation_1() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.retention = Duration::from_millis(300);
    let path = cfg.path.clone();
    let st = Storage::open(cfg.clone()).unwrap();
    st.write_logs(batch("api", &[(1, "indexed by version 7")]))
        .await
        .unwrap();
    st.shutdown().await;
    drop(st);
    // take the file back to schema 7: one index, rows deleted through the trigger
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "DROP TABLE log_body_generations;
             ALTER TABLE logs_body_1 RENAME TO logs_body;
             CREATE TRIGGER logs_body_delete AFTER DELETE ON logs BEGIN
                 DELETE FROM logs_body WHERE rowid = old.id;
             END;
             PRAGMA user_version = 7;",
        )
        .unwrap();
    }
    let st = Storage::open(cfg).unwrap();
    assert_eq!(generations(&path), [(1, 1)]);
    let c = Connection::open(&path).unwrap();
    let triggers: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'logs_body_delete'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(triggers, 0);
    assert_eq!(
        found(&st, "VERSION 7", None).await,
        ["indexed by version 7"]
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    st.write_logs(batch("api", &[(2, "after version 7")]))
        .await
        .unwrap();
    assert_eq!(
        found(&st, "version 7", None).await,
        ["after version 7", "indexed by version 7"]
    );
    let report = st.run_retention().await.unwrap();
    assert_eq!(report.logs_deleted, 1, "{report:?}");
    assert_eq!(found(&st, "version 7", None).await, ["after version 7"]);
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, stallwatch_storage::SCHEMA_VERSION);
    st.shutdown().await;
}
