"""One-call setup that points the OpenTelemetry SDK of a runner at stallwatch.

stallwatch gives every runner it spawns the environment it needs (``docs/design.md``,
"Interfaces: Runners"): ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` (with ``stallwatch.runner.id``),
``STALLWATCH_RUNNER_ID``, ``STALLWATCH_HEARTBEAT_SOCKET``, ``STALLWATCH_CHECKPOINT_DIR``
and ``STALLWATCH_STACKS_FILE``. :func:`setup` reads it and wires, in one of two ways:

- *create*: a TracerProvider with a BatchSpanProcessor and an OTLP exporter (protocol
  from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``), set
  as the global provider;
- *attach*: to a provider the application already has (passed as ``tracer_provider``,
  or already global): only the on-start processor is added, the application's
  exporters, resource and sampler stay as they are;

plus the heartbeat server, ``faulthandler`` (and the stall-forensics hook on SIGUSR2),
an ``MPLBACKEND`` check, and optionally a LoggerProvider.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import signal
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional, cast

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from .heartbeat import HeartbeatServer, serve_heartbeat
from .onstart import DEFAULT_EXPORT_TIMEOUT_S, DEFAULT_REFRESH_INTERVAL_S, OnStartSpanProcessor

_logger = logging.getLogger("stallwatch_runner")

#: Environment variable with the runner id (also in ``OTEL_RESOURCE_ATTRIBUTES``).
RUNNER_ID_ENV = "STALLWATCH_RUNNER_ID"
#: Environment variable with the checkpoint staging folder of the current transaction.
CHECKPOINT_DIR_ENV = "STALLWATCH_CHECKPOINT_DIR"
#: Resource attribute that ties spans to a runner (``docs/design.md``, "Runners").
RUNNER_ID_ATTR = "stallwatch.runner.id"
#: Environment variable naming the stall-forensics file (``docs/design.md``, "Stall
#: forensics"): the kit writes a header line there and dumps every thread's stack to it
#: on SIGUSR2.
STACKS_FILE_ENV = "STALLWATCH_STACKS_FILE"
#: Environment variable with stallwatch's heartbeat timeout in milliseconds; the
#: heartbeat answers ``ERR export_stuck`` when a tool span has waited that long to be
#: exported. Default :data:`DEFAULT_HEARTBEAT_TIMEOUT_MS` (stallwatch's own default).
HEARTBEAT_TIMEOUT_ENV = "STALLWATCH_HEARTBEAT_TIMEOUT_MS"
#: stallwatch's default heartbeat timeout in milliseconds (``[watchdog]``).
DEFAULT_HEARTBEAT_TIMEOUT_MS = 5000
#: OTLP protocols this kit can export with (OTLP exporter spec, "Specify Protocol").
SUPPORTED_PROTOCOLS = ("http/protobuf", "grpc")

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
    back (``docs/design.md``, "Checkpoints").
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

    tracer_provider: Any
    on_start: OnStartSpanProcessor
    heartbeat: Optional[HeartbeatServer]
    logger_provider: Any = None
    #: True when setup() created the provider (then shutdown() shuts it down); False
    #: when it attached to the application's provider (left to the application).
    owns_provider: bool = True
    _closed: bool = field(default=False, repr=False)

    @property
    def runner_id(self) -> Optional[str]:
        """``stallwatch.runner.id`` of the resource, or None."""
        resource = getattr(self.tracer_provider, "resource", None)
        value = resource.attributes.get(RUNNER_ID_ATTR) if resource is not None else None
        return str(value) if value is not None else None

    def shutdown(self) -> None:
        """Say goodbye on the heartbeat (``BYE``), then flush and shut down what setup() made.

        The heartbeat keeps serving (answering ``BYE``) until the process exits, so
        stallwatch marks the runner ``stopping`` and waits for its exit instead of
        tripping it while exit work (``atexit`` hooks, cache saves) still runs. An
        attached provider is flushed, not shut down; the on-start processor is.
        """
        if self._closed:
            return
        self._closed = True
        if self.heartbeat is not None:
            self.heartbeat.goodbye()
        try:
            if self.owns_provider:
                self.tracer_provider.shutdown()
            else:
                self.on_start.shutdown()
                self.tracer_provider.force_flush()
        except Exception:  # pragma: no cover
            _logger.debug("tracer provider shutdown failed", exc_info=True)
        if self.logger_provider is not None:
            try:
                self.logger_provider.shutdown()
            except Exception:  # pragma: no cover
                pass


def otlp_protocol(signal_name: str = "traces") -> str:
    """The OTLP protocol for ``signal_name`` (``traces`` or ``logs``) from the environment.

    ``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``, else
    ``http/protobuf`` (OTLP exporter spec, "Specify Protocol"). Raises ``ValueError``
    naming the value for a protocol this kit cannot send (``http/json``: the Python SDK
    has no such exporter).
    """
    value = (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal_name.upper()}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if value not in SUPPORTED_PROTOCOLS:
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={value!r} is not supported by stallwatch_runner "
            f"(use one of {', '.join(SUPPORTED_PROTOCOLS)})"
        )
    return value


def span_exporter(timeout_s: Optional[float] = None) -> SpanExporter:
    """An OTLP span exporter configured from the standard ``OTEL_EXPORTER_OTLP_*`` variables.

    Protocol per :func:`otlp_protocol`; endpoint (``..._TRACES_ENDPOINT`` or
    ``..._ENDPOINT``), headers, compression, certificates and timeout are read by the
    SDK's exporter itself. ``timeout_s`` (seconds) overrides the timeout. ``grpc`` needs
    the ``grpc`` extra (``pip install 'stallwatch-runner[grpc]'``); without it this raises
    ``ImportError`` saying so.
    """
    if otlp_protocol("traces") == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError as err:
            raise ImportError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the grpc extra: "
                "pip install 'stallwatch-runner[grpc]'"
            ) from err
        # SDK 1.30 annotates `timeout` as int; every release takes seconds as a float.
        return GrpcSpanExporter(timeout=cast(Any, timeout_s))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(timeout=cast(Any, timeout_s))


def _env_timeout_s() -> Optional[float]:
    # OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT is in milliseconds (OTLP exporter spec).
    raw = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TIMEOUT"
    )
    try:
        return float(raw) / 1000.0 if raw else None
    except ValueError:
        return None


def snapshot_timeout_s(export_timeout_s: Optional[float] = None) -> float:
    """Per-request timeout in seconds of the on-start snapshot exporter.

    ``export_timeout_s`` when given; else :data:`DEFAULT_EXPORT_TIMEOUT_S` (2 s), or the
    ``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`` value when that is shorter: a snapshot that
    cannot leave within the heartbeat timeout is no use to the watchdog.
    """
    if export_timeout_s is not None:
        return float(export_timeout_s)
    env = _env_timeout_s()
    return min(DEFAULT_EXPORT_TIMEOUT_S, env) if env else DEFAULT_EXPORT_TIMEOUT_S


def heartbeat_timeout_s() -> float:
    """stallwatch's heartbeat timeout in seconds: ``$STALLWATCH_HEARTBEAT_TIMEOUT_MS`` or 5 s."""
    raw = os.environ.get(HEARTBEAT_TIMEOUT_ENV, "")
    try:
        value = int(raw) if raw else DEFAULT_HEARTBEAT_TIMEOUT_MS
    except ValueError:
        value = DEFAULT_HEARTBEAT_TIMEOUT_MS
    return max(value, 1) / 1000.0


