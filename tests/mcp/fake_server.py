"""A plain stdio MCP server (newline-delimited JSON-RPC, no SDK) whose misbehaviour the
`mcp` whole-system tests choose, for what the SDK servers cannot be made to do on cue.

    fake_server.py MODE LOG

Every line received is appended to LOG as `<pid> <line>`, so a test can tell which
incarnation saw which request. MODES:

- `slow-start`: sleeps 5 s before it reads stdin (a first `npx` fetch, a model loading),
  then serves normally.
- `crash`: tool `crash` exits with code 3 at once; other tools answer after 1 s.
- `replay-hang`: the first incarnation serves normally and its tool `crash` exits 3; a later
  incarnation (LOG already names a first one) never answers `initialize`.
- `old-ping`: answers the wrapper's pings, and after the first one also sends an answer to a
  ping id of the same wrapper run that was never sent (as a very late answer would be).
- `exit7`: exits with code 7 as soon as it starts.
- `close-stdout`: tool `close` closes the server's stdout and sleeps for ever (it can
  answer nothing more, but runs).
- `grandchild`: starts `sleep 300` (its child, in its process group, ignoring nothing) and
  writes the sleep's pid to LOG + ".child"; serves normally.

Tools: `add` (answers `a + b`), `crash` (see the modes). A batch (a JSON array) is
answered with one array of the answers to its requests, in its order (JSON-RPC 2.0 §6).
"""

import json
import os
import subprocess
import sys
import time

MODE, LOG = sys.argv[1], sys.argv[2]


def log(line):
    with open(LOG, "a") as f:
        f.write(f"{os.getpid()} {line}\n")


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def earlier_incarnation():
    try:
        with open(LOG) as f:
            return any(not l.startswith(f"{os.getpid()} ") for l in f)
    except FileNotFoundError:
        return False


def main():
    if MODE == "exit7":
        sys.exit(7)
    if MODE == "slow-start":
        time.sleep(5)
    if MODE == "grandchild":
        child = subprocess.Popen(["sleep", "300"])
        with open(LOG + ".child", "w") as f:
            f.write(str(child.pid))
    state = {"hang_initialize": MODE == "replay-hang" and earlier_incarnation(),
             "old_ping_sent": False}
    for raw in sys.stdin:
        line = raw.strip()
        if not line:
            continue
        log(line)
        msg = json.loads(line)
        if isinstance(msg, list):
            answers = [a for a in (handle(m, state) for m in msg) if a is not None]
            if answers:
                send(answers)
            continue
        answer = handle(msg, state)
        if answer is not None:
            send(answer)


def handle(msg, state):
    """The answer to one message (None for none); may exit or hang, per the mode."""
    method, mid = msg.get("method"), msg.get("id")
    if method == "initialize":
        if state["hang_initialize"]:
            return None
        return {"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "stallwatch-fake-server", "version": "1"},
        }}
    if method == "ping":
        if MODE == "old-ping" and not state["old_ping_sent"] and isinstance(mid, str):
            state["old_ping_sent"] = True
            send({"jsonrpc": "2.0", "id": mid, "result": {}})
            prefix = mid.rsplit("-", 1)[0]
            return {"jsonrpc": "2.0", "id": f"{prefix}-999999", "result": {}}
        return {"jsonrpc": "2.0", "id": mid, "result": {}}
    if method == "tools/list":
        return {"jsonrpc": "2.0", "id": mid, "result": {"tools": [
            {"name": "add", "inputSchema": {"type": "object"}},
            {"name": "crash", "inputSchema": {"type": "object"}},
        ]}}
    if method == "tools/call":
        name = msg["params"]["name"]
        if name == "crash":
            sys.exit(3)
        if name == "close" and MODE == "close-stdout" and not earlier_incarnation():
            sys.stdout.flush()
            try:
                os.close(1)
            except OSError:
                pass
            time.sleep(3600)
        if MODE == "crash":
            time.sleep(1)
        args = msg["params"].get("arguments") or {}
        text = str(args.get("a", 0) + args.get("b", 0))
        return {"jsonrpc": "2.0", "id": mid, "result": {
            "content": [{"type": "text", "text": text}], "isError": False}}
    if mid is not None:
        return {"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no such method"}}
    return None


if __name__ == "__main__":
    main()
