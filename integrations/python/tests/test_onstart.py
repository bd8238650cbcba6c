"""On-start processor and setup(): real child runners exporting to a real OTLP/HTTP receiver."""

from __future__ import annotations

import json
import socket

import pytest

from conftest import ping, wait_until

TOOL = "execute_tool slow_tool"


def runner_env(receiver_endpoint: str, short_tmp, **extra: str) -> dict:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "runner-under-test",
        "OTEL_RESOURCE_ATTRIBUTES": "stallwatch.runner.id=rt-1,service.instance.id=inst-1",
        "STALLWATCH_HEARTBEAT_SOCKET": str(short_tmp / "hb.sock"),
        "MPLBACKEND": "Agg",
    }
    env.update(extra)
    return env


BLOCKED_TOOL = """
import os, threading, time
import stallwatch_runner as sw
runner = sw.setup(refresh_interval_s=float(os.environ["REFRESH_S"]))
lock = threading.Lock()
lock.acquire()
with sw.tool_span("slow_tool", sla_ms=5000, attributes={"mcp.session.id": "s-1"}, step=3):
    print("in-tool", flush=True)
    if os.environ["BLOCK_HOW"] == "sleep":
        time.sleep(600)
    else:
        lock.acquire()
"""


def test_start_record_is_exported_at_once(spawn, receiver, short_tmp):
    # Refresh every 600 s: any record seen within the deadline is the start record.
    child = spawn(BLOCKED_TOOL, runner_env(receiver.endpoint, short_tmp, REFRESH_S="600", BLOCK_HOW="sleep"))
    child.wait_line("in-tool")
    records = wait_until(lambda: receiver.named(TOOL), what="start record")
    rec = records[0]
    assert rec["end"] == 0
    assert rec["start"] > 0
    attrs = rec["attributes"]
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["gen_ai.tool.name"] == "slow_tool"
    assert attrs["stallwatch.sla_ms"] == 5000
    assert attrs["mcp.session.id"] == "s-1"
    assert attrs["step"] == 3
    res = rec["resource"]
    assert res["stallwatch.runner.id"] == "rt-1"
    assert res["service.name"] == "runner-under-test"
    assert res["service.instance.id"] == "inst-1"
    assert res["process.pid"] == child.proc.pid
    assert len(rec["trace_id"]) == 32 and len(rec["span_id"]) == 16


@pytest.mark.parametrize("how", ["sleep", "lock"])
def test_refreshes_while_main_thread_is_blocked(spawn, receiver, short_tmp, how):
    child = spawn(BLOCKED_TOOL, runner_env(receiver.endpoint, short_tmp, REFRESH_S="0.2", BLOCK_HOW=how))
    child.wait_line("in-tool")
    records = wait_until(lambda: (r := receiver.named(TOOL)) and len(r) >= 4 and r, what="4 records")
    assert len({r["span_id"] for r in records}) == 1, "refreshes are of the same span"
    assert all(r["end"] == 0 for r in records)
    assert len({r["start"] for r in records}) == 1, "the start time never changes"
    # The heartbeat answers from its own thread meanwhile.
    assert ping(short_tmp / "hb.sock") == b"PONG\n"
    assert child.proc.poll() is None


MIXED = """
import time
from opentelemetry import trace
import stallwatch_runner as sw
runner = sw.setup(refresh_interval_s=0.2)
tracer = trace.get_tracer("t")
with tracer.start_as_current_span("plain"):
    with tracer.start_as_current_span("mcp call", attributes={"mcp.method.name": "tools/call"}):
        with tracer.start_as_current_span("late") as late:
            late.set_attribute("gen_ai.operation.name", "execute_tool")
            print("in-tool", flush=True)
            time.sleep(float(__import__("os").environ["HOLD_S"]))
runner.shutdown()
print("done", flush=True)
"""


