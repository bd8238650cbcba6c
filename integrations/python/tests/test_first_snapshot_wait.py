"""A tool span's start waits (bounded) for the first attempt at its snapshot.

The export thread needs the GIL. A tool whose body starts with a native call that holds the
GIL (``sum(range(N))``) kept the start snapshot from leaving until the call returned, and
stallwatch judged the runner "heartbeat lost, no span" (``lost_no_span``) after the heartbeat
timeout instead of "suspect in a known tool span" after min(SLA, 30 s).
"""

from __future__ import annotations

import json

import pytest

from conftest import wait_until
from test_contracts import HangingReceiver
from test_onstart import runner_env

from stallwatch_runner import OnStartSpanProcessor
from stallwatch_runner.onstart import FIRST_SNAPSHOT_WAIT_S

#: Slack over the bound for a start to return on a loaded CI box.
SLACK_S = 1.0


GIL_HOG = """
import json, time
import stallwatch_runner as sw
# Size one GIL-holding C call to about 1.5 s on this machine.
t = time.monotonic(); sum(range(10**6)); per_million = max(time.monotonic() - t, 1e-4)
n = int(1.5 / per_million * 10**6)
runner = sw.setup(refresh_interval_s=600)
with sw.tool_span("crunch", sla_ms=20000):
    sum(range(n))  # holds the GIL from right after the start until it returns
    call_end = time.monotonic()
print("times", json.dumps({"call_end": call_end}), flush=True)
time.sleep(600)
"""


def test_snapshot_leaves_before_a_gil_holding_call_ends(spawn, receiver, short_tmp):
    child = spawn(GIL_HOG, runner_env(receiver.endpoint, short_tmp))
    call_end = json.loads(child.wait_line("times ").split(" ", 1)[1])["call_end"]
    # The ended span follows at once (on_end); by then every record of the span is in.
    wait_until(
        lambda: any(r["end"] != 0 for r in receiver.named("execute_tool crunch")),
        what="the ended tool span",
    )
    records = receiver.named("execute_tool crunch")
    open_snaps = [r for r in records if r["end"] == 0]
    assert open_snaps, f"no open-span snapshot (end 0) was ever sent: {records}"
    first = min(r["received_at"] for r in open_snaps)
    # time.monotonic() is CLOCK_MONOTONIC, shared by the child and this process (Linux).
    assert first < call_end, (
        f"the open-span snapshot arrived {first - call_end:.3f}s after the GIL-holding call "
        "ended: the watchdog could not see the tool span while it ran"
    )
    assert open_snaps[0]["attributes"]["stallwatch.sla_ms"] == 20000


HUNG_SIDECAR = """
import json, time
import stallwatch_runner as sw
runner = sw.setup(refresh_interval_s=600, export_timeout_s=30)
t0 = time.monotonic()
with sw.tool_span("hung", sla_ms=5000) as span:
    first_start = time.monotonic() - t0
    span.set_attribute("step", 1)
    recording = span.is_recording()
    valid = span.get_span_context().is_valid
    ran = True
# Later starts while the first attempt still hangs.
t0 = time.monotonic()
for _ in range(10):
    with sw.tool_span("hung-again"):
        pass
later_starts = time.monotonic() - t0
print("report", json.dumps({
    "first_start": first_start, "later_starts": later_starts, "recording": recording,
    "valid": valid, "ran": ran, "ended": span.end_time is not None,
}), flush=True)
time.sleep(600)
"""


def test_start_waits_at_most_the_bound_when_the_sidecar_hangs(spawn, short_tmp):
    rx = HangingReceiver()  # accepts, reads, never answers: the export waits its 30 s timeout
    try:
        child = spawn(HUNG_SIDECAR, runner_env(rx.endpoint, short_tmp))
        rep = json.loads(child.wait_line("report ").split(" ", 1)[1])
        assert rep["first_start"] < FIRST_SNAPSHOT_WAIT_S + SLACK_S, rep
        assert rep["later_starts"] < FIRST_SNAPSHOT_WAIT_S + SLACK_S, rep
        assert rep["ran"] and rep["recording"] and rep["valid"] and rep["ended"], rep
    finally:
        rx.close()


NON_TOOL = """
import json, os, time
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from stallwatch_runner import OnStartSpanProcessor

def tracer(wait_s):
    provider = TracerProvider()
    exporter = OTLPSpanExporter(endpoint=os.environ["ENDPOINT"] + "/v1/traces", timeout=30)
    provider.add_span_processor(OnStartSpanProcessor(exporter, refresh_interval_s=600, first_snapshot_wait_s=wait_s))
    return provider.get_tracer("t")

def start_s(tr, attributes):
    t0 = time.monotonic()
    with tr.start_as_current_span("s", attributes=attributes):
        took = time.monotonic() - t0
    return took

TOOL = {"gen_ai.operation.name": "execute_tool"}
waiting = tracer(3.0)  # a long bound, so waiting and not waiting are far apart
out = {
    "plain": max(start_s(waiting, {"k": i}) for i in range(5)),
    "plain_nested": max(start_s(waiting, None) for _ in range(5)),
    "tool_wait_0": start_s(tracer(0.0), TOOL),
    "tool": start_s(waiting, TOOL),  # last: it waits the whole bound (nothing answers)
}
print("report", json.dumps(out), flush=True)
time.sleep(600)
"""


def test_non_tool_spans_never_wait(spawn, short_tmp):
    rx = HangingReceiver()
    try:
        child = spawn(NON_TOOL, {"ENDPOINT": rx.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "60000"})
        rep = json.loads(child.wait_line("report ", deadline_s=30).split(" ", 1)[1])
        assert rep["plain"] < SLACK_S and rep["plain_nested"] < SLACK_S, rep
        assert rep["tool_wait_0"] < SLACK_S, f"first_snapshot_wait_s=0 never waits: {rep}"
        # The same processor does wait for a tool span (the receiver never answers).
        assert 2.5 < rep["tool"] < 3.0 + SLACK_S, rep
    finally:
        rx.close()


@pytest.mark.parametrize("bad", [-0.1, float("nan")])
def test_first_snapshot_wait_must_not_be_negative(bad):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    with pytest.raises(ValueError, match="first_snapshot_wait_s"):
        OnStartSpanProcessor(InMemorySpanExporter(), first_snapshot_wait_s=bad)
