"""The one commit protocol of a checkpoint dir, torch-free, for every writer.

A checkpoint is written into `<root>/.tmp-<name>/` (invisible to selection), every member fsynced
and hashed into a manifest entry, MANIFEST.json written LAST (its presence is what makes the dir
a checkpoint), the dir fsynced, renamed to `<name>` atomically and the parent fsynced; `latest`
is repointed for resumable checkpoints. A dir that a framework has already named (a HF Trainer's
`checkpoint-N/`) is committed in place: its manifest goes in by temp file and rename.

Removing a checkpoint goes the other way: rename it out of sight first (`discard`), then delete,
so a half-deleted dir never looks like a committed one.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Optional

from .atomic import atomic_write_bytes, exchange, fsync_dir
from .errors import InvalidCheckpoint
from .layout import RUN_DIR_MODE, TMP_PREFIX
from .manifest import MANIFEST_NAME, FileEntry, digest_file, new_hasher
from .selection import repoint_latest
from .writeback import Writeback

__all__ = ["tmp_dir", "fresh_tmp_dir", "hash_tree", "commit_dir", "commit_in_place", "copy_member",
           "copy_verified", "discard"]

_COPY_CHUNK = 8 << 20
Progress = Callable[[int], None]


def tmp_dir(root: Path, name: str) -> Path:
    """Where checkpoint `name` is written before its commit (selection never looks there)."""
    return Path(root) / f"{TMP_PREFIX}{name}"


def fresh_tmp_dir(root: Path, name: str) -> Path:
    """An empty temporary dir for checkpoint `name` (what a killed writer left there is removed)."""
    tmp = tmp_dir(root, name)
    Path(root).mkdir(mode=RUN_DIR_MODE, parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=RUN_DIR_MODE)
    return tmp


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hash_tree(directory: Path) -> dict[str, FileEntry]:
    """Manifest entries (size, xxh3-128) of every file under `directory` that someone else wrote
    (a framework's save), each fsynced with its dir; the manifest and symlinks are not members."""
    files: dict[str, FileEntry] = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(directory).as_posix()
            if rel == MANIFEST_NAME or full.is_symlink():
                continue
            _fsync_file(full)
            files[rel] = FileEntry(full.stat().st_size, digest_file(full))
        fsync_dir(Path(dirpath))
    return files


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_dir(tmp: Path, final: Path, manifest_bytes: bytes, *, repoint: bool) -> None:
    """MANIFEST.json last, rename `tmp` to `final`, fsync the parent; `repoint` moves `latest` to it.

    No temp+rename for the manifest inside tmp: the whole dir is invisible until its own rename.
    """
    _write_new(tmp / MANIFEST_NAME, manifest_bytes)
    fsync_dir(tmp)
    if final.exists():
        # Superseding the committed checkpoint of the same step (a step save on an epoch's last
        # batch, replaced by the epoch-end save): it stays valid until the new one stands.
        if exchange(tmp, final):
            shutil.rmtree(tmp, ignore_errors=True)   # now the old one
        else:
            discard(final, "superseded", then=lambda: os.rename(tmp, final))
    else:
        os.rename(tmp, final)
    fsync_dir(final.parent)
    if repoint:  # `latest` names something resumable; an emergency save is not
        repoint_latest(final.parent, final.name)


def commit_in_place(directory: Path, manifest_bytes: bytes) -> None:
    """Commit a dir a framework already named: its MANIFEST.json by temp file, fsync, rename."""
    atomic_write_bytes(directory / MANIFEST_NAME, manifest_bytes)


def discard(path: Path, why: str = "deleting", *, then: Optional[Callable[[], None]] = None,
            background: bool = False) -> Optional[threading.Thread]:
    """Rename `path` out of sight (`.tmp-<why>-<name>`), run `then`, delete it (in a daemon thread
    when `background`: unlinking GBs costs time, and the renamed dir is already invisible).
    OSError of the rename propagates; the dir is then untouched."""
    trash = path.parent / f"{TMP_PREFIX}{why}-{path.name}"
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(path, trash)
    if then is not None:
        then()
    if not background:
        shutil.rmtree(trash, ignore_errors=True)
        return None
    t = threading.Thread(target=shutil.rmtree, args=(trash, True), daemon=True, name="trainer_shim-rotate")
    t.start()
    return t


def copy_verified(src: Path, dst: Path, want: Optional[str], progress: Progress = lambda n: None,
                  base: int = 0) -> int:
    """Copy one member into a new fsynced file, hashing what is written; InvalidCheckpoint if it is
    not what the manifest says. want=None: an in-kernel copy (copy_file_range), no hashing."""
    if want is None:
        try:
            return _kernel_copy(src, dst, progress, base)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            os.unlink(dst)
    h = new_hasher()
    buf = bytearray(_COPY_CHUNK)
    view = memoryview(buf)

    def hashed(f: BinaryIO, fd: int) -> int:
        got = f.readinto(buf)
        piece = view[:got]
        h.update(piece)
        while piece:
            piece = piece[os.write(fd, piece):]
        return got

    n = _copy_into_new(src, dst, progress, base, hashed)
    if want is not None and h.hexdigest() != want:
        raise InvalidCheckpoint(src.parent, f"{src.name} digest mismatch (changed in memory?)")
    return n


def copy_member(src: Path, dst: Path, progress: Progress = lambda n: None) -> int:
    """Copy one member into a new file, fsynced (in the kernel where it can); the caller knows its digest."""
    return copy_verified(src, dst, None, progress)


def _kernel_copy(src: Path, dst: Path, progress: Progress, base: int) -> int:
    return _copy_into_new(src, dst, progress, base, lambda f, fd: os.copy_file_range(f.fileno(), fd, _COPY_CHUNK))


def _copy_into_new(src: Path, dst: Path, progress: Progress, base: int, step: Callable[[BinaryIO, int], int]) -> int:
    """Copy `src` into a new file `dst`, one `step(src file, dst fd)` at a time (bytes moved, 0 at the
    end): the hashing copy and the in-kernel one differ only in the step. The writes are flushed
    behind as they go and fsynced at the end (Writeback); `progress` hears base + bytes so far."""
    n = 0
    with open(src, "rb", buffering=0) as f:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        wb = Writeback(fd)
        try:
            while got := step(f, fd):
                n += got
                wb.wrote(n)
                progress(base + n)
            wb.finish()
        finally:
            wb.join()
            os.close(fd)
    return n
