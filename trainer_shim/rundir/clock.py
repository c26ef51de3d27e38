"""Timestamps written into run-dir records (informative only: liveness uses the reader's monotonic clock)."""

from __future__ import annotations

import datetime as _dt
import os
from typing import Optional

__all__ = ["now_iso", "iso_at", "process_start_ticks", "process_start_time", "start_marks"]


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def iso_at(timestamp: float) -> str:
    """`timestamp` (seconds since the epoch, as time.time()) in the format of now_iso()."""
    return _dt.datetime.fromtimestamp(timestamp, _dt.timezone.utc).isoformat(timespec="milliseconds")


def process_start_ticks(pid: Optional[int] = None) -> Optional[int]:
    """When a process started, in kernel clock ticks since boot (/proc/PID/stat field 22): with the
    pid, an identity a reused pid cannot fake. None when the process is gone, a zombie, or there
    is no /proc."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", "rb") as f:
            stat = f.read()
        # The fields after the ")" that ends the command name: state is the 3rd field, starttime the 22nd.
        rest = stat[stat.rindex(b")") + 2:].split()
        return None if rest[0] == b"Z" else int(rest[19])
    except (OSError, ValueError, IndexError):
        return None


def process_start_time(pid: Optional[int] = None) -> Optional[float]:
    """When a process started (seconds since the epoch, to the kernel's clock tick), from /proc;
    None where there is no /proc. The report's "start" phase (interpreter start and imports) ends
    at init(), so it needs the process's own birth, not the first line the shim runs."""
    ticks = process_start_ticks(pid)
    if ticks is None:
        return None
    try:
        with open("/proc/stat", "rb") as f:
            btime = next(int(ln.split()[1]) for ln in f if ln.startswith(b"btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def start_marks(init_time: Optional[str]) -> dict[str, Optional[str]]:
    """The first_step event's marks of where an attempt's start went: the process's own start
    (interpreter start and imports follow) and init() (restoring follows, up to restored_time)."""
    born = process_start_time()
    return {"process_start_time": iso_at(born) if born is not None else None, "init_time": init_time}
