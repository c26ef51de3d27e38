"""The step mark: the last step a rank really reached, cheap enough to write on every step.

Heartbeats are rate-limited, so their `step` lags: a trainer SIGKILLed at step 8 may have last
beaten at step 5. The shim therefore also stores its step in heartbeats/rank-<R>.step, 8 bytes
(a little-endian signed int64; negative = not set yet), through a MAP_SHARED mapping: a store
into the page cache, no system call, well under a microsecond. The kernel owns those pages, so
the value survives the process being killed (not a power cut: nothing here is ever fsynced), and
the supervisor reads it with a plain read() when an attempt ends.

Ordering rule (what makes a mark trustworthy without deleting files): the shim opens its
StepMark, which resets the value, *before* its first heartbeat of the attempt. So a rank whose
heartbeat says this attempt has a mark of this attempt too: `reached_step` checks exactly that.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
from pathlib import Path
from typing import Optional

from .layout import RunDir
from .records import read_heartbeat_record

__all__ = ["StepMark", "read_step_mark", "reached_step", "STEP_MARK_SIZE"]

STEP_MARK_SIZE = 8
_FORMAT = "<q"
_UNSET = -1


class StepMark:
    """Writer of one rank's step mark; `set(step)` on every step, `close()` at the end."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, STEP_MARK_SIZE)
            self._mm: Optional[mmap.mmap] = mmap.mmap(fd, STEP_MARK_SIZE, mmap.MAP_SHARED,
                                                      mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping keeps the file; no descriptor to leak into children
        # A native int64 view stores in one aligned 8-byte write (no torn values for the reader);
        # on a big-endian host we pack explicitly to keep the file's byte order.
        self._view: Optional[memoryview] = memoryview(self._mm).cast("q") if sys.byteorder == "little" else None
        self.set(_UNSET)  # a mark left by an earlier attempt must not pass for ours

    def set(self, step: int) -> None:
        if self._view is not None:
            self._view[0] = step
        elif self._mm is not None:
            struct.pack_into(_FORMAT, self._mm, 0, step)

    def close(self) -> None:
        """Unmap (the file and its value stay for the supervisor); idempotent."""
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def __enter__(self) -> "StepMark":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_step_mark(path: Path) -> Optional[int]:
    """The step recorded at `path`, or None when absent, short or not set yet."""
    try:
        with open(path, "rb") as f:
            raw = f.read(STEP_MARK_SIZE)
    except OSError:
        return None
    if len(raw) != STEP_MARK_SIZE:
        return None
    (step,) = struct.unpack(_FORMAT, raw)
    return step if step >= 0 else None


def reached_step(run_dir: RunDir, rank: int, attempt: int) -> Optional[int]:
    """The last step rank `rank` reached in `attempt`: its step mark, else its last heartbeat's step.

    None when the rank has no heartbeat of this attempt (it never started, or the files are an
    earlier attempt's, whose mark would lie).
    """
    hb = read_heartbeat_record(run_dir.heartbeat(rank))
    if hb is None or hb.attempt != attempt:
        return None
    mark = read_step_mark(run_dir.step_mark(rank))
    return max(hb.step, mark) if mark is not None else hb.step
