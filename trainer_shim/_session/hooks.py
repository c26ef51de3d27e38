"""The process-level hooks of one Run, installed together and removed together.

SIGTERM/SIGINT set the stop flag; uncaught exceptions are recorded (and may get an emergency
checkpoint); the optimizer's post-step hook tells whether weights moved after `run.step()`. A new
Run in the same process (a notebook, a test, a second `trainer.train()`) first uninstalls the
previous Run's hooks, so handlers never chain across Runs.

Three hooks are process-wide and stay: the SIGUSR1 stack-dump relay (faulthandler keeps one
registration; a new Run only moves its target file), the fork tie of DataLoader workers
(`os.register_at_fork` cannot be undone; it only ties children to their live parent) and a
torchrun rank's tie to torchrun (it must never outlive its launcher).
"""

from __future__ import annotations

import os
import traceback
from types import TracebackType
from typing import Any, Callable, Optional

from . import signals
from .messages import say
from ..rundir import ErrorRecord, RunDir, atomic_write_json, now_iso

__all__ = ["ProcessHooks", "write_error_record", "record_exception"]

OnException = Callable[[type, BaseException, Optional[TracebackType]], None]

_active: Optional["ProcessHooks"] = None


class ProcessHooks:
    def __init__(self) -> None:
        self.stop = signals.StopFlag()
        self._undo: list[Callable[[], None]] = []

    def install(self, rd: RunDir, on_exception: OnException, optimizer: Any = None,
                on_optimizer_step: Optional[Callable[..., None]] = None, *, stop_now: bool = True) -> "ProcessHooks":
        """`stop_now=False`: SIGTERM/SIGINT keep their handlers until `install_stop` (a framework
        installs its own when training starts; ours must come after it)."""
        global _active
        if _active is not None:
            _active.uninstall()
        if stop_now:
            self.install_stop()
        signals.install_stack_dumps(rd.stacks_file(os.getpid()))
        signals.tie_forked_children()
        signals.die_with_launcher()
        self._undo.append(signals.install_excepthook(on_exception))
        if optimizer is not None and on_optimizer_step is not None and hasattr(optimizer, "register_step_post_hook"):
            self._undo.append(optimizer.register_step_post_hook(on_optimizer_step).remove)
        _active = self
        return self

    def install_stop(self) -> None:
        """SIGTERM/SIGINT set the stop flag from now on (uninstalled with the other hooks)."""
        if self.stop.install():
            self._undo.append(self.stop.uninstall)

    def uninstall(self) -> None:
        """Put back what was there before `install` (idempotent)."""
        global _active
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except (ValueError, RuntimeError) as e:   # e.g. signal handlers off the main thread
                say(f"warning: cannot remove a hook: {e}")
        if _active is self:
            _active = None


def write_error_record(rd: RunDir, attempt: int, rank: int, record: ErrorRecord) -> None:
    """errors/attempt-N[-rank-R].json: why this process ends, for the supervisor's classification.
    A failure to write is reported and ignored (the process is ending anyway)."""
    path = rd.error_file(attempt, rank)
    try:
        atomic_write_json(path, record.to_json())
    except OSError as e:
        say(f"warning: cannot write {path}: {e}")


def record_exception(rd: RunDir, attempt: int, rank: int, tp: type, value: BaseException,
                     tb: Optional[TracebackType], *, step: Optional[int]) -> None:
    """The error record of an uncaught exception (the excepthook's first act)."""
    write_error_record(rd, attempt, rank, ErrorRecord(
        type=signals.qualified_name(tp), message=str(value),
        traceback="".join(traceback.format_exception(tp, value, tb)), step=step, time=now_iso()))
