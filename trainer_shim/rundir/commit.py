"""The one commit protocol of a checkpoint dir, torch-free, for every writer.

A checkpoint is written into `<root>/.tmp-<name>/` (invisible to selection), every member fsynced
and hashed into a manifest entry, MANIFEST.json written LAST (its presence is what makes the dir
a checkpoint), the dir fsynced, renamed to `<name>` atomically and the parent fsynced; `latest`
is repointed for resumable checkpoints. A dir that a framework has already named (a HF Trainer's
`checkpoint-N/`) is committed in place: its manifest goes in by temp file and rename.

`Draft` drives the protocol for every writer of a checkpoint dir (the raw loop's saves, a memory
slot's persist, the framework callbacks, the mirror's download): it owns the temporary dir, removes
it when anything fails, and commits it. `HashingWriter` is the one chunked write loop: members a
writer serialises and members copied from elsewhere are hashed, counted and flushed by it alike.

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
from typing import Any, BinaryIO, Optional

from .atomic import atomic_write_bytes, exchange, fsync_dir
from .errors import InvalidCheckpoint
from .layout import LATEST, RUN_DIR_MODE, TMP_PREFIX
from .manifest import MANIFEST_NAME, FileEntry, digest_file, new_hasher, read_pieces

__all__ = ["Draft", "HashingWriter", "Writeback", "WRITEBACK_EVERY", "tmp_dir", "fresh_tmp_dir", "hash_tree", "commit_dir", "commit_in_place",
           "copy_member", "copy_verified", "write_new", "discard", "repoint_latest"]

# Writes are split so progress (the heartbeat's save_bytes) advances visibly during huge tensors.
_CHUNK = 16 << 20
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


# Write-back while writing: Write-back while writing: a checkpoint file is flushed to disk in the background as it grows.
#
# A verified save (or a copy of a member: a memory snapshot persisted, a mirror download) ends with
# fsync, which on its own waits for every byte written. Here, each time another WRITEBACK_EVERY
# bytes have been written, a thread calls fdatasync on the file (it releases the GIL), so the disk
# works while the writer keeps serialising, hashing or copying; the final fsync only waits for the tail. Durability is unchanged (the final fsync still comes before
# the manifest). An error of a background flush is kept and raised by `finish()`: after a failed
# fsync, Linux may not report the same lost write to a later one.
WRITEBACK_EVERY = 64 << 20


class Writeback:
    """Background flushes of one open fd; `wrote(n)` after each write, `finish()` instead of fsync."""

    def __init__(self, fd: int, every: int = WRITEBACK_EVERY) -> None:
        self.fd = fd
        self.every = every
        self._flushed_at = 0
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[OSError] = None

    def wrote(self, total: int) -> None:
        """`total` bytes are written so far: start a flush when enough is new and none is running."""
        if total - self._flushed_at < self.every or (self._thread is not None and self._thread.is_alive()):
            return
        self._flushed_at = total
        self._thread = threading.Thread(target=self._flush, name="trainer_shim-writeback", daemon=True)
        self._thread.start()

    def _flush(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as e:
            self._error = self._error or e

    def join(self) -> None:
        """Wait for the flush in flight: before the fd is closed (it could be reused), whatever happened."""
        if self._thread is not None:
            self._thread.join()

    def finish(self) -> None:
        """Wait for the flush in flight, then fsync the file; OSError if any flush failed."""
        self.join()
        if self._error is not None:
            raise self._error
        os.fsync(self.fd)


class Draft:
    """Checkpoint `name` of `root` on its way in: written into its temporary dir (`path`), then
    committed (MANIFEST.json last, renamed to `final`) or removed. `Draft.open` makes the temporary
    dir fresh; `Draft(root, name)` stands for one another process opened (multi-rank: rank 0 opens,
    every rank writes, rank 0 commits). Leaving a `with` block without committing removes it."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = Path(root)
        self.name = name
        self.path = tmp_dir(self.root, name)
        self.final = self.root / name
        self.committed = False

    @classmethod
    def open(cls, root: Path, name: str) -> "Draft":
        """A fresh temporary dir for `name` (what a killed writer left there is removed); OSError if
        it cannot be made (nothing is left behind then)."""
        draft = cls(root, name)
        fresh_tmp_dir(draft.root, name)
        return draft

    def commit(self, manifest_bytes: bytes, *, repoint: bool) -> Path:
        """Make it a checkpoint (see commit_dir); on failure the temporary dir is removed and the
        error propagates. Returns the committed dir."""
        try:
            commit_dir(self.path, self.final, manifest_bytes, repoint=repoint)
        except BaseException:
            self.discard()
            raise
        self.committed = True
        return self.final

    def discard(self) -> None:
        """Remove the temporary dir and everything written into it."""
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> "Draft":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.committed:
            self.discard()


