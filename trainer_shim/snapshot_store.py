"""The shim's side of committing checkpoint dirs and copying snapshot members.

Finding, persisting and freeing memory snapshot slots is torch-free and shared with the supervisor,
so it lives in the contract (trainer_shim.rundir.snapshots); the names below are re-exported for
the shim's callers.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from . import rundir
from .rundir import InvalidCheckpoint, Manifest
from .rundir.snapshots import add_to_index, complete_slots, merged_manifest, newest_complete, persist_newest
from .rundir.snapshots import free_slots as free, persist_slot as persist, remove_slot as remove

__all__ = ["commit_dir", "manifest_bytes", "copy_member",
           # re-exported from the contract for the shim's callers
           "complete_slots", "newest_complete", "merged_manifest", "persist", "add_to_index", "persist_newest",
           "remove", "free"]

_COPY_CHUNK = 8 << 20


def commit_dir(tmp: Path, final: Path, manifest_bytes: bytes, exact: bool) -> None:
    """MANIFEST.json last (its presence makes the checkpoint complete), rename, repoint `latest`.

    No temp+rename for the manifest inside tmp: the whole dir is invisible until its own rename.
    """
    fd = os.open(tmp / rundir.MANIFEST_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        data = manifest_bytes
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)
    rundir.fsync_dir(tmp)
    if final.exists():
        # Superseding the committed checkpoint of the same step (a step save on an epoch's last
        # batch, replaced by the epoch-end save): it stays valid until the new one stands.
        if rundir.exchange(tmp, final):
            shutil.rmtree(tmp, ignore_errors=True)   # now the old one
        else:
            old = final.with_name(f"{rundir.TMP_PREFIX}superseded-{final.name}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    rundir.fsync_dir(final.parent)
    if exact:  # `latest` names something resumable; an emergency save is not
        rundir.repoint_latest(final.parent, final.name)


def manifest_bytes(manifest: Manifest) -> bytes:
    return (json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n").encode()


def _copy_member(src: Path, dst: Path, want: Optional[str], progress: Callable[[int], None], base: int) -> int:
    """Copy one member, hashing what is written; InvalidCheckpoint if it is not what the manifest
    says. want=None: an in-kernel copy (copy_file_range), no hashing."""
    if want is None:
        try:
            return _kernel_copy(src, dst, progress, base)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            os.unlink(dst)
    h = rundir.new_hasher()
    n = 0
    buf = bytearray(_COPY_CHUNK)
    view = memoryview(buf)
    with open(src, "rb", buffering=0) as f:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            while True:
                got = f.readinto(buf)
                if not got:
                    break
                piece = view[:got]
                h.update(piece)
                while piece:
                    piece = piece[os.write(fd, piece):]
                n += got
                progress(base + n)
            os.fsync(fd)
        finally:
            os.close(fd)
    if want is not None and h.hexdigest() != want:
        raise InvalidCheckpoint(src.parent, f"{src.name} digest mismatch (changed in memory?)")
    return n


def copy_member(src: Path, dst: Path, progress: Callable[[int], None] = lambda n: None) -> int:
    """Copy one member into a new file, fsynced (in the kernel where it can); the caller knows its digest."""
    return _copy_member(src, dst, None, progress, 0)


def _kernel_copy(src: Path, dst: Path, progress: Callable[[int], None], base: int) -> int:
    n = 0
    with open(src, "rb", buffering=0) as f:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            while True:
                got = os.copy_file_range(f.fileno(), fd, _COPY_CHUNK)
                if not got:
                    break
                n += got
                progress(base + n)
            os.fsync(fd)
        finally:
            os.close(fd)
    return n
