"""The framework callbacks' background saves: reusable staging buffers and one writer thread.

The training thread copies a save's state into `staging` (the engine's memory_snapshot.Staging: buffers
kept across saves, reallocated only when a shape or dtype changes) and `submit`s a job; the writer
thread runs `write(job)`. At most one save is in flight: the next due save `wait`s for it (never
dropped; the buffers are then free again). A preempt or final save, the end of training and
interpreter exit `drain` it, bounded by the engine's DRAIN_GRACE.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any, Callable, Optional

from .._memory.saver import DRAIN_GRACE
from .._memory.slots import Staging
from .._memory.writer import serve, stop
from ._session import say

__all__ = ["BackgroundSaves"]


class BackgroundSaves:
    """The staging buffers and the one writer thread, which runs `write(job)` for each submitted job."""

    def __init__(self, write: Callable[[Any], None], name: str, grace: float = DRAIN_GRACE) -> None:
        self.staging = Staging()
        self.grace = grace
        self._write = write
        self._cv = threading.Condition()
        self._job: Any = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"trainer_shim-{name}-save")
        self._thread.start()
        atexit.register(self.drain)  # a script that ends without on_train_end still gets its save

    def submit(self, job: Any) -> None:
        with self._cv:
            self._job = job
            self._cv.notify_all()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Until no save is in flight (at most `timeout` s when given); True when none is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._job is not None and self._thread.is_alive():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def drain(self) -> bool:
        """Wait for the save in flight, bounded by `grace`; say so when it is still running."""
        if self.wait(self.grace):
            return True
        say(f"warning: the background checkpoint is still being written after {self.grace:.0f} s; going on without it")
        return False

    def close(self) -> None:
        self.drain()
        stop(self._cv, self._mark_closed, (self._thread,), self.grace)
        atexit.unregister(self.drain)

    def _loop(self) -> None:
        serve(self._cv, lambda: self._job, lambda: self._closed, self._write_reported, self._job_done)

    def _write_reported(self, job: Any) -> None:
        try:
            self._write(job)
        except BaseException as e:  # `write` reports its own failures; never let the writer die silently
            say(f"warning: background checkpoint writer: {type(e).__name__}: {e}")

    def _job_done(self) -> None:
        self._job = None

    def _mark_closed(self) -> None:
        self._closed = True
