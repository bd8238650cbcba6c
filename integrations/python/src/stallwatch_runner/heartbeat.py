"""Heartbeat server: answers stallwatch's ``PING`` with ``PONG`` on a UNIX socket.

stallwatch tells a stuck runner from a busy one by pinging a UNIX domain socket that
the runner serves from a thread of its own, never the main thread (``docs/design.md``,
"Heartbeat" and "Heartbeat details"). Protocol: the client connects and writes
``PING\\n``; the server reads at most 64 bytes up to ``\\n``, answers one line and
closes. Anything else is closed without an answer. The answers:

- ``PONG``: the runner vouches for itself: its serving thread is alive and no tool span
  has been waiting to be exported for longer than the heartbeat timeout (the ``health``
  callback below says so; stallwatch's open-span ledger therefore knows every tool call
  that has run longer than that).
- ``ERR <reason>`` (e.g. ``ERR export_stuck``): the runner knows it is unhealthy; any
  answer but ``PONG`` counts as a lost heartbeat (label ``bad_answer``).
- ``BYE``: the runner is exiting deliberately (:meth:`HeartbeatServer.goodbye`);
  stallwatch marks it ``stopping`` and waits for its exit instead of tripping it
  (``docs/design.md``, "Runner lifecycle").

A client may write ``STACKS\\n`` instead (stall forensics, ``docs/design.md``, "Stall
forensics"): the answer is one line ``STACKS <json>`` with every Python thread's stack
(:func:`thread_stacks`), taken with :func:`sys._current_frames` under the interpreter's
locks. That is the safe way to see the other threads: ``faulthandler`` walking every
thread from a signal handler reads thread states that another thread may be freeing
(a thread ending, the interpreter exiting) and crashed runners with SIGSEGV.

On Windows stallwatch injects a named pipe (``\\\\.\\pipe\\stallwatch-<hash>``) instead of
a socket path (``docs/platforms.md``); the server then serves that pipe with the same bytes
(through ``_winapi``: one pipe instance per client, byte mode, remote clients rejected).

A thread that only waits in ``accept``/``recv`` keeps answering while the main thread
sleeps, waits on a lock or does I/O (all of which release the GIL). A native call that
holds the GIL starves it, and stallwatch reads that as *suspect* rather than dead.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Dict, List, Optional

#: Environment variable that carries the socket path (set by stallwatch for spawned runners).
HEARTBEAT_SOCKET_ENV = "STALLWATCH_HEARTBEAT_SOCKET"

#: Longest socket path in bytes: ``sun_path`` is 108 bytes on Linux including the NUL.
MAX_SOCKET_PATH_BYTES = 107

#: Most bytes read from one client, per the heartbeat protocol.
MAX_REQUEST_BYTES = 64

#: How long one client may take to send its ``PING`` line, in seconds; the server
#: answers clients one at a time, so a silent client delays the next one by at most this.
CLIENT_READ_TIMEOUT_S = 1.0

#: How a named-pipe path starts (Windows): ``\\.\pipe\``.
PIPE_PREFIX = "\\\\.\\pipe\\"

#: Most frames per thread in a ``STACKS`` answer (innermost first; stallwatch keeps 48).
MAX_STACK_FRAMES = 48

#: Most bytes of a ``STACKS`` answer line (stallwatch reads at most 256 KiB).
MAX_STACKS_ANSWER_BYTES = 256 * 1024

_PING = b"PING"
_STACKS = b"STACKS"
_PONG = b"PONG\n"
_BYE = b"BYE\n"

#: A health check: returns None when healthy, else a short reason (``export_stuck``)
#: that the server answers as ``ERR <reason>``.
HealthCheck = Callable[[], Optional[str]]


class HeartbeatError(RuntimeError):
    """The heartbeat socket could not be served (bad path, not a socket, bind failed)."""


class SocketInUseError(HeartbeatError):
    """The socket path is served by another live process: the runner this process was
    started by (a helper subprocess, or a ``multiprocessing`` child that re-imported the
    main module, inherits ``STALLWATCH_HEARTBEAT_SOCKET``). Taking the socket over cut the
    runner off its heartbeat, and stallwatch stopped the healthy runner."""


class SocketPathTooLongError(HeartbeatError, ValueError):
    """The socket path is longer than the 107-byte UNIX socket limit."""


def is_named_pipe(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` names a Windows named pipe (``\\\\.\\pipe\\...``)."""
    return os.fspath(path).startswith(PIPE_PREFIX)


