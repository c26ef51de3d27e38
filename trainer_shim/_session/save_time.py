"""Time spent saving: the training stall of every checkpoint save, told to the run dir cheaply.

Each outermost save (a nested fallback save is part of its caller's) adds its wall time on the
training thread to the attempt's total; a disk save then appends one `checkpoint_saved` event
(rank 0) with this save's stall and the running total, which `resilient-run report` reads. An
async save counts only its copy into memory (the background write does not stall training); a
memory snapshot adds to the total without an event of its own (it may run every step). The
framework callbacks time their saves themselves and call `add`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

from ..rundir import CheckpointKind, Event

__all__ = ["SaveTimer"]


class SaveTimer:
    """`emit(event, **fields)` appends an event; `position()` -> (step, checkpoint step) at a save's end."""

    def __init__(self, emit: Callable[..., None], rank: int = 0,
                 position: Callable[[], tuple[int, Optional[int]]] = lambda: (0, None)) -> None:
        self.emit = emit
        self.rank = rank
        self.position = position
        self.total = 0.0
        self._depth = 0

    @classmethod
    def for_run(cls, run: Any) -> "SaveTimer":
        return cls(run.engine.event, run.rank, lambda: (run.global_step, run.checkpoint_step))

    @contextlib.contextmanager
    def stall(self, kind: CheckpointKind, event: bool = True) -> Iterator[None]:
        """Around the training thread's part of a save (`with engine.saves.stall(kind):`)."""
        self._depth += 1
        t0 = time.monotonic()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.add(time.monotonic() - t0, kind, *self.position(), event=event)

    def add(self, seconds: float, kind: CheckpointKind, step: int, checkpoint_step: Optional[int],
            event: bool = True) -> None:
        self.total += seconds
        if event and self.rank == 0:
            self.emit(Event.CHECKPOINT_SAVED, step=step, kind=kind.value, seconds=round(seconds, 4),
                      saving_seconds=round(self.total, 4), checkpoint_step=checkpoint_step)
