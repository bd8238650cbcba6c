//! The log body substring index (FTS5 `trigram`, migration 3; in generations since
//! migration 8; see `schema.rs`): what is indexed, the back-fill, the generations, and the
//! candidate look-up the log search uses for a body filter.
//!
//! Generations (migration 8, issue 16: the cap bounds the data folder under a log flood):
//! the index is a series of FTS5 tables `logs_body_<gen>`, listed in `log_body_generations`
//! with the first `logs.id` each one indexes. The writer indexes every new record in the
//! newest generation and opens the next one once the records indexed in it hold
//! [`generation_bytes`] of payload; log ids only grow (`writer::RowIds`), so generation
//! `g` indexes exactly the ids from its `first_id` up to the next generation's. Deleting a
//! log row leaves its index entry (an orphan: a search joins every candidate to its `logs`
//! row, so an orphan is never a result); the transaction that deletes log rows drops every
//! generation whose rows are all gone ([`drop_dead_generations`]), so orphans hold at most
//! about one generation's index. Before, each deleted row was deleted from one FTS5 index
//! (`contentless_delete`): every delete counted as a page of merge work, and the merges it
//! started rewrote most of the index in the deleting transaction (16-28 MiB of WAL to delete
//! 5,000 records of ~1 KiB, against a 4 MiB WAL share at the smallest cap; 4.4 MiB now),
//! and the insert merges of one large index reached 9 MiB (2.7 MiB in generations).
//!
//! Case rule (the same as the search's check on each decoded row): the body's searchable
//! text ([`super::logs_read::body_text`]) and the query are both lowercased with Rust's
//! `str::to_lowercase` (Unicode lowercase mapping), then the query must be a substring. The
//! index holds that lowercased text with a case-sensitive trigram tokenizer, so a record
//! that matches always holds every trigram of the query: the index can only over-select
//! (`detail=none` keeps no positions), never miss.

use rusqlite::{params, Connection, Transaction};

use super::logs_read::body_text;
use crate::error::StorageError;
use crate::model::{AnyValue, LogRecord, Resource, Scope};

/// Shortest body query (in characters) the index can answer: one trigram (SQLite FTS5
/// documentation, "The Trigram Tokenizer"). Shorter ones are checked row by row.
pub const MIN_INDEXED_QUERY_CHARS: usize = 3;

/// Candidate rows up to which a body search drives from the index: at most this many rows
/// are looked up and sorted by time; above it the query text is common, and walking the
/// time-ordered indexes finds a page sooner.
pub const MAX_INDEX_CANDIDATES: usize = 10_000;

/// The text indexed for a body: its searchable text, lowercased.
pub(crate) fn body_key(v: &AnyValue) -> String {
    body_text(v).to_lowercase()
}

/// Trigrams of a query sent to the index at most: enough to make a long query selective.
const MAX_QUERY_TRIGRAMS: usize = 12;

/// The FTS5 terms of a lowercased body query of 3+ characters: its trigrams, each one
/// FTS5 string (double quotes doubled, SQLite FTS5 documentation, "FTS5 Strings"), sorted
/// and distinct. `detail=none` answers no phrase queries, so adjacency is left to the check
/// on the decoded body. Every trigram of the query is a term (overlapping: without
/// positions, only overlapping trigrams tie the query's parts together); at most
/// [`MAX_QUERY_TRIGRAMS`], spread over the query, the last one always.
///
/// A trigram holding NUL is left out: FTS5 reads its query as C text, so NUL ended it
/// ("unterminated string", a 500); the check on the decoded body still requires it. A
/// query made only of such trigrams has no terms and is not [`indexable`].
fn trigram_terms(lower: &str) -> Vec<String> {
    let chars: Vec<char> = lower.chars().collect();
    let n = chars.len().saturating_sub(2);
    let mut starts: Vec<usize> = (0..n)
        .filter(|&i| !chars[i..i + 3].contains(&'\0'))
        .collect();
    if starts.len() > MAX_QUERY_TRIGRAMS {
        let last = starts[starts.len() - 1];
        let step = starts.len().div_ceil(MAX_QUERY_TRIGRAMS);
        starts = starts.iter().step_by(step).copied().collect();
        starts.push(last);
    }
    let mut terms: Vec<String> = starts
        .iter()
        .map(|&i| {
            let t: String = chars[i..i + 3].iter().collect();
            format!("\"{}\"", t.replace('"', "\"\""))
        })
        .collect();
    terms.sort();
    terms.dedup();
    terms
}

/// The FTS5 query of all of [`trigram_terms`], all required (implicit AND).
#[cfg(test)]
pub(crate) fn fts_query(lower: &str) -> String {
    trigram_terms(lower).join(" ")
}

