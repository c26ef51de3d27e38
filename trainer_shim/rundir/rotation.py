"""Pure retention policy: which checkpoints to delete, decided from plain data only."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Optional

from .manifest import CheckpointKind


@dataclasses.dataclass(frozen=True)
class Entry:
    """What rotation needs to know about one committed checkpoint."""

    name: str
    step: int
    kind: CheckpointKind
    loss: Optional[float] = None
    exact: bool = True


def best_names(entries: Iterable[Entry], keep_best: int) -> set[str]:
    """The keep_best exact checkpoints with the lowest finite loss (ties: newer wins)."""
    cands = [e for e in entries if e.exact and e.loss is not None and e.loss == e.loss]
    cands.sort(key=lambda e: (e.loss, -e.step))
    return {e.name for e in cands[:max(0, keep_best)]}


def to_delete(
    entries: Iterable[Entry],
    *,
    keep_last: int,
    keep_epochs: int,
    keep_best: int,
    protected: Iterable[str] = (),
) -> set[str]:
    """Names to delete: everything not among the newest keep_last of the step pool, the newest
    keep_epochs of the epoch pool, the keep_best lowest-loss ones, or `protected`."""
    entries = list(entries)
    keep = set(protected) | best_names(entries, keep_best)
    by_new = sorted(entries, key=lambda e: e.step, reverse=True)
    step_pool = [e for e in by_new if e.kind.pool == "step"]
    epoch_pool = [e for e in by_new if e.kind.pool == "epoch"]
    keep |= {e.name for e in step_pool[:max(0, keep_last)]}
    keep |= {e.name for e in epoch_pool[:max(0, keep_epochs)]}
    return {e.name for e in entries if e.name not in keep}
