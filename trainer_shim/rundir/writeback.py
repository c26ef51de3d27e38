"""Write-back while writing: a checkpoint file is flushed to disk in the background as it grows.

A verified save (or a copy of a member: a memory snapshot persisted, a mirror download) ends with
fsync, which on its own waits for every byte written. Here, each time another WRITEBACK_EVERY
bytes have been written, a thread calls fdatasync on the file (it releases the GIL), so the disk
works while the writer keeps serialising, hashing or copying; the final fsync only waits for the tail. Durability is unchanged (the final fsync still comes before
the manifest). An error of a background flush is kept and raised by `finish()`: after a failed
fsync, Linux may not report the same lost write to a later one.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

__all__ = ["Writeback", "WRITEBACK_EVERY"]

WRITEBACK_EVERY = 64 << 20


class Writeback:
    """Background flushes of one open fd; `wrote(n)` after each write, `finish()` instead of fsync."""

    def __init__(self, fd: int, every: int = WRITEBACK_EVERY) -> None:
        self.fd = fd
        self.every = every
        self._flushed_at = 0
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[OSError] = None

    def wrote(self, total: int) -> None:
        """`total` bytes are written so far: start a flush when enough is new and none is running."""
        if total - self._flushed_at < self.every or (self._thread is not None and self._thread.is_alive()):
            return
        self._flushed_at = total
        self._thread = threading.Thread(target=self._flush, name="trainer_shim-writeback", daemon=True)
        self._thread.start()

    def _flush(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as e:
            self._error = self._error or e

    def join(self) -> None:
        """Wait for the flush in flight: before the fd is closed (it could be reused), whatever happened."""
        if self._thread is not None:
            self._thread.join()

    def finish(self) -> None:
        """Wait for the flush in flight, then fsync the file; OSError if any flush failed."""
        self.join()
        if self._error is not None:
            raise self._error
        os.fsync(self.fd)
