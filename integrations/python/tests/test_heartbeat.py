"""Heartbeat server: PONG from its own thread, protocol strictness, socket file handling."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from conftest import ping
from stallwatch_runner import (
    HeartbeatError,
    HeartbeatServer,
    SocketInUseError,
    SocketPathTooLongError,
)

BLOCKED_CHILD = """
import os, sys, threading, time
from stallwatch_runner import serve_heartbeat
server = serve_heartbeat()
assert server is not None
print("thread", server._thread.name, server._thread is threading.main_thread(), flush=True)
how = sys.argv[1] if len(sys.argv) > 1 else os.environ["BLOCK_HOW"]
if how == "sleep":
    print("ready", flush=True)
    time.sleep(600)
else:
    lock = threading.Lock()
    lock.acquire()
    print("ready", flush=True)
    lock.acquire()  # waits forever
"""


@pytest.mark.parametrize("how", ["sleep", "lock"])
def test_pong_while_main_thread_is_blocked(spawn, short_tmp, how):
    sock = short_tmp / "hb.sock"
    child = spawn(BLOCKED_CHILD, {"STALLWATCH_HEARTBEAT_SOCKET": str(sock), "BLOCK_HOW": how})
    line = child.wait_line("thread ")
    assert line == "thread stallwatch-heartbeat False"
    child.wait_line("ready")
    for _ in range(5):
        assert ping(sock) == b"PONG\n"
    assert child.proc.poll() is None, "the child must still be blocked"


def test_garbage_gets_no_pong_and_server_keeps_serving(short_tmp):
    sock = short_tmp / "hb.sock"
    with HeartbeatServer(sock) as server:
        assert ping(sock, b"HELLO\n") == b""
        assert ping(sock, b"PINGPONG\n") == b""
        assert ping(sock, b"PING") == b""  # no newline before EOF
        assert ping(sock, b"P" * 70) == b""  # over 64 bytes, no newline
        assert ping(sock, b"") == b""
        assert server.pongs == 0
        assert ping(sock, b"PING\n") == b"PONG\n"
        assert ping(sock, b"PI") == b""
        assert server.pongs == 1


def test_ping_split_across_writes(short_tmp):
    sock = short_tmp / "hb.sock"
    with HeartbeatServer(sock):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(sock))
            s.sendall(b"PI")
            s.sendall(b"NG\n")
            assert s.recv(64) == b"PONG\n"
            assert s.recv(64) == b""  # server closed


def test_silent_client_does_not_stop_later_pings(short_tmp):
    sock = short_tmp / "hb.sock"
    with HeartbeatServer(sock):
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect(str(sock))
        try:
            assert ping(sock, timeout=10) == b"PONG\n"
        finally:
            silent.close()


def test_stale_socket_file_is_replaced(short_tmp):
    sock = short_tmp / "hb.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()  # leaves the socket file behind, nobody listening
    assert sock.exists()
    with pytest.raises(ConnectionRefusedError):
        ping(sock)
    with HeartbeatServer(sock):
        assert ping(sock) == b"PONG\n"
    assert not sock.exists(), "close() removes the socket file"


CHILD_SETUP = """
from stallwatch_runner import serve_heartbeat
print("served", serve_heartbeat() is not None, flush=True)
"""


def test_a_child_of_the_runner_never_takes_its_socket(spawn, short_tmp):
    """A helper subprocess (or a multiprocessing child re-importing the main module) that
    sets the kit up inherits STALLWATCH_HEARTBEAT_SOCKET: it took the runner's live socket
    over and, exiting, removed it, so stallwatch stopped the healthy runner. Now it does not
    serve it, and the runner keeps answering."""
    sock = short_tmp / "hb.sock"
    with HeartbeatServer(sock):
        child = spawn(CHILD_SETUP, {"STALLWATCH_HEARTBEAT_SOCKET": str(sock)})
        assert child.wait_line("served ") == "served False"
        child.proc.wait(timeout=30)
        assert sock.exists(), "the child removed the runner's socket"
        assert ping(sock) == b"PONG\n"
        with pytest.raises(SocketInUseError):
            HeartbeatServer(sock).start()
        assert ping(sock) == b"PONG\n"


def test_regular_file_at_path_is_not_removed(short_tmp):
    path = short_tmp / "hb.sock"
    path.write_text("user data")
    with pytest.raises(HeartbeatError, match="not a socket"):
        HeartbeatServer(path).start()
    assert path.read_text() == "user data"


def test_parent_folder_is_created(short_tmp):
    sock = short_tmp / "run" / "nested" / "hb.sock"
    with HeartbeatServer(sock):
        assert ping(sock) == b"PONG\n"
        assert oct(os.stat(sock).st_mode & 0o777) == oct(0o600)


def test_long_path_raises_clear_error(short_tmp):
    long_path = short_tmp / ("d" * 60) / ("s" * 60 + ".sock")
    n = len(os.fsencode(long_path))
    assert n > 107
    with pytest.raises(SocketPathTooLongError) as info:
        HeartbeatServer(long_path)
    msg = str(info.value)
    assert f"{n} bytes" in msg and "107-byte" in msg and str(long_path) in msg
    assert isinstance(info.value, ValueError)
    assert not (short_tmp / ("d" * 60)).exists(), "nothing is created for a refused path"


def test_path_of_exactly_107_bytes_works(short_tmp):
    base = str(short_tmp) + "/"
    path = base + "x" * (107 - len(base))
    assert len(path.encode()) == 107
    with HeartbeatServer(path):
        assert ping(path) == b"PONG\n"


def test_close_stops_thread(short_tmp):
    sock = short_tmp / "hb.sock"
    server = HeartbeatServer(sock).start()
    assert server.running
    assert server._thread is not threading.main_thread()
    server.close()
    assert not server.running
    with pytest.raises(OSError):
        ping(sock)


def test_named_pipe_paths_are_recognised_and_ping_lines_judged_alike() -> None:
    from stallwatch_runner.heartbeat import is_named_pipe, is_ping

    assert is_named_pipe("\\\\.\\pipe\\stallwatch-0123456789abcdef")
    assert not is_named_pipe("/tmp/stallwatch-1000/run.sock")
    assert not is_named_pipe("C:\\pipe\\x")
    # The line rule both transports share: PING up to a newline, CR tolerated.
    assert is_ping(b"PING\n") and is_ping(b"PING\r\n")
    assert not is_ping(b"PING") and not is_ping(b"PONG\n") and not is_ping(b"PINGX\n")


@pytest.mark.skipif(os.name == "nt", reason="the refusal is for platforms without named pipes")
def test_a_named_pipe_is_refused_off_windows_with_a_clear_error() -> None:
    name = "\\\\.\\pipe\\stallwatch-" + "a" * 200  # long: no UNIX socket limit applies
    server = HeartbeatServer(name)
    with pytest.raises(HeartbeatError, match="Windows"):
        server.start()
    assert not server.running
