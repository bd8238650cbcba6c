//! Row ids of the telemetry tables only grow, even across a table emptied by retention
//! and a restart after it.
//!
//! SQLite gives a rowid table without `AUTOINCREMENT` the largest id plus one, so once
//! retention deleted every row of `span_batches`, `logs` or `metric_points` (an idle
//! sidecar past its retention, a log flood that stopped while traces went on), the next
//! row took id 1 again after a restart: the forwarder's cursor (`forward.rs`, "rows with a
//! larger id are the backlog") then skipped every new row until the ids passed it, the
//! live tail's "rows after the last one sent" likewise, and a log id would be indexed in
//! two body-index generations (`log_body.rs`). So the writer assigns the ids itself from
//! counters that never go down while it runs, and every transaction that deletes rows of a
//! table records the table's next id in `telemetry_meta`; at start the next id is the
//! larger of that record and the largest id stored plus one.

use rusqlite::{params, Connection};

/// A telemetry table whose ids the writer assigns.
#[derive(Clone, Copy, Debug)]
pub(crate) enum IdTable {
    SpanBatches,
    Logs,
    MetricPoints,
}

impl IdTable {
    fn table(self) -> &'static str {
        match self {
            IdTable::SpanBatches => "span_batches",
            IdTable::Logs => "logs",
            IdTable::MetricPoints => "metric_points",
        }
    }

    /// The `telemetry_meta` key of the table's next id.
    fn key(self) -> &'static str {
        match self {
            IdTable::SpanBatches => "next_id.span_batches",
            IdTable::Logs => "next_id.logs",
            IdTable::MetricPoints => "next_id.metric_points",
        }
    }
}

/// The first id `table` may use: after every id stored and every id recorded as used.
pub(crate) fn first_free_id(conn: &Connection, table: IdTable) -> Result<i64, rusqlite::Error> {
    conn.query_row(
        &format!(
            "SELECT max(
                coalesce((SELECT max(id) FROM {}), 0) + 1,
                coalesce((SELECT value FROM telemetry_meta WHERE key = ?1), 1))",
            table.table()
        ),
        [table.key()],
        |r| r.get(0),
    )
}

/// Records `next` as the first id `table` may use, in the transaction that deletes rows
/// of it.
pub(crate) fn record_next_id(
    conn: &Connection,
    table: IdTable,
    next: i64,
) -> Result<(), rusqlite::Error> {
    conn.prepare_cached("INSERT OR REPLACE INTO telemetry_meta(key, value) VALUES (?1, ?2)")?
        .execute(params![table.key(), next])?;
    Ok(())
}

/// The largest id `table` has used: its largest stored id, or more when the newest rows
/// were deleted (0 when it never held a row). The forwarder restarts its cursor at 0 only
/// below this (a table emptied by a version that still restarted ids).
pub(crate) fn last_used_id(conn: &Connection, table: IdTable) -> Result<i64, rusqlite::Error> {
    Ok(first_free_id(conn, table)? - 1)
}
