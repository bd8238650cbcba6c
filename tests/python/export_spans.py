"""Sends one trace (a root span and a tool span with attributes, an event, a link and an
error status) and one log record through the stock OpenTelemetry Python SDK exporters.

Endpoint and protocol come from OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_PROTOCOL
(`grpc` or `http/protobuf`). Prints the ids as JSON on stdout.
"""

import json
import logging
import os
import sys

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
endpoint = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
if protocol == "grpc":
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

    span_exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    log_exporter = OTLPLogExporter(endpoint=endpoint, insecure=True)
else:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    span_exporter = OTLPSpanExporter(endpoint=endpoint + "/v1/traces")
    log_exporter = OTLPLogExporter(endpoint=endpoint + "/v1/logs")

resource = Resource.create({"deployment.environment": "test"})
provider = TracerProvider(resource=resource)
provider.add_span_processor(BatchSpanProcessor(span_exporter))
logs = LoggerProvider(resource=resource)
logs.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
log = logging.getLogger("e2e")
log.addHandler(LoggingHandler(level=logging.INFO, logger_provider=logs))
log.setLevel(logging.INFO)

tracer = provider.get_tracer("stallwatch.e2e", "0.1")
link_ctx = SpanContext(
    trace_id=0x0123456789ABCDEF0123456789ABCDEF,
    span_id=0x0123456789ABCDEF,
    is_remote=True,
    trace_flags=TraceFlags(1),
)
with tracer.start_as_current_span("invoke_agent", kind=SpanKind.INTERNAL) as root:
    with tracer.start_as_current_span(
        "execute_tool read_file",
        kind=SpanKind.CLIENT,
        links=[Link(link_ctx, {"link.reason": "batch"})],
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "read_file",
            "file.bytes": 9007199254740993,
            "score": 0.5,
            "cached": False,
            "paths": ["a.csv", "b.csv"],
        },
    ) as tool:
        tool.add_event("retry", {"attempt": 2})
        log.warning("reading a.csv")
        tool.set_status(Status(StatusCode.ERROR, "file vanished"))

ok = provider.force_flush(15000) and logs.force_flush(15000)
provider.shutdown()
logs.shutdown()
if not ok:
    sys.exit("flush timed out")
print(
    json.dumps(
        {
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "root_span_id": format(root.get_span_context().span_id, "016x"),
            "tool_span_id": format(tool.get_span_context().span_id, "016x"),
            "link_trace_id": format(link_ctx.trace_id, "032x"),
            "link_span_id": format(link_ctx.span_id, "016x"),
        }
    )
)
