"""The options both framework callbacks take, declared once (their names and types are the
contract's CALLBACK_OPTIONS, which the config file's `callback:` mapping also uses), and when a step
save is due: every N steps and/or every S seconds ("auto": Young/Daly from the save cost and the run
dir's failure history), agreed by every rank."""

from __future__ import annotations

import os
import time
import warnings
from typing import Any, Optional, Union

from ..errors import ConfigError
from .._policies import save_interval
from ..rundir import AUTO_INTERVAL

__all__ = ["CallbackOptions", "DEFAULT_KEEP_LAST"]

DEFAULT_KEEP_LAST = 3   # checkpoints kept when neither keep_last nor the framework's own limit says


class CallbackOptions:
    """What `ResilientCallback(...)` takes, for the HF Trainer and for Lightning alike.

    run_dir: the run dir when no supervisor set one ($RESILIENT_RUN_DIR wins); trainer: ignored (ms-swift
    builds its callbacks as ``cls(args, trainer)``, and an args object in `run_dir` is read as that).
    save_every_steps / save_every_seconds (seconds or "auto"): step saves besides the framework's own
    (HF: its save_steps; Lightning has none); keep_last: checkpoints kept (None: HF's save_total_limit,
    else 3); save_on_train_end: a checkpoint of the last step; heartbeat_interval: seconds between
    beats; async_save: step saves written by a background thread.
    """

    def __init__(self, run_dir: Any = None, trainer: Any = None, *, save_every_steps: Optional[int] = None,
                 save_every_seconds: Optional[Union[float, str]] = None, keep_last: Optional[int] = None,
                 save_on_train_end: bool = True, heartbeat_interval: float = 1.0, async_save: bool = False) -> None:
        framework_args = None
        if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)) and hasattr(run_dir, "output_dir"):
            framework_args, run_dir = run_dir, None   # ms-swift's cls(args, trainer)
        if isinstance(run_dir, int) and not isinstance(run_dir, bool):
            # Lightning's callback took save_every_steps first.
            warnings.warn("ResilientCallback(N): pass save_every_steps=N", DeprecationWarning, stacklevel=3)
            run_dir, save_every_steps = None, run_dir
        if save_every_steps is not None and (isinstance(save_every_steps, bool) or save_every_steps < 1):
            raise ConfigError(f"save_every_steps must be >= 1, not {save_every_steps!r}")
        if save_every_seconds is not None and save_every_seconds != AUTO_INTERVAL and (
                isinstance(save_every_seconds, (str, bool)) or save_every_seconds <= 0):
            raise ConfigError(f"save_every_seconds must be a positive number or 'auto', not {save_every_seconds!r}")
        if keep_last is not None and keep_last < 1:
            raise ConfigError(f"keep_last must be >= 1, not {keep_last!r}")
        self.run_dir: Optional[Union[str, os.PathLike]] = run_dir
        self.save_every_steps = save_every_steps
        self.save_every_seconds = save_every_seconds
        self.keep_last = keep_last
        self.save_on_train_end = save_on_train_end
        self.heartbeat_interval = heartbeat_interval
        self.async_save = async_save   # as init(async_save=True): step saves written by a background thread
        self._interval: Optional[float] = None         # seconds between timed saves, once known
        self._auto: Optional[save_interval.AutoInterval] = None
        self._last_save_t = time.monotonic()
        self._setup()
        if framework_args is not None:
            self._framework_args(framework_args)

    def _setup(self) -> None:
        """The callback's own state (each framework's callback defines it)."""

    def _framework_args(self, args: Any) -> None:
        raise ConfigError(f"run_dir must be a path, not {type(args).__name__}")

    def _start_schedule(self, session: Any) -> None:
        """The timed schedule of this run dir (the "auto" interval starts from its failure history)."""
        value = self.save_every_seconds
        if value is not None and self._interval is None:
            self._interval, self._auto = save_interval.from_option(value, session.rd, save_interval.DEFAULT_MTBF_HOURS,
                                                                   session.hb)

    def _step_save_due(self, session: Any, step: int) -> bool:
        """Every rank at the same step: a step save is due by count or by time. The time is agreed (one
        MAX all-reduce: ranks' clocks differ) only when a time interval is set."""
        due = bool(self.save_every_steps) and step % self.save_every_steps == 0  # type: ignore[operator]
        if self._interval is not None:
            timed = time.monotonic() - self._last_save_t >= self._interval
            due = session.group.agree(timed, False)[0] or due
        return due

    def _saved(self, session: Any, stall_s: Optional[float]) -> None:
        """A save ended: the timed schedule restarts; "auto" re-tunes from what it cost training."""
        self._last_save_t = time.monotonic()
        if stall_s is not None:
            every = save_interval.tune(self._auto, session.hb, stall_s)
            if every is not None:
                self._interval = every
