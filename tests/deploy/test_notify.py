"""sd_notify datagrams as a real receiving socket sees them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.insight.notify import Notifier, child_environ
from tests.conftest import REPO


@pytest.fixture
def receiver(tmp_path: Path):
    """A datagram socket bound at a path, standing in for systemd's notify socket."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    yield str(path), sock
    sock.close()


def recv_all(sock: socket.socket) -> list[bytes]:
    """Every datagram queued on `sock` right now."""
    out = []
    sock.setblocking(False)
    try:
        while True:
            out.append(sock.recv(4096))
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(2.0)
    return out


def test_exact_datagrams_on_path_socket(receiver):
    path, sock = receiver
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000"})
    assert n.enabled and n.watchdog_interval == 1.5
    n.ready("attempt 1, starting")
    n.status("attempt 1, starting")  # unchanged: not resent
    n.status("attempt 2, step 140, running")
    n.watchdog()
    n.mainpid(4242)
    n.stopping("stopping: waiting for the trainer to save")
    n.close()
    assert recv_all(sock) == [
        b"READY=1\nSTATUS=attempt 1, starting",
        b"STATUS=attempt 2, step 140, running",
        b"WATCHDOG=1",
        b"MAINPID=4242",
        b"STOPPING=1\nSTATUS=stopping: waiting for the trainer to save",
    ]


def test_abstract_socket():
    name = f"resilient-run-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2.0)
    try:
        n = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        n.ready()
        assert sock.recv(4096) == b"READY=1"
        assert n.watchdog_interval is None and not n.watchdog_due(time.monotonic())
    finally:
        sock.close()


def test_watchdog_due_follows_interval(receiver):
    path, sock = receiver
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())})
    assert n.watchdog_interval == pytest.approx(0.1)
    assert n.watchdog_due(time.monotonic())  # never pinged yet
    n.watchdog()
    assert not n.watchdog_due(time.monotonic())
    assert n.watchdog_due(time.monotonic() + 0.1)
    assert recv_all(sock) == [b"WATCHDOG=1"]


def test_watchdog_for_another_pid_is_ignored(receiver):
    path, _ = receiver
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"})
    assert n.enabled and n.watchdog_interval is None
    assert not n.watchdog_due(time.monotonic() + 1000)


def test_disabled_when_unset():
    n = Notifier.from_env({"WATCHDOG_USEC": "1000000"})
    assert not n.enabled and n.watchdog_interval is None
    n.ready("x"); n.status("y"); n.watchdog(); n.stopping(); n.mainpid(1); n.close()  # all no-ops
    assert not n.watchdog_due(time.monotonic())


def test_send_failure_warns_once_and_never_raises(tmp_path: Path):
    # A real process, so we read its real stderr: the socket path does not exist.
    code = (
        "from supervisor.insight.notify import Notifier\n"
        f"n = Notifier.from_env({{'NOTIFY_SOCKET': {str(tmp_path / 'missing.sock')!r}}})\n"
        "n.ready('a'); n.status('b'); n.watchdog(); n.stopping()\n"
        "print('survived')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == "survived\n"
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("resilient-run: sd_notify failed: ")


def test_child_environ_strips_notify_vars():
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "PATH": "/bin", "HOME": "/root"}
    assert child_environ(env) == {"PATH": "/bin", "HOME": "/root"}
    assert "NOTIFY_SOCKET" in env  # the caller's mapping is untouched