class HashingWriter:
    """A binary file object over an fd that hashes (unless `hashing` is off), counts, flushes in the
    background and reports every byte written: the one write loop of members, serialised by
    torch.save (`write`) or copied from another file (`copy_from`)."""

    def __init__(self, fd: int, progress: Optional[Progress] = None, *, hashing: bool = True) -> None:
        self.fd = fd
        self.hasher = new_hasher() if hashing else None
        self.nbytes = 0
        self._progress = progress
        self.writeback = Writeback(fd)

    def _advance(self, n: int) -> None:
        self.nbytes += n
        self.writeback.wrote(self.nbytes)
        if self._progress is not None:
            self._progress(self.nbytes)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        for start in range(0, total, _CHUNK):
            piece = view[start:start + _CHUNK]
            if self.hasher is not None:
                self.hasher.update(piece)
            n = len(piece)
            while piece:
                piece = piece[os.write(self.fd, piece):]
            self._advance(n)
        return total

    def copy_from(self, src: BinaryIO) -> None:
        """Append all of `src`: in the kernel (copy_file_range) when nothing is hashed, else read and
        hashed piece by piece."""
        if self.hasher is None:
            while True:
                got = os.copy_file_range(src.fileno(), self.fd, _CHUNK)
                if not got:
                    return
                self._advance(got)
        for piece in read_pieces(src, _CHUNK):
            self.write(piece)

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.nbytes  # the file was created empty and is only appended to

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        pass  # the fd belongs to whoever opened it

    def digest(self) -> str:
        assert self.hasher is not None
        return self.hasher.hexdigest()


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


def repoint_latest(ckpt_root: Path, name: str) -> None:
    """Atomically swap `latest` to `name` (relative target, so the run dir can be moved)."""
    tmp = ckpt_root / f"{TMP_PREFIX}latest-{os.getpid()}"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(name, tmp)
    os.replace(tmp, ckpt_root / LATEST)
    fsync_dir(ckpt_root)


def commit_in_place(directory: Path, manifest_bytes: bytes, *, latest_in: Optional[Path] = None) -> None:
    """Commit a dir a framework already named (a HF Trainer's checkpoint-N/): its MANIFEST.json by
    temp file, fsync, rename; `latest_in`: the checkpoints dir whose `latest` then names it."""
    atomic_write_bytes(directory / MANIFEST_NAME, manifest_bytes)
    if latest_in is not None:
        repoint_latest(Path(latest_in), os.path.relpath(directory, latest_in))


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
            return _copy(src, dst, False, progress, base).nbytes
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            os.unlink(dst)   # a filesystem without copy_file_range: copied through user space
    w = _copy(src, dst, True, progress, base)
    if want is not None and w.digest() != want:
        raise InvalidCheckpoint(src.parent, f"{src.name} digest mismatch (changed in memory?)")
    return w.nbytes


def copy_member(src: Path, dst: Path, progress: Progress = lambda n: None) -> int:
    """Copy one member into a new file, fsynced (in the kernel where it can); the caller knows its digest."""
    return copy_verified(src, dst, None, progress)


def write_new(path: Path, body: Callable[[HashingWriter], object], progress: Optional[Progress] = None,
              hashing: bool = True) -> HashingWriter:
    """Create `path` (it must not exist), let `body` write it through a HashingWriter, fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        w = HashingWriter(fd, progress, hashing=hashing)
        try:
            body(w)
            w.writeback.finish()   # the fsync, mostly done in the background while body wrote
        finally:
            w.writeback.join()
    finally:
        os.close(fd)
    return w


def _copy(src: Path, dst: Path, hashing: bool, progress: Progress, base: int) -> HashingWriter:
    with open(src, "rb", buffering=0) as f:
        return write_new(dst, lambda w: w.copy_from(f), lambda n: progress(base + n), hashing)