/// Whether `lower` (a lowercased body query) can be looked up in the index.
pub(crate) fn indexable(lower: &str) -> bool {
    lower.chars().count() >= MIN_INDEXED_QUERY_CHARS && !trigram_terms(lower).is_empty()
}

/// Payload bytes of log records after which the writer opens the next generation: a
/// sixteenth of the telemetry budget, from 1 MiB to 128 MiB. A generation is dropped whole
/// once its rows are gone, so this bounds the orphaned index entries, and the largest merge
/// FTS5 runs inside one generation (at the smallest cap, 2.75 MiB of records; at the
/// default 2 GiB cap, ~120 MiB, with a 64 MiB WAL share).
pub(crate) fn generation_bytes(telemetry_budget_bytes: u64) -> u64 {
    (telemetry_budget_bytes / 16).clamp(1 << 20, 128 << 20)
}

/// DDL of migration 8: the index of migration 3 becomes generation 1 (it keeps its
/// `contentless_delete` option, unused from now on), and its delete trigger goes.
pub(crate) const GENERATIONS_SCHEMA: &str = "
DROP TRIGGER logs_body_delete;
ALTER TABLE logs_body RENAME TO logs_body_1;
CREATE TABLE log_body_generations (
    gen      INTEGER PRIMARY KEY,
    first_id INTEGER NOT NULL
);
INSERT INTO log_body_generations(gen, first_id) VALUES (1, 1);
";

/// The FTS5 table of generation `gen`.
pub(crate) fn generation_table(gen: i64) -> String {
    format!("logs_body_{gen}")
}

/// The statement that indexes one record in generation `gen`: `?1` the log id, `?2` the
/// body's lowercased text.
fn insert_sql(gen: i64) -> String {
    format!(
        "INSERT INTO {}(rowid, body) VALUES (?1, ?2)",
        generation_table(gen)
    )
}

/// DDL of a new generation: contentless (the text lives only in the payload), no
/// positions (`detail=none`: a candidate filter) and no per-row sizes (`columnsize=0`:
/// nothing ranks), so inserting a row writes its trigrams' postings only.
fn create_generation_sql(gen: i64) -> String {
    format!(
        "CREATE VIRTUAL TABLE {} USING fts5(
            body, content='', tokenize='trigram case_sensitive 1', detail=none, columnsize=0
        )",
        generation_table(gen)
    )
}

/// The writer's side of the generations: the newest one, and how much was indexed in it.
#[derive(Clone, Debug)]
pub(crate) struct BodyIndexWriter {
    gen: i64,
    /// The statement that indexes one record in `gen` ([`BodyIndexWriter::insert_sql`]).
    insert_sql: String,
    first_id: i64,
    /// Payload bytes of the rows indexed in `gen` (rows deleted since included).
    bytes: u64,
    /// [`generation_bytes`] of the budget.
    roll_bytes: u64,
}

impl BodyIndexWriter {
    /// Reads the newest generation and the payload bytes of the rows stored in it.
    pub(crate) fn load(conn: &Connection, roll_bytes: u64) -> Result<Self, rusqlite::Error> {
        let (gen, first_id): (i64, i64) = conn.query_row(
            "SELECT gen, first_id FROM log_body_generations ORDER BY gen DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let bytes: i64 = conn.query_row(
            "SELECT coalesce(sum(length(payload)), 0) FROM logs WHERE id >= ?1",
            [first_id],
            |r| r.get(0),
        )?;
        Ok(Self {
            gen,
            insert_sql: insert_sql(gen),
            first_id,
            bytes: bytes.max(0) as u64,
            roll_bytes,
        })
    }

    /// Before records are indexed from log id `next_id` on, in the writer's transaction:
    /// opens the next generation when the newest one is full (and holds a row).
    pub(crate) fn before_insert(
        &mut self,
        conn: &Connection,
        next_id: i64,
    ) -> Result<(), rusqlite::Error> {
        if self.bytes < self.roll_bytes || next_id <= self.first_id {
            return Ok(());
        }
        let gen = self.gen + 1;
        conn.execute_batch(&create_generation_sql(gen))?;
        conn.execute(
            "INSERT INTO log_body_generations(gen, first_id) VALUES (?1, ?2)",
            params![gen, next_id],
        )?;
        *self = Self {
            gen,
            insert_sql: insert_sql(gen),
            first_id: next_id,
            bytes: 0,
            roll_bytes: self.roll_bytes,
        };
        Ok(())
    }

    /// The statement that indexes one record in the newest generation.
    pub(crate) fn insert_sql(&self) -> &str {
        &self.insert_sql
    }

    /// Counts a record of `payload_bytes` indexed.
    pub(crate) fn added(&mut self, payload_bytes: usize) {
        self.bytes = self.bytes.saturating_add(payload_bytes as u64);
    }
}

