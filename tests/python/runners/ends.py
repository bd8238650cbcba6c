"""A kit runner that ends while its tool span is open, in one of the ways real runners
end (issue 12 #1).

Usage: ends.py HOW GO_FILE
  crash  os._exit(3) inside the span (an unhandled native failure)
  kill   SIGKILL to itself inside the span (as the OOM killer does)
  exit0  os._exit(0) inside the span (sys.exit from a tool)
The span is opened first; the runner waits until GO_FILE exists (the test creates it once
the open span is stored), then ends.
"""

import os
import signal
import sys
import time

import stallwatch_runner as sw

how, go = sys.argv[1], sys.argv[2]
sw.setup(refresh_interval_s=0.5)
with sw.tool_span("fit_model"):
    while not os.path.exists(go):
        time.sleep(0.05)
    if how == "crash":
        os._exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)
