"""Reports a running tool span to stallwatch in one of the open-span wire shapes that real
SDK add-ons send, using the stock OpenTelemetry Python SDK (OTLP/HTTP protobuf):

  log      shape 2: an OTLP log record with span.state=heartbeat, log.body.type=json/v1
           and the running span as OTLP/JSON TracesData in the body (the python-contrib
           PartialSpanProcessor shape); on "end" a span.state=ended record follows.
  pending  shape 3: a zero-length twin span with logfire.span_type=pending_span whose
           parent is the running span (Logfire's shape); on "end" the real span ends.

Prints {"trace_id","span_id"} once the start record is exported, then waits for a line
on stdin: "end" ends the span and exits.
"""

import json
import os
import sys
import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

mode = sys.argv[1]
endpoint = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
resource = Resource.create({})  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES (runner id)
provider = TracerProvider(resource=resource)
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint + "/v1/traces")))
logs = LoggerProvider(resource=resource)
logs.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=endpoint + "/v1/logs")))
tracer = provider.get_tracer("shapes")
logger = logs.get_logger("shapes")

attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fit_model"}
span = tracer.start_span("execute_tool fit_model", attributes=attrs)
ctx = span.get_span_context()
tid, sid = format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def traces_data(end_ns):
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": []},
                    "scopeSpans": [
                        {
                            "scope": {"name": "shapes"},
                            "spans": [
                                {
                                    "traceId": tid,
                                    "spanId": sid,
                                    "name": "execute_tool fit_model",
                                    "kind": 1,
                                    "startTimeUnixNano": str(span.start_time),
                                    "endTimeUnixNano": str(end_ns),
                                    "attributes": [
                                        {"key": k, "value": {"stringValue": v}} for k, v in attrs.items()
                                    ],
                                }
                            ],
                        }
                    ],
                }
            ]
        }
    )


def span_state(state, end_ns):
    logger.emit(
        timestamp=time.time_ns(),
        context=trace.set_span_in_context(span),  # carries the trace and span ids
        body=traces_data(end_ns),
        attributes={"span.state": state, "log.body.type": "json/v1"},
    )


if mode == "log":
    span_state("heartbeat", 0)
elif mode == "pending":
    now = time.time_ns()
    twin = tracer.start_span(
        "execute_tool fit_model",
        context=trace.set_span_in_context(span),
        attributes={**attrs, "logfire.span_type": "pending_span"},
        start_time=now,
    )
    twin.end(end_time=now)
else:
    sys.exit(f"unknown mode {mode}")

print(json.dumps({"trace_id": tid, "span_id": sid}), flush=True)
sys.stdin.readline()
end = time.time_ns()
if mode == "log":
    span_state("ended", end)
span.end(end_time=end)
provider.shutdown()
logs.shutdown()
