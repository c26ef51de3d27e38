"""A trainer whose supervisor died: found from supervisor.json and ended before a new attempt starts."""

from __future__ import annotations

from typing import Callable

import psutil

from trainer_shim.rundir import ContractError, RunDir, SupervisorState

from . import procs
from ..messages import say

__all__ = ["kill_leftover_trainer"]


def kill_leftover_trainer(rd: RunDir, grace: float, tick: Callable[[], None]) -> None:
    """A trainer whose supervisor died must go before a new one starts on the same run dir; a
    process that merely reuses its pid (another start time) is left alone. The start time, not the
    recorded command line, is the proof: a trainer retitles itself (rundir.titles), which rewrites
    the command line `ps` and /proc/PID/cmdline show."""
    try:
        prev = SupervisorState.read(rd.supervisor_state)
    except ContractError:
        return
    pid = prev.child_pid
    if not pid:
        return
    if procs.matches(pid, prev.child_create_time) is None:
        if psutil.pid_exists(int(pid)):
            say(f"pid {pid} recorded in supervisor.json is no longer our trainer (start time differs); leaving it alone")
        return
    say(f"stopping trainer pid {pid} left over from a supervisor that died")
    procs.kill_tree(int(pid), grace=grace, tick=tick)
