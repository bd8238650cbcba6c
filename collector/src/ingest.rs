//! The ingest pipeline both transports share: in-flight byte budget, capped decompression,
//! decode, `Storage::write_*` (resolves after COMMIT), then the observation for the
//! watchdog. Transport modules only parse headers/framing and render the outcome.
//!
//! Order per request (docs/design.md, Durability and limits): nothing is acknowledged before its
//! commit; the observation is sent after the commit and before the answer, so a full
//! watchdog channel slows exporters down instead of growing memory.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use stallwatch_storage::control::{Observation, ObservedData};
use stallwatch_storage::{Storage, Transient, WriteError};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::chunks::{self, ChunkError, ChunkedTraces, TraceChunker};
use crate::config::CollectorConfig;
use crate::cors::CorsPolicy;
use crate::decode::{self, Format, Limits};
use crate::decompress::{self, Coding};
use crate::error::CollectorError;
use crate::part_pool::PartPool;
use crate::stats::{IngestStats, RefuseReason};

/// `Retry-After` when the in-flight budget or the write queue is full, seconds.
pub(crate) const BUSY_RETRY_AFTER_S: u64 = 1;
/// Once shutdown has begun, how long a request body may pause before its next frame
/// (instead of `body_idle_timeout`): a client that stopped sending mid-body must not hold
/// the drain for the whole `drain_timeout`; it is answered 503 (retryable) instead. A body
/// that keeps arriving is read to its end and committed.
pub(crate) const STOPPING_BODY_IDLE: std::time::Duration = std::time::Duration::from_millis(500);
/// `Retry-After` when storage is busy (another process holds the lock), has an I/O error
/// or lost its file, seconds.
pub(crate) const STORAGE_BUSY_RETRY_AFTER_S: u64 = 2;
/// `Retry-After` when the disk (or `max_db_bytes`) is full, seconds.
pub(crate) const STORAGE_FULL_RETRY_AFTER_S: u64 = 10;
/// The smallest share of a protobuf trace export given a part of its own, bytes (64 KiB):
/// decoding that much takes about 0.1 ms on this project's 2-core reference machine,
/// several times what handing a part to the pool and gathering it back costs.
const MIN_PART_BYTES: usize = 64 * 1024;
/// The most parts one trace export is decoded in ([`chunks::chunk_protobuf_traces`]).
const MAX_PARTS: usize = 4;
/// The largest protobuf trace export decoded in parts, bytes (4 MiB): a part holds what
/// it decoded until its turn to be chunked, so a larger export decodes streaming on one
/// thread, holding one chunk's records at a time (issue 17 #14), where the fixed cost a
/// request pays is small against its decode anyway.
const MAX_PARTED_BYTES: usize = 4 * 1024 * 1024;
/// Memory charged against `max_inflight_bytes` per byte of a protobuf trace export
/// decoded in parts, on top of [`Charge::grow_for_decode`]'s: the spans the parts gather
/// (borrowed records, their attribute lists) before they are chunked.
const GATHER_CHARGE_PER_BYTE: usize = 2;
/// How long exports decode whole after the pipeline was seen holding every core, ms.
const SATURATED_HOLD_MS: u64 = 200;

/// Whether cores are free for decoding one protobuf trace export in parts (issue 16).
///
/// Every export request in the pipeline (its body being read, decoding, or waiting for its
/// commit, which keeps the writer thread busy) is taken to hold a core. An export is cut into parts only over
/// the cores the others leave free: with one exporter sending one request at a time, its
/// decode spreads over the idle core(s) (A/B at HTTP/protobuf c=1: +14%); with as many
/// requests in flight as cores, every export decodes on one thread, as parts would only
/// add their hand-offs. Once seen saturated, it stays so for [`SATURATED_HOLD_MS`]: a
/// saturated runtime takes new requests up late, so a count taken at one moment misses
/// them (measured at c=4 against the build before: cutting whenever no other decode ran
/// cost 4–8%; counting the requests in the pipeline at that moment, 2–5%).
#[derive(Debug)]
pub(crate) struct DecodeThreads {
    /// Cores the process may run on (`available_parallelism`).
    cores: usize,
    /// Export requests in the pipeline now ([`DecodeThreads::enter`]).
    requests: std::sync::atomic::AtomicUsize,
    /// When the pipeline was last seen holding every core, ms since `epoch` plus one
    /// (0: never).
    saturated_at_ms: std::sync::atomic::AtomicU64,
    /// The clock's start.
    epoch: Instant,
    /// The threads that decode every part but the first (`cores − 1` of them, at most
    /// [`MAX_PARTS`] − 1), started at the first export cut into parts; `None` inside when
    /// they could not be started (exports then decode whole).
    pool: std::sync::OnceLock<Option<PartPool>>,
}

/// One export request in the pipeline ([`DecodeThreads::enter`]); leaves on drop.
pub(crate) struct InPipeline {
    threads: Arc<DecodeThreads>,
}

