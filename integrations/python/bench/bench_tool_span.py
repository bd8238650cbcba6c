"""Cost of one tool span in the tool's thread, with and without the on-start processor.

Run: python bench/bench_tool_span.py [N]. The endpoint is a closed local port, so every
snapshot export fails (the worst case for the export thread); the numbers show what the
tool itself pays: on_start records the span, enqueues it and waits (at most
FIRST_SNAPSHOT_WAIT_S) for the export thread's first attempt at its snapshot.
"""

from __future__ import annotations

import socket
import sys
import time

from opentelemetry.sdk.trace import TracerProvider

from stallwatch_runner import OnStartSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

ATTRS = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "bench"}


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def per_span_us(provider: TracerProvider, n: int) -> float:
    tracer = provider.get_tracer("bench")
    t0 = time.perf_counter()
    for _ in range(n):
        with tracer.start_as_current_span("execute_tool bench", attributes=ATTRS):
            pass
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    plain = TracerProvider()
    with_proc = TracerProvider()
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{closed_port()}/v1/traces", timeout=0.5)
    proc = OnStartSpanProcessor(exporter, refresh_interval_s=5.0)
    with_proc.add_span_processor(proc)
    per_span_us(plain, 1000)
    per_span_us(with_proc, 1000)
    a = per_span_us(plain, n)
    b = per_span_us(with_proc, n)
    print(f"tool span, no processor:      {a:8.2f} us/span (n={n})")
    print(f"tool span, on-start processor: {b:8.2f} us/span (n={n}); overhead {b - a:.2f} us")
    print(f"snapshots dropped (queue full or export failed): {proc.dropped}")
    proc.shutdown()


if __name__ == "__main__":
    main()
