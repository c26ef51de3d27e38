"""`memory_every_steps="auto"`: how many steps between memory snapshots, as plain functions on plain data.

    tau = min(sqrt(2 * C * M), C / BUDGET)      steps = max(1, round(tau / step time))

C is what one snapshot costs: the copy run.step() waits for plus the CPU time of its background
hash (on a busy box the hash competes with training); M the mean time between failures from the
run dir's history (save_interval.mtbf_for: the default `mtbf_hours` until a failure is on record).
Young/Daly alone would wait minutes between snapshots while no failure is on record (M = 24 h:
tau ~ 60 s for a 40 ms snapshot), so the first failure of a run would lose all of that; the cap
C / BUDGET keeps snapshots at most ~BUDGET of the training time apart from that, a price a user
does not notice (1 %), and frequent failures (small M) bring them closer still. Torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .save_interval import DEFAULT_MTBF_HOURS

__all__ = ["BUDGET", "memory_interval_s", "AutoMemory"]

BUDGET = 0.01      # share of training time snapshots may cost while failures are rare
_EWMA = 0.3


def memory_interval_s(cost_s: float, mtbf_s: float, budget: float = BUDGET) -> float:
    """Seconds between snapshots: Young/Daly, capped at cost / budget."""
    cost = max(cost_s, 0.0)
    return min(math.sqrt(2.0 * cost * max(mtbf_s, 0.0)), cost / budget)


@dataclasses.dataclass
class AutoMemory:
    """The current interval in steps, recomputed from each snapshot's cost and the step time."""

    mtbf_s: float = DEFAULT_MTBF_HOURS * 3600.0
    cost_s: Optional[float] = None     # EWMA of measured snapshot costs; None before the first one
    step_s: Optional[float] = None     # EWMA of the time between run.step() calls
    every: int = 1                     # the first snapshot comes at once: it measures C

    def observe_step(self, seconds: float) -> None:
        s = max(0.0, float(seconds))
        self.step_s = s if self.step_s is None else (1 - _EWMA) * self.step_s + _EWMA * s
        self._update()

    def observe_cost(self, seconds: float) -> int:
        c = max(0.0, float(seconds))
        self.cost_s = c if self.cost_s is None else (1 - _EWMA) * self.cost_s + _EWMA * c
        self._update()
        return self.every

    def _update(self) -> None:
        if self.step_s and self.cost_s is not None:
            self.every = max(1, round(memory_interval_s(self.cost_s, self.mtbf_s) / self.step_s))
