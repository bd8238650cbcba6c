"""A runner that speaks the heartbeat protocol by hand (no kit), to test how stallwatch
reads each answer.

Usage: goodbye.py MODE [SOCKET]   (SOCKET defaults to $STALLWATCH_HEARTBEAT_SOCKET)
  pong      answers PONG forever: a healthy runner
  bye       PONG for 1 s, then its goodbye (BYE) while it keeps working 4 s at exit
            (longer than the heartbeat timeout), then exits 0
  bye_hang  PONG for 1 s, then BYE forever, and never exits
  rebind    PONG for 1 s, then its socket removed for 1 s (as a kit does at exit), then a
            new socket answering PONG forever: alive all along
"""

import os
import socket
import sys
import threading
import time

mode = sys.argv[1]
path = sys.argv[2] if len(sys.argv) > 2 else os.environ["STALLWATCH_HEARTBEAT_SOCKET"]
answer = [b"PONG\n"]


def serve():
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        try:
            conn.settimeout(1.0)
            conn.recv(64)
            conn.sendall(answer[0])
        except OSError:
            pass
        finally:
            conn.close()


threading.Thread(target=serve, daemon=True).start()
print(f"pid {os.getpid()} mode {mode}", flush=True)
if mode == "pong":
    while True:
        time.sleep(1)
time.sleep(1.0)
if mode == "rebind":
    os.unlink(path)
    time.sleep(1.0)
    threading.Thread(target=serve, daemon=True).start()
    while True:
        time.sleep(1)
answer[0] = b"BYE\n"
if mode == "bye":
    time.sleep(4.0)  # an atexit hook saving a cache
    sys.exit(0)
while True:
    time.sleep(1)
