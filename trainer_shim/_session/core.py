"""The session core every front end uses, the raw loop's Run and the framework callbacks alike: one
training process's heartbeat (paced) and step mark, its process hooks, its events and their
messages, the save timer, the exception record, the preempt exit and the finish record.

A front end translates its framework's moments into these calls (trainer_shim._loop.run for the
raw loop, trainer_shim.integrations._session for the callbacks) and re-implements none of them.
"""

from __future__ import annotations

import math
import os
import sys
import time
from types import TracebackType
from typing import Any, Callable, NoReturn, Optional

from .. import rundir
from .save_time import SaveTimer
from ..rundir import Event, Phase, RunDir, RunEnv, StepMark
from .engine import Reporter
from .heartbeat import Heartbeat
from .hooks import OnException, ProcessHooks, record_exception
from .messages import say

__all__ = ["Session"]


def _title_as_trainer(rd: RunDir, rank: int, attempt: int) -> None:
    """`resilient-run trainer rank R attempt N RUN_DIR (python train.py ...)` in `ps`. Here rather than
    in the warm standby alone: every trainer passes through init(), cold or warm, torchrun's ranks and
    a launcher's child, and only here is its rank known. Loaded only under the supervisor."""
    from ..rundir import titles

    titles.set_title(titles.trainer_title(rd.root, rank=rank, attempt=attempt, node=rd.node,
                                          command=[os.path.basename(sys.executable), *sys.argv]))


class Session:
    """Rank `rank` of `world_size` writing into `rd` for attempt `env.attempt`."""

    def __init__(self, rd: RunDir, env: RunEnv, *, rank: int, world_size: int, heartbeat_interval: float,
                 position: Callable[[], tuple[int, Optional[int]]] = lambda: (0, None)) -> None:
        self.rd, self.env, self.rank, self.world_size = rd, env, rank, world_size
        self.attempt = env.attempt
        if env.run_dir:   # supervised: the supervisor and its standby carry titles, so `ps` tells us apart
            _title_as_trainer(rd, rank, self.attempt)
        self.reporter = Reporter(rd, self.attempt)
        # The step mark is reset before the first beat: the supervisor trusts a mark only once this
        # attempt's heartbeat exists, so it never reads a previous attempt's step as ours.
        self.mark = StepMark(rd.step_mark(rank))
        # The first beat (phase starting) goes out before any restore work: the supervisor's startup
        # clock stops here, and a slow restore is visibly "starting".
        self.hb = Heartbeat(rd.heartbeat(rank), rank=rank, attempt=self.attempt, interval=heartbeat_interval,
                            node=rd.node)
        self.hb.write_now()
        self.saves = SaveTimer(self.reporter.event, rank, position)
        self.hooks: Optional[ProcessHooks] = None
        self._beat_t = -math.inf
        self._ended = False

    def install_hooks(self, on_exception: OnException, optimizer: Any = None,
                      on_optimizer_step: Optional[Callable[..., None]] = None, *, stop_now: bool = True) -> None:
        """The process hooks, installed together (a previous Run's or session's are removed first).
        `stop_now=False`: SIGTERM waits for `install_stop`, after a framework's own handler."""
        self.hooks = ProcessHooks().install(self.rd, on_exception, optimizer, on_optimizer_step, stop_now=stop_now)

    @property
    def stop(self) -> Any:
        """The stop flag SIGTERM/SIGINT set (hooks.StopFlag)."""
        assert self.hooks is not None
        return self.hooks.stop

    def install_stop(self) -> None:
        """SIGTERM/SIGINT now mean "checkpoint at this step's end, exit 75" (see exit_preempted)."""
        assert self.hooks is not None
        self.hooks.install_stop()

    # --- heartbeats ---------------------------------------------------------------------------

    def beat(self, step: int, epoch: int, loss: Optional[float] = None, phase: Phase = Phase.TRAINING) -> None:
        """Stamp where training stands; the file is written at most once per heartbeat interval, or at
        once when the phase changes."""
        changed = self.hb.progress(step, epoch, loss, phase)
        now = time.monotonic()
        if changed or now - self._beat_t >= self.hb.interval:
            self._beat_t = now
            self.hb.request()

    def beat_due(self) -> bool:
        """Whether the next beat() writes (so a caller can skip computing what only the file needs)."""
        return time.monotonic() - self._beat_t >= self.hb.interval

    # --- events and errors --------------------------------------------------------------------

    def event(self, event: Event, **fields: Any) -> None:
        self.reporter.event(event, **fields)

    def reject(self, path: Any, reason: str) -> None:
        self.reporter.rejected(path, reason)

    def record_exception(self, tp: type, value: BaseException, tb: Optional[TracebackType],
                         step: Optional[int]) -> None:
        """errors/attempt-N[-rank-R].json for an uncaught exception (what the supervisor classifies)."""
        record_exception(self.rd, self.attempt, self.rank if self.world_size > 1 else 0, tp, value, tb, step=step)

    # --- the end ------------------------------------------------------------------------------

    def exit_preempted(self, where: str, before_exit: Callable[[], None] = lambda: None, **fields: Any) -> NoReturn:
        """After the preempt checkpoint: heartbeat `stopping`, one line, exit 75 (EXIT_PREEMPTED)."""
        self.hb.stop()
        self.mark.close()
        self.hb.write_now(phase=Phase.STOPPING.value, **fields)
        say(f"stop requested (signal {self.stop.signum}); {where}; exiting {rundir.EXIT_PREEMPTED}")
        before_exit()
        sys.exit(rundir.EXIT_PREEMPTED)

    def finish(self, uninstall: bool = True, **fields: Any) -> None:
        """The `finished` heartbeat (once); `uninstall`: the process hooks go too."""
        if self._ended:
            return
        self._ended = True
        if uninstall and self.hooks is not None:
            self.hooks.uninstall()
        self.hb.stop()
        self.mark.close()
        self.hb.write_now(phase=Phase.FINISHED.value, **fields)
