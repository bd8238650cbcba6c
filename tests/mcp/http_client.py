"""The unmodified Python MCP Streamable HTTP client asking stallwatch's own `/mcp` endpoint.
Usage: http_client.py URL TOOL_NAME. Prints one JSON object per step."""

import json
import sys

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

url, tool_name = sys.argv[1], sys.argv[2]


def out(**kv):
    print(json.dumps(kv), flush=True)


async def main():
    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            out(step="initialize", server=init.serverInfo.name)
            tools = await session.list_tools()
            out(step="tools", names=[t.name for t in tools.tools])
            r = await session.call_tool("search_traces", {"tool_name": tool_name})
            out(step="search_traces", is_error=r.isError, structured=r.structuredContent,
                text=r.content[0].text)
            r = await session.call_tool("search_traces", {"nonsense": "x"})
            out(step="bad_argument", is_error=r.isError, text=r.content[0].text)
            r = await session.call_tool("list_runners", {})
            out(step="list_runners", is_error=r.isError, structured=r.structuredContent)


anyio.run(main)
