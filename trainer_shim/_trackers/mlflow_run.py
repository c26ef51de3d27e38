"""mlflow.start_run continued across attempts: one MLflow run for all attempts of a run dir.

The first top-level run a supervised job starts is recorded in the run dir; the supervisor gives the
later attempts MLFLOW_RUN_ID (rundir.trackers), which MLflow itself (and HF's MLflowCallback through
it) reads to continue that run. A restarted attempt tags the run with the step it resumed from
(`resilient.resume.attempt-N`). If the recorded run cannot be continued (another tracking store),
the attempt starts a run of its own after one warning line instead of failing.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

from ..rundir import ENV_MLFLOW_RUN_ID, MLFLOW_ID, claim, resume_tag
from .._session.messages import describe, say
from . import point

__all__ = ["patch"]

_MARK = "__resilient_continued__"


def patch(module: Any) -> None:
    """Wrap ``module.start_run`` (mlflow.tracking.fluent; `mlflow.start_run` binds it afterwards, and
    the module's own auto-started runs call it by its global name)."""
    try:
        orig = module.start_run
        if getattr(orig, _MARK, False):
            return
        sig = inspect.signature(orig)
    except Exception as e:
        say(f"warning: trackers: MLflow runs not continued across restarts: {describe(e)}")
        return

    @functools.wraps(orig)
    def start_run(*args: Any, **kwargs: Any) -> Any:
        try:
            arguments = sig.bind(*args, **kwargs).arguments
        except TypeError:
            return orig(*args, **kwargs)   # MLflow's own error for a wrong call
        run = _start(orig, args, kwargs, arguments)
        try:
            _after(module, run, arguments)
        except Exception as e:
            say(f"warning: trackers: MLflow run {_run_id(run)} not recorded for the next attempts: {describe(e)}")
        return run

    setattr(start_run, _MARK, True)
    module.start_run = start_run


def _start(orig: Any, args: tuple, kwargs: dict, arguments: dict) -> Any:
    """orig(...); when the run id we set cannot be continued, a run of its own after one warning."""
    ours = os.environ.get(ENV_MLFLOW_RUN_ID) if ENV_MLFLOW_RUN_ID in point.env().trackers else None
    try:
        return orig(*args, **kwargs)
    except Exception as e:
        if not ours or arguments.get("run_id") is not None:
            raise
        say(f"warning: trackers: the MLflow run of the first attempt ({ours}) cannot be continued "
            f"({describe(e)}); this attempt starts a run of its own")
        os.environ.pop(ENV_MLFLOW_RUN_ID, None)   # MLflow removes it once read; be sure it is gone
        return orig(*args, **kwargs)


def _after(module: Any, run: Any, arguments: dict) -> None:
    """Record the first top-level run; tag a restarted attempt's run with the step it resumed from."""
    if arguments.get("nested") or arguments.get("parent_run_id"):
        return
    rd = point.run_dir()
    run_id = _run_id(run)
    if rd is None or not run_id:
        return
    first = claim(rd, MLFLOW_ID, run_id)
    here = point.current()
    if first == run_id and here.first_step is not None:   # a restart continuing the one run
        module.set_tag(resume_tag(here.attempt), str(here.resumed_step or 0))


def _run_id(run: Any) -> str:
    return getattr(getattr(run, "info", None), "run_id", "") or ""

