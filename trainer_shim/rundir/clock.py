"""Timestamps written into run-dir records (informative only: liveness uses the reader's monotonic clock)."""

from __future__ import annotations

import datetime as _dt

__all__ = ["now_iso"]


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