def is_ping(data: bytes) -> bool:
    """True when ``data`` (at most 64 bytes read from a client) holds the ``PING`` line."""
    line, newline, _ = data.partition(b"\n")
    return bool(newline) and line.rstrip(b"\r") == _PING


def is_stacks_request(data: bytes) -> bool:
    """True when ``data`` (at most 64 bytes read from a client) holds the ``STACKS`` line."""
    line, newline, _ = data.partition(b"\n")
    return bool(newline) and line.rstrip(b"\r") == _STACKS


def thread_stacks(max_frames: int = MAX_STACK_FRAMES) -> bytes:
    """The ``STACKS`` answer: ``STACKS {"threads": [...]}\\n``, one line of JSON.

    Each thread: ``id`` (``0x`` + 16 hex digits of its ident, as ``faulthandler`` prints
    it), ``name`` (the :class:`threading.Thread` name, or null for a thread
    :mod:`threading` does not know), ``main`` (bool), ``frames`` (innermost first, each
    ``{"function", "file", "line"}``, at most ``max_frames``) and ``frames_omitted``.
    Stacks come from :func:`sys._current_frames` (the interpreter's thread list, read under
    its lock with the GIL held), so a thread ending meanwhile is simply left out. The line
    is at most :data:`MAX_STACKS_ANSWER_BYTES`; past that, fewer frames per thread.
    """
    known = {t.ident: t.name for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    frames_by_thread = sys._current_frames()
    try:
        limit = max_frames
        while True:
            threads: List[Dict[str, Any]] = []
            for ident, top in frames_by_thread.items():
                frames: List[Dict[str, Any]] = []
                omitted = 0
                f: Optional[FrameType] = top
                while f is not None:
                    if len(frames) < limit:
                        code = f.f_code
                        frames.append({"function": code.co_name, "file": code.co_filename, "line": f.f_lineno})
                    else:
                        omitted += 1
                    f = f.f_back
                threads.append(
                    {
                        "id": f"0x{ident:016x}",
                        "name": known.get(ident),
                        "main": ident == main_ident,
                        "frames": frames,
                        "frames_omitted": omitted,
                    }
                )
            line = b"STACKS " + json.dumps({"threads": threads}, separators=(",", ":")).encode() + b"\n"
            if len(line) <= MAX_STACKS_ANSWER_BYTES or limit <= 1:
                return line[:MAX_STACKS_ANSWER_BYTES]
            limit //= 2
    finally:
        del frames_by_thread  # frames hold their locals alive


def _block_dump_signal() -> None:
    # The dump signal is meant for the main thread (faulthandler dumps the thread that
    # handles it); a kit thread never takes it, so the kernel hands it to another.
    sigusr2 = getattr(signal, "SIGUSR2", None)
    if sigusr2 is not None and hasattr(signal, "pthread_sigmask"):
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {sigusr2})
        except (OSError, ValueError):
            pass


def _check_path(path: Path) -> bytes:
    raw = os.fsencode(path)
    if len(raw) > MAX_SOCKET_PATH_BYTES:
        raise SocketPathTooLongError(
            f"heartbeat socket path is {len(raw)} bytes, over the {MAX_SOCKET_PATH_BYTES}-byte "
            f"UNIX socket limit: {os.fsdecode(raw)!r} (choose a shorter path, e.g. under /tmp)"
        )
    return raw


