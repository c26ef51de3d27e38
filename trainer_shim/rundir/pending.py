"""A checkpoint still arriving: the supervisor downloads it while the attempt that resumes from it starts.

On a new node (`--mirror`) the supervisor knows which remote checkpoint it will restore, and so the
local dir it will be committed to, before the download. It writes DOWNLOAD_RECORD beside that dir
(owner pid and start ticks, the dir's name), starts the first attempt with RESILIENT_RESUME_FROM
naming the dir, downloads and commits it, and removes the record. The trainer builds its model
meanwhile; its chooser (selection.choose) waits while the record names its checkpoint and the
owner lives, then validates the checkpoint as usual. No record (removed, or never written) means
the same as before this existed: the dir is committed or it is not. A failed download leaves no
dir (it goes to a .tmp- dir, committed by rename with its manifest last), so the chooser falls
back to an older checkpoint or a fresh start; a dead owner's record is ignored.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from .atomic import atomic_write_json, read_json
from .clock import process_start_ticks
from .errors import ContractError

__all__ = ["DOWNLOAD_RECORD", "announce_download", "settle_download", "download_pending", "wait_for_download"]

DOWNLOAD_RECORD = ".downloading.json"   # in the checkpoints dir the download is committed to
POLL_S = 0.02   # a stat every 20 ms: the wait adds at most this to the resume


def _record(ckpt: Path) -> Path:
    return ckpt.parent / DOWNLOAD_RECORD


def announce_download(ckpt: Path) -> None:
    """The supervisor (this process) is about to download into `ckpt`; written before the attempt starts."""
    # Not durable: after a power cut its writer is dead, and a dead writer's record is ignored.
    atomic_write_json(_record(Path(ckpt)), {"checkpoint": Path(ckpt).name, "pid": os.getpid(),
                                            "start": process_start_ticks()}, durable=False)


def settle_download(ckpt_root: Path) -> None:
    """The download is over (committed, or failed and cleaned up): waiting trainers go on. Also
    removes a record a killed supervisor left (called under the run dir's lock at start)."""
    try:
        os.unlink(Path(ckpt_root) / DOWNLOAD_RECORD)
    except FileNotFoundError:
        pass


def download_pending(ckpt: Path) -> bool:
    """Whether a live supervisor is still downloading into `ckpt` (its record names it and the
    process that wrote it is the same one: pid and start ticks, so a reused pid does not count)."""
    try:
        rec = read_json(_record(Path(ckpt)))
    except ContractError:   # none (the usual case), or unreadable: nothing to wait for
        return False
    if not isinstance(rec, dict) or rec.get("checkpoint") != Path(ckpt).name:
        return False
    pid, start = rec.get("pid"), rec.get("start")
    if not isinstance(pid, int) or pid <= 0:
        return False
    now = process_start_ticks(pid)
    return now is not None and (start is None or now == start)


def wait_for_download(requested: Optional[str], on_wait: Optional[Callable[[Path], None]] = None,
                      poll: float = POLL_S) -> bool:
    """Block while the supervisor downloads `requested` (a checkpoint path; anything else returns
    at once); True when it waited. Bounded by the download: the supervisor removes the record when
    it ends, and a supervisor that dies (its pid gone or reused) ends the wait too."""
    if not requested or os.sep not in requested:
        return False
    ckpt = Path(requested)
    if not download_pending(ckpt):
        return False
    if on_wait is not None:
        on_wait(ckpt)
    while download_pending(ckpt):
        time.sleep(poll)
    return True
