//! Schema migrations by `PRAGMA user_version`.
//!
//! Migration N is the list of steps in `MIGRATIONS[N-1]`: DDL strings, or a Rust function
//! where rows must be computed from payloads (a back-fill); each domain module owns its own
//! DDL constant. Until a release ships, version 1 may still be edited; after that, only
//! new entries are appended. A database whose version is newer than [`SCHEMA_VERSION`] is
//! refused ([`StorageError::SchemaTooNew`]).

use rusqlite::{Connection, Transaction};

use crate::error::StorageError;

/// One step of a migration.
enum Step {
    /// DDL (or plain SQL), run with `execute_batch`.
    Sql(&'static str),
    /// Rust code inside the migration's transaction (a back-fill that decodes payloads).
    Rust(fn(&Transaction<'_>) -> Result<(), StorageError>),
}

use Step::{Rust, Sql};

/// The migrations, oldest first. Each is applied in one transaction.
const MIGRATIONS: &[&[Step]] = &[
    &[
        Sql(crate::telemetry::SCHEMA),
        Sql(crate::incidents::SCHEMA),
        Sql(crate::ledger::SCHEMA),
        Sql(crate::runners::SCHEMA),
        Sql(crate::checkpoints::SCHEMA),
        Sql(crate::outbox::SCHEMA),
        Sql(crate::forward::SCHEMA),
    ],
    // 2: log and metric read-back columns and indexes (issue 13)
    &[Sql(crate::telemetry::READBACK_SCHEMA)],
    // 3: the log body substring index (FTS5 trigram), back-filled from the stored rows, and
    // the covering metric point index (issue 13, query speed)
    &[
        Sql(crate::telemetry::LOGS_BODY_SCHEMA),
        Sql(crate::telemetry::QUERY_INDEX_SCHEMA),
        Rust(crate::telemetry::backfill_log_bodies),
    ],
    // 4: the metric point index by series then time (issue 13, points query speed)
    &[Sql(crate::telemetry::SERIES_INDEX_SCHEMA)],
    // 5: the trace index as sorted runs, appended (issue 16, ingest speed
    // with millions of spans stored)
    &[Sql(crate::telemetry::TRACE_RUNS_SCHEMA)],
    // 6: term postings merged in bulk with the trace index (issue 16, bytes written per span)
    &[Sql(crate::telemetry::POSTINGS_SCHEMA)],
    // 7: trace-index runs stored in blocks of traces (issue 16, ingest speed)
    &[Sql(crate::telemetry::TRACE_BLOCKS_SCHEMA)],
    // 8: the log body index in generations, dropped whole instead of deleted row by row
    // (issue 16, the size cap under a log flood)
    &[Sql(crate::telemetry::LOG_BODY_GENERATIONS_SCHEMA)],
    // 9: trace payloads of several zstd frames (issue 16, one export encoded in parts):
    // no DDL, the version only keeps earlier binaries, which read one frame, from the file
    &[Sql(crate::telemetry::PAYLOAD_FRAMES_SCHEMA)],
    // 10: open spans listed a page at a time, oldest first, along an index (the open-span
    // list had no limit: one read of a 300k-span ledger answered 100 MB)
    &[Sql(crate::ledger::PAGING_SCHEMA)],
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings the database to [`SCHEMA_VERSION`].
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), StorageError> {
    let found = check(conn)?;
    for (i, parts) in MIGRATIONS.iter().enumerate().skip(found.max(0) as usize) {
        let tx = conn.transaction()?;
        for step in parts.iter() {
            match step {
                Sql(ddl) => tx.execute_batch(ddl)?,
                Rust(f) => f(&tx)?,
            }
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

/// Reads `PRAGMA user_version` and refuses a file this binary must not touch; called before
/// any pragma that would change the file (WAL mode), and again by [`migrate`].
pub(crate) fn check(conn: &Connection) -> Result<i64, StorageError> {
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StorageError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    // A negative version, or version 0 on a file that already holds tables, was written by
    // something else: migrating it would fail half-way with a raw SQL error.
    let foreign = found < 0
        || (found == 0
            && conn.query_row(
                "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'",
                [],
                |r| r.get::<_, i64>(0),
            )? > 0);
    if foreign {
        return Err(StorageError::SchemaForeign {
            path: conn.path().unwrap_or_default().into(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(found)
}