def _remove_stale(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise HeartbeatError(
            f"heartbeat socket path {str(path)!r} exists and is not a socket; refusing to remove it"
        )
    # Stale only if nothing listens: a live server (the runner that started this process)
    # accepts the connection, or keeps it waiting when its backlog is full.
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(os.fsencode(path))
    except socket.timeout:
        live = True
    except OSError:
        live = False
    else:
        live = True
    finally:
        probe.close()
    if live:
        raise SocketInUseError(
            f"heartbeat socket {str(path)!r} is served by another live process (the runner "
            "this process was started by); this process does not serve it"
        )
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class HeartbeatServer:
    """A UNIX socket server on a daemon thread that answers ``PING\\n`` with ``PONG\\n``.

    ``health`` (optional) is called for every ping from the serving thread; when it
    returns a reason the answer is ``ERR <reason>\\n`` instead of ``PONG``. After
    :meth:`goodbye` every ping is answered ``BYE\\n``.

    ``path`` is the socket path (str or Path); its parent folder is created (mode 0700)
    and a stale socket file left by an earlier process is unlinked first. Raises
    :class:`SocketPathTooLongError` when the path is over 107 bytes and
    :class:`HeartbeatError` when the path is taken by something that is not a socket or
    cannot be bound. Use :meth:`start` (or ``with``) to serve and :meth:`close` to stop,
    which also removes the socket file.
    """

    def __init__(self, path: str | os.PathLike[str], health: Optional[HealthCheck] = None) -> None:
        self._pipe_name = os.fspath(path) if is_named_pipe(path) else None
        self.path = Path(path)
        self._health = health
        self._bye = threading.Event()
        if self._pipe_name is None:
            _check_path(self.path)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: Number of PONG answers sent (for diagnostics and tests).
        self.pongs = 0

    def start(self) -> "HeartbeatServer":
        """Bind the socket and start the serving thread; returns ``self``."""
        with self._lock:
            if self._thread is not None:
                return self
            if self._pipe_name is not None:
                return self._start_pipe(self._pipe_name)
            parent = self.path.parent
            try:
                parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as err:
                raise HeartbeatError(f"cannot create heartbeat socket folder {str(parent)!r}: {err}") from err
            _remove_stale(self.path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(os.fsencode(self.path))
                os.chmod(self.path, 0o600)
                sock.listen(16)
            except OSError as err:
                sock.close()
                raise HeartbeatError(f"cannot serve heartbeat socket {str(self.path)!r}: {err}") from err
            # A timeout on accept lets close() stop the loop without relying on
            # shutdown() semantics of listening sockets.
            sock.settimeout(0.5)
            self._sock = sock
            self._thread = threading.Thread(
                target=self._serve, name="stallwatch-heartbeat", daemon=True
            )
            self._thread.start()
            return self

    def _serve(self) -> None:
        _block_dump_signal()
        sock = self._sock
        assert sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = sock.accept()
            except socket.timeout:
                continue
            except OSError as err:
                if self._stop.is_set() or err.errno in (errno.EBADF, errno.EINVAL):
                    return
                continue
            try:
                self._answer(conn)
            except OSError:
                pass
            finally:
                conn.close()

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(CLIENT_READ_TIMEOUT_S)
        data = b""
        while len(data) < MAX_REQUEST_BYTES and b"\n" not in data:
            chunk = conn.recv(MAX_REQUEST_BYTES - len(data))
            if not chunk:
                break
            data += chunk
        if is_ping(data):
            conn.sendall(self._reply())
        elif is_stacks_request(data):
            conn.sendall(thread_stacks())

    def _start_pipe(self, name: str) -> "HeartbeatServer":
        if sys.platform != "win32":
            raise HeartbeatError(
                f"heartbeat path {name!r} is a Windows named pipe; it can be served on Windows only"
            )
        self._thread = threading.Thread(
            target=self._serve_pipe, args=(name,), name="stallwatch-heartbeat", daemon=True
        )
        self._thread.start()
        return self

    if sys.platform == "win32":

        def _serve_pipe(self, name: str) -> None:
            import _winapi

            first = True
            while not self._stop.is_set():
                mode = _winapi.PIPE_ACCESS_DUPLEX
                if first:
                    mode |= _winapi.FILE_FLAG_FIRST_PIPE_INSTANCE
                try:
                    handle = _winapi.CreateNamedPipe(
                        name,
                        mode,
                        _winapi.PIPE_TYPE_BYTE | _winapi.PIPE_READMODE_BYTE | _winapi.PIPE_WAIT
                        | 0x8,  # PIPE_REJECT_REMOTE_CLIENTS
                        _winapi.PIPE_UNLIMITED_INSTANCES,
                        MAX_REQUEST_BYTES,
                        MAX_REQUEST_BYTES,
                        0,
                        _winapi.NULL,
                    )
                except OSError:
                    if first:
                        return
                    continue
                first = False
                try:
                    try:
                        _winapi.ConnectNamedPipe(handle, False)
                    except OSError as err:
                        if getattr(err, "winerror", None) != 535:  # ERROR_PIPE_CONNECTED
                            continue
                    if self._stop.is_set():
                        return
                    data = b""
                    while len(data) < MAX_REQUEST_BYTES and b"\n" not in data:
                        chunk, _ = _winapi.ReadFile(handle, MAX_REQUEST_BYTES - len(data), False)
                        if not chunk:
                            break
                        data += chunk
                    if is_ping(data):
                        _winapi.WriteFile(handle, self._reply(), False)
                except OSError:
                    pass
                finally:
                    _winapi.CloseHandle(handle)

        def _wake_pipe(self, name: str) -> None:
            import _winapi

            try:
                h = _winapi.CreateFile(
                    name,
                    _winapi.GENERIC_READ | _winapi.GENERIC_WRITE,
                    0,
                    _winapi.NULL,
                    _winapi.OPEN_EXISTING,
                    0,
                    _winapi.NULL,
                )
                _winapi.CloseHandle(h)
            except OSError:
                pass

    def _reply(self) -> bytes:
        if self._bye.is_set():
            return _BYE
        reason = None
        if self._health is not None:
            try:
                reason = self._health()
            except Exception:  # a broken check must not stop the heartbeat
                reason = "health_check_failed"
        if reason:
            return b"ERR " + reason.encode("ascii", "replace")[:48] + b"\n"
        self.pongs += 1
        return _PONG

    def goodbye(self) -> None:
        """Answer ``BYE`` from now on (the runner is exiting on purpose); keeps serving.

        The socket stays until :meth:`close` or the end of the process, so stallwatch
        hears the goodbye instead of finding the socket gone (``docs/design.md``,
        "Runner lifecycle": a deliberate goodbye makes the runner ``stopping``).
        """
        self._bye.set()

    @property
    def saying_goodbye(self) -> bool:
        """True once :meth:`goodbye` was called."""
        return self._bye.is_set()

    @property
    def running(self) -> bool:
        """True while the serving thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stop serving, join the thread (at most ~1 s) and remove the socket file."""
        self._stop.set()
        if self._pipe_name is not None:
            if sys.platform == "win32" and self._thread is not None:
                self._wake_pipe(self._pipe_name)
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=1.0)
            return
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        try:
            st = os.lstat(self.path)
            if stat.S_ISSOCK(st.st_mode):
                os.unlink(self.path)
        except OSError:
            pass

    def __enter__(self) -> "HeartbeatServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_heartbeat(
    path: str | os.PathLike[str] | None = None, health: Optional[HealthCheck] = None
) -> HeartbeatServer | None:
    """Start a :class:`HeartbeatServer` on ``path`` (default: ``$STALLWATCH_HEARTBEAT_SOCKET``).

    Returns the running server, or ``None`` when no path is given and the variable is
    unset or empty, or names a socket another live process serves (a child of the runner
    that inherited its environment: the runner keeps its heartbeat). Raises what
    :class:`HeartbeatServer` raises.
    """
    if path is None:
        env = os.environ.get(HEARTBEAT_SOCKET_ENV, "")
        if not env:
            return None
        try:
            return HeartbeatServer(env, health).start()
        except SocketInUseError:
            # A child of the runner that inherited its environment: the runner serves the
            # heartbeat; this process must not take it over (or remove it at exit).
            return None
    return HeartbeatServer(path, health).start()
