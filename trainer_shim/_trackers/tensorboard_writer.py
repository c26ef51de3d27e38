"""SummaryWriter (torch.utils.tensorboard's and tensorboardX's; HF's TensorBoardCallback and
Lightning's TensorBoardLogger build one of the two) continued across attempts.

* purge_step: a writer opened in a restarted attempt gets the first step this attempt logs, unless
  the caller passed one. TensorBoard drops every event of that log dir at or after that step that
  was written before (the dead attempt's steps past its checkpoint), so each step is drawn once.
* One log dir: the default one (runs/<date>_<host>, made anew at every start by torch,
  tensorboardX and HF) of the first attempt is recorded in the run dir and reused by the later
  attempts' default writers; a log dir the caller chose is left as it is.
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
from pathlib import Path
from typing import Any, Optional

from ..rundir import TB_LOGDIR, claim, default_logdir, is_default_logdir
from .._session.messages import describe, say
from . import point

__all__ = ["patch"]

_MARK = "__resilient_continued__"


def patch(module: Any) -> None:
    """Wrap ``module.SummaryWriter.__init__`` (torch.utils.tensorboard.writer or tensorboardX.writer)."""
    try:
        cls = module.SummaryWriter
        orig = cls.__init__
        if getattr(orig, _MARK, False):
            return
        sig = inspect.signature(orig)
    except Exception as e:  # a writer module of another shape: its writers stay as they are
        say(f"warning: trackers: SummaryWriter not continued across restarts: {describe(e)}")
        return

    @functools.wraps(orig)
    def __init__(*args: Any, **kwargs: Any) -> None:
        try:
            bound = sig.bind(*args, **kwargs)
            _continue(bound.arguments, "logdir" if "logdir" in sig.parameters else "log_dir")
            args, kwargs = bound.args, bound.kwargs
        except Exception as e:  # never the training's problem: the writer opens as asked
            say(f"warning: trackers: SummaryWriter opened without purge_step: {describe(e)}")
        orig(*args, **kwargs)

    setattr(__init__, _MARK, True)
    cls.__init__ = __init__


def _continue(arguments: dict[str, Any], key: str) -> None:
    """Set the log dir and purge_step of one SummaryWriter call's bound arguments, in place."""
    given = arguments.get(key) or arguments.get("log_dir")   # tensorboardX also takes log_dir=
    first = point.current().first_step
    shared = _shared_logdir(given, arguments.get("comment") or "", restarted=first is not None)
    if shared is not None:
        arguments[key] = shared
        if key != "log_dir":
            arguments.pop("log_dir", None)
    if arguments.get("purge_step") is None and first is not None:
        arguments["purge_step"] = first


def _shared_logdir(given: Optional[Any], comment: str, restarted: bool) -> Optional[str]:
    """The log dir all attempts share when `given` is a default one; None: leave it alone. The first
    default writer of the first attempt records its dir; only a restarted attempt's writers move into
    it (a first attempt's second default writer keeps its own, as without us)."""
    rd = point.run_dir()
    host = socket.gethostname()
    if rd is None or comment:
        return None
    if given is None:   # what torch and tensorboardX would make, made here so that it can be recorded
        given = default_logdir(host)
    elif not is_default_logdir(os.fspath(given), host):
        return None
    mine = os.path.abspath(os.fspath(given))
    first = claim(rd, TB_LOGDIR, mine)
    # One default dir per run dir: a default under another parent (another output_dir) is its own.
    return first if restarted and Path(first).parent == Path(mine).parent else mine
