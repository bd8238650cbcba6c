"""One-call setup that points the OpenTelemetry SDK of a runner at stallwatch.

stallwatch gives every runner it spawns the environment it needs (DESIGN.md,
"Interfaces: Runners"): ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES`` (with ``stallwatch.runner.id``), ``STALLWATCH_RUNNER_ID``,
``STALLWATCH_HEARTBEAT_SOCKET`` and ``STALLWATCH_CHECKPOINT_DIR``. :func:`setup` reads
it and wires: a TracerProvider with a BatchSpanProcessor and an OTLP/HTTP protobuf
exporter, the :class:`~stallwatch_runner.onstart.OnStartSpanProcessor`, the heartbeat
server, ``faulthandler``, an ``MPLBACKEND`` check, and optionally a LoggerProvider.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from .heartbeat import HeartbeatServer, serve_heartbeat
from .onstart import DEFAULT_EXPORT_TIMEOUT_S, DEFAULT_REFRESH_INTERVAL_S, OnStartSpanProcessor

_logger = logging.getLogger("stallwatch_runner")

#: Environment variable with the runner id (also in ``OTEL_RESOURCE_ATTRIBUTES``).
RUNNER_ID_ENV = "STALLWATCH_RUNNER_ID"
#: Environment variable with the checkpoint staging folder of the current transaction.
CHECKPOINT_DIR_ENV = "STALLWATCH_CHECKPOINT_DIR"
#: Resource attribute that ties spans to a runner (DESIGN.md, "Runners").
RUNNER_ID_ATTR = "stallwatch.runner.id"

#: Matplotlib backends that never open a window (compared lower-case).
NON_INTERACTIVE_BACKENDS = frozenset({"agg", "pdf", "svg", "ps", "cairo", "template", "pgf"})


class InteractiveBackendWarning(UserWarning):
    """``MPLBACKEND`` names a GUI backend, which can block a headless runner forever."""


def mpl_backend_is_interactive(value: Optional[str]) -> bool:
    """True when ``value`` (an ``MPLBACKEND`` setting) names an interactive backend.

    Unset/empty is not flagged. Non-interactive: Agg, pdf, svg, ps, cairo, template, pgf
    (any case) and ``module://...inline`` backends (Jupyter's inline backend).
    """
    if not value:
        return False
    v = value.strip()
    if v.lower().startswith("module://"):
        return not v.lower().endswith("inline")
    return v.lower() not in NON_INTERACTIVE_BACKENDS


def check_mpl_backend() -> bool:
    """Warn with :class:`InteractiveBackendWarning` when ``MPLBACKEND`` is interactive.

    Returns True when it warned.
    """
    value = os.environ.get("MPLBACKEND")
    if mpl_backend_is_interactive(value):
        warnings.warn(
            f"MPLBACKEND={value!r} is an interactive matplotlib backend; a runner has no "
            "display and a GUI event loop can block it forever (use MPLBACKEND=Agg)",
            InteractiveBackendWarning,
            stacklevel=3,
        )
        return True
    return False


def checkpoint_dir() -> Optional[Path]:
    """``$STALLWATCH_CHECKPOINT_DIR`` as a Path, or None when unset or empty.

    Tools write their outputs there (a staging folder); stallwatch commits or rolls it
    back (DESIGN.md, "Checkpoints").
    """
    value = os.environ.get(CHECKPOINT_DIR_ENV, "")
    return Path(value) if value else None


def build_resource(service_name: Optional[str] = None) -> Resource:
    """The runner's resource: SDK defaults + ``OTEL_RESOURCE_ATTRIBUTES`` +
    ``OTEL_SERVICE_NAME`` (or ``service_name`` when given, which wins) + ``process.pid``,
    and ``stallwatch.runner.id`` from ``$STALLWATCH_RUNNER_ID`` when the resource
    attributes do not carry it already.
    """
    extra: dict[str, Any] = {"process.pid": os.getpid()}
    if service_name:
        extra["service.name"] = service_name
    resource = Resource.create(extra)
    runner_id = os.environ.get(RUNNER_ID_ENV, "")
    if runner_id and RUNNER_ID_ATTR not in resource.attributes:
        resource = resource.merge(Resource({RUNNER_ID_ATTR: runner_id}))
    return resource


@dataclass
class Runner:
    """What :func:`setup` wired; :meth:`shutdown` flushes and stops it all (idempotent)."""

    tracer_provider: TracerProvider
    on_start: OnStartSpanProcessor
    heartbeat: Optional[HeartbeatServer]
    logger_provider: Any = None
    _closed: bool = field(default=False, repr=False)

    @property
    def runner_id(self) -> Optional[str]:
        """``stallwatch.runner.id`` of the resource, or None."""
        value = self.tracer_provider.resource.attributes.get(RUNNER_ID_ATTR)
        return str(value) if value is not None else None

    def shutdown(self) -> None:
        """Stop the heartbeat, flush and shut down the providers."""
        if self._closed:
            return
        self._closed = True
        if self.heartbeat is not None:
            self.heartbeat.close()
        try:
            self.tracer_provider.shutdown()
        except Exception:  # pragma: no cover
            _logger.debug("tracer provider shutdown failed", exc_info=True)
        if self.logger_provider is not None:
            try:
                self.logger_provider.shutdown()
            except Exception:  # pragma: no cover
                pass


_setup_lock = threading.Lock()
_current: Optional[Runner] = None


def setup(
    service_name: Optional[str] = None,
    *,
    refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S,
    export_timeout_s: float = DEFAULT_EXPORT_TIMEOUT_S,
    heartbeat: bool = True,
    logs: bool = False,
    set_global: bool = True,
) -> Runner:
    """Point this process's OpenTelemetry SDK at stallwatch; returns the :class:`Runner`.

    - ``service_name``: overrides ``OTEL_SERVICE_NAME`` when given.
    - ``refresh_interval_s``: seconds between refreshes of a running tool span (> 0).
    - ``export_timeout_s``: per-request timeout of the on-start snapshot exporter.
    - ``heartbeat``: serve ``$STALLWATCH_HEARTBEAT_SOCKET`` when set (raises
      :class:`~stallwatch_runner.heartbeat.HeartbeatError` on a bad path).
    - ``logs``: also set a global LoggerProvider exporting OTLP logs and attach an
      OpenTelemetry handler to the root logger.
    - ``set_global``: install the TracerProvider as the global one. When an SDK
      TracerProvider is already global, it is kept (with its resource and exporters)
      and only the on-start processor is added to it.

    Exporter endpoint, headers, compression and timeouts come from the standard
    ``OTEL_EXPORTER_OTLP_*`` variables (default ``http://localhost:4318``). Calling
    it again returns the first Runner. Enables ``faulthandler`` (stack dumps on fatal
    signals go to stderr, which stallwatch keeps) and warns on an interactive
    ``MPLBACKEND``. Registers :meth:`Runner.shutdown` with ``atexit``.
    """
    global _current
    with _setup_lock:
        if _current is not None and not _current._closed:
            return _current
        # First, so that a bad socket path raises before anything global is installed.
        server = serve_heartbeat() if heartbeat else None
        if not faulthandler.is_enabled():
            try:
                faulthandler.enable(file=sys.stderr, all_threads=True)
            except Exception:  # stderr may be closed or not a real file
                pass
        check_mpl_backend()

        on_start = OnStartSpanProcessor(
            OTLPSpanExporter(timeout=export_timeout_s), refresh_interval_s=refresh_interval_s
        )
        existing = trace.get_tracer_provider()
        if set_global and isinstance(existing, TracerProvider):
            # Someone (e.g. opentelemetry-instrument) already installed an SDK provider:
            # the global provider cannot be replaced, so watch its spans instead.
            provider = existing
            resource = provider.resource
        else:
            resource = build_resource(service_name)
            provider = TracerProvider(resource=resource, shutdown_on_exit=False)
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            if set_global:
                trace.set_tracer_provider(provider)
        provider.add_span_processor(on_start)

        logger_provider = _setup_logs(resource) if logs else None

        runner = Runner(provider, on_start, server, logger_provider)
        atexit.register(runner.shutdown)
        _current = runner
        return runner


def _setup_logs(resource: Resource) -> Any:
    try:
        from opentelemetry._logs import set_logger_provider
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    except ImportError as err:  # the logs API moved between SDK versions
        warnings.warn(f"stallwatch_runner: OTLP logs not available: {err}", RuntimeWarning)
        return None
    provider = LoggerProvider(resource=resource)
    provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
    set_logger_provider(provider)
    logging.getLogger().addHandler(LoggingHandler(logger_provider=provider))
    return provider
