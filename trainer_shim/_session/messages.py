"""`say`: the shim's one line on stderr, for every room of the shim (the supervisor has its own)."""

from __future__ import annotations

import errno
import sys

__all__ = ["PREFIX", "say", "describe"]

PREFIX = "trainer_shim:"


def say(msg: str) -> None:
    """One line on stderr, flushed at once (a killed process still leaves it behind)."""
    print(f"{PREFIX} {msg}", file=sys.stderr, flush=True)


def describe(e: BaseException) -> str:
    """An error in one line: `ENOSPC: No space left on device` (the errno name first, for people and
    for tests) for a storage error, else `Type: message`."""
    if isinstance(e, OSError):
        code = errno.errorcode.get(e.errno or 0, "")
        return f"{code + ': ' if code else ''}{e.strerror or e}"
    return f"{type(e).__name__}: {e}"
