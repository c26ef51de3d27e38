"""The run dir's lock: one live supervisor per run dir (per node), its pid written in the lock file.

Taking it is the supervisor's; probing who holds it is the contract's (trainer_shim.rundir.lock_pid),
since the shim's stale-slot rule asks too.
"""

from __future__ import annotations

import fcntl
import os

from trainer_shim.rundir import RunDir

from ..errors import LockedError, RunDirError

__all__ = ["acquire_lock"]


def acquire_lock(rd: RunDir) -> int:
    """The run dir's exclusive flock, holding our pid; LockedError names the supervisor that has it."""
    try:
        fd = os.open(rd.lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise RunDirError(f"cannot open {rd.lock}: {e.strerror}; check the run dir's permissions") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raw = os.read(fd, 64).decode(errors="replace").strip()
        os.close(fd)
        which = "" if rd.node is None else f" (node {rd.node})"
        raise LockedError(
            f"run dir {rd.root}{which} is in use by supervisor pid {raw or '?'}; "
            f"stop it with `resilient-run stop {rd.root}` or pick another --run-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