def on_start_processor(
    *,
    refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S,
    export_timeout_s: Optional[float] = None,
) -> OnStartSpanProcessor:
    """An :class:`OnStartSpanProcessor` exporting with :func:`span_exporter` (short timeout).

    For frameworks that take a list of span processors (Logfire's
    ``additional_span_processors``, ``TracerProvider.add_span_processor``).
    """
    return OnStartSpanProcessor(
        span_exporter(snapshot_timeout_s(export_timeout_s)), refresh_interval_s=refresh_interval_s
    )


_stacks_file: Optional[IO[str]] = None


def install_stacks_hook(path: Optional[str] = None, *, threads_on_heartbeat: bool = False) -> Optional[str]:
    """Stall-forensics hook: dump the main thread's stack to ``path`` on SIGUSR2.

    ``path`` defaults to ``$STALLWATCH_STACKS_FILE``; returns the path used, or None when
    there is none (or the platform has no SIGUSR2). Registers :func:`faulthandler.register`
    for SIGUSR2 with ``all_threads=False`` on the file (kept open, append mode), then writes
    one header line, ``stallwatch-stacks v1 pid=<pid> signal=SIGUSR2 runtime=python``, plus
    ``" threads=heartbeat"`` when ``threads_on_heartbeat`` (the heartbeat server answers
    ``STACKS`` with every thread's stack, :func:`~stallwatch_runner.heartbeat.thread_stacks`).

    faulthandler writes from the C signal handler, so the dump is made even while a C call
    holds the GIL. It dumps the thread that handles the signal, which is the main thread:
    Linux offers a process-directed signal to the main thread first when it does not block
    it (``complete_signal()`` in ``kernel/signal.c``), and the kit's own threads block
    SIGUSR2. Only that one thread:
    ``all_threads=True`` walks the other threads' states from the signal handler without
    the interpreter's lock, and a thread ending meanwhile (an exporter thread at exit)
    crashed runners with SIGSEGV (``docs/design.md``, "Stall forensics"); the other
    threads come from ``STACKS`` instead, read under that lock.

    stallwatch sends SIGUSR2 only when the header names the runner's pid, and SIGUSR2's
    default action ends a process, so the order matters:

    - called from the main thread, SIGUSR2 is first set to ``SIG_IGN``: faulthandler
      saves that as the handler it restores, so a SIGUSR2 that lands after faulthandler
      let go of it (the interpreter's finalization, when the process is exiting anyway)
      is ignored instead of ending the process with signal 12;
    - the handler is in place before the header exists, so a header always means a
      handler;
    - at exit (:mod:`atexit`, which runs before the interpreter's finalization starts
      tearing down thread states) the handler is unregistered, so SIGUSR2 falls back to
      ``SIG_IGN``.

    With ``chain=True``, CPython's handler briefly puts the previous action (``SIG_IGN``)
    back after each dump, raises the signal to it and then registers itself again: a
    second SIGUSR2 landing in those few instructions is ignored. stallwatch sends one
    signal per dump, so this only meets senders that fire again the moment a dump ends.
    """
    global _stacks_file
    path = path if path is not None else os.environ.get(STACKS_FILE_ENV, "")
    sigusr2 = getattr(signal, "SIGUSR2", None)
    if not path or sigusr2 is None:
        return None
    if _stacks_file is not None:
        return path
    f = open(path, "a", encoding="utf-8")
    try:
        if threading.current_thread() is threading.main_thread():
            signal.signal(sigusr2, signal.SIG_IGN)
        # chain=True only over a handler that keeps the process: its chaining path alone
        # restores errno, and the dump's write loop sets errno to 0 (CPython 3.11
        # faulthandler_user); a signal landing between a failed sem_wait and its errno
        # check then made a lock look acquired ("release unlocked lock" in threading, 4 of
        # 10 runners under a SIGUSR2 storm; 0 of 12 with chain=True). Chained to SIG_DFL,
        # the dump would end the process with signal 12.
        chain = signal.getsignal(sigusr2) not in (signal.SIG_DFL, None)
        faulthandler.register(sigusr2, file=f, all_threads=False, chain=chain)
        atexit.register(_release_stacks_hook, sigusr2)
        threads = " threads=heartbeat" if threads_on_heartbeat else ""
        f.write(f"stallwatch-stacks v1 pid={os.getpid()} signal=SIGUSR2 runtime=python{threads}\n")
        f.flush()
    except BaseException:
        f.close()
        raise
    _stacks_file = f
    return path


