"""Step-boundary watching every raw-loop run has: the first-step event, the "state changed after
run.step()" warning, and the run's length for `status` (heartbeat `total_steps`).

Run calls the hooks: `on_step` at the end of run.step(), `on_batch` before a training batch is
handed out, `on_stream` when a training stream starts, `on_epoch_end` after the epoch-end
checkpoint. Doctor mode (trainer_shim._insight.probe) extends it with per-step digests and faults.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import torch

from .. import rundir
from .messages import say
from ..rundir import Event

__all__ = ["StepWatch"]


def _tensors(model: Any) -> tuple:
    """Parameters and buffers, listed once: walking the module tree costs more than the sum itself."""
    if not isinstance(model, torch.nn.Module):
        return ()
    return tuple(model.parameters()) + tuple(model.buffers())


class StepWatch:
    """Per-process step-boundary observer of a raw loop."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.restored_time = rundir.now_iso()
        self._first = True
        self._ref_version: Optional[int] = None   # version sum at the last run.step()
        self._ref_step: Optional[int] = None
        self._warned = False
        self._watched: tuple = ()
        self._watched_model: Any = None
        self.num_epochs: Optional[int] = None  # set by run.epochs(n)
        self._total_set_by: Optional[str] = None

    def _version_sum(self) -> int:
        m = self.run.model
        if m is not self._watched_model:
            self._watched, self._watched_model = _tensors(m), m
        return sum([t._version for t in self._watched])

    def on_step(self) -> None:
        run = self.run
        if self._first:
            self._first = False
            if run.rank == 0:
                rundir.append_event(run.rd, Event.FIRST_STEP, run.attempt, step=run.global_step,
                                    restored_time=self.restored_time, pid=os.getpid(), **rundir.start_marks(run.init_time))
                # For the next attempt's warm interpreter: the frameworks this one imported (rundir.warm).
                rundir.record_frameworks(run.rd.frameworks, sys.modules, os.getpid(), os.getppid())
        self._ref_step = run.global_step
        self._ref_version = self._version_sum()

    def on_batch(self, batch: Any) -> None:
        if self._ref_step is not None and not self._warned:
            if self._version_sum() != self._ref_version:
                self._warned = True
                say(f"model parameters or buffers changed after run.step() at step {self._ref_step} (before the "
                     "next batch); a checkpoint taken at run.step() misses that change, so a resume is not exact. "
                     "Call run.step() after the last change to training state in the loop body")

    def set_total_steps(self, total: Optional[int], source: str = "integration") -> None:
        """The run's length in optimizer steps, for `status` progress and ETA (heartbeat `total_steps`).

        Integrations call this with HF `max_steps` / Lightning `estimated_stepping_batches`; it wins
        over the `run.epochs(n)` x len(loader) estimate."""
        if total is None or total <= 0:
            return
        self._total_set_by = source
        self.run.engine.hb.set_total_steps(total)

    def on_stream(self, loader: Any) -> None:
        """A training stream starts: with run.epochs(n) and a sized loader the length is known."""
        if self._total_set_by == "integration" or not self.run.engine.stream.in_epochs or self.num_epochs is None:
            return
        try:
            n = len(loader)
        except TypeError:
            return
        self._total_set_by = "epochs"
        self.run.engine.hb.set_total_steps(self.num_epochs * n)

    def on_epoch_end(self) -> None:
        self._ref_step = None
        self._ref_version = None
