//! Telemetry tables and the names of the search terms.
//!
//! Layout (designed for group commits of 512-span export requests, see `mod.rs`): one
//! `span_batches` row per stored request (a per-span index blob plus the postcard payload),
//! a `trace_index` row per trace and run (the batches holding it, merged in bulk),
//! per-batch term postings for search, one `logs` row per log record and one
//! `metric_points` row per data point. No table has a per-span row or a per-span index.

/// DDL for the telemetry tables (part of migration 1).
///
/// - `span_batches.idx`: the per-span index ([`super::encode::BatchIndex`]: ids, times,
///   status, term references and payload offsets) in one of three forms, the newest in
///   columns (`index_blob`); `payload`: `[u32 LE header length]`,
///   postcard header (resources, scopes), then each span's postcard body.
/// - `span_batches.traces`: the batch's distinct trace ids, sorted, 16 bytes each.
/// - `trace_index`: trace id → the batches holding its spans (i64 LE each), for batches
///   up to `telemetry_meta.merged_upto`. Newer batches are found by scanning their
///   `traces` column; the writer merges them into `trace_index` in bulk (every
///   [`MERGE_BATCHES`] batches), so a commit never dirties one random B-tree page per
///   trace (that alone halved throughput). Migration 5 ([`TRACE_RUNS_SCHEMA`]) splits it
///   into sorted runs.
/// - `terms`/`batch_terms`: postings from `(key, value)` to the batches holding a span
///   with that term (service, span name, service+span name, indexed attribute keys,
///   status error); written in bulk since migration 6 ([`POSTINGS_SCHEMA`]).
/// - Unsigned 64-bit nanoseconds are stored bit-cast into INTEGER columns.
pub(crate) const SCHEMA: &str = "
CREATE TABLE span_batches (
    id                 INTEGER PRIMARY KEY,
    received_unix_nano INTEGER NOT NULL,
    min_start          INTEGER NOT NULL,
    max_start          INTEGER NOT NULL,
    max_duration       INTEGER NOT NULL,
    span_count         INTEGER NOT NULL,
    traces             BLOB NOT NULL,
    idx                BLOB NOT NULL,
    payload            BLOB NOT NULL
);
CREATE INDEX span_batches_scan
    ON span_batches(id, received_unix_nano, min_start, max_start, max_duration);
