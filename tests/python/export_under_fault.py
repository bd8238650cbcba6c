"""Exports N tool spans one request at a time through the stock OpenTelemetry Python SDK
exporter (its own retry loop: HTTP 429/502/503/504, gRPC UNAVAILABLE with RetryInfo) and
prints, as JSON, which spans the SDK was told were accepted and which were not.

argv: protocol (`grpc` | `http/protobuf`), endpoint, count, gap seconds between exports.
"""

import json
import sys
import time

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult, SimpleSpanProcessor

protocol, endpoint, count, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
if protocol == "grpc":
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    inner = OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=30)
else:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    inner = OTLPSpanExporter(endpoint=endpoint + "/v1/traces", timeout=30)

accepted, refused = [], []


class Recording(SpanExporter):
    def export(self, spans):
        result = inner.export(spans)
        for s in spans:
            ctx = s.get_span_context()
            ids = {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}
            (accepted if result == SpanExportResult.SUCCESS else refused).append(ids)
        return result

    def shutdown(self):
        inner.shutdown()


provider = TracerProvider(resource=Resource.create({"service.name": "fault-" + protocol.replace("/", "-")}))
provider.add_span_processor(SimpleSpanProcessor(Recording()))
tracer = provider.get_tracer("stallwatch.faults")
for i in range(count):
    with tracer.start_as_current_span("execute_tool t%d" % i, attributes={"gen_ai.operation.name": "execute_tool"}):
        pass
    time.sleep(gap)
provider.shutdown()
print(json.dumps({"accepted": accepted, "refused": refused}))
