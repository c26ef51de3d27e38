"""What wakes the supervisor's loop: queued signals, heartbeat file events, and timers.

Signal handlers only queue (they may run at any bytecode); Python's wakeup fd and our own writes
land in one self-pipe, so the loop sleeps in a single select() and wakes for any of them.
"""

from __future__ import annotations

import os
import select
import signal
from typing import Any, Iterable

__all__ = ["Wakeup"]


class Wakeup:
    """The self-pipe and the signal queue; `open()` installs, `close()` restores."""

    def __init__(self, signals: Iterable[int]) -> None:
        self._wanted = tuple(signals)
        self.queued: list[int] = []
        self._r, self._w = -1, -1
        self._old: dict[int, Any] = {}

    def open(self) -> None:
        self._r, self._w = os.pipe()
        for fd in (self._r, self._w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        for sig in self._wanted:
            self._old[sig] = signal.signal(sig, self._queue)

    def close(self) -> None:
        for sig, h in self._old.items():
            signal.signal(sig, h)
        self._old.clear()
        if self._w >= 0:
            signal.set_wakeup_fd(-1)
            os.close(self._r)
            os.close(self._w)
            self._r, self._w = -1, -1

    def _queue(self, signum: int, frame: Any) -> None:
        self.queued.append(signum)

    def wake(self) -> None:
        """Wake the loop from another thread (the heartbeat file watcher)."""
        try:
            os.write(self._w, b"w")
        except OSError:
            pass  # pipe full: the loop is awake anyway

    def sleep(self, timeout: float) -> None:
        """Until a signal, a wake() or `timeout` seconds, whichever comes first."""
        if self.queued:
            return
        try:
            r, _, _ = select.select([self._r], [], [], max(0.0, timeout))
        except InterruptedError:
            return
        if r:
            try:
                while os.read(self._r, 4096):
                    pass
            except BlockingIOError:
                pass

    def pop(self) -> list[int]:
        """The queued signals, oldest first; the queue is emptied."""
        out, self.queued = self.queued, []
        return out