CREATE TABLE trace_index (
    trace_id BLOB PRIMARY KEY,
    batches  BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE telemetry_meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE terms (
    id    INTEGER PRIMARY KEY,
    key   TEXT NOT NULL,
    value TEXT NOT NULL,
    UNIQUE (key, value)
);
CREATE TABLE batch_terms (
    term_id  INTEGER NOT NULL,
    batch_id INTEGER NOT NULL,
    PRIMARY KEY (term_id, batch_id)
) WITHOUT ROWID;
CREATE TABLE logs (
    id                 INTEGER PRIMARY KEY,
    received_unix_nano INTEGER NOT NULL,
    time_unix_nano     INTEGER NOT NULL,
    trace_id           BLOB,
    span_id            BLOB,
    payload            BLOB NOT NULL
);
CREATE INDEX logs_trace ON logs(trace_id, time_unix_nano) WHERE trace_id IS NOT NULL;
CREATE INDEX logs_received ON logs(received_unix_nano);
CREATE TABLE metric_points (
    id                 INTEGER PRIMARY KEY,
    received_unix_nano INTEGER NOT NULL,
    name               TEXT NOT NULL,
    time_unix_nano     INTEGER NOT NULL,
    payload            BLOB NOT NULL
);
CREATE INDEX metric_points_name ON metric_points(name, id);
CREATE INDEX metric_points_received ON metric_points(received_unix_nano);
";

/// DDL of migration 5 (issue 16, ingest speed with millions of spans stored): the trace
/// index as sorted runs, each appended once.
///
/// Until migration 5 every merge inserted its ~16k trace ids (random keys) into one
/// B-tree of all stored traces, dirtying nearly every leaf page once the index outgrew the
/// page cache: each merge rewrote the whole index, so the cost per stored span grew with
/// the store (ingest fell by a third at ~10M stored spans).
///
/// - `trace_runs`: one row per run: the batch ids it covers (`lo..=hi`, contiguous, runs
///   never overlap), `units` (the number of merges folded into it: 1 for every run written
///   now; runs of several merges were written by earlier versions, which compacted runs,
///   and by migration 5 itself) and `entries`
///   (its rows).
/// - `trace_index` (`run, trace_id` → `batches`): a run's rows. A merge writes a new run
///   whose key range lies after every existing row, so its pages are appended, not
///   scattered. Each row is written once: runs are not compacted (see below), so a store of
///   `n` merges holds `n` runs (a lookup seeks once per run).
/// - A trace's batches are the union of its rows over all runs (one B-tree seek per run).
///   Retention deletes a run whole (one key range) once all its batches are gone; a run
///   partly deleted keeps stale batch ids, and readers skip batch ids whose row is gone.
///
/// Earlier versions compacted the newest four runs of one merge into one (a k-way merge,
/// rewriting each row once and deleting its old copy), so a lookup sought a quarter as
/// many runs. That compaction was 8.6% of the sidecar's CPU under HTTP/protobuf c=1 (the
/// merges themselves 5.1%), and dropping it raised the rate 1.11-1.18x (HTTP/protobuf c=1
/// and c=4, gRPC c=4; issue 16). Without it a store at the default 2 GiB cap (~9M spans
/// in 512-span exports, ~70 runs: one per 256 batches, so smaller exports make more)
/// seeks ~70 runs per lookup (~0.1 ms with cached pages, measured with 67 runs); the
/// writer's deduplication looks up only the traces its Bloom filter may hold.
///
/// The index stored before migration 5 becomes run 1 (covering batches `0..=merged_upto`).
pub(crate) const TRACE_RUNS_SCHEMA: &str = "
CREATE TABLE trace_runs (
    run     INTEGER PRIMARY KEY,
    lo      INTEGER NOT NULL,
    hi      INTEGER NOT NULL,
    units   INTEGER NOT NULL,
    entries INTEGER NOT NULL
);
ALTER TABLE trace_index RENAME TO trace_index_v1;
CREATE TABLE trace_index (
    run      INTEGER NOT NULL,
    trace_id BLOB NOT NULL,
    batches  BLOB NOT NULL,
    PRIMARY KEY (run, trace_id)
) WITHOUT ROWID;
INSERT INTO trace_runs(run, lo, hi, units, entries)
    SELECT 1, 0,
           coalesce((SELECT value FROM telemetry_meta WHERE key = 'merged_upto'), 0),
           max(1, coalesce((SELECT value FROM telemetry_meta WHERE key = 'merged_upto'), 0) / 256),
           count(*)
    FROM trace_index_v1 HAVING count(*) > 0;
INSERT INTO trace_index(run, trace_id, batches)
    SELECT 1, trace_id, batches FROM trace_index_v1 ORDER BY trace_id;
DROP TABLE trace_index_v1;
";

/// DDL of migration 7 (issue 16, ingest speed): runs of the trace index stored in blocks.
///
/// A run of form 1 (every run before migration 7) holds one `trace_index` row per trace:
/// `(run, trace_id, batches)`. A merge wrote one B-tree insert per trace (64 per
/// 512-span export of otlp-blast, 16k per merge), 5.6% of the sidecar's CPU under
/// HTTP/protobuf c=4. A run of form 2 holds its traces in blocks
/// ([`super::traceidx::encode_block`]): each row's `trace_id` is the block's first trace
/// id and `batches` the block (up to [`super::traceidx::BLOCK_TRACES`] traces, ascending,
/// with their batch lists), so a merge inserts a block per ~128 traces. A lookup finds, in
/// each run, the row with the greatest `trace_id` not above the one sought: the row itself
/// in form 1 (kept when the ids are equal), the block to search in form 2. Retention and
/// the other per-run steps are unchanged; rows of both forms are read.
pub(crate) const TRACE_BLOCKS_SCHEMA: &str = "
ALTER TABLE trace_runs ADD COLUMN form INTEGER NOT NULL DEFAULT 1;
";

/// DDL of migration 6 (issue 16, bytes written per span): term postings merged in bulk.
///
/// Until migration 6 each stored batch inserted one `batch_terms` row per term it holds
/// (10–30 for a typical export), each in the key range of its own term: every group commit
/// dirtied one 16 KiB leaf page per term, and those pages made up a quarter of all bytes
/// written (1,363 → 1,020 MB per million spans with them left out, `/proc/PID/io`).
///
/// - `pending_terms` (`batch_id` → `term_ids`, i64 LE each, ascending): the distinct term
///   ids of each batch whose postings are not in `batch_terms` yet, one small row per
///   batch (its own table: a column added to `span_batches` would sit after the payload,
///   in its overflow pages). The writer moves them into `batch_terms` in (term, batch)
///   order when it merges the trace index (every [`MERGE_BATCHES`] batches, same
///   transaction) and deletes the rows, so each term's leaf is written once per merge and
///   every pending batch is newer than every batch in `batch_terms`.
/// - Every posting stored before it is in `batch_terms`: `pending_terms` starts empty.
pub(crate) const POSTINGS_SCHEMA: &str = "
CREATE TABLE pending_terms (
    batch_id INTEGER PRIMARY KEY,
    term_ids BLOB NOT NULL
);
";

/// "DDL" of migration 9 (issue 16, one export encoded in parts): none. From this version
/// on a `span_batches.payload` may be several zstd frames, which decompress to the
/// concatenation of their contents (RFC 8878, section 3.1); a binary of an earlier
/// version read only one, so the version number alone refuses it the file
/// ([`crate::StorageError::SchemaTooNew`]) instead of letting it report those rows damaged.
pub(crate) const PAYLOAD_FRAMES_SCHEMA: &str = "-- trace payloads of several zstd frames";

/// `telemetry_meta` key of the newest batch already merged into `trace_index`.
pub(crate) const META_MERGED_UPTO: &str = "merged_upto";
/// Unmerged batches that trigger a merge into `trace_index`.
pub(crate) const MERGE_BATCHES: usize = 256;

/// Term key of a span's resource `service.name` ([`crate::model::UNKNOWN_SERVICE`] when
/// absent).
pub(crate) const TERM_SERVICE: &str = "service.name";
/// Term key of a span name.
pub(crate) const TERM_SPAN_NAME: &str = "span.name";
/// Term key of `service.name` + [`PAIR_SEP`] + span name (for `span_names(service)`).
pub(crate) const TERM_SERVICE_SPAN: &str = "service.span";
/// Term key of `gen_ai.tool.name`.
pub(crate) const TERM_TOOL: &str = "gen_ai.tool.name";
/// Term key marking spans with status ERROR (value `error`).
pub(crate) const TERM_STATUS: &str = "status";
/// Separator inside [`TERM_SERVICE_SPAN`] values (ASCII unit separator).
pub(crate) const PAIR_SEP: char = '\u{1f}';

/// Attribute keys indexed for search (docs/design.md, Read API JSON): on the span or its resource.
pub const INDEXED_ATTRIBUTE_KEYS: [&str; 5] = [
    "gen_ai.tool.name",
    "service.name",
    "error.type",
    "process.pid",
    "stallwatch.runner.id",
];

/// DDL of migration 2 (issue 13, reading logs and metrics back): columns and indexes that
/// let the log search and the metric point queries use an index instead of decoding every
/// payload. Additive only; rows stored before it carry the defaults (`service = ''`,
/// `severity = 0`, `series = 0`) and are found only by the unfiltered queries.
///
/// - `logs.service`: the resource `service.name`; `logs.severity`: `severity_number`
///   clamped to the OTLP range 0..=24; `logs.runner_id`: resource `stallwatch.runner.id`.
///   Searches walk `(…, time_unix_nano)` indexes newest first (see `logs_read.rs`).
/// - `metric_points.service`, `.series` (a 64-bit FNV-1a hash of the resource attributes,
///   the scope name and version and the point attributes: one series per attribute set and
///   source), `.value`, `.count`, `.sum` (for aggregation without decoding the payload).
/// - `metric_instruments`: one row per (metric name, service) with kind, unit, description,
///   point count and first/last point time, kept by the writer at each commit and
///   recomputed by retention.
pub(crate) const READBACK_SCHEMA: &str = "
ALTER TABLE logs ADD COLUMN service TEXT NOT NULL DEFAULT '';
ALTER TABLE logs ADD COLUMN severity INTEGER NOT NULL DEFAULT 0;
ALTER TABLE logs ADD COLUMN runner_id TEXT;
CREATE INDEX logs_time ON logs(time_unix_nano);
CREATE INDEX logs_severity_time ON logs(severity, time_unix_nano);
CREATE INDEX logs_service_time ON logs(service, severity, time_unix_nano);
CREATE INDEX logs_runner_time ON logs(runner_id, time_unix_nano) WHERE runner_id IS NOT NULL;
ALTER TABLE metric_points ADD COLUMN service TEXT NOT NULL DEFAULT '';
ALTER TABLE metric_points ADD COLUMN series INTEGER NOT NULL DEFAULT 0;
ALTER TABLE metric_points ADD COLUMN value REAL;
ALTER TABLE metric_points ADD COLUMN count INTEGER;
ALTER TABLE metric_points ADD COLUMN sum REAL;
CREATE INDEX metric_points_name_time ON metric_points(name, time_unix_nano);
CREATE TABLE metric_instruments (
    name        TEXT NOT NULL,
    service     TEXT NOT NULL,
    kind        TEXT NOT NULL,
    unit        TEXT NOT NULL,
    description TEXT NOT NULL,
    point_count INTEGER NOT NULL,
    first_time  INTEGER NOT NULL,
    last_time   INTEGER NOT NULL,
    PRIMARY KEY (name, service)
) WITHOUT ROWID;
";

/// The log body index of migration 3 (see [`QUERY_INDEX_SCHEMA`]).
pub(crate) const LOGS_BODY_SCHEMA: &str = "
CREATE VIRTUAL TABLE logs_body USING fts5(
    body, content='', contentless_delete=1, tokenize='trigram case_sensitive 1', detail=none
);
";

/// DDL of migration 3 (issue 13, query speed), after [`LOGS_BODY_SCHEMA`]. The back-fill of
/// `logs_body` from the rows stored before it runs in the same transaction (`log_body.rs`).
///
/// - `logs_body` ([`LOGS_BODY_SCHEMA`]): an FTS5 index of each log record's body text, rowid = `logs.id`, with the
///   `trigram` tokenizer (SQLite FTS5 documentation, "The Trigram Tokenizer": every
///   three-character sequence is a token, so any substring of 3+ characters is a query).
///   The text indexed is the body's searchable text lowercased by stallwatch
///   ([`super::log_body::body_key`]) and the tokenizer is case-sensitive, so the index
///   folds case exactly as the search does. Contentless (`content=''`, the text lives only
///   in the payload) with `contentless_delete=1` (rows can be deleted by rowid) and
///   `detail=none` (no positions: a candidate filter, every candidate is checked against the
///   decoded body). The writer fills it in the transaction that inserts the log rows.
/// - `logs_body_delete`: deleting a `logs` row (retention by age or size) deletes its
///   index row in the same statement, so the index never holds orphans.
/// - `metric_points_series_time`: a covering index for the points query
///   (`name, service, time_unix_nano` then the aggregated columns), replacing
///   `metric_points_name_time`; a query without a service seeks once per service of the
///   instrument (`metric_instruments`). Replaced by `metric_points_series` in migration 4
///   ([`SERIES_INDEX_SCHEMA`]).
pub(crate) const QUERY_INDEX_SCHEMA: &str = "
CREATE TRIGGER logs_body_delete AFTER DELETE ON logs BEGIN
    DELETE FROM logs_body WHERE rowid = old.id;
END;
DROP INDEX metric_points_name_time;
CREATE INDEX metric_points_series_time
    ON metric_points(name, service, time_unix_nano, series, value, count, sum);
";

/// DDL of migration 4 (issue 13, points query speed): `metric_points_series`, the covering
/// index `(name, service, series, time_unix_nano, value, count, sum)` replacing
/// `metric_points_series_time`. The points query reads each series' window as one index
/// range already in time order and groups it by step as it streams, so no temporary
/// B-tree sorts the window's rows (`metrics_read.rs`); the distinct series of an
/// instrument are found by a skip-scan, one seek per series.
pub(crate) const SERIES_INDEX_SCHEMA: &str = "
DROP INDEX metric_points_series_time;
CREATE INDEX metric_points_series
    ON metric_points(name, service, series, time_unix_nano, value, count, sum);
";
