"""The kit's contracts with stallwatch and with the OpenTelemetry ecosystem, each with a
real child runner: attach to the application's own provider, the standard ``OTEL_*``
variables (OTLP/gRPC included), ``BYE`` at deliberate exit, a failed first snapshot
retried at once, ``ERR export_stuck``, and the SIGUSR2 stack dump."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Dict, List

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from conftest import DEADLINE_S, Receiver, ping, wait_until
from test_onstart import runner_env

TOOL = "execute_tool slow_tool"

# ---------------------------------------------------------------------------------------
# Attach to a provider the application already has


ATTACH = """
import os, time
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
import stallwatch_runner as sw

# The application's own provider, resource and exporter (to its own backend).
app = TracerProvider(resource=Resource.create({"service.name": "my-app", "app.owned": True}))
app.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["APP_BACKEND"] + "/v1/traces")))
trace.set_tracer_provider(app)
runner = sw.setup(tracer_provider=app, refresh_interval_s=600) if os.environ["HOW"] == "explicit" else sw.setup(refresh_interval_s=600)
assert runner.tracer_provider is app and not runner.owns_provider
with sw.tool_span("slow_tool", sla_ms=4000):
    print("in-tool", flush=True)
    time.sleep(float(os.environ["HOLD_S"]))
runner.shutdown()
print("done", flush=True)
"""


@pytest.mark.parametrize("how", ["explicit", "global"])
def test_attach_keeps_the_apps_exporter_and_is_watched(spawn, receiver, short_tmp, how):
    app_backend = Receiver()
    try:
        env = runner_env(receiver.endpoint, short_tmp, APP_BACKEND=app_backend.endpoint, HOW=how, HOLD_S="1.5")
        child = spawn(ATTACH, env)
        child.wait_line("in-tool")
        # stallwatch's endpoint sees the running tool span (end time 0) while it runs ...
        opened = wait_until(lambda: [r for r in receiver.named(TOOL) if r["end"] == 0], what="open span")
        assert opened[0]["resource"]["service.name"] == "my-app"
        assert opened[0]["resource"]["app.owned"] is True
        child.wait_line("done")
        assert child.proc.wait(timeout=20) == 0
        # ... and the application's own backend still gets its spans, ended ones only.
        app_spans = wait_until(lambda: app_backend.named(TOOL), what="span at the app's backend")
        assert [s["end"] != 0 for s in app_spans] == [True]
        assert app_spans[0]["span_id"] == opened[0]["span_id"]
    finally:
        app_backend.close()


# ---------------------------------------------------------------------------------------
# Standard OTEL_* variables


HOLD_TOOL = """
import os, time
import stallwatch_runner as sw
runner = sw.setup(refresh_interval_s=600)
with sw.tool_span("slow_tool"):
    print("in-tool", flush=True)
    time.sleep(60)
