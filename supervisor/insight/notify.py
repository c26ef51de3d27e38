"""systemd's sd_notify protocol over $NOTIFY_SOCKET, in the standard library only."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Optional

__all__ = ["Notifier", "child_environ", "NOTIFY_VARS"]

# Variables systemd hands the main process; a child that inherited them could send READY= or
# WATCHDOG= on our behalf (NotifyAccess=main ignores it, but a stray ping must not hide a hang).
NOTIFY_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def child_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of `environ` without the notify variables, for the supervised child."""
    return {k: v for k, v in environ.items() if k not in NOTIFY_VARS}


def _address(value: str) -> str | bytes:
    # A leading '@' names a Linux abstract socket, whose real name starts with a NUL byte.
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def _watchdog_interval(environ: Mapping[str, str]) -> Optional[float]:
    usec = environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = environ.get("WATCHDOG_PID")
    try:
        if pid and int(pid) != os.getpid():
            return None  # the watchdog is meant for another process (e.g. our parent)
        value = int(usec)
    except ValueError:
        return None
    # Half the timeout, as sd_watchdog_enabled(3) recommends, so one late ping is not fatal.
    return value / 2 / 1e6 if value > 0 else None


class Notifier:
    """Speaks systemd's notify protocol over $NOTIFY_SOCKET; does nothing when it is unset."""

    def __init__(self, address: Optional[str] = None, watchdog_interval: Optional[float] = None) -> None:
        self.address = address
        self.watchdog_interval = watchdog_interval if address else None
        self._sock: Optional[socket.socket] = None
        self._last_status: Optional[str] = None
        self._last_ping: Optional[float] = None
        self._warned = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Notifier":
        """A Notifier configured from NOTIFY_SOCKET / WATCHDOG_USEC / WATCHDOG_PID."""
        address = environ.get("NOTIFY_SOCKET") or None
        return cls(address, _watchdog_interval(environ))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def _send(self, message: str) -> None:
        if self.address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message.encode(), _address(self.address))
        except OSError as e:
            # Losing a notification must never take the job down; say so once, not every second.
            if not self._warned:
                self._warned = True
                print(f"resilient-run: sd_notify failed: {e}", file=sys.stderr, flush=True)

    def ready(self, status: Optional[str] = None) -> None:
        """Tell systemd start-up is complete (READY=1), with an optional status line."""
        self._send_state("READY=1", status)

    def _send_state(self, state: str, status: Optional[str]) -> None:
        """One datagram: a state change and the status line with it (systemd applies them together)."""
        lines = [state]
        if status is not None:
            lines.append(f"STATUS={status}")
            self._last_status = status
        self._send("\n".join(lines))

    def status(self, text: str) -> None:
        """Set the status line `systemctl status` shows; sent only when it changed."""
        if text == self._last_status:
            return
        self._last_status = text
        self._send(f"STATUS={text}")

    def watchdog(self) -> None:
        """Ping the service watchdog (WATCHDOG=1)."""
        self._last_ping = time.monotonic()
        self._send("WATCHDOG=1")

    def watchdog_due(self, now: float) -> bool:
        """True when the watchdog is on and its interval has elapsed since the last ping (monotonic `now`)."""
        if self.watchdog_interval is None or not self.enabled:
            return False
        return self._last_ping is None or now - self._last_ping >= self.watchdog_interval

    def stopping(self, status: Optional[str] = None) -> None:
        """Tell systemd the service is shutting down (STOPPING=1)."""
        self._send_state("STOPPING=1", status)

    def mainpid(self, pid: int) -> None:
        """Tell systemd which process is the service's main process (MAINPID=)."""
        self._send(f"MAINPID={pid}")

    def close(self) -> None:
        """Close the socket; later calls reopen it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
