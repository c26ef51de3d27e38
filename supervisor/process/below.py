"""Deaths below a launcher: a trainer killed by a signal (or the OOM killer) under `sh -c`, a
Python launcher (swift, accelerate) or any wrapper that reports its child's death in its exit code.

Only the launcher is our child, so the trainer's wait status never reaches us; what does: the
launcher's exit code in one of the two forms launchers use (a shell's 128+N, a Python launcher's
`sys.exit(returncode)` = 256-N), and the trainer's pid from its heartbeat, which must be gone by
the time the launcher has exited. Both together name the signal and the pid that died; a code
alone (a script may exit 137 itself) is not enough.
"""

from __future__ import annotations

import dataclasses
import signal as signal_mod
from typing import Iterable, Mapping, Optional

import psutil

__all__ = ["DeathBelow", "signal_of_exit", "death_below"]


@dataclasses.dataclass(frozen=True)
class DeathBelow:
    """A process of the job, below its launcher, that a signal killed."""

    pid: int
    signal: int
    launcher_pid: int

    def describe(self) -> str:
        """For humans (evidence lines); code reads the fields, never this phrase."""
        try:
            name = signal_mod.Signals(self.signal).name
        except ValueError:
            name = f"signal {self.signal}"
        return f"trainer pid {self.pid} killed by {name} below launcher pid {self.launcher_pid}"


def signal_of_exit(code: Optional[int]) -> Optional[int]:
    """The signal a launcher's exit code reports: 128+N (129..192) or 256-N (193..255); else None."""
    if code is None or not 128 < code <= 255:
        return None
    n = code - 128 if code <= 192 else 256 - code
    try:
        signal_mod.Signals(n)
    except ValueError:
        return None
    return n


def _gone(pid: int, seen: Mapping[int, psutil.Process]) -> bool:
    proc = seen.get(pid)
    if proc is None:  # never seen in the tree: only its absence can be checked (no reused pid then)
        return not psutil.pid_exists(pid)
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def death_below(returncode: Optional[int], launcher_pid: int, trainer_pids: Iterable[int],
                seen: Mapping[int, psutil.Process]) -> Optional[DeathBelow]:
    """The trainer a signal killed below the launcher `launcher_pid`, which exited `returncode`:
    the first heartbeat pid (other than the launcher) that is gone, when the code reports a signal."""
    n = signal_of_exit(returncode)
    if n is None:
        return None
    for pid in trainer_pids:
        if pid and pid != launcher_pid and _gone(pid, seen):
            return DeathBelow(pid, n, launcher_pid)
    return None