/// Drops every generation but the newest whose rows are all deleted (the next
/// generation's first id is at most the smallest log id left, or no log is left), in the
/// transaction that deleted log rows. Answers the generations dropped.
pub(crate) fn drop_dead_generations(conn: &Connection) -> Result<u64, rusqlite::Error> {
    let oldest: Option<i64> = conn.query_row("SELECT min(id) FROM logs", [], |r| r.get(0))?;
    let gens: Vec<(i64, i64)> = {
        let mut st =
            conn.prepare_cached("SELECT gen, first_id FROM log_body_generations ORDER BY gen")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<Result<_, _>>()?
    };
    let mut dropped = 0;
    for w in gens.windows(2) {
        let ((gen, _), (_, next_first)) = (w[0], w[1]);
        if oldest.is_some_and(|o| next_first > o) {
            break;
        }
        conn.execute_batch(&format!("DROP TABLE {}", generation_table(gen)))?;
        conn.execute("DELETE FROM log_body_generations WHERE gen = ?1", [gen])?;
        dropped += 1;
    }
    Ok(dropped)
}

/// The generations' tables, newest first: read as the first statement of a read
/// transaction, so every table named exists in its snapshot.
pub(crate) fn generation_tables(conn: &Connection) -> Result<Vec<String>, rusqlite::Error> {
    let mut st = conn.prepare_cached("SELECT gen FROM log_body_generations ORDER BY gen DESC")?;
    let rows = st.query_map([], |r| r.get::<_, i64>(0))?;
    rows.map(|g| g.map(generation_table)).collect()
}

/// The rowids of every generation whose body matches `?1`, as one `UNION ALL` (a
/// subquery with one column, `cid`); `tables` from [`generation_tables`].
fn matching_rowids(tables: &[String]) -> String {
    let parts: Vec<String> = tables
        .iter()
        .map(|t| format!("SELECT rowid AS cid FROM {t} WHERE {t} MATCH ?1"))
        .collect();
    if parts.is_empty() {
        // no generation (cannot happen after migration 8): no candidate
        return "SELECT NULL AS cid WHERE 0".to_string();
    }
    parts.join(" UNION ALL ")
}

/// The `FROM` clause of a search driven by the index: each candidate's `logs` row by rowid
/// (`CROSS JOIN` keeps the index as the outer loop; a candidate whose row is deleted is
/// no result); binds the [`candidate_query`] as `?1`, so the caller's next `?` is `?2`. Ends
/// in a `WHERE` clause the caller extends with `AND ...`.
pub(crate) fn from_candidates(tables: &[String]) -> String {
    format!(
        "({}) AS c CROSS JOIN logs ON logs.id = c.cid WHERE 1",
        matching_rowids(tables)
    )
}

/// The FTS5 query a body search drives from when at most [`MAX_INDEX_CANDIDATES`] rows may
/// hold `lower`; `None` when more may (the caller walks the time-ordered indexes).
///
/// The query is built from the rare trigrams: each trigram of the query is first counted
/// in the index up to the bound (`LIMIT`, so a common one costs at most the bound's rowids,
/// never its whole doclist), and the query ANDs only those under the bound. Intersecting
/// the doclists of the common trigrams (every row holds "cel" of "cell 499") cost more
/// than the rest of the search, and adds nothing to a candidate set the rare ones already
/// bound: any subset of the trigrams still selects every matching row (each candidate is
/// checked against its decoded body). When no single trigram is rare, all of them are
/// ANDed and counted as a whole. Reads at most one rowid past the bound per count.
///
/// Counts include orphaned entries (rows deleted, their generation not yet dropped): they
/// can only make the index look less selective than it is.
pub(crate) fn candidate_query(
    conn: &Connection,
    tables: &[String],
    lower: &str,
) -> Result<Option<String>, StorageError> {
    let terms = trigram_terms(lower);
    let cap = MAX_INDEX_CANDIDATES as i64 + 1;
    let mut count = conn.prepare_cached(&format!(
        "SELECT count(*) FROM ({} LIMIT ?2)",
        matching_rowids(tables)
    ))?;
    let mut rare = Vec::new();
    if terms.len() > 1 {
        for t in &terms {
            let n: i64 = count.query_row(params![t, cap], |r| r.get(0))?;
            if n == 0 {
                // no row holds this trigram: nothing matches
                return Ok(Some(t.clone()));
            }
            if n < cap {
                rare.push(t.as_str());
            }
        }
    }
    if !rare.is_empty() {
        return Ok(Some(rare.join(" ")));
    }
    let all = terms.join(" ");
    let n: i64 = count.query_row(params![all, cap], |r| r.get(0))?;
    Ok((n < cap).then_some(all))
}