impl DecodeThreads {
    fn new() -> Self {
        Self::with_cores(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    fn with_cores(cores: usize) -> Self {
        Self {
            cores,
            requests: std::sync::atomic::AtomicUsize::new(0),
            saturated_at_ms: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
            pool: std::sync::OnceLock::new(),
        }
    }

    /// Counts one export request in the pipeline until the guard drops: the transports
    /// take it when a request's body starts being read.
    pub(crate) fn enter(self: &Arc<Self>) -> InPipeline {
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        InPipeline {
            threads: Arc::clone(self),
        }
    }

    /// The parts to decode a `body_bytes` protobuf trace export in, from within a request
    /// counted by [`DecodeThreads::enter`]: one, and one more per [`MIN_PART_BYTES`] of it
    /// (at most [`MAX_PARTS`], none over [`MAX_PARTED_BYTES`]) while the other requests in
    /// the pipeline leave cores free.
    fn parts(&self, body_bytes: usize) -> usize {
        use std::sync::atomic::Ordering::Relaxed;
        let free = self.free_cores();
        let saturated_at = self.saturated_at_ms.load(Relaxed);
        if body_bytes > MAX_PARTED_BYTES
            || (saturated_at > 0 && self.now_ms() + 1 < saturated_at + SATURATED_HOLD_MS)
        {
            return 1;
        }
        (body_bytes / MIN_PART_BYTES)
            .clamp(1, MAX_PARTS)
            .min(free.max(1))
    }

    /// Cores the other requests in the pipeline leave free to this one, noting when
    /// there are none ([`DecodeThreads::parts`] then cuts nothing for
    /// [`SATURATED_HOLD_MS`]). Called before a decode and again after it: requests that
    /// arrived while it ran are counted only once a worker took them up, which a saturated
    /// runtime does late.
    fn free_cores(&self) -> usize {
        use std::sync::atomic::Ordering::Relaxed;
        let others = self.requests.load(Relaxed).saturating_sub(1);
        let free = self.cores.saturating_sub(others);
        if free <= 1 && others > 0 {
            self.saturated_at_ms.store(self.now_ms() + 1, Relaxed);
        }
        free
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// The part decoders ([`DecodeThreads::pool`]), started on first use.
    fn pool(&self) -> Option<&PartPool> {
        self.pool
            .get_or_init(|| {
                let threads = self.cores.saturating_sub(1).clamp(1, MAX_PARTS - 1);
                PartPool::new(threads, "otlp-decode")
                    .map_err(|e| {
                        tracing::warn!(error = %e, "trace decode threads not started; exports decode whole")
                    })
                    .ok()
            })
            .as_ref()
    }
}

impl Drop for InPipeline {
    fn drop(&mut self) {
        self.threads
            .requests
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Bodies at most this large (wire and identity-coded) are decoded on the async worker;
/// larger or compressed ones on the blocking pool, bytes.
const INLINE_DECODE_BYTES: usize = 256 * 1024;
/// Decode-time memory charged against `max_inflight_bytes` per byte of a protobuf trace
/// body, on top of the body itself: what decoding it holds besides the body (the encoded
/// chunks, the watchdog's view, the chunk being built), issue 17 #14. Measured: one 19 MiB
/// export raises peak RSS by 3.3–3.7× (HTTP) / 3.5–3.8× (gRPC) its body, of which 1× is the body
/// and ~0.4× the writer's fixed 8 MiB page cache, so ~2× is per byte decoded (debug build,
/// `cargo test -p stallwatch --test tests memory:: -- --nocapture --test-threads=1`). A
/// request never charges more than the whole budget, so one request of
/// `max_request_bytes` is always admitted when nothing else is in flight.
const DECODE_CHARGE_PER_PROTOBUF_BYTE: usize = 2;
/// The same for an OTLP/JSON trace body (larger than the records it holds): 2.1–2.6×
/// growth for a 19.7 MiB body, of which 1× body and ~0.4× page cache, so ~1×.
const DECODE_CHARGE_PER_JSON_BYTE: usize = 1;
/// The same for a protobuf log body: decoded whole, then encoded record by record, freeing
/// each record (4.1–5.5× growth for a 19 MiB export, so ~3×).
const DECODE_CHARGE_PER_PROTOBUF_LOG_BYTE: usize = 3;
/// The same for a protobuf metrics body: decoded whole into wire types, then points, then
/// rows (5.6–6.8× growth for a 19 MiB export of one gauge with 93k points, so ~5×).
const DECODE_CHARGE_PER_PROTOBUF_METRIC_BYTE: usize = 5;
/// The same for OTLP/JSON log and metrics bodies (walked one record, or 1,024 metric
/// points, at a time into wire types, then as protobuf): 3.0–3.6× growth for a 19.7 MiB log
/// export, 3.9× for a metrics one, so ~2×.
const DECODE_CHARGE_PER_JSON_LOG_OR_METRIC_BYTE: usize = 2;

/// Decode-time memory per body byte of `signal` in `format` (the constants above).
fn decode_charge_per_byte(signal: Signal, format: Format) -> usize {
    match (signal, format) {
        (Signal::Traces, Format::Protobuf) => DECODE_CHARGE_PER_PROTOBUF_BYTE,
        (Signal::Traces, Format::Json) => DECODE_CHARGE_PER_JSON_BYTE,
        (Signal::Logs, Format::Protobuf) => DECODE_CHARGE_PER_PROTOBUF_LOG_BYTE,
        (Signal::Metrics, Format::Protobuf) => DECODE_CHARGE_PER_PROTOBUF_METRIC_BYTE,
        (Signal::Logs | Signal::Metrics, Format::Json) => DECODE_CHARGE_PER_JSON_LOG_OR_METRIC_BYTE,
    }
}

/// Which OTLP signal an export carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// `/v1/traces`, `TraceService/Export`.
    Traces,
    /// `/v1/logs`, `LogsService/Export`.
    Logs,
    /// `/v1/metrics`, `MetricsService/Export`.
    Metrics,
}

/// Why a request was not accepted; each variant is one HTTP status and one gRPC code.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// HTTP 400 / `INVALID_ARGUMENT`: the message names what was wrong.
    BadRequest(String),
    /// HTTP 400 / `INVALID_ARGUMENT`, as a stalled body is answered: the body arrived slower
    /// than the listener's `body_min_bytes_per_s` (`stallwatch_storage::listen`, "Minimum
    /// body rate"); the message names the rule. Counted as `body_too_slow`.
    TooSlow(String),
    /// HTTP 413 / `RESOURCE_EXHAUSTED` (no RetryInfo: not retryable as is).
    TooLarge(String),
    /// HTTP 415: unknown `Content-Type`.
    UnsupportedMediaType(String),
    /// HTTP 415 / `UNIMPLEMENTED`: unknown content coding.
    UnsupportedEncoding(String),
    /// HTTP 401 / `UNAUTHENTICATED`.
    Unauthenticated,
    /// HTTP 503 + `Retry-After` / `UNAVAILABLE` + RetryInfo.
    Busy {
        /// Whole seconds, at least 1.
        retry_after_s: u64,
        /// What is full.
        message: String,
        /// Counter label.
        reason: RefuseReason,
    },
    /// HTTP 500 / `INTERNAL`: a genuine internal failure, never bad input.
    Internal(String),
}

impl Refusal {
    /// The counter label.
    pub(crate) fn reason(&self) -> RefuseReason {
        match self {
            Refusal::BadRequest(_) => RefuseReason::BadRequest,
            Refusal::TooSlow(_) => RefuseReason::BodyTooSlow,
            Refusal::TooLarge(_) => RefuseReason::TooLarge,
            Refusal::UnsupportedMediaType(_) => RefuseReason::UnsupportedMediaType,
            Refusal::UnsupportedEncoding(_) => RefuseReason::UnsupportedEncoding,
            Refusal::Unauthenticated => RefuseReason::Unauthenticated,
            Refusal::Busy { reason, .. } => *reason,
            Refusal::Internal(_) => RefuseReason::Internal,
        }
    }

    /// The human message sent to the client.
    pub(crate) fn message(&self) -> String {
        match self {
            Refusal::BadRequest(m)
            | Refusal::TooSlow(m)
            | Refusal::TooLarge(m)
            | Refusal::UnsupportedMediaType(m)
            | Refusal::UnsupportedEncoding(m)
            | Refusal::Internal(m) => m.clone(),
            Refusal::Unauthenticated => {
                "missing or wrong ingest token (send Authorization: Bearer <token>)".into()
            }
            Refusal::Busy { message, .. } => message.clone(),
        }
    }

    /// The answer to a request body that could not be read: [`Refusal::TooSlow`] when the
    /// listener cut it for its pace (`e`'s source chain holds
    /// `stallwatch_storage::listen::TooSlow`), else a 400 saying `what` could not be read.
    pub(crate) fn body_error(what: &str, e: &(dyn std::error::Error + 'static)) -> Self {
        match stallwatch_storage::listen::too_slow(e) {
            Some(t) => Refusal::TooSlow(t.to_string()),
            None => Refusal::BadRequest(format!("cannot read {what}: {e}")),
        }
    }

    fn inflight_full() -> Self {
        Refusal::Busy {
            retry_after_s: BUSY_RETRY_AFTER_S,
            message: "collector busy: max_inflight_bytes reached, retry later".into(),
            reason: RefuseReason::InflightFull,
        }
    }
}

/// Maps a storage write failure to its answer (docs/design.md, Back-pressure and limits).
pub(crate) fn refusal_for_write(e: WriteError) -> Refusal {
    match e {
        WriteError::QueueFull { .. } => Refusal::Busy {
            retry_after_s: BUSY_RETRY_AFTER_S,
            message: format!("{e}, retry later"),
            reason: RefuseReason::QueueFull,
        },
        WriteError::Full(_) => Refusal::Busy {
            retry_after_s: STORAGE_FULL_RETRY_AFTER_S,
            message: format!("{e}, retry later"),
            reason: RefuseReason::StorageFull,
        },
        WriteError::AtCap(_) => Refusal::Busy {
            retry_after_s: BUSY_RETRY_AFTER_S,
            message: format!("{e}, retry later"),
            reason: RefuseReason::StorageFull,
        },
        WriteError::Closed => Refusal::Busy {
            retry_after_s: BUSY_RETRY_AFTER_S,
            message: format!("{e}, retry later"),
            reason: RefuseReason::ShuttingDown,
        },
        WriteError::Unavailable { kind, .. } => Refusal::Busy {
            retry_after_s: STORAGE_BUSY_RETRY_AFTER_S,
            message: format!("{e}, retry later"),
            reason: match kind {
                Transient::Busy => RefuseReason::StorageBusy,
                Transient::Locked => RefuseReason::StorageLocked,
                Transient::Io => RefuseReason::StorageIo,
                Transient::Full => RefuseReason::StorageFull,
                Transient::Gone => RefuseReason::StorageGone,
            },
        },
        WriteError::Failed(m) => Refusal::Internal(format!("storage commit failed: {m}")),
    }
}

/// The budget of request bytes held at once (`max_inflight_bytes`).
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    sem: Arc<Semaphore>,
    total: usize,
    stats: Arc<IngestStats>,
}

impl Budget {
    pub(crate) fn new(max_inflight_bytes: usize, stats: Arc<IngestStats>) -> Self {
        let total = max_inflight_bytes.min(Semaphore::MAX_PERMITS);
        Self {
            sem: Arc::new(Semaphore::new(total)),
            total,
            stats,
        }
    }
    /// An empty charge for one request; released when dropped.
    pub(crate) fn charge(&self) -> Charge {
        Charge {
            budget: self.clone(),
            permit: None,
            bytes: 0,
            decode: 0,
        }
    }
}

/// The bytes one request holds against the [`Budget`]: its body and the decode-time
/// memory charged for it.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Budget,
    permit: Option<OwnedSemaphorePermit>,
    /// Everything held, bytes.
    bytes: usize,
    /// Of `bytes`, the decode-time share ([`Charge::grow_for_decode`]), bytes.
    decode: usize,
}

impl Charge {
    /// Takes `n` more bytes, or refuses at once (503 / `UNAVAILABLE`) when the budget is
    /// exhausted: waiting would let slow clients pin memory. A request that would hold more
    /// than the whole budget by itself (a coded body with what it decompresses to) can never
    /// be taken, however long its client waits: it is refused as too large (413 /
    /// `RESOURCE_EXHAUSTED`, no retry), not as busy.
    pub(crate) fn grow(&mut self, n: usize) -> Result<(), Refusal> {
        if n == 0 {
            return Ok(());
        }
        let total = self.budget.total;
        if self.bytes.saturating_add(n) > total {
            return Err(Refusal::TooLarge(format!(
                "request needs more than max_inflight_bytes ({total}) in flight by itself \
                 (its body as sent, what it decompresses to, and its decoding): send it \
                 uncompressed or in smaller exports"
            )));
        }
        let n32 = u32::try_from(n).map_err(|_| Refusal::inflight_full())?;
        let p = Arc::clone(&self.budget.sem)
            .try_acquire_many_owned(n32)
            .map_err(|_| Refusal::inflight_full())?;
        match &mut self.permit {
            Some(existing) => existing.merge(p),
            None => self.permit = Some(p),
        }
        self.bytes += n;
        self.budget.stats.inflight_add(n);
        Ok(())
    }
    /// Holds the decode-time memory of a `body_bytes` body of `signal` in `format` (what decoding it
    /// holds besides the body), capped so that this request holds at most the whole
    /// budget. Called again with the final size, it takes only the difference: a transport
    /// charges it when the body's length is declared, before reading it, so a concurrent
    /// export that cannot be decoded is refused before it is read.
    pub(crate) fn grow_for_decode(
        &mut self,
        body_bytes: usize,
        signal: Signal,
        format: Format,
    ) -> Result<(), Refusal> {
        let per_byte = decode_charge_per_byte(signal, format);
        let room = self.budget.total.saturating_sub(self.body_bytes());
        let want = body_bytes.saturating_mul(per_byte).min(room);
        let more = want.saturating_sub(self.decode);
        self.grow(more)?;
        self.decode += more;
        Ok(())
    }
    /// Body bytes held (everything but the decode-time share).
    pub(crate) fn body_bytes(&self) -> usize {
        self.bytes - self.decode
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.stats.inflight_sub(self.bytes);
    }
}

/// What was accepted: the partial-success count and message (both empty on full success).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Accepted {
    pub rejected: u64,
    pub message: String,
}

enum Batch {
    Traces(decode::Decoded<ChunkedTraces>),
    Logs(decode::Decoded<stallwatch_storage::model::LogBatch>),
    Metrics(decode::Decoded<stallwatch_storage::model::MetricBatch>),
}

/// Shared state of both transports: storage, the watchdog channel, limits, CORS policy,
/// ingest token and counters. Cheap to clone.
#[derive(Clone)]
pub struct IngestState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) storage: Storage,
    pub(crate) observer: mpsc::Sender<Observation>,
    pub(crate) stats: Arc<IngestStats>,
    pub(crate) budget: Budget,
    pub(crate) cors: CorsPolicy,
    pub(crate) token: Option<String>,
    pub(crate) max_request_bytes: usize,
    pub(crate) limits: Limits,
    pub(crate) body_idle_timeout: std::time::Duration,
    pub(crate) allowed_hosts: Vec<String>,
    /// Cancelled when shutdown begins ([`crate::Server::run`]): body reads then wait at most
    /// [`STOPPING_BODY_IDLE`] per frame.
    pub(crate) stopping: tokio_util::sync::CancellationToken,
    /// Export requests in the pipeline and the trace part decoders ([`DecodeThreads`]).
    pub(crate) decode_threads: Arc<DecodeThreads>,
}

