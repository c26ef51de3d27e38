"""Memory a restore lands in, faulted in before it is needed.

A fresh process restoring a memory snapshot has no optimizer state yet: raw_read reads it into
fresh anonymous memory, and faulting those pages in (the kernel zeroes each 4 KiB page at its
first touch) cost three to four times the copy itself here: 0.10 s against 0.03 s for 256 MiB on
two threads. The warm standby (trainer_shim._launch.warm) has nothing to do while it waits for its
attempt, so it keeps one region of the size the newest complete slot's optimizer state needs,
populated (MAP_POPULATE), and the restore reads into it instead of fresh memory.

The rules, so that an idle standby never starves the job it stands by for:
- the region is held only while MemAvailable is at least ROOM_FACTOR x its size (checked at each
  resize; a region already held is kept);
- it follows the slots: it is resized when the slots' size changes and dropped when no complete
  slot is left;
- the restore takes it only when it fits the need within a little slack, and releases it when the
  restore ends either way (restoring.restore), so an untaken region never outlives init().
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import psutil

from . import slot_maps
from .. import rundir

ROOM_FACTOR = 4
_SLACK = 1 << 20     # a held region larger than the need by more than this (or 1/8) is not taken

_held: Optional[mmap.mmap] = None
_landed = 0          # bytes of this process's restore that landed in a held region (said at resume)


def needed(slots: Sequence[Path]) -> int:
    """Bytes the optimizer state of the newest complete slot among `slots` takes (0: none).

    Only stats: it runs on every poll of a waiting standby."""
    best, newest = 0, -1.0
    for slot in slots:
        try:
            done = os.stat(slot / rundir.MANIFEST_NAME).st_mtime
            size = os.stat(slot / (rundir.OPTIMIZER_FILE + rundir.TENSORS_SUFFIX)).st_size
        except OSError:
            continue
        if done > newest:
            best, newest = size, done
    # Whole pages: at least what the fresh region needs (its entries padded to raw_tensors.ALIGN, far
    # below a page), and what the mapping costs anyway.
    return -(-best // mmap.PAGESIZE) * mmap.PAGESIZE


def keep_ready(slots: Sequence[Path]) -> int:
    """Hold a populated region of needed(slots) bytes and populated mappings of the slots' regions
    (slot_maps; the standby, between polls); the region's size now."""
    global _held
    slot_maps.follow(slots)
    n = needed(slots)
    if _held is not None and len(_held) == n:
        return n
    _drop_region()
    if n == 0 or not _room_for(n):
        return 0
    _held = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    return n


def held() -> int:
    return 0 if _held is None else len(_held)


def take(n: int) -> Optional[mmap.mmap]:
    """The held region for a fresh region of n bytes, when it fits (raw_read); else None."""
    global _held, _landed
    region = _held
    if region is None or not n <= len(region) <= n + max(n >> 3, _SLACK):
        return None
    _held, _landed = None, _landed + n
    return region


def landed() -> int:
    """Bytes restored into a region held ahead of time, in this process."""
    return _landed


def release() -> None:
    """Drop the held region and the slots' mappings (the restore is over)."""
    slot_maps.release()
    _drop_region()


def _drop_region() -> None:
    """Drop the held region (unmapped as soon as nothing refers to it)."""
    global _held
    region, _held = _held, None
    if region is not None:
        try:
            region.close()
        except BufferError:  # a tensor still views it: the tensor keeps it alive instead
            pass


def _room_for(n: int) -> bool:
    try:
        return psutil.virtual_memory().available >= ROOM_FACTOR * n
    except (OSError, psutil.Error):
        return False