def _release_stacks_hook(sigusr2: int) -> None:
    # At exit: no more dumps (see install_stacks_hook); SIGUSR2 goes back to SIG_IGN.
    try:
        faulthandler.unregister(sigusr2)
    except (RuntimeError, ValueError):
        pass


_setup_lock = threading.Lock()
_current: Optional[Runner] = None


def _can_attach(provider: object) -> bool:
    # An SDK TracerProvider, or a proxy that takes span processors (Logfire's).
    return isinstance(provider, TracerProvider) or callable(
        getattr(provider, "add_span_processor", None)
    )


def setup(
    service_name: Optional[str] = None,
    *,
    tracer_provider: Any = None,
    refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S,
    export_timeout_s: Optional[float] = None,
    heartbeat: bool = True,
    logs: bool = False,
    set_global: bool = True,
) -> Runner:
    """Point this process's OpenTelemetry SDK at stallwatch; returns the :class:`Runner`.

    - ``service_name``: overrides ``OTEL_SERVICE_NAME`` when given (create mode only).
    - ``tracer_provider``: attach to this provider (an SDK ``TracerProvider`` or one that
      has ``add_span_processor``): only the on-start processor is added; its exporters,
      resource and sampler are the application's. Not made global.
    - ``refresh_interval_s``: seconds between refreshes of a running tool span (> 0).
    - ``export_timeout_s``: per-request timeout in seconds of the on-start snapshot
      exporter (see :func:`snapshot_timeout_s`).
    - ``heartbeat``: serve ``$STALLWATCH_HEARTBEAT_SOCKET`` when set (raises
      :class:`~stallwatch_runner.heartbeat.HeartbeatError` on a bad path).
    - ``logs``: also set a global LoggerProvider exporting OTLP logs and attach an
      OpenTelemetry handler to the root logger.
    - ``set_global``: with no ``tracer_provider``: when the global provider is already
      an SDK provider (``opentelemetry-instrument``, Logfire), attach to it; else create
      one and install it as the global one (False: create it but do not install it).

    Standard variables honoured: ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``
    (``http/protobuf`` default, ``grpc`` with the extra), ``..._[TRACES_]ENDPOINT``,
    ``..._[TRACES_]HEADERS``, ``..._[TRACES_]TIMEOUT``, ``..._[TRACES_]COMPRESSION``,
    ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``. Calling it again
    returns the first Runner. Enables ``faulthandler`` (fatal-signal dumps go to stderr,
    which stallwatch keeps), installs :func:`install_stacks_hook` when
    ``$STALLWATCH_STACKS_FILE`` is set, and warns on an interactive ``MPLBACKEND``.
    Registers :meth:`Runner.shutdown` with ``atexit``.
    """
    global _current
    with _setup_lock:
        if _current is not None and not _current._closed:
            return _current
        otlp_protocol("traces")  # a bad protocol fails before anything starts
        stuck_after_s = heartbeat_timeout_s()
        watched: list[OnStartSpanProcessor] = []

        def health() -> Optional[str]:
            stuck = bool(watched) and watched[0].export_stuck_s() > stuck_after_s
            return "export_stuck" if stuck else None

        # The heartbeat first: it is what stallwatch waits for after a (re)start, and a
        # bad socket path raises before anything global is installed.
        server = serve_heartbeat(health=health) if heartbeat else None
        try:
            on_start = on_start_processor(
                refresh_interval_s=refresh_interval_s, export_timeout_s=export_timeout_s
            )
        except BaseException:
            if server is not None:
                server.close()
            raise
        watched.append(on_start)
        if not faulthandler.is_enabled():
            try:
                faulthandler.enable(file=sys.stderr, all_threads=True)
            except Exception:  # stderr may be closed or not a real file
                pass
        try:
            install_stacks_hook(threads_on_heartbeat=server is not None)
        except OSError as err:
            warnings.warn(f"stallwatch_runner: stacks file not usable: {err}", RuntimeWarning)
        check_mpl_backend()

        owns = False
        if tracer_provider is not None:
            if not _can_attach(tracer_provider):
                raise TypeError(
                    f"tracer_provider must be an SDK TracerProvider, got {type(tracer_provider)!r}"
                )
            provider = tracer_provider
        else:
            existing = trace.get_tracer_provider()
            if set_global and _can_attach(existing):
                # Someone already installed an SDK provider: the global provider cannot
                # be replaced, so watch its spans instead.
                provider = existing
            else:
                provider = TracerProvider(resource=build_resource(service_name), shutdown_on_exit=False)
                provider.add_span_processor(BatchSpanProcessor(span_exporter()))
                owns = True
                if set_global:
                    trace.set_tracer_provider(provider)
        provider.add_span_processor(on_start)
        resource = getattr(provider, "resource", None) or build_resource(service_name)

        logger_provider = _setup_logs(resource) if logs else None

        runner = Runner(provider, on_start, server, logger_provider, owns_provider=owns)
        atexit.register(runner.shutdown)
        if _stacks_file is not None and hasattr(signal, "SIGUSR2"):
            # atexit runs the newest first: no dumps once the exit starts (the shutdown
            # ends the exporter's thread, and a dump is only ever for a runner that runs).
            atexit.unregister(_release_stacks_hook)
            atexit.register(_release_stacks_hook, signal.SIGUSR2)
        _current = runner
        return runner


def attach(tracer_provider: Any, **kwargs: Any) -> Runner:
    """:func:`setup` in attach mode: ``setup(tracer_provider=tracer_provider, **kwargs)``."""
    return setup(tracer_provider=tracer_provider, **kwargs)


def _setup_logs(resource: Resource) -> Any:
    try:
        from opentelemetry._logs import set_logger_provider
        from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    except ImportError as err:  # the logs API moved between SDK versions
        warnings.warn(f"stallwatch_runner: OTLP logs not available: {err}", RuntimeWarning)
        return None
    exporter: Any
    if otlp_protocol("logs") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
            OTLPLogExporter as GrpcLogExporter,
        )

        exporter = GrpcLogExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

        exporter = OTLPLogExporter()
    provider = LoggerProvider(resource=resource)
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    set_logger_provider(provider)
    logging.getLogger().addHandler(LoggingHandler(logger_provider=provider))
    return provider
