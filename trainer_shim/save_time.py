"""Time spent saving: the training stall of every checkpoint save, told to the run dir cheaply.

Each outermost save (a nested fallback save is part of its caller's) adds its wall time on the
training thread to the attempt's total; a disk save then appends one `checkpoint_saved` event
(rank 0) with this save's stall and the running total, which `resilient-run report` reads. An
async save counts only its copy into memory (the background write does not stall training); a
memory snapshot adds to the total without an event of its own (it may run every step).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from .rundir import EVENT_CHECKPOINT_SAVED, CheckpointKind

__all__ = ["SaveTimer"]


class SaveTimer:
    """Owned by a Run: `with run._saves.stall(kind):` around the training thread's part of a save."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.total = 0.0
        self._depth = 0

    @contextlib.contextmanager
    def stall(self, kind: CheckpointKind, event: bool = True) -> Iterator[None]:
        self._depth += 1
        t0 = time.monotonic()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                secs = time.monotonic() - t0
                self.total += secs
                if event and self.run.rank == 0:
                    self.run._event(EVENT_CHECKPOINT_SAVED, step=self.run.global_step, kind=kind.value,
                                    seconds=round(secs, 4), saving_seconds=round(self.total, 4),
                                    checkpoint_step=self.run.checkpoint_step)
