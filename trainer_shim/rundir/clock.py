"""Timestamps written into run-dir records (informative only: liveness uses the reader's monotonic clock)."""

from __future__ import annotations

import datetime as _dt
import os
from typing import Optional

__all__ = ["now_iso", "iso_at", "process_start_time", "start_marks"]


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def iso_at(timestamp: float) -> str:
    """`timestamp` (seconds since the epoch, as time.time()) in the format of now_iso()."""
    return _dt.datetime.fromtimestamp(timestamp, _dt.timezone.utc).isoformat(timespec="milliseconds")


def process_start_time(pid: Optional[int] = None) -> Optional[float]:
    """When a process started (seconds since the epoch, to the kernel's clock tick), from /proc;
    None where there is no /proc. The report's "start" phase (interpreter start and imports) ends
    at init(), so it needs the process's own birth, not the first line the shim runs."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", "rb") as f:
            stat = f.read()
        with open("/proc/stat", "rb") as f:
            btime = next(int(ln.split()[1]) for ln in f if ln.startswith(b"btime "))
        # Field 22 (starttime, ticks since boot) counts after the ")" that ends the command name.
        ticks = int(stat[stat.rindex(b")") + 2:].split()[19])
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def start_marks(init_time: Optional[str]) -> dict[str, Optional[str]]:
    """The first_step event's marks of where an attempt's start went: the process's own start
    (interpreter start and imports follow) and init() (restoring follows, up to restored_time)."""
    born = process_start_time()
    return {"process_start_time": iso_at(born) if born is not None else None, "init_time": init_time}
