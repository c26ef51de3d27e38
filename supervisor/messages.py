"""The supervisor's one-line messages to the user (stderr), kept apart from the child's output."""

from __future__ import annotations

import sys

__all__ = ["PREFIX", "say"]

PREFIX = "resilient-run: "


def say(msg: str) -> None:
    """One line on stderr, prefixed so it stands out of the child's output; never fails."""
    try:
        sys.stderr.write(f"{PREFIX}{msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
