"""Divergence guard: a non-finite loss given to run.step() ends the attempt before the bad state is saved.

Modes (`init(on_nonfinite=...)`):
- "raise" (default): nothing is saved (no step checkpoint, no emergency checkpoint), an error record
  and a `diverged` event are written, and the process exits EXIT_DIVERGED (65); the supervisor
  classifies the attempt as `diverged` and falls back to an older checkpoint when it diverged soon
  after resuming.
- "skip" (single process only): the step is not counted: global_step, the heartbeat, the loss and the save schedule are
  untouched, so no checkpoint holds the state of a skipped step (as AMP's GradScaler skips steps
  with inf gradients). The caller is expected not to have applied the update (or to overwrite it);
  `run.skipped_steps` counts them and the first one is reported.
- "ignore": the loss is recorded and training goes on (the pre-guard behaviour).

The check is one float comparison: the loss is turned into a Python float once, which run.step()
always did for the heartbeat (a tensor pays the same single device sync it paid before).
"""

from __future__ import annotations

import math
import traceback
from typing import Any

from .. import rundir
from .._session.messages import say
from ..rundir import DIVERGED_ERROR_TYPE, EXIT_DIVERGED, Event
from .._session.hooks import write_error_record

__all__ = ["DIVERGED_ERROR_TYPE", "is_nonfinite", "nonfinite", "stop_diverged", "note_skip"]


def is_nonfinite(value: float) -> bool:
    return not math.isfinite(value)


def nonfinite(run: Any, value: float) -> bool:
    """run.step() saw a non-finite loss (mode raise or skip): True when the step is skipped; raise never returns."""
    if run.on_nonfinite == "skip":
        return True
    stop_diverged(run, value)
    return False


def stop_diverged(run: Any, value: float) -> None:
    """End the attempt without saving: error record, `diverged` event, exit EXIT_DIVERGED."""
    step = run.global_step + 1   # the step that produced the loss (not counted)
    msg = (f"non-finite loss {value!r} at step {step}; nothing saved, exiting {EXIT_DIVERGED} "
           f"(init(on_nonfinite='skip'|'ignore') to train through it)")
    write_error_record(run.rd, run.attempt, run.rank if run.world_size > 1 else 0, rundir.ErrorRecord(
        type=DIVERGED_ERROR_TYPE, message=msg, traceback="".join(traceback.format_stack(limit=8)), step=step,
        time=rundir.now_iso(), loss=repr(value), resumed_from=run.resumed_from))
    if run.rank == 0:
        run.engine.event(Event.DIVERGED, step=step, loss=repr(value), resumed_from=run.resumed_from)
    say(msg)
    run.engine.exit_now(EXIT_DIVERGED)   # no emergency checkpoint of the bad state from any exit path


def note_skip(run: Any, value: float) -> None:
    """A skipped step (the Run has counted it): the first one is said."""
    if run.skipped_steps == 1:
        say(f"non-finite loss {value!r} after step {run.global_step}: step skipped (on_nonfinite='skip'); "
             "later skips are counted in run.skipped_steps")