"""


class GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """A real OTLP/gRPC trace receiver on 127.0.0.1:0 recording span names and metadata."""

    def __init__(self) -> None:
        self.spans: List[Dict[str, object]] = []
        self.metadata: List[Dict[str, str]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request, context):  # noqa: N802 - the generated name
        self.metadata.append({k: v for k, v in context.invocation_metadata()})
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    self.spans.append({"name": span.name, "end": span.end_time_unix_nano})
        return trace_service_pb2.ExportTraceServiceResponse()


def test_grpc_protocol_is_used_when_the_variable_says_so(spawn, short_tmp):
    rx = GrpcReceiver()
    try:
        env = runner_env(
            f"http://127.0.0.1:{rx.port}",
            short_tmp,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_EXPORTER_OTLP_HEADERS="x-ingest-token=tok-123",
        )
        child = spawn(HOLD_TOOL, env)
        child.wait_line("in-tool")
        wait_until(lambda: [s for s in rx.spans if s["name"] == TOOL and s["end"] == 0], what="open span over gRPC")
        assert rx.metadata[0].get("x-ingest-token") == "tok-123"
    finally:
        rx.server.stop(0)


def test_per_signal_endpoint_headers_and_timeout_are_honoured(spawn, receiver, short_tmp):
    env = runner_env(
        "http://127.0.0.1:9",  # the generic endpoint is dead: the traces one must win
        short_tmp,
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.endpoint + "/v1/traces",
        OTEL_EXPORTER_OTLP_TRACES_HEADERS="x-ingest-token=tok-456",
        OTEL_EXPORTER_OTLP_TIMEOUT="800",
        OTEL_RESOURCE_ATTRIBUTES="stallwatch.runner.id=rt-9,deployment.environment.name=lab",
        OTEL_SERVICE_NAME="named-by-env",
    )
    code = HOLD_TOOL.replace(
        'print("in-tool", flush=True)',
        'print("in-tool", sw.snapshot_timeout_s(), flush=True)',
    )
    child = spawn(code, env)
    line = child.wait_line("in-tool")
    assert float(line.split()[1]) == pytest.approx(0.8), "the shorter OTEL timeout caps the snapshot timeout"
    rec = wait_until(lambda: receiver.named(TOOL), what="open span at the traces endpoint")[0]
    assert rec["resource"]["stallwatch.runner.id"] == "rt-9"
    assert rec["resource"]["deployment.environment.name"] == "lab"
    assert rec["resource"]["service.name"] == "named-by-env"
    assert receiver.headers[0].get("x-ingest-token") == "tok-456"


def test_unsupported_protocol_fails_clearly(spawn, receiver, short_tmp):
    env = runner_env(receiver.endpoint, short_tmp, OTEL_EXPORTER_OTLP_PROTOCOL="http/json")
    child = spawn("import stallwatch_runner as sw\nsw.setup()\n", env)
    assert child.proc.wait(timeout=20) != 0
    err = child.proc.stderr.read() if child.proc.stderr else ""
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='http/json' is not supported" in err
    assert not (short_tmp / "hb.sock").exists(), "nothing is served after a bad protocol"


# ---------------------------------------------------------------------------------------
# BYE at deliberate exit (issue 12, point 12)


EXIT_WORK = """
import atexit, os, time
from pathlib import Path

def save_cache():  # registered before setup(): runs after the kit's own shutdown
    print("saving", flush=True)
    time.sleep(3)
    Path(os.environ["SAVED"]).write_text("ok")

atexit.register(save_cache)
import stallwatch_runner as sw
runner = sw.setup(refresh_interval_s=600)
print("ready", flush=True)
input()  # the test says when to finish
"""


def test_exit_work_after_shutdown_answers_bye_not_silence(spawn, receiver, short_tmp):
    saved = short_tmp / "saved"
    child = spawn(EXIT_WORK, runner_env(receiver.endpoint, short_tmp, SAVED=str(saved)))
    child.wait_line("ready")
    sock = short_tmp / "hb.sock"
    assert ping(sock) == b"PONG\n", "healthy while running"
    # Let the main module end: the kit's atexit shutdown runs, then the 3 s cache save.
    assert child.proc.stdin is not None
    child.proc.stdin.write("\n")
    child.proc.stdin.flush()
    child.wait_line("saving")
    answers = []
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        answers.append(ping(sock))
        time.sleep(0.3)
    assert answers and all(a == b"BYE\n" for a in answers), answers
    assert child.proc.wait(timeout=20) == 0
    assert saved.read_text() == "ok", "the exit work finished"


# ---------------------------------------------------------------------------------------
# A failed first snapshot is retried at once (issue 12, point 13)


def test_failed_first_snapshot_is_retried_at_once(spawn, short_tmp):
    rx = Receiver(fail_first=2)
    try:
        child = spawn(HOLD_TOOL, runner_env(rx.endpoint, short_tmp))  # refresh every 600 s
        child.wait_line("in-tool")
        t0 = time.monotonic()
        wait_until(lambda: rx.named(TOOL), deadline_s=10, what="the start record after two failures")
        assert rx.failed == 2
        assert time.monotonic() - t0 < 5.0, "retried at once, not at the next refresh"
    finally:
        rx.close()


def test_successful_first_snapshot_is_not_resent(spawn, receiver, short_tmp):
    child = spawn(HOLD_TOOL, runner_env(receiver.endpoint, short_tmp))
    child.wait_line("in-tool")
    wait_until(lambda: receiver.named(TOOL), what="the start record")
    time.sleep(1.5)
    assert len(receiver.named(TOOL)) == 1, "no retries after a success (refresh is 600 s)"


# ---------------------------------------------------------------------------------------
# ERR export_stuck (issue 12, point 14)


class HangingReceiver:
    """Accepts TCP connections on 127.0.0.1:0, reads, and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: List[socket.socket] = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


