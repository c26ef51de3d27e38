"""`say`: the shim's one line on stderr, for every room of the shim (the supervisor has its own)."""

from __future__ import annotations

import sys

__all__ = ["PREFIX", "say"]

PREFIX = "trainer_shim:"


def say(msg: str) -> None:
    """One line on stderr, flushed at once (a killed process still leaves it behind)."""
    print(f"{PREFIX} {msg}", file=sys.stderr, flush=True)
