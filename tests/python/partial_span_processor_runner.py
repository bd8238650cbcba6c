"""Open a tool span through the published `partial-span-processor` (PyPI 0.0.9) and keep it
open until GO_FILE exists, then end it (issue 12 #7: the fourth open-span shape).

Usage: partial_span_processor_runner.py ENDPOINT RUNNER_ID GO_FILE
The processor sends `partial.event = heartbeat` log records while the span runs and one
`partial.event = stop` record when it ends; the span itself goes through the ordinary
OTLP span exporter.
"""

import os
import sys
import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from partial_span_processor import PartialSpanProcessor

endpoint, runner_id, go = sys.argv[1], sys.argv[2], sys.argv[3]
resource = Resource.create({"service.name": "partial-runner", "stallwatch.runner.id": runner_id})
provider = TracerProvider(resource=resource)
provider.add_span_processor(
    PartialSpanProcessor(
        OTLPLogExporter(endpoint=f"{endpoint}/v1/logs"),
        heartbeat_interval_millis=300,
        initial_heartbeat_delay_millis=0,
        process_interval_millis=100,
        resource=resource,
    )
)
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
tracer = provider.get_tracer("partial-test")
with tracer.start_as_current_span(
    "execute_tool fit_model",
    attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fit_model"},
):
    deadline = time.time() + 60
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.05)
provider.shutdown()
