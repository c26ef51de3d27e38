"""Where this attempt stands for the trackers: the step it resumed from and the first step it logs.

The raw loop (after its restore) and the framework callbacks (when they choose the checkpoint) say
it exactly; before they have, the supervisor's choice in the environment stands for it (a
SummaryWriter may be opened before `init()`). The first logged step follows the framework's count:
the HF Trainer and a raw loop log a step after counting it (checkpoint N: N steps done, the next
one logged is N + 1), Lightning logs a step before counting it (the next one logged is N).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple, Optional

from ..rundir import EnvError, RunDir, RunEnv, parse_checkpoint_name

__all__ = ["Point", "set_resumed", "set_fresh", "current", "run_dir", "env"]


class Point(NamedTuple):
    attempt: int
    resumed_step: Optional[int]   # the checkpoint's step; None: this attempt started fresh
    first_step: Optional[int]     # the first step this attempt logs; None: not a restart (nothing to purge)


_said: Optional[Point] = None


def set_resumed(step: int, first_step: int) -> None:
    """The checkpoint of `step` was restored; the attempt logs from `first_step` on."""
    global _said
    _said = Point(env().attempt, step, first_step)


def set_fresh() -> None:
    """Nothing was restored: training starts at step 0."""
    global _said
    attempt = env().attempt
    _said = Point(attempt, None, 0 if attempt > 1 else None)


def current() -> Point:
    """What the shim said, else what the supervisor's choice in the environment implies."""
    if _said is not None:
        return _said
    e = env()
    step = _checkpoint_step(e.resume_from) if e.resume_from and not e.fresh_start_requested else None
    if step is not None:
        return Point(e.attempt, step, step + 1)
    # A later attempt that starts over (nothing valid to resume) relogs from the first step.
    return Point(e.attempt, None, 0 if e.attempt > 1 else None)


def run_dir() -> Optional[RunDir]:
    """The supervisor's run dir; None for a job that runs alone (nothing is shared then)."""
    d = env().run_dir
    return RunDir(Path(d)) if d else None


def _checkpoint_step(path: str) -> Optional[int]:
    return parse_checkpoint_name(Path(path).name)   # step-N (ours, Lightning's) or checkpoint-N (HF's)


def env() -> RunEnv:
    """This process's product environment, as it is now (a warm interpreter gets its attempt's late)."""
    try:
        return RunEnv.from_environ(os.environ)
    except EnvError:  # the shim's init() says so loudly; the trackers only lose their continuity
        return RunEnv()
