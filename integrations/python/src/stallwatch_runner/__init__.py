"""stallwatch runner kit: lets stallwatch see a Python tool runner that is stuck.

``setup()`` wires the OpenTelemetry SDK to stallwatch from the environment stallwatch
gives spawned runners, serves the PING/PONG heartbeat socket from its own thread and
exports running tool spans at once (end time 0) and while they run. See the
package README.
"""

from .bootstrap import (
    InteractiveBackendWarning,
    Runner,
    attach,
    build_resource,
    check_mpl_backend,
    checkpoint_dir,
    heartbeat_timeout_s,
    install_stacks_hook,
    mpl_backend_is_interactive,
    on_start_processor,
    otlp_protocol,
    setup,
    snapshot_timeout_s,
    span_exporter,
)
from .heartbeat import (
    HeartbeatError,
    HeartbeatServer,
    SocketInUseError,
    SocketPathTooLongError,
    serve_heartbeat,
    thread_stacks,
)
from .onstart import OnStartSpanProcessor, is_tool_span, snapshot
from .spans import tool_span

__all__ = [
    "HeartbeatError",
    "HeartbeatServer",
    "InteractiveBackendWarning",
    "OnStartSpanProcessor",
    "Runner",
    "attach",
    "SocketInUseError",
    "SocketPathTooLongError",
    "build_resource",
    "check_mpl_backend",
    "heartbeat_timeout_s",
    "install_stacks_hook",
    "on_start_processor",
    "otlp_protocol",
    "snapshot_timeout_s",
    "span_exporter",
    "checkpoint_dir",
    "is_tool_span",
    "mpl_backend_is_interactive",
    "serve_heartbeat",
    "setup",
    "snapshot",
    "thread_stacks",
    "tool_span",
]

__version__ = "0.2.0"
