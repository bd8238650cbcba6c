"""Sends log records and the five metric instrument kinds (counter, up-down counter, gauge,
histogram, exponential histogram) through the stock OpenTelemetry Python SDK exporters.

Endpoint and protocol come from OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_PROTOCOL
(`grpc` or `http/protobuf`), the service from OTEL_SERVICE_NAME. Prints the trace and span
id of the one record written inside a span as JSON on stdout.
"""

import json
import logging
import os

from opentelemetry import trace
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
endpoint = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
if protocol == "grpc":
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    log_exporter = OTLPLogExporter(endpoint=endpoint, insecure=True)
    metric_exporter = OTLPMetricExporter(endpoint=endpoint, insecure=True)
else:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    log_exporter = OTLPLogExporter(endpoint=endpoint + "/v1/logs")
    metric_exporter = OTLPMetricExporter(endpoint=endpoint + "/v1/metrics")

resource = Resource.create({"deployment.environment": "readback"})

# logs
logs = LoggerProvider(resource=resource)
logs.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
log = logging.getLogger("readback.py")
log.addHandler(LoggingHandler(level=logging.DEBUG, logger_provider=logs))
log.setLevel(logging.DEBUG)
log.debug("cache warmed", extra={"cache.entries": 12})
log.info("loaded dataset", extra={"dataset": "iris", "rows": 150})
log.warning("slow read of a.csv", extra={"dataset": "iris"})
tracer = TracerProvider(resource=resource).get_tracer("readback.py")
with tracer.start_as_current_span("execute_tool fit") as span:
    log.error("fit diverged", extra={"dataset": "iris"})
    ctx = span.get_span_context()
logs.shutdown()

# metrics: one export of every instrument kind
reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=3_600_000)
meters = MeterProvider(
    resource=resource,
    metric_readers=[reader],
    views=[
        View(
            instrument_name="payload.size",
            aggregation=ExponentialBucketHistogramAggregation(max_size=160),
        )
    ],
)
meter = meters.get_meter("readback.py.meter", "1.0")
counter = meter.create_counter("tool.calls", unit="{call}", description="tool calls")
for route in ["a", "a", "a", "b", "b"]:
    counter.add(1, {"tool": route})
updown = meter.create_up_down_counter("queue.depth", unit="{item}", description="queued")
updown.add(5)
updown.add(-2)
gauge = meter.create_gauge("cpu.temperature", unit="Cel", description="cpu temperature")
gauge.set(41.5, {"core": "0"})
hist = meter.create_histogram("tool.duration", unit="ms", description="tool duration")
for v in [5, 15, 30]:
    hist.record(v)
exp = meter.create_histogram("payload.size", unit="By", description="payload size")
for v in [100, 200, 400, 800]:
    exp.record(v)
meters.force_flush()
meters.shutdown()

print(json.dumps({"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}))
