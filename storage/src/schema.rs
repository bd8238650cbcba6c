//! Schema migrations by `PRAGMA user_version`.
//!
//! Migration N is the list of DDL strings in `MIGRATIONS[N-1]`; each domain module owns its
//! own DDL constant. Until a release ships, version 1 may still be edited; after that, only
//! new entries are appended. A database whose version is newer than [`SCHEMA_VERSION`] is
//! refused ([`StorageError::SchemaTooNew`]).

use rusqlite::Connection;

use crate::error::StorageError;

/// The migrations, oldest first. Each is applied in one transaction.
const MIGRATIONS: &[&[&str]] = &[
    &[
        crate::telemetry::SCHEMA,
        crate::incidents::SCHEMA,
        crate::ledger::SCHEMA,
        crate::runners::SCHEMA,
        crate::checkpoints::SCHEMA,
        crate::outbox::SCHEMA,
        crate::forward::SCHEMA,
    ],
    // 2: log and metric read-back columns and indexes (issue 13)
    &[crate::telemetry::READBACK_SCHEMA],
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings the database to [`SCHEMA_VERSION`].
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), StorageError> {
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StorageError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, parts) in MIGRATIONS.iter().enumerate().skip(found.max(0) as usize) {
        let tx = conn.transaction()?;
        for ddl in parts.iter() {
            tx.execute_batch(ddl)?;
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}
