"""A Python tool runner that stalls in one of the ways stall forensics must explain, built
on the stallwatch Python kit (heartbeat, on-start spans). The forensics hook (header line
in STALLWATCH_STACKS_FILE + faulthandler on SIGUSR2) comes from the kit's setup() when the
kit provides it; else this script does exactly what the contract says, itself.

Usage: runner.py MODE    (the tool span is always `run_notebook`)
  deadlock     two threads take two locks in opposite order; the main thread joins one
  socket_read  recv() on a socket nobody writes to
  gil_sleep    sleep() in a C call that holds the GIL (ctypes.PyDLL)
  busy         a pure-Python busy loop
  stopped      the runner sends itself SIGSTOP
  dump_hangs   the header is written but SIGUSR2 is ignored (the dump never comes)

Lines the tests look for carry a `# FRAME:<name>` marker.
"""

import ctypes
import faulthandler
import os
import signal
import socket
import sys
import threading
import time

import stallwatch_runner as sw

MODE = sys.argv[1]
runner = sw.setup(refresh_interval_s=0.5)
stacks_file = os.environ.get("STALLWATCH_STACKS_FILE")
HEADER = f"stallwatch-stacks v1 pid={os.getpid()} signal=SIGUSR2 runtime=python"


def kit_wrote_header():
    try:
        with open(stacks_file) as f:
            return f.readline().strip().startswith(f"stallwatch-stacks v1 pid={os.getpid()} ")
    except OSError:
        return False


_dump_file = None
if stacks_file and MODE == "dump_hangs":
    with open(stacks_file, "w") as f:
        f.write(HEADER + "\n")
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
elif stacks_file and not kit_wrote_header():
    # The handler before the header: a header must always mean a handler.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    _dump_file = open(stacks_file, "a")
    faulthandler.register(signal.SIGUSR2, file=_dump_file, all_threads=False, chain=True)
    _dump_file.write(HEADER + "\n")
    _dump_file.flush()

print(f"forensics runner pid {os.getpid()} mode {MODE}", flush=True)


def take_two(first, second):
    with first:
        time.sleep(0.2)
        with second:  # FRAME:take_two
            pass


def deadlock():
    a, b = threading.Lock(), threading.Lock()
    t1 = threading.Thread(target=take_two, args=(a, b), daemon=True)
    t2 = threading.Thread(target=take_two, args=(b, a), daemon=True)
    t1.start()
    t2.start()
    t1.join()  # FRAME:deadlock


def socket_read():
    mine, _theirs = socket.socketpair()
    mine.recv(1)  # FRAME:socket_read


def gil_sleep():
    time.sleep(0.5)  # let the span's start snapshot go out
    libc = ctypes.PyDLL(None)  # PyDLL keeps the GIL held during the call
    while True:
        libc.sleep(30)  # FRAME:gil_sleep


def busy():
    x = 0
    # one line, so a sample inside the loop names this line whichever half it is in
    while True: x += 1  # noqa: E701  FRAME:busy


def stopped():
    time.sleep(0.5)  # let the span's start snapshot go out
    os.kill(os.getpid(), signal.SIGSTOP)  # FRAME:stopped
    threading.Event().wait()


def dump_hangs():
    threading.Event().wait()  # FRAME:dump_hangs


with sw.tool_span("run_notebook"):
    {"deadlock": deadlock, "socket_read": socket_read, "gil_sleep": gil_sleep, "busy": busy,
     "stopped": stopped, "dump_hangs": dump_hangs}[MODE]()