STUCK_EXPORT = """
import time
import stallwatch_runner as sw
runner = sw.setup(refresh_interval_s=600, export_timeout_s=60)
print("before", flush=True)
time.sleep(float(__import__("os").environ["BEFORE_S"]))
with sw.tool_span("slow_tool"):
    print("in-tool", flush=True)
    time.sleep(60)
"""


def test_heartbeat_says_export_stuck_while_a_tool_span_cannot_leave(spawn, short_tmp):
    rx = HangingReceiver()
    try:
        env = runner_env(rx.endpoint, short_tmp, STALLWATCH_HEARTBEAT_TIMEOUT_MS="1500", BEFORE_S="1")
        child = spawn(STUCK_EXPORT, env)
        child.wait_line("before")
        sock = short_tmp / "hb.sock"
        # No tool span yet: a hanging exporter alone is no reason to refuse PONG.
        assert ping(sock) == b"PONG\n"
        child.wait_line("in-tool")
        answer = wait_until(
            lambda: (a := ping(sock)) != b"PONG\n" and a, deadline_s=10, what="a non-PONG answer"
        )
        assert answer == b"ERR export_stuck\n"
    finally:
        rx.close()


def test_heartbeat_stays_pong_when_exports_work(spawn, receiver, short_tmp):
    env = runner_env(receiver.endpoint, short_tmp, STALLWATCH_HEARTBEAT_TIMEOUT_MS="1500")
    child = spawn(HOLD_TOOL, env)
    child.wait_line("in-tool")
    wait_until(lambda: receiver.named(TOOL), what="the start record")
    time.sleep(2.0)  # longer than the heartbeat timeout, the tool span still open
    assert ping(short_tmp / "hb.sock") == b"PONG\n"


# ---------------------------------------------------------------------------------------
# Stall forensics: STALLWATCH_STACKS_FILE + faulthandler on SIGUSR2 (issue 18)


STUCK = """
import os, re, threading, time
import stallwatch_runner as sw
runner = sw.setup(refresh_interval_s=600)

def stuck_in_lock():
    lock = threading.Lock()
    lock.acquire()
    print("stuck", flush=True)
    lock.acquire()  # LINE-LOCK

def stuck_spinning():
    print("stuck", flush=True)
    n = 0
    while True:  # LINE-SPIN
        n += 1

def stuck_in_c_holding_the_gil():
    print("stuck", flush=True)
    re.match(r"(a+)+$", "a" * 64 + "b")  # LINE-C

helper = threading.Thread(target=lambda: time.sleep(600), name="helper", daemon=True)
helper.start()
with sw.tool_span("slow_tool"):
    globals()[os.environ["HOW"]]()
"""


@pytest.mark.parametrize(
    "how,marker",
    [("stuck_in_lock", "LINE-LOCK"), ("stuck_spinning", "LINE-SPIN"), ("stuck_in_c_holding_the_gil", "LINE-C")],
)
def test_sigusr2_dumps_the_main_thread_and_stacks_names_every_thread(spawn, receiver, short_tmp, how, marker):
    stacks = short_tmp / "stacks.txt"
    child = spawn(STUCK, runner_env(receiver.endpoint, short_tmp, STALLWATCH_STACKS_FILE=str(stacks), HOW=how))
    child.wait_line("stuck")
    header = stacks.read_text().splitlines()[0]
    assert header == f"stallwatch-stacks v1 pid={child.proc.pid} signal=SIGUSR2 runtime=python threads=heartbeat"
    line_no = next(i for i, l in enumerate(STUCK.splitlines(), 1) if marker in l)
    # A spinning loop is on its `while` line or on its body's line at the moment of the dump.
    lines = f"({line_no}|{line_no + 1})" if how == "stuck_spinning" else str(line_no)
    time.sleep(0.2)
    os.kill(child.proc.pid, signal.SIGUSR2)
    dump = wait_until(
        lambda: (t := stacks.read_text())
        and re.search(rf"line {lines} in {how}\b", t)
        and re.search(r"line \d+ in <module>\n", t)
        and t,
        deadline_s=10,
        what=f"a stack naming {how} at line {line_no}",
    )
    # One thread, the main one (the signal's handler runs there; faulthandler walks no
    # other thread's state from it).
    assert dump.count("Stack (most recent call first):") == 1, dump
    assert "Thread 0x" not in dump, dump
    assert child.proc.poll() is None, "SIGUSR2 with the hook installed does not kill the runner"

    # STACKS on the heartbeat socket: every thread, read under the interpreter's lock.
    sock = short_tmp / "hb.sock"
    if how == "stuck_in_c_holding_the_gil":
        # The heartbeat thread needs the GIL the C call holds: no answer (stallwatch then
        # has the main thread from the dump alone).
        with pytest.raises(socket.timeout):
            ping(sock, b"STACKS\n", timeout=1.0)
        return
    answer = ping(sock, b"STACKS\n")
    assert answer.startswith(b"STACKS {") and answer.endswith(b"}\n"), answer[:200]
    threads = __import__("json").loads(answer[len(b"STACKS "):])["threads"]
    by_name = {t["name"]: t for t in threads}
    assert {"MainThread", "helper", "stallwatch-heartbeat"} <= set(by_name), sorted(map(str, by_name))
    main = by_name["MainThread"]
    assert main["main"] is True and [t for t in threads if t["main"]] == [main]
    assert main["frames"][-1]["function"] == "<module>", main
    assert any(f["function"] == how and f["line"] in (line_no, line_no + 1) for f in main["frames"]), main
    assert by_name["helper"]["main"] is False
    assert any(f["function"] == "<lambda>" for f in by_name["helper"]["frames"]), by_name["helper"]
    assert all(re.fullmatch(r"0x[0-9a-f]{16}", t["id"]) for t in threads), threads
    assert child.proc.poll() is None


