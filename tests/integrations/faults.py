"""Job-side fault injection for the integration tests (test-only knob RRTEST_FAULTS).

RRTEST_FAULTS="1:truncate@17,2:savekill@25,3:hang@28,4:pause@32": in attempt A (RESILIENT_ATTEMPT),
at global step S (`kind@S/R`: only on rank R of a multi-rank job, RANK as torchrun sets it):
  kill      SIGKILL at the end of step S (after the callbacks ran)
  truncate  truncate the largest file of the newest committed checkpoint, then SIGKILL (disk damage + kill)
  savekill  SIGKILL inside the framework's save at step S, before our manifest
  writekill SIGKILL while the background writer thread writes step S's checkpoint file (async_save:
            a value put into the checkpoint, or into the optimizer's param group for the HF Trainer's
            optimizer.pt, kills the process when the writer pickles it)
  hang      block forever inside the model's forward of step S+1 (a hung training_step)
  pause     hold step S's end until SIGTERM arrived (the test sends it), heartbeating, so the stop is seen there
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Optional

from trainer_shim import rundir


def _parse() -> dict[str, int]:
    attempt = os.environ.get(rundir.ENV_ATTEMPT, "1")
    rank = os.environ.get("RANK", "0")
    out = {}
    for item in filter(None, os.environ.get("RRTEST_FAULTS", "").split(",")):
        a, _, rest = item.partition(":")
        kind, _, where = rest.partition("@")
        step, _, only = where.partition("/")
        if a == attempt and only in ("", rank):
            out[kind] = int(step)
    return out


class Faults:
    def __init__(self, cb: Any) -> None:
        self.cb = cb
        self.plan = _parse()
        self.step = 0

    def at(self, kind: str, step: int) -> bool:
        return self.plan.get(kind) == step

    def after_step(self, step: int) -> None:
        self.step = step
        if self.at("kill", step):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.at("truncate", step):
            self._truncate_newest()
            os.kill(os.getpid(), signal.SIGKILL)
        if self.at("pause", step):
            s = self.cb.session
            deadline = time.monotonic() + 120
            while not s.stop.requested and time.monotonic() < deadline:
                s.hb.request()
                time.sleep(0.05)

    def in_save(self, step: int, checkpoint: Optional[dict] = None) -> None:
        """Inside the framework's save; `checkpoint`: the dict it is about to write (Lightning)."""
        if self.at("savekill", step):
            os.kill(os.getpid(), signal.SIGKILL)
        if checkpoint is not None and self.at("writekill", step):
            checkpoint["rrtest_writekill"] = KillWhenWritten()

    def before_save(self, step: int, optimizer: Any) -> None:
        """HF Trainer, after the step's callbacks and before its save: the optimizer's state_dict will
        carry a param-group value that kills the process when the background writer pickles it."""
        if optimizer is not None and self.at("writekill", step):
            optimizer.param_groups[0]["rrtest_writekill"] = KillWhenWritten()

    def in_forward(self, *args: Any) -> None:
        if self.plan.get("hang") is not None and self.step == self.plan["hang"]:
            while True:
                time.sleep(1)

    def _truncate_newest(self) -> None:
        rd = self.cb.session.rd
        info: Optional[rundir.CheckpointInfo] = rundir.newest_valid(rundir.checkpoint_roots(rd))
        assert info is not None, "truncate: no committed checkpoint yet"
        biggest = max(info.manifest.files.items(), key=lambda kv: kv[1].size)[0]
        p = Path(info.path) / biggest
        with open(p, "r+b") as f:
            f.truncate(p.stat().st_size // 2)
            os.fsync(f.fileno())


class KillWhenWritten:
    """SIGKILLs the process when pickled by a thread other than the training thread: the background
    writer's torch.save, with the checkpoint's temp file created and half written. Pickled on the
    training thread, the save was not in the background: that fails the attempt instead."""

    def __deepcopy__(self, memo: dict) -> "KillWhenWritten":  # the training thread's copy of the dict
        return self

    def __reduce__(self) -> Any:
        if threading.current_thread() is threading.main_thread():
            raise AssertionError("writekill: the checkpoint was written on the training thread")
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("writekill: still alive after SIGKILL")


class DiskFull:
    """Pickled by a background writer's torch.save: the write fails as on a full disk."""

    def __deepcopy__(self, memo: dict) -> "DiskFull":  # the training thread's copy keeps it
        return self

    def __reduce__(self) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