def test_only_tool_spans_get_snapshots_and_ended_span_follows(spawn, receiver, short_tmp):
    child = spawn(MIXED, runner_env(receiver.endpoint, short_tmp, HOLD_S="3"))
    child.wait_line("in-tool")
    wait_until(lambda: receiver.named("mcp call"), what="mcp tools/call start record")
    # "late" became a tool span after start: picked up at a refresh.
    wait_until(lambda: receiver.named("late"), what="late tool span via refresh")
    child.wait_line("done")
    assert child.proc.wait(timeout=20) == 0
    for name in ("mcp call", "late"):
        recs = receiver.named(name)
        assert any(r["end"] == 0 for r in recs), name
        ended = [r for r in recs if r["end"] != 0]
        # The processor's own ended copy and the batch processor's: the same span, same end.
        assert 1 <= len(ended) <= 2 and ended[0]["end"] > ended[0]["start"], name
        assert len({(r["span_id"], r["end"]) for r in ended}) == 1, name
    plain = receiver.named("plain")
    assert [r["end"] != 0 for r in plain] == [True], "a non-tool span is only exported when it ends"


PROMPT_END = """
import time
import stallwatch_runner as sw
runner = sw.setup(refresh_interval_s=600)
with sw.tool_span("quick"):
    time.sleep(0.05)
print("ended", flush=True)
time.sleep(30)
"""


def test_tool_span_end_is_exported_at_once_not_with_the_batch(spawn, receiver, short_tmp):
    # The SDK batch processor waits 30 s here: only the on-start processor can deliver the
    # end within the bound, so the watchdog never judges a finished tool as still open.
    env = runner_env(receiver.endpoint, short_tmp, OTEL_BSP_SCHEDULE_DELAY="30000")
    child = spawn(PROMPT_END, env)
    child.wait_line("ended")
    wait_until(
        lambda: any(r["end"] != 0 for r in receiver.named("execute_tool quick")),
        deadline_s=5,
        what="the ended tool span before the batch processor's 30 s delay",
    )
    child.proc.kill()


FAST_TOOLS = """
import json, os, time
import stallwatch_runner as sw
runner = sw.setup(refresh_interval_s=0.05, export_timeout_s=3.0)
t0 = time.monotonic()
for i in range(20):
    with sw.tool_span("quick"):
        pass
elapsed = time.monotonic() - t0
print("elapsed", json.dumps(elapsed), flush=True)
time.sleep(600)
"""


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("kind", ["closed-port", "silent-listener"])
def test_never_blocks_when_endpoint_is_unreachable(spawn, short_tmp, kind):
    silent = None
    if kind == "closed-port":
        endpoint = f"http://127.0.0.1:{_closed_port()}"
    else:
        # Accepts connections (kernel backlog) but never answers: an export waits its timeout.
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        child = spawn(FAST_TOOLS, runner_env(endpoint, short_tmp))
        elapsed = float(child.wait_line("elapsed ").split()[1])
        # A synchronous export would take >= 3 s (silent) for the first span alone.
        assert elapsed < 1.5, f"20 tool spans took {elapsed:.3f}s"
        assert ping(short_tmp / "hb.sock") == b"PONG\n"
    finally:
        if silent is not None:
            silent.close()


SETUP_REPORT = """
import faulthandler, json, os, sys, warnings
warnings.simplefilter("always")
import stallwatch_runner as sw
from opentelemetry import trace
runner = sw.setup(*sys.argv[1:2])
print("report", json.dumps({
    "runner_id": runner.runner_id,
    "resource": {k: v for k, v in runner.tracer_provider.resource.attributes.items()},
    "global": trace.get_tracer_provider() is runner.tracer_provider,
    "again": sw.setup() is runner,
    "heartbeat": str(runner.heartbeat.path) if runner.heartbeat else None,
    "faulthandler": faulthandler.is_enabled(),
    "checkpoint_dir": str(sw.checkpoint_dir()) if sw.checkpoint_dir() else None,
}), flush=True)
"""


def _report(child) -> dict:
    return json.loads(child.wait_line("report ").split(" ", 1)[1])