impl IngestState {
    /// Builds the state from a configuration (validated here).
    ///
    /// Errors: [`CollectorError::Config`] when `config` is invalid.
    pub fn new(
        config: &CollectorConfig,
        storage: Storage,
        observer: mpsc::Sender<Observation>,
    ) -> Result<Self, CollectorError> {
        config.validate()?;
        let stats = Arc::new(IngestStats::default());
        Ok(Self {
            inner: Arc::new(Inner {
                storage,
                observer,
                budget: Budget::new(config.max_inflight_bytes, Arc::clone(&stats)),
                stats,
                cors: CorsPolicy::new(&config.cors_allowed_origins)
                    .map_err(CollectorError::Config)?,
                token: config.ingest_token.clone(),
                max_request_bytes: config.max_request_bytes,
                limits: Limits {
                    max_nesting_depth: config.max_nesting_depth,
                },
                body_idle_timeout: config.body_idle_timeout,
                allowed_hosts: config.allowed_hosts.clone(),
                stopping: tokio_util::sync::CancellationToken::new(),
                decode_threads: Arc::new(DecodeThreads::new()),
            }),
        })
    }

    /// The `Host` (HTTP/1.1) or `:authority` (HTTP/2) of a request when it is refused by
    /// the shared rule ([`stallwatch_storage::hosts::host_allowed`]); `None` when allowed.
    /// A request with neither is refused (as `""`).
    pub(crate) fn foreign_host(
        &self,
        version: http::Version,
        uri: &http::Uri,
        headers: &http::HeaderMap,
    ) -> Option<String> {
        let host = stallwatch_storage::hosts::refused_host(
            version,
            uri,
            headers,
            &self.inner.allowed_hosts,
        )?;
        self.inner.stats.refuse_request(RefuseReason::ForbiddenHost);
        tracing::warn!(host = %host, "refused an OTLP request for a foreign Host (DNS rebinding guard)");
        Some(host)
    }

