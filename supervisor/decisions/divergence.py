"""What a `diverged` attempt says about its checkpoints, as a plain decision on plain data.

An attempt that diverged (non-finite loss) within `divergence_window` steps of the checkpoint it
resumed from condemns that checkpoint and every newer one (written since, from the same state):
the next attempt resumes from the next older one. Divergence from fresh state within the window
has nothing older to fall back to: after `FRESH_DIVERGENCES` of them in a row the supervisor gives
up with reason `diverged` instead of looping. A divergence later than the window says nothing
about the checkpoint; the attempt is restarted like any failure.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

__all__ = ["DivergenceVerdict", "DivergenceTracker", "FRESH_DIVERGENCES"]

FRESH_DIVERGENCES = 2   # from-scratch divergences in a row before giving up (nondeterministic jobs get one retry)


@dataclasses.dataclass(frozen=True)
class DivergenceVerdict:
    poison: tuple[str, ...] = ()    # checkpoints to condemn (resumed-from first)
    reason: str = ""                # why (for checkpoint_rejected / gave_up detail)
    give_up: bool = False


@dataclasses.dataclass
class DivergenceTracker:
    window: int
    fresh_in_a_row: int = 0

    def judge(self, *, diverged_step: Optional[int], resumed_from: Optional[str], resumed_step: Optional[int],
              newer: tuple[str, ...] = ()) -> DivergenceVerdict:
        """`newer`: valid checkpoints with a step above resumed_step (written by the diverged lineage)."""
        base = resumed_step or 0
        steps = None if diverged_step is None else diverged_step - base
        within = steps is None or steps <= self.window
        if not within:
            self.fresh_in_a_row = 0
            return DivergenceVerdict()
        where = "at an unknown step" if steps is None else f"at step {diverged_step}, {steps} steps"
        if resumed_from is None:
            self.fresh_in_a_row += 1
            reason = (f"diverged {where} after a fresh start (within --divergence-window {self.window}); "
                      f"{self.fresh_in_a_row} fresh start(s) in a row diverged")
            if self.fresh_in_a_row >= FRESH_DIVERGENCES:
                return DivergenceVerdict(poison=newer, reason=reason, give_up=True)
            return DivergenceVerdict(poison=newer, reason=reason)
        self.fresh_in_a_row = 0
        reason = f"diverged {where} after resuming from it (within --divergence-window {self.window})"
        return DivergenceVerdict(poison=(resumed_from, *newer), reason=reason)

    def reset(self) -> None:
        self.fresh_in_a_row = 0