/// Migration 3's back-fill: indexes the body of every stored log row, in the migration's
/// transaction (into `logs_body`, generation 1 from migration 8 on).
pub(crate) fn backfill_log_bodies(tx: &Transaction<'_>) -> Result<(), StorageError> {
    let mut read = tx.prepare("SELECT id, payload FROM logs ORDER BY id")?;
    let mut write = tx.prepare("INSERT INTO logs_body(rowid, body) VALUES (?1, ?2)")?;
    let mut rows = read.query([])?;
    while let Some(r) = rows.next()? {
        let id: i64 = r.get(0)?;
        let payload: &[u8] = r.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
        let (_, _, record): (Resource, Scope, LogRecord) = postcard::from_bytes(payload)
            .map_err(|e| StorageError::Corrupt(format!("log row {id}: {e}")))?;
        write.execute(params![id, body_key(&record.body)])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_trigrams_covering_the_text_with_quotes_doubled() {
        assert_eq!(fts_query(r#"a "hi""#), r#"" ""h" """hi" "a """ "hi""""#);
        assert_eq!(fts_query("abcdef"), r#""abc" "bcd" "cde" "def""#);
        assert_eq!(fts_query("abc"), r#""abc""#);
        assert_eq!(
            fts_query(&"x".repeat(100)),
            r#""xxx""#,
            "one distinct trigram"
        );
        let long: String = ('a'..='z').chain('A'..='Z').collect();
        assert!(fts_query(&long).matches('"').count() <= 2 * (MAX_QUERY_TRIGRAMS + 1));
        assert!(
            fts_query(&long).contains(r#""XYZ""#),
            "the last trigram is kept"
        );
        assert!(indexable("abc"));
        assert!(!indexable("ab"));
        assert!(indexable("äöü"), "characters, not bytes");
    }

    /// The index of migration 3 alone, as a generation list.
    fn one() -> Vec<String> {
        vec!["logs_body".to_string()]
    }

    fn candidates(conn: &Connection, lower: &str) -> Vec<i64> {
        let mut st = conn
            .prepare("SELECT rowid FROM logs_body WHERE logs_body MATCH ?1 ORDER BY rowid DESC")
            .unwrap();
        st.query_map([fts_query(&lower.to_lowercase())], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn the_trigram_index_finds_substrings_and_deletes_by_rowid() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(super::super::schema::LOGS_BODY_SCHEMA)
            .unwrap();
        for (id, body) in [
            (1, "Connection REFUSED by peer"),
            (2, "all fine"),
            (3, "refusal"),
        ] {
            conn.execute(
                "INSERT INTO logs_body(rowid, body) VALUES (?1, ?2)",
                params![id, body_key(&AnyValue::String(body.into()))],
            )
            .unwrap();
        }
        // a substring in the middle of a word, any case in the query
        assert_eq!(candidates(&conn, "eFuSe"), vec![1]);
        assert_eq!(
            candidates(&conn, "efus"),
            vec![3, 1],
            "\"refusal\" holds it too"
        );
        assert_eq!(candidates(&conn, "on ref"), vec![1], "across words");
        assert_eq!(candidates(&conn, "refus"), vec![3, 1]);
        assert_eq!(candidates(&conn, "nothing"), Vec::<i64>::new());
        assert_eq!(
            candidate_query(&conn, &one(), "refus").unwrap().as_deref(),
            Some(r#""efu" "fus" "ref""#),
            "every trigram is rare here"
        );
        conn.execute("DELETE FROM logs_body WHERE rowid = 1", [])
            .unwrap();
        assert_eq!(candidates(&conn, "refus"), vec![3]);
    }

    /// The index is asked for the rare trigrams only; a text whose every trigram is common
    /// is left to the walk; a trigram no row holds answers no candidate at once.
    #[test]
    fn the_candidate_query_keeps_the_rare_trigrams() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(super::super::schema::LOGS_BODY_SCHEMA)
            .unwrap();
        let mut ins = conn
            .prepare("INSERT INTO logs_body(rowid, body) VALUES (?1, ?2)")
            .unwrap();
        for id in 1..=MAX_INDEX_CANDIDATES as i64 + 1 {
            ins.execute(params![id, format!("cell {} ok", id % 97)])
                .unwrap();
        }
        ins.execute(params![0, "cell zebra ok"]).unwrap();
        let q = candidate_query(&conn, &one(), "cell zeb").unwrap();
        assert_eq!(q.as_deref(), Some(r#"" ze" "l z" "zeb""#));
        assert_eq!(
            candidates(&conn, "cell zeb"),
            vec![0],
            "the full query agrees"
        );
        assert_eq!(
            candidate_query(&conn, &one(), "cell").unwrap(),
            None,
            "common"
        );
        let none = candidate_query(&conn, &one(), "cell qq").unwrap().unwrap();
        let n: i64 = conn
            .query_row(
                "SELECT count(*) FROM logs_body WHERE logs_body MATCH ?1",
                [&none],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 0, "{none}");
    }
}
