"""Pipelined memory snapshots: the optimizer's tensors are copied while the next step computes.

A memory snapshot used to cost run.step() a copy of the whole state; Young/Daly then spaces
snapshots by that cost, and each failure redoes the steps in between. But between run.step() and
the optimizer's next step() nothing changes the parameters or the optimizer state: forward and
backward read them and write gradients. So run.step() copies only the rest into the slot (buffers,
which forward may change, e.g. BatchNorm statistics; RNG, loader and scheduler state) and hands
the tensors the optimizer owns (its parameters and their state) to the hasher thread, which copies
them while forward and backward run (on another core: what that still costs training, memory
bandwidth, is measured for memory_every_steps="auto", see _policies/memory_interval), then hashes
the slot. The copy is complete before the optimizer's next step() (a global
step pre-hook waits for it), before the next run.step() at the latest.

Safety: the snapshot is committed (its manifest written) only after the training thread, at that
point, has seen that none of those tensors changed while they were copied (their autograd version
counters, bumped by every in-place op). A job that changes them in place elsewhere (a manual weight
update between run.step() and optimizer.step()) loses that one snapshot, is told once, and its
later snapshots are copied before run.step() returns, as before. Single process only (N ranks
hash on the training thread, see async_save); torch optimizers only (the hook is theirs).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

__all__ = ["CHANGED_WHILE_COPIED", "LateCopy"]

CHANGED_WHILE_COPIED = ("memory snapshot dropped: a parameter or optimizer state changed outside optimizer.step() "
                        "while it was copied; later snapshots are copied before run.step() returns")


@dataclasses.dataclass
class _Pending:
    slot: Any                       # memory_snapshot.Slot whose late tensors are copied
    versions: list[int]             # the late tensors' version counters when run.step() handed them over
    copied: bool = False            # the hasher finished the copy (or failed it)
    failed: bool = False
    ok: Optional[bool] = None       # the training thread's verdict: unchanged while copied


class LateCopy:
    """One process's pipelined copies; `cv` is the saver's condition (the hasher waits on it too)."""

    def __init__(self, cv: threading.Condition, optimizer: Any) -> None:
        self.cv = cv
        self.optimizer = optimizer
        self.on = True
        self.pending: Optional[_Pending] = None
        self.last_wait = 0.0   # seconds training waited for the last judged copy
        self._hook = register_optimizer_step_pre_hook(self._before_optimizer_step)

    @staticmethod
    def usable(optimizer: Any, world_size: int) -> bool:
        return world_size == 1 and isinstance(optimizer, torch.optim.Optimizer)

    def protected(self) -> Optional[set[int]]:
        """Storage addresses of what only optimizer.step() changes; None when copies are synchronous."""
        if not self.on:
            return None
        out: set[int] = set()
        for group in self.optimizer.param_groups:
            out.update(p.data_ptr() for p in group["params"])
        for state in self.optimizer.state.values():
            out.update(v.data_ptr() for v in state.values() if isinstance(v, torch.Tensor))
        return out

    def begin(self, slot: Any) -> None:
        """run.step(): hand the slot's late tensors (if any) to the hasher."""
        if slot.late:
            with self.cv:
                self.pending = _Pending(slot, _versions(slot))

    # --- hasher thread ---------------------------------------------------------------------------

    def copy(self) -> None:
        p = self.pending
        if p is None or p.copied:
            return
        try:
            p.slot.copy_late()
        except BaseException:
            p.failed = True
            raise
        finally:
            with self.cv:
                p.copied = True
                self.cv.notify_all()

    def verdict(self, closed: Callable[[], bool]) -> bool:
        """Wait for the training thread's word; True: the copy is the state of the snapshot's step."""
        p = self.pending
        if p is None:
            return True
        with self.cv:
            while p.ok is None and not closed():
                self.cv.wait()
            self.pending = None
            return bool(p.ok)

    # --- training thread -------------------------------------------------------------------------

    def settle(self) -> None:
        """Before anything may change the late tensors: wait for their copy, then judge it."""
        p = self.pending
        if p is None or p.ok is not None:
            return
        t0 = time.perf_counter()
        with self.cv:
            while not p.copied:
                self.cv.wait(1.0)
        self.last_wait = time.perf_counter() - t0
        ok = not p.failed and _versions(p.slot) == p.versions
        with self.cv:
            p.ok = ok
            self.cv.notify_all()
        if not ok and not p.failed:
            self.on = False

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.settle()

    def close(self) -> None:
        self._hook.remove()


def _versions(slot: Any) -> list[int]:
    """The late tensors' autograd version counters (torch bumps one on every in-place op; there is
    no public accessor)."""
    return [t._version for t in slot.late_tensors()]
