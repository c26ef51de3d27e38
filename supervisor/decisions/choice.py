"""Which checkpoint the next attempt resumes from: the newest valid one that was never poisoned.

A rejection (torn, corrupt, digest mismatch) is announced once per checkpoint and reason; a
poisoned checkpoint (a crash loop, a divergence) is recorded as `checkpoint_rejected` with
`poisoned: true`, so that every later supervisor of the run dir keeps skipping it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from trainer_shim.rundir import POISONED, Event, RunDir, checkpoint_roots, newest_valid, parse_checkpoint_name

from ..process import snapshots
from ..messages import say

__all__ = ["CheckpointChoice"]


class CheckpointChoice:
    def __init__(self, rd: RunDir, poisoned: set[str], emit: Callable[..., Any]) -> None:
        self.rd = rd
        self.poisoned = poisoned      # shared with the supervisor's History: the run's poisoned checkpoints
        self._emit = emit
        self._rejected: set[tuple[str, str]] = set()

    def reject(self, path: Path, reason: str) -> None:
        key = (str(path), reason)
        if key not in self._rejected:
            self._rejected.add(key)
            say(f"checkpoint rejected: {path}: {reason}")
            self._emit(Event.CHECKPOINT_REJECTED, path=str(path), reason=reason)

    def poison(self, path: str, reason: str) -> None:
        """Never resume from `path` again, in this supervisor or any later one on this run dir."""
        self.poisoned.add(path)
        step = parse_checkpoint_name(Path(path).name)
        if step is not None:
            snapshots.drop_step(self.rd, step)
        say(f"checkpoint rejected: {path}: {POISONED}: {reason}")
        # Poisoning travels as its own field; the reason says only why (readers test the field).
        self._emit(Event.CHECKPOINT_REJECTED, path=path, reason=reason, **{POISONED: True})

    def choose(self) -> Optional[str]:
        info = newest_valid(checkpoint_roots(self.rd), exclude=self.poisoned, on_reject=self.reject)
        return str(info.path) if info else None

    def persist_snapshot(self) -> None:
        """A memory snapshot newer than the newest disk checkpoint goes to disk before any choice."""
        snapshots.persist_newest(self.rd, self._emit, say, self.reject)
