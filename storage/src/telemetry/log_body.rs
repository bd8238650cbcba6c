//! The log body substring index (`logs_body`, FTS5 `trigram`, migration 3; see
//! `schema.rs`): what is indexed, the back-fill, and the candidate look-up the log search
//! uses for a body filter.
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

/// The `FROM` clause of a search driven by the index: each candidate's `logs` row by rowid
/// (`CROSS JOIN` keeps the index as the outer loop); binds the [`candidate_query`] first.
pub(crate) const FROM_CANDIDATES: &str =
    "logs_body CROSS JOIN logs ON logs.id = logs_body.rowid WHERE logs_body MATCH ?";

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
pub(crate) fn candidate_query(
    conn: &Connection,
    lower: &str,
) -> Result<Option<String>, StorageError> {
    let terms = trigram_terms(lower);
    let cap = MAX_INDEX_CANDIDATES as i64 + 1;
    let mut count = conn.prepare_cached(
        "SELECT count(*) FROM (SELECT rowid FROM logs_body WHERE logs_body MATCH ?1 LIMIT ?2)",
    )?;
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
/// transaction.
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
            candidate_query(&conn, "refus").unwrap().as_deref(),
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
        let q = candidate_query(&conn, "cell zeb").unwrap();
        assert_eq!(q.as_deref(), Some(r#"" ze" "l z" "zeb""#));
        assert_eq!(
            candidates(&conn, "cell zeb"),
            vec![0],
            "the full query agrees"
        );
        assert_eq!(candidate_query(&conn, "cell").unwrap(), None, "common");
        let none = candidate_query(&conn, "cell qq").unwrap().unwrap();
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
