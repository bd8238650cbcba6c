"""Logfire wired to a non-Logfire backend so that its pending spans reach it (issue 12 #11),
exactly as README shows: `send_to_logfire=False`, `AdvancedOptions(pending_spans=True)`,
and an OTLP span exporter in `additional_span_processors`, wrapped in Logfire's
`RemovePendingSpansExporter` (Logfire 5.4 gives pending spans only to exporters of the
types it knows). The span stays open until GO_FILE exists.

Usage: logfire_pending.py ENDPOINT RUNNER_ID GO_FILE
"""

import os
import sys
import time

import logfire
from logfire._internal.exporters.remove_pending import RemovePendingSpansExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

endpoint, runner_id, go = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["OTEL_RESOURCE_ATTRIBUTES"] = f"stallwatch.runner.id={runner_id}"
logfire.configure(
    send_to_logfire=False,
    service_name="logfire-runner",
    console=False,
    advanced=logfire.AdvancedOptions(pending_spans=True),
    additional_span_processors=[
        SimpleSpanProcessor(
            RemovePendingSpansExporter(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"))
        )
    ],
)
with logfire.span("tool {name}", name="fit_model", **{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fit_model"}):
    deadline = time.time() + 60
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.05)
logfire.force_flush()