    /// The ingest counters (a [`stallwatch_storage::MetricsSource`]).
    pub fn stats(&self) -> Arc<IngestStats> {
        Arc::clone(&self.inner.stats)
    }

    /// True when no token is configured, or `authorization` is `Bearer <token>`
    /// (constant-time comparison).
    pub(crate) fn authorized(&self, authorization: Option<&[u8]>) -> bool {
        let Some(token) = &self.inner.token else {
            return true;
        };
        let Some(h) = authorization else {
            return false;
        };
        let Some(given) = h
            .get(..7)
            .filter(|p| p.eq_ignore_ascii_case(b"bearer "))
            .map(|_| h[7..].trim_ascii())
        else {
            return false;
        };
        let want = token.as_bytes();
        if given.len() != want.len() {
            return false;
        }
        given
            .iter()
            .zip(want)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// The next frame of a request body, or a refusal when the client stalls longer than
    /// `body_idle_timeout` (400), or, once shutdown has begun, longer than
    /// [`STOPPING_BODY_IDLE`] (503, retryable: nothing of it was stored).
    pub(crate) async fn next_frame<B>(
        &self,
        body: &mut B,
    ) -> Result<Option<Result<hyper::body::Frame<Bytes>, B::Error>>, Refusal>
    where
        B: hyper::body::Body<Data = Bytes> + Unpin,
    {
        use http_body_util::BodyExt;
        let t = self.inner.body_idle_timeout;
        let deadline = tokio::time::Instant::now() + t;
        let stalled = || {
            Refusal::BadRequest(format!(
                "request body stalled for more than {} ms",
                t.as_millis()
            ))
        };
        let frame = body.frame();
        tokio::pin!(frame);
        tokio::select! {
            biased;
            r = tokio::time::timeout_at(deadline, &mut frame) => return r.map_err(|_| stalled()),
            () = self.inner.stopping.cancelled() => {}
        }
        let short = deadline.min(tokio::time::Instant::now() + STOPPING_BODY_IDLE);
        match tokio::time::timeout_at(short, &mut frame).await {
            Ok(r) => Ok(r),
            Err(_) if short == deadline => Err(stalled()),
            Err(_) => Err(Refusal::Busy {
                retry_after_s: BUSY_RETRY_AFTER_S,
                message: "stallwatch is shutting down and the request body stopped arriving; \
                          nothing of it was stored, retry later"
                    .into(),
                reason: RefuseReason::ShuttingDown,
            }),
        }
    }

    /// Counts a request refused before it reached [`IngestState::process`].
    pub(crate) fn refused(&self, r: &Refusal) {
        self.inner.stats.refuse_request(r.reason());
    }

    /// Runs the pipeline on a raw (possibly compressed) body: capped decompression,
    /// decode, commit, observation.
    pub(crate) async fn process(
        &self,
        signal: Signal,
        format: Format,
        codings: Vec<Coding>,
        raw: Bytes,
        mut charge: Charge,
        received: Instant,
    ) -> Result<Accepted, Refusal> {
        let result = self
            .process_inner(signal, format, codings, raw, &mut charge, received)
            .await;
        if let Err(r) = &result {
            self.refused(r);
            match r {
                Refusal::Internal(m) => tracing::warn!(error = %m, "OTLP export failed"),
                r => {
                    tracing::debug!(reason = r.reason().as_str(), message = %r.message(), "OTLP export refused")
                }
            }
        }
        drop(charge);
        result
    }

    async fn process_inner(
        &self,
        signal: Signal,
        format: Format,
        codings: Vec<Coding>,
        raw: Bytes,
        charge: &mut Charge,
        received: Instant,
    ) -> Result<Accepted, Refusal> {
        let limit = self.inner.max_request_bytes;
        let limits = self.inner.limits;
        let inline = raw.len() <= INLINE_DECODE_BYTES && codings.is_empty();
        let threads = Arc::clone(&self.inner.decode_threads);
        let counters = Arc::clone(&self.inner.stats);
        let work = move |raw: Bytes, charge: &mut Charge| -> Result<Batch, Refusal> {
            let mut body = decompress::decompress(raw, &codings, limit, charge)?;
            charge.grow_for_decode(body.len(), signal, format)?;
            // JSON strings cut inside a character: replaced, not the export refused.
            let mut replaced = 0;
            if format == Format::Json {
                if let Some((fixed, n)) = decode::replace_lone_surrogates(&body) {
                    body = Bytes::from(fixed);
                    replaced = n;
                }
            }
            let warned = |message| decode::lone_surrogates_warning(message, replaced);
            let bad = |e: decode::DecodeError| Refusal::BadRequest(e.0);
            Ok(match signal {
                Signal::Traces if format == Format::Protobuf => {
                    // In parts side by side while cores are free, when the budget holds
                    // what the parts gather.
                    let want = threads.parts(body.len());
                    let pool = if want > 1 { threads.pool() } else { None };
                    let parts = match pool {
                        Some(_)
                            if charge
                                .grow(body.len().saturating_mul(GATHER_CHARGE_PER_BYTE))
                                .is_ok() =>
                        {
                            want
                        }
                        _ => 1,
                    };
                    let d = chunks::chunk_protobuf_traces(&body, &limits, parts, pool);
                    threads.free_cores();
                    if d.as_ref().is_ok_and(|d| d.batch.parts > 1) {
                        counters.decoded_in_parts();
                    }
                    drop(body);
                    Batch::Traces(d.map_err(|e| match e {
                        ChunkError::Decode(e) => bad(e),
                        ChunkError::Write(w) => refusal_for_write(w),
                        ChunkError::Panicked => {
                            Refusal::Internal("a trace decode part panicked".into())
                        }
                    })?)
                }
                Signal::Traces => {
                    // OTLP/JSON (protobuf: `protobuf_traces`), encoded chunk by chunk
                    // as it decodes: the records are never all held.
                    let mut chunker = TraceChunker::default();
                    let d = decode::decode_traces_into(&body, format, &limits, &mut chunker);
                    let d = match d {
                        Ok(d) => d,
                        Err(e) => {
                            return Err(match chunker.take_failure() {
                                Some(w) => refusal_for_write(w),
                                None => bad(e),
                            })
                        }
                    };
                    let chunked = chunker.finish().map_err(refusal_for_write)?;
                    drop(body);
                    Batch::Traces(decode::Decoded {
                        batch: chunked,
                        rejected: d.rejected,
                        rejected_end_before_start: d.rejected_end_before_start,
                        message: warned(d.message),
                    })
                }
                Signal::Logs => {
                    let mut d = decode::decode_logs(&body, format, &limits).map_err(bad)?;
                    d.message = warned(d.message);
                    Batch::Logs(d)
                }
                Signal::Metrics => {
                    let mut d = decode::decode_metrics(&body, format, &limits).map_err(bad)?;
                    d.message = warned(d.message);
                    Batch::Metrics(d)
                }
            })
        };
        let batch = if inline {
            work(raw, charge)?
        } else {
            // Move the charge into the blocking task and take it back afterwards.
            let mut moved = std::mem::replace(charge, self.inner.budget.charge());
            let (res, back) = tokio::task::spawn_blocking(move || {
                let r = work(raw, &mut moved);
                (r, moved)
            })
            .await
            .map_err(|e| Refusal::Internal(format!("decode task failed: {e}")))?;
            *charge = back;
            res?
        };
        let stats = &self.inner.stats;
        let storage = &self.inner.storage;
        let (accepted, data) = match batch {
            Batch::Traces(d) => {
                let ChunkedTraces {
                    chunks,
                    open,
                    ended,
                    spans: n,
                    parts: _,
                } = d.batch;
                stats.refuse_records(
                    RefuseReason::InvalidId,
                    d.rejected - d.rejected_end_before_start,
                );
                stats.refuse_records(RefuseReason::EndBeforeStart, d.rejected_end_before_start);
                if n > 0 {
                    self.write(n, storage.write_trace_chunks(chunks).await)?;
                    stats.committed(n, 0, 0);
                }
                let acc = Accepted {
                    rejected: d.rejected,
                    message: d.message,
                };
                let observed = ObservedData::Traces {
                    open: Arc::new(open),
                    ended: Arc::new(ended),
                };
                (acc, (n > 0).then_some(observed))
            }
            Batch::Logs(d) => {
                let n = d.batch.record_count();
                // The watchdog reads only the open-span records; the rest are freed once
                // storage encoded them, before the commit.
                let b = Arc::new(d.batch.watchdog_view());
                if n > 0 {
                    self.write(n, storage.write_logs(Arc::new(d.batch)).await)?;
                    stats.committed(0, n, 0);
                }
                let acc = Accepted {
                    rejected: d.rejected,
                    message: d.message,
                };
                (acc, (n > 0).then_some(ObservedData::Logs(b)))
            }
            Batch::Metrics(d) => {
                let n = d.batch.point_count();
                stats.refuse_records(RefuseReason::InvalidId, d.rejected);
                if n > 0 {
                    self.write(n, storage.write_metrics(Arc::new(d.batch)).await)?;
                    stats.committed(0, 0, n);
                }
                (
                    Accepted {
                        rejected: d.rejected,
                        message: d.message,
                    },
                    None,
                )
            }
        };
        if let Some(data) = data {
            // After the commit, before the answer: a full channel back-pressures ingest.
            if self
                .inner
                .observer
                .send(Observation { received, data })
                .await
                .is_err()
            {
                tracing::debug!("watchdog channel closed; observation not delivered");
            }
        }
        Ok(accepted)
    }

    fn write(&self, records: usize, r: Result<(), WriteError>) -> Result<(), Refusal> {
        r.map_err(|e| {
            let refusal = refusal_for_write(e);
            self.inner
                .stats
                .refuse_records(refusal.reason(), records as u64);
            refusal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Format;
    use prost::Message;

    #[test]
    fn an_export_is_cut_only_while_cores_are_free() {
        const KIB: usize = 1024;
        let t = Arc::new(DecodeThreads::with_cores(2));
        let one = t.enter();
        // Alone: one part per 64 KiB, up to the cores.
        assert_eq!(t.parts(200 * KIB), 2);
        assert_eq!(t.parts(100 * KIB), 1);
        assert_eq!(t.parts(5 * 1024 * KIB), 1, "over 4 MiB: streaming, whole");
        // A second request in the pipeline holds the other core; once it left, the
        // pipeline still counts as saturated for a while.
        let two = t.enter();
        assert_eq!(t.parts(200 * KIB), 1);
        drop(two);
        assert_eq!(t.parts(200 * KIB), 1);
        std::thread::sleep(std::time::Duration::from_millis(SATURATED_HOLD_MS + 50));
        assert_eq!(t.parts(200 * KIB), 2);
        drop(one);
        // Eight cores: two requests leave room for parts, up to MAX_PARTS.
        let t = Arc::new(DecodeThreads::with_cores(8));
        let (_a, _b) = (t.enter(), t.enter());
        assert_eq!(t.parts(1024 * KIB), MAX_PARTS);
        // One core: never.
        let t = Arc::new(DecodeThreads::with_cores(1));
        let _a = t.enter();
        assert_eq!(t.parts(1024 * KIB), 1);
    }

    #[test]
    fn storage_write_errors_map_to_retryable_answers() {
        let cases = [
            (WriteError::QueueFull { capacity: 8 }, 503, Some("1"), 14),
            (WriteError::Full("disk".into()), 503, Some("10"), 14),
            (WriteError::AtCap("a moment".into()), 503, Some("1"), 14),
            (WriteError::Closed, 503, Some("1"), 14),
            (WriteError::Failed("boom".into()), 500, None, 13),
            (
                WriteError::Unavailable {
                    kind: Transient::Busy,
                    detail: "database is locked".into(),
                },
                503,
                Some("2"),
                14,
            ),
        ];
        for (err, http, retry_after, grpc) in cases {
            let r = refusal_for_write(err);
            let resp = crate::http::refusal_response(Format::Json, &r);
            assert_eq!(resp.status().as_u16(), http, "{r:?}");
            assert_eq!(
                resp.headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap()),
                retry_after,
                "{r:?}"
            );
            let st = crate::grpc::refusal_status(&r);
            assert_eq!(st.code() as i32, grpc, "{r:?}");
            if grpc == 14 {
                let details = crate::rpc::RpcStatus::decode(st.details()).unwrap();
                assert_eq!(details.details[0].type_url, crate::rpc::RETRY_INFO_TYPE);
                let ri = crate::rpc::RetryInfo::decode(&details.details[0].value[..]).unwrap();
                assert!(ri.retry_delay.unwrap().seconds >= 1);
            } else {
                assert!(st.details().is_empty());
            }
        }
    }

    #[test]
    fn decode_memory_is_charged_once_and_capped_at_the_whole_budget() {
        let budget = Budget::new(1000, Arc::new(IngestStats::default()));
        let mut a = budget.charge();
        a.grow(100).unwrap();
        a.grow_for_decode(100, Signal::Traces, Format::Protobuf)
            .unwrap();
        assert_eq!(a.bytes, 100 + 100 * DECODE_CHARGE_PER_PROTOBUF_BYTE);
        // charged again with the final size: only the difference
        a.grow(20).unwrap();
        a.grow_for_decode(120, Signal::Traces, Format::Protobuf)
            .unwrap();
        assert_eq!(a.bytes, 120 + 120 * DECODE_CHARGE_PER_PROTOBUF_BYTE);
        assert_eq!(a.body_bytes(), 120);
        drop(a);
        // a body as large as the budget is admitted alone: the decode share is capped
        let mut big = budget.charge();
        big.grow(600).unwrap();
        big.grow_for_decode(600, Signal::Traces, Format::Protobuf)
            .unwrap();
        assert_eq!(big.bytes, 1000);
        // and a second request waits its turn (refused, retryable)
        let mut second = budget.charge();
        assert!(matches!(second.grow(1), Err(Refusal::Busy { .. })));
        // but one that alone needs more than the whole budget can never be taken
        let mut alone = budget.charge();
        assert!(
            matches!(alone.grow(1001), Err(Refusal::TooLarge(ref m)) if m.contains("max_inflight_bytes (1000)")),
            "not refused as too large"
        );
        assert_eq!(alone.bytes, 0);
        drop(big);
        second.grow(100).unwrap();
        second
            .grow_for_decode(100, Signal::Traces, Format::Json)
            .unwrap();
        assert_eq!(second.bytes, 100 + 100 * DECODE_CHARGE_PER_JSON_BYTE);
    }

    #[test]
    fn too_large_is_resource_exhausted_without_retry_info() {
        let r = Refusal::TooLarge("big".into());
        let st = crate::grpc::refusal_status(&r);
        assert_eq!(st.code(), tonic::Code::ResourceExhausted);
        assert!(st.details().is_empty());
        let resp = crate::http::refusal_response(Format::Protobuf, &r);
        assert_eq!(resp.status().as_u16(), 413);
        assert!(resp.headers().get("retry-after").is_none());
    }

    #[test]
    fn bearer_token_check() {
        let (tx, _rx) = mpsc::channel(1);
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(stallwatch_storage::StorageConfig::new(
            dir.path().join("t.db"),
        ))
        .unwrap();
        let config = CollectorConfig {
            ingest_token: Some("abc".into()),
            ..CollectorConfig::default()
        };
        let s = IngestState::new(&config, storage, tx).unwrap();
        assert!(s.authorized(Some(b"Bearer abc")));
        assert!(s.authorized(Some(b"bearer abc ")));
        assert!(!s.authorized(Some(b"Bearer abd")));
        assert!(!s.authorized(Some(b"Bearer ab")));
        assert!(!s.authorized(Some(b"Basic abc")));
        assert!(!s.authorized(Some(b"abc")));
        assert!(!s.authorized(None));
    }
}
