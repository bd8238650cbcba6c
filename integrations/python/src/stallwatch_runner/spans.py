"""``tool_span``: a context manager that opens a span stallwatch treats as a tool execution.

The span carries the semantic-convention attributes that mark a tool call
(``gen_ai.operation.name = "execute_tool"``, ``gen_ai.tool.name``; ``docs/design.md``, "Tool
spans") and is named ``execute_tool {name}`` as the GenAI conventions suggest.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Optional

from opentelemetry import trace

#: Instrumentation scope name of spans made by this kit.
TRACER_NAME = "stallwatch_runner"


@contextlib.contextmanager
def tool_span(
    name: str,
    *,
    sla_ms: Optional[int] = None,
    attributes: Optional[Mapping[str, Any]] = None,
    **attrs: Any,
) -> Iterator[trace.Span]:
    """Run the ``with`` body inside a tool span for the tool ``name``; yields the span.

    ``sla_ms`` sets ``stallwatch.sla_ms`` (the per-span SLA in milliseconds; stallwatch
    never lets it go below its ``min_sla_ms``). ``attributes`` takes keys with dots
    (``{"mcp.session.id": ...}``); ``**attrs`` adds plain keyword attributes. An exception
    is recorded on the span, which ends with status ERROR, and is re-raised.
    """
    all_attrs: dict[str, Any] = {}
    if attributes:
        all_attrs.update(attributes)
    all_attrs.update(attrs)
    all_attrs["gen_ai.operation.name"] = "execute_tool"
    all_attrs["gen_ai.tool.name"] = name
    if sla_ms is not None:
        all_attrs["stallwatch.sla_ms"] = int(sla_ms)
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(f"execute_tool {name}", attributes=all_attrs) as span:
        yield span
