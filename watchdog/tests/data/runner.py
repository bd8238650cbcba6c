"""A stand-in MCP tool runner for the watchdog's tests (stdlib only).

Serves a heartbeat UNIX socket from a thread, separate from the main thread: each
connection reads one line and, if it is PING, answers according to the current mode:
  pong     -> "PONG\n"
  garbage  -> "PANG\n"
  silent   -> accepts, reads, never answers (the connection is held open)
The main thread reads commands from stdin, one per line: a mode name switches the mode;
"block" blocks the main thread forever (a tool span that never ends); "exit" exits.
Prints "ready" on stdout once the socket is listening.
"""
import os
import socket
import sys
import threading
import time

path = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else "pong"
held = []


def serve():
    global mode
    while True:
        conn, _ = srv.accept()
        try:
            conn.settimeout(2.0)
            data = b""
            while b"\n" not in data and len(data) < 64:
                chunk = conn.recv(64)
                if not chunk:
                    break
                data += chunk
            if mode == "silent":
                held.append(conn)
                continue
            if data.startswith(b"PING"):
                conn.sendall(b"PONG\n" if mode == "pong" else b"PANG\n")
        except OSError:
            pass
        if mode != "silent":
            conn.close()


try:
    os.unlink(path)
except FileNotFoundError:
    pass
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(128)
threading.Thread(target=serve, daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd in ("pong", "garbage", "silent"):
        mode = cmd
        print("mode " + cmd, flush=True)
    elif cmd == "block":
        print("blocking", flush=True)
        while True:
            time.sleep(3600)
    elif cmd == "exit":
        break
