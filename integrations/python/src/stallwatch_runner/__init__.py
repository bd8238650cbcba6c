"""stallwatch runner kit: lets stallwatch see a Python tool runner that is stuck.

``setup()`` wires the OpenTelemetry SDK to stallwatch from the environment stallwatch
gives spawned runners, serves the PING/PONG heartbeat socket from its own thread and
exports running tool spans at once (end time 0) and while they run. See
``integrations/README.md``.
"""

from .bootstrap import (
    InteractiveBackendWarning,
    Runner,
    build_resource,
    check_mpl_backend,
    checkpoint_dir,
    mpl_backend_is_interactive,
    setup,
)
from .heartbeat import (
    HeartbeatError,
    HeartbeatServer,
    SocketPathTooLongError,
    serve_heartbeat,
)
from .onstart import OnStartSpanProcessor, is_tool_span, snapshot
from .spans import tool_span

__all__ = [
    "HeartbeatError",
    "HeartbeatServer",
    "InteractiveBackendWarning",
    "OnStartSpanProcessor",
    "Runner",
    "SocketPathTooLongError",
    "build_resource",
    "check_mpl_backend",
    "checkpoint_dir",
    "is_tool_span",
    "mpl_backend_is_interactive",
    "serve_heartbeat",
    "setup",
    "snapshot",
    "tool_span",
]

__version__ = "0.1.0"
