"""`memory_every_steps="auto"`: how many steps between memory snapshots, as plain functions on plain data.

    tau = min(sqrt(2 * C * M), C / BUDGET)      steps = max(1, round(tau / step time))

C is what one snapshot costs training: how much longer the steps run while it is copied and hashed
than the steps without one (base_s), measured, since on a spare core the background copy and hash
cost little, and on a busy box as much as their CPU; until a step without a snapshot is measured,
the copy run.step() waited for plus the background CPU. M the mean time between failures from the
run dir's history (save_interval.mtbf_for: the default `mtbf_hours` until a failure is on record).
Young/Daly alone would wait minutes between snapshots while no failure is on record (M = 24 h:
tau ~ 60 s for a 40 ms snapshot), so the first failure of a run would lose all of that; the cap
C / BUDGET keeps snapshots at most ~BUDGET of the training time apart from that, a price a user
does not notice (2 %: at 1 % the goodput bench's first failure redid ~45 steps for +0.1 % of
measured step time), and frequent failures (small M) bring them closer still. Torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..rundir import DEFAULT_MTBF_HOURS

__all__ = ["BUDGET", "memory_interval_s", "AutoMemory"]

BUDGET = 0.02      # share of training time snapshots may cost while failures are rare
_EWMA = 0.3
PAUSE = 4.0        # a "step" this many times the usual one is a pause in the loop, not a step


def memory_interval_s(cost_s: float, mtbf_s: float, budget: float = BUDGET) -> float:
    """Seconds between snapshots: Young/Daly, capped at cost / budget."""
    cost = max(cost_s, 0.0)
    return min(math.sqrt(2.0 * cost * max(mtbf_s, 0.0)), cost / budget)


@dataclasses.dataclass
class _Cost:
    """What one snapshot costs training, measured as it goes."""
    excess: Optional[float]            # the steps beside its background work, over a quiet step (None:
                                       # no quiet step was known when it began)
    fallback: Optional[float] = None   # the copy waited for + the background CPU (while no quiet step is known)
    measure: bool = False              # not a slot's first fill (which creates the file)


@dataclasses.dataclass
class AutoMemory:
    """The current interval in steps, recomputed from each snapshot's cost and the step time."""

    mtbf_s: float = DEFAULT_MTBF_HOURS * 3600.0
    cost_s: Optional[float] = None     # EWMA of measured snapshot costs; None before the first one
    step_s: Optional[float] = None     # EWMA of the time between run.step() calls
    base_s: Optional[float] = None     # EWMA of that time for steps with no snapshot work in the background
    every: int = 1                     # the first snapshot comes at once: it measures C
    pending: Optional[_Cost] = None    # the snapshot whose background work is not over yet

    def snapshot_started(self) -> None:
        """run.step() took a snapshot; its background work begins."""
        self.pending = _Cost(0.0 if self.base_s is not None else None)

    def snapshot_hashed(self, fallback: float, measure: bool) -> None:
        """Its background work is over (the hasher thread): `fallback` is its cost while no quiet step is known."""
        if self.pending is not None:
            self.pending.fallback, self.pending.measure = fallback, measure

    def observe_step(self, seconds: float, busy: bool = False, hashing: bool = False) -> None:
        """One step's time; `busy`: background save work ran beside it, `hashing`: a snapshot's still does.
        The snapshot's cost is the steps' excess over a quiet step once its background work is over."""
        s = max(0.0, float(seconds))
        if self.step_s is not None and s > PAUSE * self.step_s:
            return  # a pause (evaluation, a disk save, a break in the loop), not a step: no measure
        self.step_s = _ewma(self.step_s, s)
        quiet = not busy and self.pending is None
        if quiet:
            self.base_s = _ewma(self.base_s, s)
        cost = self.pending
        if cost is not None:
            if cost.excess is not None and self.base_s is not None:
                cost.excess += s - self.base_s
            if not hashing:
                self.pending = None
                if cost.measure and cost.fallback is not None:
                    self.observe_cost(cost.fallback if cost.excess is None else cost.excess)
        self._update()

    def observe_cost(self, seconds: float) -> int:
        self.cost_s = _ewma(self.cost_s, max(0.0, float(seconds)))
        self._update()
        return self.every

    def _update(self) -> None:
        if self.step_s and self.cost_s is not None:
            self.every = max(1, round(memory_interval_s(self.cost_s, self.mtbf_s) / self.step_s))


def _ewma(old: Optional[float], new: float) -> float:
    return new if old is None else (1 - _EWMA) * old + _EWMA * new