CHURN = """
import threading, time
import stallwatch_runner as sw
sw.setup(refresh_interval_s=600)
print("ready", flush=True)
end = time.monotonic() + float(__import__("os").environ["RUN_S"])
def churn():
    while time.monotonic() < end:
        ts = [threading.Thread(target=lambda: sum(range(200))) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
churn()  # LINE-CHURN
"""


def test_stacks_while_threads_start_and_end_answers_and_never_harms_the_runner(spawn, receiver, short_tmp):
    # Threads that start and end all the time: a dump that walked other threads' states
    # from a signal handler (faulthandler, all_threads=True) crashed such a runner within
    # ~40 ms of a SIGUSR2 storm. STACKS reads them under the interpreter's lock instead.
    stacks = short_tmp / "churn.txt"
    child = spawn(CHURN, runner_env(receiver.endpoint, short_tmp, STALLWATCH_STACKS_FILE=str(stacks), RUN_S="4"))
    child.wait_line("ready")
    sock = short_tmp / "hb.sock"
    answers = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:
        answer = ping(sock, b"STACKS\n")
        threads = __import__("json").loads(answer[len(b"STACKS "):])["threads"]
        main = [t for t in threads if t["main"]]
        assert len(main) == 1 and main[0]["frames"][-1]["function"] == "<module>", main
        answers += 1
    assert child.proc.wait(timeout=DEADLINE_S) == 0
    assert answers > 100, f"only {answers} STACKS answers in 3 s"
    assert stacks.read_text().count("\n") == 1, "STACKS sends no signal and writes no dump"


EXITS = """
import time
import stallwatch_runner as sw
sw.setup(refresh_interval_s=600, heartbeat=False)
print("ready", flush=True)
time.sleep(0.3)
"""


def test_sigusr2_while_the_runner_exits_never_ends_it_with_signal_12(spawn, receiver, short_tmp):
    # At the end of finalization faulthandler gives SIGUSR2 back to the handler it found.
    # Were that SIG_DFL, a dump signal landing then would end an exiting runner with
    # signal 12 (a "crash" of a runner we only meant to look at). The kit sets SIG_IGN
    # first, so such a late signal is ignored and the runner exits with its own code.
    codes = []
    for i in range(5):
        stacks = short_tmp / f"exit{i}.txt"
        child = spawn(EXITS, runner_env(receiver.endpoint, short_tmp, STALLWATCH_STACKS_FILE=str(stacks)))
        child.wait_line("ready")
        sent = 0
        while child.proc.poll() is None:
            try:
                os.kill(child.proc.pid, signal.SIGUSR2)
                sent += 1
            except ProcessLookupError:
                break
            time.sleep(0.002)
        codes.append(child.proc.wait(timeout=DEADLINE_S))
        assert sent > 10, "the signals landed while the runner ran and exited"
    assert codes == [0] * 5, f"exit codes under SIGUSR2 (-12 = ended by the signal): {codes}"
