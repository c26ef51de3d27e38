"""Sharded model/optimizer state through torch.distributed.checkpoint (DCP), for FSDP2 and other DTensor state.

Every rank writes only its own shards (`__<rank>_<n>.distcp`) and rank 0 the global
`.metadata`, so a huge model never gathers on one rank and the ranks write in parallel.
DCP's load planner reads whatever slices the loading job's placements need, so the same
files load at another world size (reshard) or into a plain single-process model.
Replicated (DDP) state is de-duplicated by DCP and its writes spread over the ranks.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from .. import rundir
from ..rundir.commit import HashingWriter
from ..errors import CheckpointError
from ..rundir import FileEntry

__all__ = ["METADATA_FILE", "save", "load", "full_model_state"]

METADATA_FILE = ".metadata"
_MODEL, _OPTIM = "model", "optim"


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """Silence DCP's warning that it loads in a single process: outside a job that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is .*uninitialized")
        yield


def _state(model: Any, optimizer: Any) -> dict[str, Any]:
    # get_state_dict keeps each rank's local shards (no gather) and gives optimizer state
    # parameter-FQN keys, which is what makes it loadable under another sharding.
    if optimizer is None:
        return {_MODEL: get_model_state_dict(model)}
    msd, osd = get_state_dict(model, optimizer)
    return {_MODEL: msd, _OPTIM: osd}


def _storage_failure(e: CheckpointException) -> Exception:
    """The OSError behind a DCP failure (so ENOSPC stays a storage error), else a CheckpointError."""
    for rank, (exc, _tb) in sorted(e.failures.items()):
        cause: Optional[BaseException] = exc
        while cause is not None:
            if isinstance(cause, OSError):
                return cause
            cause = cause.__cause__ or cause.__context__
    first = next(iter(sorted(e.failures.items())), None)
    what = f"rank {first[0]}: {type(first[1][0]).__name__}: {first[1][0]}" if first else str(e)
    return CheckpointError(f"sharded (DCP) write failed: {what}")


class _HashingFileSystem(FileSystem):
    """DCP's file system, but every file it writes is hashed (and counted for progress) as it is written.

    Re-reading shards to hash them afterwards would double the I/O of a save whose shards no
    longer fit the page cache.
    """

    def __init__(self, progress: Callable[[int], None]) -> None:
        super().__init__()
        self.entries: dict[str, FileEntry] = {}
        self._progress = progress
        self._done = 0  # bytes of the files already closed

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        path = Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        base = self._done
        w = HashingWriter(fd, lambda n: self._progress(base + n))
        try:
            yield w
        finally:
            os.close(fd)
        self._done += w.nbytes
        self.entries[path.name] = FileEntry(w.nbytes, w.digest())

    def rename(self, path: Any, new_path: Any) -> None:  # .metadata is written as a temp file first
        super().rename(path, new_path)
        ent = self.entries.pop(Path(path).name, None)
        if ent is not None:
            self.entries[Path(new_path).name] = ent


def save(directory: Path, model: Any, optimizer: Any, *, rank: int, group: Any = None,
         progress: Callable[[int], None] = lambda n: None) -> tuple[dict[str, FileEntry], set[str]]:
    """Collective: write this rank's shards (and rank 0 the metadata) into `directory`.

    Returns (this rank's files with size and digest, every file the DCP metadata references),
    so the committing rank can refuse a set missing some rank's shards. Storage failures raise
    OSError/CheckpointError on every rank alike; a lost peer raises RuntimeError from the collective.
    """
    directory = Path(directory)
    writer = dcp.FileSystemWriter(str(directory))
    fs = _HashingFileSystem(progress)
    if isinstance(getattr(writer, "fs", None), FileSystem):  # else: hashed after the fact below
        writer.fs = fs
    # An optimizer without state yet (no step taken) is left out: get_state_dict would create its
    # state with a zero-lr step, and the run's first real step would then differ (Adam's count).
    if optimizer is not None and not optimizer.state:
        optimizer = None
    try:
        md = dcp.save(_state(model, optimizer), storage_writer=writer, process_group=group, no_dist=group is None)
    except CheckpointException as e:
        raise _storage_failure(e) from None
    mine = re.compile(rf"^__{rank}_\d+\.distcp$")
    names = [n for n in os.listdir(directory) if mine.match(n)]
    if rank == 0:
        names.append(METADATA_FILE)
    files = {}
    for n in sorted(names):
        fp = directory / n
        ent = fs.entries.get(n)
        if ent is None or ent.size != fp.stat().st_size:  # a DCP that bypassed our file system
            os.chmod(fp, 0o600)  # owner-only, like the shim's own files
            ent = FileEntry(fp.stat().st_size, rundir.digest_file(fp))
        files[n] = ent
    referenced = {info.relative_path for info in md.storage_data.values()} | {METADATA_FILE}
    return files, referenced


def load(directory: Path, model: Any, optimizer: Any, *, group: Any = None) -> None:
    """Collective: load the DCP set in `directory` into `model` (and `optimizer`) in place, resharding as needed."""
    reader = dcp.FileSystemReader(str(directory))
    try:
        keys = reader.read_metadata().state_dict_metadata
    except (OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"sharded (DCP) metadata unreadable: {e}") from None
    if not any(k.startswith(_OPTIM + ".") for k in keys):
        optimizer = None  # saved before the optimizer's first step: it had no state to restore
    sd = _state(model, optimizer)
    try:
        with _single_process_quiet():
            dcp.load(sd, storage_reader=reader, process_group=group, no_dist=group is None)
    except CheckpointException as e:
        err = _storage_failure(e)
        raise CheckpointError(f"sharded (DCP) load failed: {err}") from None
    if optimizer is None:
        set_model_state_dict(model, sd[_MODEL])
    else:
        set_state_dict(model, optimizer, model_state_dict=sd[_MODEL], optim_state_dict=sd[_OPTIM])


def full_model_state(directory: Path) -> dict[str, Any]:
    """The whole model state dict of a DCP set, loaded in this one process (for inference or export)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    try:
        with _single_process_quiet():
            return _load_state_dict_from_keys({_MODEL}, checkpoint_id=str(directory))[_MODEL]
    except CheckpointException as e:
        raise CheckpointError(f"sharded (DCP) load failed: {_storage_failure(e)}") from None
