"""An unmodified FastMCP server (Python MCP SDK) for the `mcp` whole-system tests.

Tools: `add` (healthy), `deadlock` (a real threading deadlock on a worker thread while the
event loop stays free: ping keeps answering), `block_loop` (a synchronous sleep inside an
async handler: the event loop, and so ping, stops), `slow` (sleeps longer than the default
SLA but within its `_meta` SLA), `progress` (long, reports progress), `wait` (sleeps until
cancelled). SLAs come from `_meta["dev.stallwatch/sla_ms"]`.
"""

import os
import sys
import threading
import time

import anyio
from mcp.server.fastmcp import Context, FastMCP

SLA = "dev.stallwatch/sla_ms"
mcp = FastMCP("stallwatch-test-server")


@mcp.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@mcp.tool()
def pid() -> int:
    """The server's pid."""
    return os.getpid()


@mcp.tool(meta={SLA: 2000})
async def deadlock() -> str:
    """Takes one lock twice on a worker thread: never returns."""
    lock = threading.Lock()

    def stuck() -> None:
        lock.acquire()
        lock.acquire()

    await anyio.to_thread.run_sync(stuck)
    return "unreachable"


@mcp.tool(meta={SLA: 60000})
async def block_loop() -> str:
    """A synchronous sleep in an async handler: the event loop stops."""
    time.sleep(600)
    return "unreachable"


@mcp.tool(meta={SLA: 9000})
async def slow(seconds: float) -> str:
    """Sleeps `seconds` without blocking the event loop."""
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@mcp.tool(meta={SLA: 30000})
async def progress(seconds: float, ctx: Context) -> str:
    """Runs `seconds`, reporting progress every 0.25 s."""
    steps = int(seconds / 0.25)
    for i in range(steps):
        await ctx.report_progress(i, steps)
        await anyio.sleep(0.25)
    return "done"


@mcp.tool()
async def wait() -> str:
    """Sleeps until cancelled."""
    await anyio.sleep(600)
    return "unreachable"


@mcp.tool()
def fail() -> str:
    """Raises: the result has isError true."""
    raise RuntimeError("this tool always fails")


if __name__ == "__main__":
    print(f"test server pid {os.getpid()} starting", file=sys.stderr, flush=True)
    mcp.run("stdio")
