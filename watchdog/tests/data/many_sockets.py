"""Serves N heartbeat UNIX sockets from one asyncio process (the watchdog benchmark's
1000 runners). Usage: many_sockets.py DIR N. Answers every PING with PONG. Prints "ready"."""
import asyncio
import os
import sys

directory, n = sys.argv[1], int(sys.argv[2])


async def handle(reader, writer):
    try:
        line = await reader.readline()
        if line.startswith(b"PING"):
            writer.write(b"PONG\n")
            await writer.drain()
    finally:
        writer.close()


async def main():
    servers = []
    for i in range(n):
        p = os.path.join(directory, f"r{i}.sock")
        servers.append(await asyncio.start_unix_server(handle, path=p, backlog=64))
    print("ready", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