def test_setup_reads_the_runner_environment(spawn, receiver, short_tmp):
    child = spawn(
        SETUP_REPORT,
        runner_env(receiver.endpoint, short_tmp, STALLWATCH_CHECKPOINT_DIR=str(short_tmp / "ck")),
    )
    rep = _report(child)
    assert rep["runner_id"] == "rt-1"
    assert rep["resource"]["stallwatch.runner.id"] == "rt-1"
    assert rep["resource"]["service.name"] == "runner-under-test"
    assert rep["resource"]["service.instance.id"] == "inst-1"
    assert rep["resource"]["process.pid"] == child.proc.pid
    assert rep["global"] is True and rep["again"] is True
    assert rep["heartbeat"] == str(short_tmp / "hb.sock")
    assert rep["faulthandler"] is True
    assert rep["checkpoint_dir"] == str(short_tmp / "ck")
    assert child.proc.wait(timeout=20) == 0
    assert "InteractiveBackendWarning" not in child.proc.stderr.read()


def test_setup_runner_id_from_stallwatch_variable_and_service_name_argument(spawn, receiver, short_tmp):
    env = runner_env(receiver.endpoint, short_tmp, STALLWATCH_RUNNER_ID="rt-env", OTEL_RESOURCE_ATTRIBUTES="")
    env["STALLWATCH_HEARTBEAT_SOCKET"] = ""
    child = spawn(SETUP_REPORT.replace("sys.argv[1:2]", '["svc-arg"]'), env)
    rep = _report(child)
    assert rep["runner_id"] == "rt-env"
    assert rep["resource"]["service.name"] == "svc-arg"
    assert rep["heartbeat"] is None
    assert rep["checkpoint_dir"] is None


def test_setup_warns_on_interactive_mpl_backend(spawn, receiver, short_tmp):
    child = spawn(SETUP_REPORT, runner_env(receiver.endpoint, short_tmp, MPLBACKEND="TkAgg"))
    _report(child)
    assert child.proc.wait(timeout=20) == 0
    err = child.proc.stderr.read()
    assert "InteractiveBackendWarning" in err and "TkAgg" in err


def test_setup_long_heartbeat_path_fails_clearly(spawn, receiver, short_tmp):
    long_path = str(short_tmp / ("x" * 120) / "hb.sock")
    child = spawn(SETUP_REPORT, runner_env(receiver.endpoint, short_tmp, STALLWATCH_HEARTBEAT_SOCKET=long_path))
    assert child.proc.wait(timeout=20) != 0
    err = child.proc.stderr.read()
    assert "SocketPathTooLongError" in err and "107-byte" in err


EXISTING_PROVIDER = """
import time
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
import stallwatch_runner as sw
mine = TracerProvider(resource=Resource.create({"custom.key": "kept"}))
trace.set_tracer_provider(mine)
runner = sw.setup(refresh_interval_s=600)
assert runner.tracer_provider is mine
with sw.tool_span("slow_tool"):
    print("in-tool", flush=True)
    time.sleep(600)
"""


def test_setup_keeps_an_existing_sdk_provider(spawn, receiver, short_tmp):
    child = spawn(EXISTING_PROVIDER, runner_env(receiver.endpoint, short_tmp))
    child.wait_line("in-tool")
    rec = wait_until(lambda: receiver.named(TOOL), what="start record")[0]
    assert rec["end"] == 0
    assert rec["resource"]["custom.key"] == "kept"
    assert rec["resource"]["stallwatch.runner.id"] == "rt-1"  # from OTEL_RESOURCE_ATTRIBUTES


QUIET_FAILURES = """
import os, time
import stallwatch_runner as sw
runner = sw.setup(refresh_interval_s=0.1, export_timeout_s=0.5)
with sw.tool_span("slow_tool"):
    deadline = time.monotonic() + 20
    while runner.on_start.dropped < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
print("dropped", runner.on_start.dropped, flush=True)
os._exit(0)  # skip the exit-time flush of the batch processor
"""


def test_failed_snapshot_exports_are_logged_once(spawn, short_tmp):
    env = runner_env(f"http://127.0.0.1:{_closed_port()}", short_tmp, OTEL_BSP_SCHEDULE_DELAY="60000")
    child = spawn(QUIET_FAILURES, env)
    dropped = int(child.wait_line("dropped ").split()[1])
    assert dropped >= 4
    assert child.proc.wait(timeout=20) == 0
    err = child.proc.stderr.read()
    assert err.count("cannot export open-span snapshots") == 1, err
    assert "Transient error" not in err and "Failed to export" not in err, err
