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

On Windows stallwatch injects a named pipe (``\\\\.\\pipe\\stallwatch-<hash>``) instead of
a socket path (``docs/platforms.md``); the server then serves that pipe with the same bytes
(through ``_winapi``: one pipe instance per client, byte mode, remote clients rejected).

A thread that only waits in ``accept``/``recv`` keeps answering while the main thread
sleeps, waits on a lock or does I/O (all of which release the GIL). A native call that
holds the GIL starves it, and stallwatch reads that as *suspect* rather than dead.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import sys
import threading
from pathlib import Path
from typing import Callable, Optional

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

_PING = b"PING"
_PONG = b"PONG\n"
_BYE = b"BYE\n"

#: A health check: returns None when healthy, else a short reason (``export_stuck``)
#: that the server answers as ``ERR <reason>``.
HealthCheck = Callable[[], Optional[str]]


class HeartbeatError(RuntimeError):
    """The heartbeat socket could not be served (bad path, not a socket, bind failed)."""


class SocketPathTooLongError(HeartbeatError, ValueError):
    """The socket path is longer than the 107-byte UNIX socket limit."""


def is_named_pipe(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` names a Windows named pipe (``\\\\.\\pipe\\...``)."""
    return os.fspath(path).startswith(PIPE_PREFIX)


def is_ping(data: bytes) -> bool:
    """True when ``data`` (at most 64 bytes read from a client) holds the ``PING`` line."""
    line, newline, _ = data.partition(b"\n")
    return bool(newline) and line.rstrip(b"\r") == _PING


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
    unset or empty. Raises what :class:`HeartbeatServer` raises.
    """
    if path is None:
        env = os.environ.get(HEARTBEAT_SOCKET_ENV, "")
        if not env:
            return None
        path = env
    return HeartbeatServer(path, health).start()
