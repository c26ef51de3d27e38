"""Doctor mode for the framework callbacks: the native shim's per-step digest records, injected
faults and last step (`trainer_shim._insight.probe.DoctorLog`), fed from the framework's own objects.

A framework restores its model, optimizer, scheduler and RNGs itself; the digests after each
optimizer step show whether it did so exactly. Inert (None) outside doctor mode.
"""

from __future__ import annotations

from typing import Any, Optional

from .._insight.probe import DoctorLog, digest, state_digests
from ..rundir import RunEnv

__all__ = ["FrameworkDoctor"]


class FrameworkDoctor:
    def __init__(self, log: DoctorLog, attempt: Optional[int]) -> None:
        self.log = log
        self.attempt = attempt

    @classmethod
    def from_env(cls, env: RunEnv) -> Optional["FrameworkDoctor"]:
        """Doctor mode as the session's parsed environment says (None outside doctor mode)."""
        log = DoctorLog.from_env(env)
        return cls(log, env.attempt) if log is not None else None

    def on_step(self, step: int, model: Any, stateful: dict[str, Any], *, loss: Optional[float] = None,
                epoch: Any = None, batch: Any = None, rank: int = 0) -> bool:
        """Record step `step` (after its optimizer step) and inject its fault; True: stop here."""
        rec = {"step": step, "loss": loss, "epoch": epoch, "batch": digest(batch) if batch is not None else None,
               "digests": state_digests(model, stateful)}
        return self.log.step(rec, attempt=self.attempt, rank=rank)
