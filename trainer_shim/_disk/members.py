"""A checkpoint's member files on disk: each written hashed and fsynced into an uncommitted dir,
then committed with a manifest listing every rank's members (the commit: trainer_shim.rundir.commit)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from .. import rundir
from .._state.capture import Capture
from ..errors import CheckpointError
from .._session.messages import describe
from ..rundir import FileEntry, Manifest
from ..rundir.commit import HashingWriter

__all__ = ["write_member", "write_checkpoint", "commit_members", "manifest_of"]


def _torch_save(obj: Any, w: HashingWriter) -> None:
    try:
        torch.save(obj, w)
    except RuntimeError as e:
        # A failed write (ENOSPC, EIO) inside torch.save makes its zip writer's __exit__ raise
        # its own RuntimeError ("unexpected pos ..."), hiding the OSError: surface that, so a
        # full disk stays a failed save and never crashes training.
        if isinstance(e.__context__, OSError):
            raise e.__context__ from None
        raise


def write_member(tmp: Path, fname: str, obj: Any, progress: Callable[[int], None] = lambda n: None) -> tuple[int, str]:
    """Write one member into an uncommitted checkpoint dir; (size, digest). OSError on failure."""
    w = rundir.commit.write_new(Path(tmp) / fname, lambda w: _torch_save(obj, w), progress)
    return w.nbytes, w.digest()


def write_checkpoint(ckpt_root: Path, cap: Capture, *, meta: dict[str, Any],
                     progress: Callable[[int], None] = lambda n: None) -> tuple[Path, Manifest, int]:
    """Write `cap` (one process, no shards) into a draft of step-N in ckpt_root and commit it
    through the same commit as a Run's saves. For tools and benchmarks; a Run saves through
    `_disk.save`. Returns (committed dir, manifest, bytes); CheckpointError on failure (draft removed).
    """
    files: dict[str, tuple[int, str]] = {}
    with _storage_errors("write", ckpt_root), rundir.commit.Draft.open(ckpt_root, rundir.checkpoint_name(cap.global_step)) as draft:
        for fname, obj in cap.files.items():
            base = sum(size for size, _ in files.values())
            files[fname] = write_member(draft.path, fname, obj, lambda n: progress(base + n))
        manifest = commit_members(draft, cap, files, meta=meta, world_size=1)
    return draft.final, manifest, sum(size for size, _ in files.values())


def commit_members(draft: rundir.commit.Draft, cap: Capture, files: dict[str, tuple[int, str]], *,
                   meta: dict[str, Any], world_size: int) -> Manifest:
    """Commit what every rank wrote into `draft` (rank 0): MANIFEST.json listing every rank's
    members, rename, repoint latest. Every listed file is checked (size) before the manifest is
    written, so a checkpoint missing any rank's files is never committed. CheckpointError on failure
    (the draft removed)."""
    with _storage_errors("commit", draft.path), draft:
        for fname, (size, _d) in files.items():
            if (draft.path / fname).stat().st_size != size:
                raise CheckpointError(f"{draft.path / fname} has not the size its rank reported")
        entries = {f: FileEntry(size, dig) for f, (size, dig) in sorted(files.items())}
        manifest = manifest_of(cap, entries, meta, world_size)
        draft.commit(manifest.to_bytes(), repoint=manifest.exact)
    return manifest


@contextlib.contextmanager
def _storage_errors(verb: str, where: Path) -> Iterator[None]:
    """A storage failure is a CheckpointError naming it (the errno first)."""
    try:
        yield
    except OSError as e:
        raise CheckpointError(f"cannot {verb} {where}: {describe(e)}") from e


def manifest_of(cap: Capture, files: dict[str, FileEntry], meta: dict[str, Any], world_size: int = 1) -> Manifest:
    """The manifest of `cap` holding `files` (a disk checkpoint, or one rank's memory slot)."""
    return Manifest.create(files, step=cap.global_step, epoch=cap.epoch, batch_in_epoch=cap.batch_in_epoch,
                           kind=cap.kind, loss=cap.loss, meta=meta, exact=cap.exact, world_size=world_size,
                           sharded=cap.sharded)
