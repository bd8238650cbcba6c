"""A tool runner that misbehaves the way real MCP runners do, built on the stallwatch
Python kit (heartbeat thread, on-start span processor).

Usage: stalled.py MODE [TOOL]
  healthy    short tool spans forever, each well within its SLA
  deadlock   two threads deadlock inside a tool span; the main thread joins them
  read_block a read with no timeout on a pipe nobody writes, inside a tool span
  gui        plt.show() with an interactive backend forced (or a blocked event loop)
  half_csv   writes half a CSV into its checkpoint folder, then blocks inside a tool span
  gil        a native call that holds the GIL (catastrophic regex), outside any span
  once       deadlocks on the first start (marker file), healthy after a restart
  crash      raises an unhandled exception outside any span (exit code 1)
  ignore_term installs a SIGTERM handler that never runs: inside a tool span the main
             thread is stuck in a C call that never checks for signals (a PBKDF2 of 2^31
             rounds; it releases the GIL, so the heartbeat thread keeps answering), so
             only the SIGKILL after the grace period ends it
"""

import hashlib
import os
import re
import sys
import threading
import time

import stallwatch_runner as sw

mode = sys.argv[1]
tool = sys.argv[2] if len(sys.argv) > 2 else "run_notebook"
runner = sw.setup(refresh_interval_s=0.5)
print(f"runner {runner.runner_id} pid {os.getpid()} mode {mode}", flush=True)


def deadlock():
    a, b = threading.Lock(), threading.Lock()

    def one(x, y):
        with x:
            time.sleep(0.2)
            with y:
                pass

    t1 = threading.Thread(target=one, args=(a, b), daemon=True)
    t2 = threading.Thread(target=one, args=(b, a), daemon=True)
    t1.start()
    t2.start()
    t1.join()


def read_block():
    r, _w = os.pipe()
    os.read(r, 1)


def gui():
    try:
        import matplotlib

        matplotlib.use("TkAgg", force=True)
        import matplotlib.pyplot as plt

        plt.plot([0, 1], [1, 0])
        plt.show()
    except Exception as e:  # no display or no tk: an event loop waiting for a window close
        print(f"no GUI ({type(e).__name__}); blocking in an event loop", flush=True)
        threading.Event().wait()


def half_csv():
    folder = sw.checkpoint_dir()
    assert folder is not None, "no STALLWATCH_CHECKPOINT_DIR"
    with open(folder / "results.csv", "w") as f:
        f.write("step,loss,accuracy\n1,0.9,0.1\n2,0.")
        f.flush()
        os.fsync(f.fileno())
    threading.Event().wait()


def healthy():
    while True:
        with sw.tool_span(tool):
            time.sleep(0.05)
        time.sleep(0.05)


if mode == "healthy":
    healthy()
elif mode == "gil":
    time.sleep(1.0)  # let the first PONGs through
    re.match(r"(a+)+$", "a" * 64 + "b")
elif mode == "ignore_term":
    import signal

    def on_term(signum, frame):  # never runs: the main thread never returns to Python
        # (a regex would not do: CPython's regex engine checks for signals while it matches)
        print("SIGTERM handled", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    time.sleep(1.0)  # let the first PONGs through
    with sw.tool_span(tool):
        time.sleep(0.5)  # the open span is exported
        hashlib.pbkdf2_hmac("sha256", b"stallwatch", b"salt", 2**31 - 1)
elif mode == "crash":
    time.sleep(0.5)
    raise RuntimeError("model weights missing")
elif mode == "once":
    marker = os.environ["ONCE_MARKER"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        with sw.tool_span(tool):
            deadlock()
    healthy()
else:
    body = {"deadlock": deadlock, "read_block": read_block, "gui": gui, "half_csv": half_csv}[mode]
    with sw.tool_span(tool):
        body()
