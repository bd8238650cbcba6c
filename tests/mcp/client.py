"""The unmodified Python MCP stdio client driving `stallwatch mcp wrap` for the `mcp`
whole-system tests. Usage: client.py SCENARIO DASHBOARD_URL RUNNER_ID -- WRAPPER_ARGV...

Prints one JSON object per step on stdout; the Rust test asserts on them.
"""

import json
import sys
import time
import urllib.error
import urllib.request

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import McpError

scenario, dashboard, runner_id = sys.argv[1], sys.argv[2], sys.argv[3]
wrapper = sys.argv[sys.argv.index("--") + 1 :]


def out(**kv):
    print(json.dumps(kv), flush=True)


async def call(session, name, args=None, **kw):
    t0 = time.monotonic()
    try:
        r = await session.call_tool(name, args or {}, **kw)
        text = r.content[0].text if r.content else None
        return {"tool": name, "ok": True, "is_error": r.isError, "text": text,
                "elapsed_ms": int((time.monotonic() - t0) * 1000)}
    except McpError as e:
        return {"tool": name, "ok": False, "code": e.error.code, "message": e.error.message,
                "data": e.error.data, "elapsed_ms": int((time.monotonic() - t0) * 1000)}


def admitted():
    try:
        with urllib.request.urlopen(f"{dashboard}/api/v1/runners/{runner_id}/admit", timeout=2) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False
    except OSError:
        return False


async def wait_admitted(limit_s=40.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if admitted():
            return True
        await anyio.sleep(0.1)
    return False


async def main():
    params = StdioServerParameters(command=wrapper[0], args=wrapper[1:])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            out(step="initialize", server=init.serverInfo.name, protocol=init.protocolVersion)
            tools = await session.list_tools()
            out(step="tools", names=sorted(t.name for t in tools.tools))
            if scenario == "deadlock":
                out(step="pid", **await call(session, "pid"))
                out(step="first", **await call(session, "add", {"a": 2, "b": 3}))
                out(step="stuck", **await call(session, "deadlock"))
                out(step="admitted", ok=await wait_admitted())
                out(step="after", **await call(session, "add", {"a": 40, "b": 2}))
            elif scenario == "block_loop":
                out(step="stuck", **await call(session, "block_loop"))
                out(step="admitted", ok=await wait_admitted())
                out(step="after", **await call(session, "add", {"a": 1, "b": 1}))
            elif scenario == "slow":
                tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                out(step="slow", **await call(session, "slow", {"seconds": 4}, meta={"traceparent": tp}))
                out(step="after", **await call(session, "add", {"a": 1, "b": 2}))
            elif scenario == "progress":
                seen = []

                async def on_progress(p, total, message):
                    seen.append(p)

                r = await call(session, "progress", {"seconds": 4}, progress_callback=on_progress)
                out(step="progress", notes=len(seen), **r)
                # Cancel a call: the SDK's own notification type, sent for the id the call uses.
                rid = session._request_id
                result = {}

                async def waiting():
                    result.update(await call(session, "wait"))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiting)
                    await anyio.sleep(1.0)
                    await session.send_notification(types.ClientNotification(types.CancelledNotification(
                        params=types.CancelledNotificationParams(requestId=rid, reason="test cancels"))))
                    with anyio.move_on_after(5):
                        while not result:
                            await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()
                out(step="cancelled", request_id=rid, answered=bool(result), **result)
                out(step="fail", **await call(session, "fail"))
                out(step="after", **await call(session, "add", {"a": 5, "b": 5}))
            elif scenario == "admission":
                out(step="stuck", **await call(session, "deadlock"))
                # The breaker is OPEN now (cooldown): refused at once, without the server.
                out(step="refused", **await call(session, "add", {"a": 1, "b": 1}))
                out(step="admitted", ok=await wait_admitted())
                out(step="after", **await call(session, "add", {"a": 1, "b": 1}))
            else:
                raise SystemExit(f"unknown scenario {scenario}")
    out(step="closed")


anyio.run(main)
