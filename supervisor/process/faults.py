"""Real faults for `drill`: a trainer SIGKILLed, stopped (SIGSTOP: a hang only its heartbeat can
reveal) or OOM-killed by the kernel inside its memory limit.

The trainer is named by the caller (from its heartbeat) and reached through a pidfd opened once
its start time is checked, so a pid reused between the check and the signal is never hit.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from trainer_shim.rundir import process_start_ticks

from .cgroup import MemoryCgroup, MemoryLimit
from .procs import join_cgroup

__all__ = ["Target", "kill", "stop", "start_oom", "hog"]

# The allocator's pace: 8 MiB per chunk, each page touched so it is really charged to the cgroup.
CHUNK = 8 << 20
PAGE = 4096
# Highest oom_score_adj: the kernel's choice inside the cgroup is then the trainer, whatever the
# sizes (its score gains the whole limit), never the allocator nor a DataLoader worker.
OOM_SCORE_ADJ_MAX = 1000
OOM_SCORE_ADJ_MIN = -1000   # the allocator's own: the kernel never picks it (root may set it)


@dataclasses.dataclass(frozen=True)
class Target:
    """One trainer process: its pid and start time (clock ticks since boot), which together name it."""

    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> Optional["Target"]:
        """The live process `pid` (None when gone or a zombie)."""
        ticks = process_start_ticks(pid)
        return None if ticks is None else cls(pid, ticks)

    def alive(self) -> bool:
        return process_start_ticks(self.pid) == self.start_ticks


def _send(t: Target, sig: int) -> bool:
    """`sig` to `t` through a pidfd: False when `t` is gone (or its pid now names another process)."""
    try:
        fd = os.pidfd_open(t.pid)
    except ProcessLookupError:
        return False
    try:
        if not t.alive():   # checked after the pidfd is held: the pidfd pins this very process
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def kill(t: Target) -> bool:
    return _send(t, signal.SIGKILL)


def stop(t: Target) -> bool:
    """SIGSTOP: every thread halts, the heartbeat thread too, so only the supervisor's watchdog can
    tell; its SIGKILL ends a stopped process as any other (SIGTERM stays pending until then)."""
    return _send(t, signal.SIGSTOP)


def start_oom(t: Target, limit: MemoryLimit, seconds: float) -> Optional[subprocess.Popen]:
    """Make the kernel OOM-kill `t` inside `limit`: raise its oom_score_adj to the maximum, then start
    an allocator in its cgroup that fills the limit until `t` is gone (or `seconds` pass).

    The allocator is a separate process, so any trainer (raw loop, HF, Lightning, no shim at all)
    can be drilled: what the kernel sees is the job's cgroup at its limit. None when `t` is gone.
    OSError (one line from the caller) when the cgroup or oom_score_adj may not be written."""
    procs_file = limit.cgroup.procs_file
    if not os.access(procs_file, os.W_OK):   # asked first: a refused drill changes nothing
        raise PermissionError(f"{procs_file} is not writable, so no allocator can join the trainer's cgroup")
    with open(f"/proc/{t.pid}/oom_score_adj", "w") as f:
        f.write(str(OOM_SCORE_ADJ_MAX))
    if not t.alive():
        return None
    code = "from supervisor.process.faults import hog; hog()"
    # This very package, also when it runs from a source tree that was never installed.
    home = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (home, os.environ.get("PYTHONPATH"))))}
    argv = [str(t.pid), str(t.start_ticks), str(limit.limit_bytes), str(seconds), str(limit.cgroup.path),
            str(limit.cgroup.version)]
    return subprocess.Popen([sys.executable, "-c", code, *argv], preexec_fn=_join(procs_file), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _join(procs_file: str) -> Callable[[], None]:
    # Before exec: every page the allocator touches is charged to the trainer's cgroup.
    return lambda: join_cgroup(procs_file)


def hog() -> None:
    """The allocator (argv: PID START_TICKS LIMIT_BYTES SECONDS CGROUP_DIR VERSION): touch memory chunk
    by chunk until the kernel has OOM-killed in the cgroup or the trainer is gone, then exit, so the
    next attempt starts with the limit free. Never more than the limit, never past SECONDS."""
    pid, ticks, limit, seconds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    cgroup = MemoryCgroup(Path(sys.argv[5]), int(sys.argv[6]))
    target, deadline, kills = Target(pid, ticks), time.monotonic() + seconds, cgroup.oom_kills()
    try:   # never the kernel's victim: while the killed trainer's memory is reaped, our next chunk waits
        with open("/proc/self/oom_score_adj", "w") as f:   # instead of making the allocator a second kill
            f.write(str(OOM_SCORE_ADJ_MIN))
    except OSError:
        pass
    held: list[bytearray] = []
    # The counter, not only the trainer's death: a killed trainer may take a while to exit on a busy
    # box, and an allocator that went on filling the memory it frees would be the kernel's next victim.
    while (target.alive() and cgroup.oom_kills() == kills and len(held) * CHUNK < limit
           and time.monotonic() < deadline):
        chunk = bytearray(CHUNK)
        chunk[::PAGE] = b"\1" * len(range(0, CHUNK, PAGE))
        held.append(chunk)
