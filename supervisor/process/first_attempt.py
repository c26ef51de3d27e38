"""The run's first attempt; on a new node it starts as the mirror download does, not after it.

The mirror announces the local dir its download is to be committed to (rundir.pending); the first
attempt starts then, resuming from that dir, so that its imports and the script's own start
(building the model) overlap the download, and its trainer waits for the download before it
restores. Without a download (no mirror, nothing newer there, no record) it starts after.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from ..messages import say
from ..mirror.mirror import Mirror
from .attempts import Attempt

__all__ = ["start_first_attempt"]


def start_first_attempt(mirror: Mirror, start: Callable[[Optional[str], bool], Attempt],
                        prestart: Callable[[], None], choose: Callable[[], Optional[str]]) -> None:
    """`start(resume_from, prestart_next)` starts an attempt (None: `choose` picks), `prestart()`
    the next one's launcher; `choose` names what a trainer falls back to when the download failed."""
    early: list[Attempt] = []

    def before_download(target: Optional[Path]) -> None:
        prestart()
        if target is not None:
            early.append(start(str(target), False))   # the next standby's imports would slow the download

    restored = mirror.restore(before_download=before_download)
    if not early:
        start(None, True)
        return
    a = early[0]
    failed = a.downloaded(restored, choose)
    if failed is not None:
        say(f"attempt {a.number}: the download of {failed} failed; it resumes from {a.chosen or 'scratch'}")
    prestart()
