"""Timestamps written into run-dir records (informative only: liveness uses the reader's monotonic clock)."""

from __future__ import annotations

import datetime as _dt

__all__ = ["now_iso", "iso_at"]


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def iso_at(timestamp: float) -> str:
    """`timestamp` (seconds since the epoch, as time.time()) in the format of now_iso()."""
    return _dt.datetime.fromtimestamp(timestamp, _dt.timezone.utc).isoformat(timespec="milliseconds")
