"""On-start span processor: exports a running tool span at once, then refreshes it.

OpenTelemetry SDKs export a span only when it ends, so a tool that hangs is never seen.
stallwatch's open-span ledger accepts a *snapshot of the running span exported with
``end_time_unix_nano = 0``* (``docs/design.md``, "Open spans", wire shape 1). This processor
sends that snapshot as soon as a tool span starts and again every ``refresh_interval_s``
while it runs, so stallwatch can tell a long tool (fresh) from a dead one (stale).

Rules that keep the watched tool safe:
- ``on_start``/``on_end`` only touch a dict and put into a bounded queue (no I/O); a
  full queue drops the record. The one wait: a *tool* span's ``on_start`` waits, at most
  ``first_snapshot_wait_s`` (:data:`FIRST_SNAPSHOT_WAIT_S`, 100 ms; 0 never waits), for
  the export thread's first attempt at that span's snapshot to finish (sent or failed).
  The export thread needs the GIL; a tool whose body starts with a native call that holds
  the GIL (``sum(range(10**9))``, a long NumPy or regex call) would otherwise keep the
  snapshot from ever leaving, and stallwatch would judge the runner "heartbeat lost, no
  span" after the heartbeat timeout instead of "suspect in a known tool span" after
  min(SLA, 30 s). Waiting on an event releases the GIL, so the export thread runs. Never
  for a non-tool span, never when the record was dropped, never from the export thread;
  once a wait has run out, later starts do not wait until the export thread has finished
  an attempt again, so a hung or absent sidecar costs at most one bound, not one per span.
- Exports run on one daemon thread with a short per-request timeout; nothing is ever
  retried in the tool's thread.
- A tool span whose *first* snapshot failed is retried at once from the export thread
  (50 ms, doubling to 1 s), not only at the next refresh, so a transient fault does not
  delay the watchdog by a refresh interval (``docs/design.md``, "Open spans").
- :meth:`OnStartSpanProcessor.export_stuck_s` says how long the oldest tool span has
  been waiting for its first successful export; the heartbeat answers
  ``ERR export_stuck`` instead of ``PONG`` when that passes the heartbeat timeout, so a
  runner whose exporter hangs is not vouched for.

A tool span is one whose attribute ``gen_ai.operation.name == "execute_tool"`` or
``mcp.method.name == "tools/call"`` (``docs/design.md``, "Tool spans"). A span that gains those
attributes after start is picked up at the next refresh.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Union, cast

from opentelemetry.context import Context
from opentelemetry.trace import SpanContext
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from .heartbeat import _block_dump_signal

_logger = logging.getLogger(__name__)

#: Default seconds between refreshes of a running tool span.
DEFAULT_REFRESH_INTERVAL_S = 5.0
#: Default per-request timeout in seconds of the snapshot exporter built by ``setup()``.
DEFAULT_EXPORT_TIMEOUT_S = 2.0
#: Most start records waiting for the export thread; more are dropped.
MAX_QUEUED_STARTS = 1024
#: Most running spans tracked (tool spans plus candidates that may become tool spans).
MAX_TRACKED_SPANS = 4096

#: First retry delay in seconds of a failed first snapshot (doubles up to the cap).
FIRST_RETRY_DELAY_S = 0.05
#: Longest delay in seconds between retries of a failed first snapshot.
MAX_RETRY_DELAY_S = 1.0
#: Default longest wait in seconds of a tool span's start for the export thread's first
#: attempt at its snapshot (see the module docs); 0 never waits.
FIRST_SNAPSHOT_WAIT_S = 0.1

#: Name of the export thread; exporter log records from it are filtered (see below).
THREAD_NAME = "stallwatch-onstart"
#: Loggers of the OTLP span exporters, whose per-failure records from the export
#: thread are dropped so a runner's stderr (which stallwatch keeps) is not flooded
#: every refresh; the first failure is logged once by ``stallwatch_runner`` instead.
EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
)

_OP_KEY = "gen_ai.operation.name"
_OP_TOOL = "execute_tool"
_MCP_KEY = "mcp.method.name"
_MCP_TOOL = "tools/call"


class _FromExportThread(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != THREAD_NAME


_QUIET = _FromExportThread()


def _quiet_exporter_logs() -> None:
    for name in EXPORTER_LOGGERS:
        lg = logging.getLogger(name)
        if _QUIET not in lg.filters:
            lg.addFilter(_QUIET)


def _context(span: ReadableSpan) -> Optional[SpanContext]:
    # SDK 1.30 leaves get_span_context() unannotated; newer releases type it.
    ctx: Optional[SpanContext] = cast(Any, span).get_span_context()
    return ctx


def is_tool_span(attributes: Any) -> bool:
    """True when the attributes mark a tool execution (see module docs)."""
    if not attributes:
        return False
    try:
        return bool(attributes.get(_OP_KEY) == _OP_TOOL or attributes.get(_MCP_KEY) == _MCP_TOOL)
    except Exception:  # pragma: no cover - defensive against odd mappings
        return False


def snapshot(span: Span) -> Optional[ReadableSpan]:
    """A :class:`ReadableSpan` copy of a running span with no end time (encoded as 0).

    Returns ``None`` when the span has ended meanwhile or cannot be read.
    """
    try:
        if span.end_time is not None:
            return None
        attrs: Dict[str, Any] = {}
        for _ in range(3):
            try:
                attrs = dict(span.attributes or {})
                break
            except (RuntimeError, KeyError):
                continue
        return ReadableSpan(
            name=span.name,
            context=_context(span),
            parent=span.parent,
            resource=span.resource,
            attributes=attrs,
            events=tuple(span.events),
            links=tuple(span.links),
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=None,
            instrumentation_scope=span.instrumentation_scope,
        )
    except Exception:  # never let a snapshot error reach the tool
        _logger.debug("stallwatch: cannot snapshot span", exc_info=True)
        return None


class OnStartSpanProcessor(SpanProcessor):
    """Exports a snapshot (end time 0) of every tool span when it starts and while it runs.

    ``exporter`` is any :class:`SpanExporter` (``setup()`` passes an
    ``OTLPSpanExporter`` with the SDK's endpoint/headers and a short timeout);
    ``refresh_interval_s`` is the seconds between refreshes (> 0);
    ``first_snapshot_wait_s`` the longest a tool span's start waits for the first attempt
    at its snapshot (>= 0; 0 never waits; see the module docs). The processor owns the
    exporter and shuts it down in :meth:`shutdown`.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S,
        first_snapshot_wait_s: float = FIRST_SNAPSHOT_WAIT_S,
    ) -> None:
        if not refresh_interval_s > 0:
            raise ValueError(f"refresh_interval_s must be > 0, got {refresh_interval_s!r}")
        if not first_snapshot_wait_s >= 0:
            raise ValueError(f"first_snapshot_wait_s must be >= 0, got {first_snapshot_wait_s!r}")
        self._exporter = exporter
        self._interval = float(refresh_interval_s)
        self._first_wait = float(first_snapshot_wait_s)
        # span id -> event set once the export thread's first attempt at its snapshot is
        # over; only while its on_start waits.
        self._waiting: Dict[int, threading.Event] = {}
        # A start's wait ran out and the export thread has finished no attempt since:
        # starts do not wait meanwhile (a hung exporter costs one bound, not one per span).
        self._behind = False
        self._starts: "queue.Queue[Optional[Union[Span, ReadableSpan]]]" = queue.Queue(maxsize=MAX_QUEUED_STARTS)
        self._tools: Dict[int, Span] = {}
        # span id -> monotonic time its start was queued, until a snapshot of it is exported.
        self._unacked: Dict[int, float] = {}
        self._retry_delay = FIRST_RETRY_DELAY_S
        self._retry_at: Optional[float] = None
        self._candidates: Dict[int, Span] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        #: Snapshots handed to the exporter / dropped (queue full, export failed).
        self.exported = 0
        self.dropped = 0
        self._warned = False
        _quiet_exporter_logs()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    # -- called in the tool's thread: never block (but see _await_first_attempt) -------

    def on_start(self, span: Span, parent_context: Optional[Context] = None) -> None:
        if self._stopped.is_set():
            return
        try:
            ctx = _context(span)
            if ctx is None:
                return
            key = ctx.span_id
            if is_tool_span(span.attributes):
                event: Optional[threading.Event] = None
                with self._lock:
                    if len(self._tools) >= MAX_TRACKED_SPANS:
                        self.dropped += 1
                        return
                    self._tools[key] = span
                    self._unacked[key] = time.monotonic()
                    if (
                        self._first_wait > 0
                        and not self._behind
                        and threading.current_thread() is not self._thread
                        and self._thread.is_alive()
                    ):
                        event = self._waiting[key] = threading.Event()
                try:
                    self._starts.put_nowait(span)
                except queue.Full:
                    self.dropped += 1
                    if event is not None:
                        with self._lock:
                            self._waiting.pop(key, None)
                    return
                if event is not None:
                    self._await_first_attempt(key, event)
            else:
                with self._lock:
                    if len(self._candidates) < MAX_TRACKED_SPANS:
                        self._candidates[key] = span
        except Exception:  # pragma: no cover - never raise into the tool
            _logger.debug("stallwatch: on_start failed", exc_info=True)

    def _await_first_attempt(self, key: int, event: threading.Event) -> None:
        # Event.wait releases the GIL, so the export thread can send the snapshot before
        # the tool's first native call takes the GIL back (module docs).
        try:
            event.wait(self._first_wait)
        except BaseException:
            # Interrupted (KeyboardInterrupt): the SDK never hands this span to the tool,
            # so nobody ends it; forget it rather than refresh it for ever.
            with self._lock:
                self._waiting.pop(key, None)
                self._tools.pop(key, None)
                self._unacked.pop(key, None)
            raise
        with self._lock:
            if self._waiting.pop(key, None) is not None:
                self._behind = True  # the wait ran out; the export thread is busy or hung

    def on_end(self, span: ReadableSpan) -> None:
        """Forget the span; for a tool span, export its ended copy at once (never blocking).

        The SDK's batch processor exports ended spans only every few seconds; without this
        the watchdog would see a finished tool as still open until then and could judge a
        short tool against its SLA. stallwatch stores the two ended copies once.
        """
        try:
            ctx = _context(span)
            if ctx is None:
                return
            key = ctx.span_id
            with self._lock:
                was_tool = self._tools.pop(key, None) is not None
                self._candidates.pop(key, None)
                self._unacked.pop(key, None)
            if (was_tool or is_tool_span(span.attributes)) and not self._stopped.is_set():
                try:
                    self._starts.put_nowait(span)
                except queue.Full:
                    self.dropped += 1
        except Exception:  # pragma: no cover
            pass

    # -- export thread -----------------------------------------------------------------

    def _run(self) -> None:
        _block_dump_signal()
        try:
            self._loop()
        finally:
            with self._lock:
                waiting, self._waiting = self._waiting, {}
            for event in waiting.values():
                event.set()

    def _loop(self) -> None:
        next_refresh = time.monotonic() + self._interval
        while not self._stopped.is_set():
            wake = next_refresh if self._retry_at is None else min(next_refresh, self._retry_at)
            timeout = max(0.0, wake - time.monotonic())
            batch: List[Union[Span, ReadableSpan]] = []
            try:
                item = self._starts.get(timeout=timeout)
                if item is None:
                    return
                batch.append(item)
                while len(batch) < 512:
                    item = self._starts.get_nowait()
                    if item is None:
                        self._export(batch)
                        return
                    batch.append(item)
            except queue.Empty:
                pass
            if batch:
                self._export(batch)
            now = time.monotonic()
            if now >= next_refresh:
                self._export(self._running_tools())
                next_refresh = time.monotonic() + self._interval
            elif self._retry_at is not None and now >= self._retry_at:
                self._export(self._unacked_tools())

    def _running_tools(self) -> List[Union[Span, ReadableSpan]]:
        with self._lock:
            for key, span in list(self._candidates.items()):
                if is_tool_span(span.attributes):
                    del self._candidates[key]
                    self._tools[key] = span
                    self._unacked.setdefault(key, time.monotonic())
            return list(self._tools.values())

    def _unacked_tools(self) -> List[Union[Span, ReadableSpan]]:
        with self._lock:
            return [self._tools[k] for k in self._unacked if k in self._tools]

    def export_stuck_s(self, now: Optional[float] = None) -> float:
        """Seconds the oldest running tool span has waited for its first successful
        export (monotonic clock), or 0.0 when every running tool span is known to the
        receiver. Safe to call from any thread.
        """
        now = time.monotonic() if now is None else now
        with self._lock:
            oldest = min(self._unacked.values(), default=None)
        return 0.0 if oldest is None else max(0.0, now - oldest)

    def _export(self, spans: Sequence[Union[Span, ReadableSpan]]) -> None:
        try:
            self._export_once(spans)
        finally:
            self._attempted(spans)

    def _attempted(self, spans: Sequence[Union[Span, ReadableSpan]]) -> None:
        # An attempt at these spans is over (sent, failed, or nothing left to send):
        # release the starts waiting for them.
        keys = [ctx.span_id for ctx in (_context(s) for s in spans) if ctx is not None]
        with self._lock:
            self._behind = False
            events = [e for e in (self._waiting.pop(k, None) for k in keys) if e is not None]
        for event in events:
            event.set()

    def _export_once(self, spans: Sequence[Union[Span, ReadableSpan]]) -> None:
        # Ended spans go out as they are; running ones as snapshots with end time 0.
        snaps: List[ReadableSpan] = []
        for span in spans:
            snap = span if span.end_time else (snapshot(span) if isinstance(span, Span) else None)
            if snap is not None:
                snaps.append(snap)
        if not snaps:
            return
        error = ""
        try:
            result = self._exporter.export(snaps)
            ok = getattr(result, "name", "") == "SUCCESS"
        except Exception as err:
            ok, error = False, f": {err}"
        keys = [
            ctx.span_id
            for ctx in (_context(s) for s in snaps if s.end_time is None)
            if ctx is not None
        ]
        if ok:
            self.exported += len(snaps)
            with self._lock:
                for key in keys:
                    self._unacked.pop(key, None)
                pending = bool(self._unacked)
            if not pending:
                self._retry_at = None
                self._retry_delay = FIRST_RETRY_DELAY_S
            return
        self.dropped += len(snaps)
        with self._lock:
            pending = any(k in self._unacked for k in keys) or bool(self._unacked)
        if pending:
            self._retry_at = time.monotonic() + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, MAX_RETRY_DELAY_S)
        if not self._warned:
            self._warned = True
            _logger.warning(
                "stallwatch: cannot export open-span snapshots%s; dropping them "
                "(further failures are counted, not logged)",
                error,
            )

    # -- lifecycle ---------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the export thread (waits at most the export timeout plus 1 s) and the exporter."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            self._starts.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout=3.0)
        try:
            self._exporter.shutdown()
        except Exception:  # pragma: no cover
            pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered beyond the start queue; returns True at once."""
        return True
