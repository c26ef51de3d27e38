"""Choosing a checkpoint: the newest one that validates, and the `latest` convenience link.

Selection never follows `latest` (a link can dangle or be pointed anywhere); it scans the
committed `step-*` dirs newest first and stops at the first valid one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Optional

from .env import RESUME_NONE
from .errors import InvalidCheckpoint
from .layout import LATEST, inside, parse_checkpoint_name
from .manifest import CheckpointInfo, inspect_checkpoint
from .pending import wait_for_download

__all__ = ["iter_checkpoint_dirs", "newest_valid", "choose"]

OnReject = Callable[[Path, str], None]


def iter_checkpoint_dirs(dirs: Iterable[Path]) -> list[tuple[int, Path, Path]]:
    """(step, checkpoint dir, the checkpoints dir it is in), newest first; tmp dirs never appear."""
    found = []
    for order, d in enumerate(dirs):
        try:
            entries = list(os.scandir(d))
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.EACCES):
                continue
            raise
        for ent in entries:
            step = parse_checkpoint_name(ent.name)
            if step is not None:
                found.append((step, -order, Path(ent.path), Path(d)))
    # Newest step first; on a tie the primary dir (listed first) wins.
    found.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [(s, p, d) for s, _, p, d in found]


def newest_valid(
    dirs: Iterable[Path],
    *,
    exclude: Iterable[str] = (),
    full: bool = False,
    allow_inexact: bool = False,
    below_step: Optional[int] = None,
    on_reject: Optional[OnReject] = None,
) -> Optional[CheckpointInfo]:
    """The newest checkpoint that validates, searching `dirs` (primary first, then fallbacks).

    Stops at the first valid one, so the cost does not grow with the number kept. `exclude`
    holds resolved paths (as str) to skip, e.g. checkpoints the supervisor marked poisoned;
    inexact (emergency) checkpoints are skipped unless `allow_inexact`.
    """
    dirs = [Path(d) for d in dirs]
    excluded = {str(Path(e)) for e in exclude}
    for d in dirs:
        _check_latest_link(d, on_reject, dirs)
    for step, path, root in iter_checkpoint_dirs(dirs):
        if below_step is not None and step >= below_step:
            continue
        if str(path) in excluded or str(path.resolve()) in excluded:
            continue
        try:
            info = inspect_checkpoint(path, full=full, root=root)
        except InvalidCheckpoint as e:
            if on_reject:
                on_reject(path, e.reason)
            continue
        if info.manifest.global_step != step:
            if on_reject:
                on_reject(path, f"manifest says step {info.manifest.global_step}, dir name says {step}")
            continue
        if not info.manifest.exact and not allow_inexact:
            continue
        return info
    return None


def choose(
    dirs: Iterable[Path],
    requested: Optional[str],
    *,
    full: bool = False,
    allow_inexact: bool = False,
    below_step: Optional[int] = None,
    on_reject: Optional[OnReject] = None,
) -> Optional[CheckpointInfo]:
    """The checkpoint to resume from, for every front end: the supervisor's pick `requested`
    (RESILIENT_RESUME_FROM) when it validates, else the newest valid one older than it (or than
    `below_step`); None for a fresh start (`requested` is RESUME_NONE, or nothing validates).
    A pick the supervisor is still downloading (pending.py) is waited for, then validated like any."""
    if requested == RESUME_NONE:
        return None
    if requested:
        wait_for_download(requested)
        try:
            return inspect_checkpoint(Path(requested), full=full)
        except InvalidCheckpoint as e:
            if on_reject:
                on_reject(e.path, e.reason)
            below_step = parse_checkpoint_name(Path(requested).name)
    return newest_valid(dirs, full=full, allow_inexact=allow_inexact, below_step=below_step, on_reject=on_reject)


def _check_latest_link(ckpt_root: Path, on_reject: Optional[OnReject], roots: Iterable[Path] = ()) -> None:
    """Report a `latest` link that dangles or leaves the searched dirs; selection never follows it."""
    link = ckpt_root / LATEST
    if not link.is_symlink() or on_reject is None:
        return
    target = link.resolve()
    # A HF Trainer's checkpoints live in its output_dir: `latest` may point into another root.
    if not any(inside(target, Path(r).resolve()) for r in [ckpt_root, *roots]):
        on_reject(link, f"latest points outside {ckpt_root} ({os.readlink(link)})")
    elif not target.exists():
        on_reject(link, f"latest points to missing {os.readlink(link)}")
