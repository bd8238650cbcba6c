"""Shared test parts: a real OTLP/HTTP receiver, a runner child process, a PING client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

#: Generous deadline for things that should happen (loaded 2-core CI box).
DEADLINE_S = 20.0


def python_exe() -> str:
    """Interpreter for child runners: ``$STALLWATCH_TEST_PYTHON`` else this one."""
    return os.environ.get("STALLWATCH_TEST_PYTHON") or sys.executable


def wait_until(pred: Callable[[], object], deadline_s: float = DEADLINE_S, what: str = "condition"):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")


def _any_value(v: AnyValue):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Receiver:
    """An OTLP/HTTP ``/v1/traces`` receiver on 127.0.0.1:0 that records decoded spans."""

    def __init__(self, fail_first: int = 0) -> None:
        self.spans: List[Dict] = []
        self.requests = 0
        #: Headers of every request, in order (lower-case names).
        self.headers: List[Dict[str, str]] = []
        #: Requests answered 400 on purpose (the first ``fail_first`` ones).
        self.failed = 0
        self._fail_first = fail_first
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ok = self.path == "/v1/traces" and self.headers.get(
                    "Content-Type", ""
                ).startswith("application/x-protobuf")
                with receiver._lock:
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                    fail = receiver.failed < receiver._fail_first
                    if fail:
                        receiver.failed += 1
                if fail:
                    ok = False
                if ok:
                    receiver._record(body)
                    payload = ExportTraceServiceResponse().SerializeToString()
                    self.send_response(200)
                else:
                    payload = b"bad request"
                    self.send_response(400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _record(self, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        now = time.monotonic()
        with self._lock:
            self.requests += 1
            for rs in req.resource_spans:
                resource = {kv.key: _any_value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        self.spans.append(
                            {
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "name": span.name,
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": {
                                    kv.key: _any_value(kv.value) for kv in span.attributes
                                },
                                "resource": resource,
                                "received_at": now,
                            }
                        )

    def named(self, name: str) -> List[Dict]:
        with self._lock:
            return [s for s in self.spans if s["name"] == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def short_tmp():
    """A short temporary folder (UNIX socket paths must stay under 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="swrt-", dir="/tmp") as d:
        yield Path(d)


def ping(path: Path, payload: bytes = b"PING\n", timeout: float = 5.0) -> bytes:
    """Connect, send ``payload``, return everything the server sends before closing."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        if payload:
            s.sendall(payload)
        out = b""
        while True:
            try:
                chunk = s.recv(64)
            except ConnectionResetError:  # server closed with our bytes unread
                return out
            if not chunk:
                return out
            out += chunk


class Child:
    """A Python child process running ``code``; waits for marker lines on stdout."""

    def __init__(self, code: str, env: Optional[Dict[str, str]] = None) -> None:
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [python_exe(), "-c", textwrap.dedent(code)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            text=True,
        )
        self.lines: List[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, prefix: str, deadline_s: float = DEADLINE_S) -> str:
        def found():
            for line in list(self.lines):
                if line.startswith(prefix):
                    return line
            if self.proc.poll() is not None and not self._t.is_alive():
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(
                    f"child exited {self.proc.returncode} before {prefix!r}; stdout={self.lines} stderr={err}"
                )
            return None

        return wait_until(found, deadline_s, f"child line {prefix!r}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def spawn():
    children: List[Child] = []

    def _spawn(code: str, env: Optional[Dict[str, str]] = None) -> Child:
        c = Child(code, env)
        children.append(c)
        return c

    yield _spawn
    for c in children:
        c.kill()
