"""Checkpoint I/O: snapshot state to CPU, write it hashed and fsynced, commit atomically, read it safely.

The save is synchronous: `snapshot()` copies GPU tensors to CPU but only *references* CPU
tensors, so the write must finish before training mutates them again. An async writer would
have to clone CPU tensors in `snapshot()` first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import torch

from . import mapped_load, raw_read, raw_tensors
from ..rundir.writeback import Writeback
from .. import rundir
from ..errors import CheckpointError
from ..rundir import MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE, CheckpointKind, FileEntry, Manifest

_CHUNK = 16 << 20  # writes are split so save_bytes advances visibly during huge tensors


class HashingWriter:
    """A minimal binary file object over an fd: every write() is hashed and counted as it goes."""

    def __init__(self, fd: int, progress: Optional[Callable[[int], None]] = None) -> None:
        self.fd = fd
        self.hasher = rundir.new_hasher()
        self.nbytes = 0
        self._progress = progress
        self.writeback = Writeback(fd)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        for start in range(0, total, _CHUNK):
            piece = view[start:start + _CHUNK]
            self.hasher.update(piece)
            while piece:
                n = os.write(self.fd, piece)
                piece = piece[n:]
            self.nbytes += min(_CHUNK, total - start)
            self.writeback.wrote(self.nbytes)
            if self._progress is not None:
                self._progress(self.nbytes)
        return total

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
        return self.hasher.hexdigest()


@dataclasses.dataclass
class Snapshot:
    """Everything one checkpoint holds, already on CPU, keyed by the file it goes into."""

    files: dict[str, Any]
    global_step: int
    epoch: int
    batch_in_epoch: int
    kind: CheckpointKind
    loss: Optional[float]
    exact: bool = True
    sharded: bool = False  # model/optimizer go through DCP (sharded.save), not into `files`
    background: bool = False  # committed by the async writer thread (its failures say so)


def map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """`obj` with `fn` applied to every leaf of its dicts, lists and tuples; the one walk over a state.

    A rebuilt dict keeps the `_metadata` that `load_state_dict` consults (module versions)."""
    if isinstance(obj, dict):
        new = type(obj)((k, map_leaves(v, fn)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            new._metadata = obj._metadata  # type: ignore[attr-defined]
        return new
    if isinstance(obj, list):
        return [map_leaves(v, fn) for v in obj]
    if isinstance(obj, tuple):
        return tuple(map_leaves(v, fn) for v in obj)
    return fn(obj)


def _cpu_leaf(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True) if obj.device.type != "cpu" else obj.detach()
    return obj


def to_cpu(obj: Any) -> Any:
    """Copy device tensors to CPU (they may change under an async GPU stream); CPU ones by reference."""
    return map_leaves(obj, _cpu_leaf)


_PLAIN = (int, float, str, bool, type(None))


def check_plain(obj: Any, where: str) -> Any:
    """Return `obj` made weights_only-loadable (NumPy scalars/arrays converted) or raise TypeError."""
    if isinstance(obj, _PLAIN) or isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, dict):
        return {k: check_plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, list):
        return [check_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(check_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    mod = type(obj).__module__
    if mod == "numpy":
        import numpy as np

        if isinstance(obj, np.ndarray):
            return torch.from_numpy(obj.copy())
        if isinstance(obj, np.generic):
            return obj.item()
    raise TypeError(f"{where} holds a {type(obj).__qualname__}; run.state takes numbers, strings, "
                    "None, lists/dicts of them and tensors")


def _write_file(path: Path, obj: Any, progress: Callable[[int], None]) -> FileEntry:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    w: Optional[HashingWriter] = None
    try:
        w = HashingWriter(fd, progress)
        try:
            torch.save(obj, w)
        except RuntimeError as e:
            # A failed write (ENOSPC, EIO) inside torch.save makes its zip writer's __exit__ raise
            # its own RuntimeError ("unexpected pos ..."), hiding the OSError: surface that, so a
            # full disk stays a failed save and never crashes training.
            if isinstance(e.__context__, OSError):
                raise e.__context__ from None
            raise
        w.writeback.finish()  # the fsync, mostly done in the background while torch.save wrote
    finally:
        if w is not None:
            w.writeback.join()
        os.close(fd)
    return FileEntry(w.nbytes, w.digest())


def write_checkpoint(ckpt_root: Path, snap: Snapshot, *, meta: dict[str, Any],
                     progress: Callable[[int], None] = lambda n: None) -> tuple[Path, Manifest, int]:
    """Write `snap` (one process, no shards) into ckpt_root/.tmp-step-N and commit it as step-N
    through the same commit as a Run's saves. For tools and benchmarks; a Run saves through
    `saving.save`. Returns (committed dir, manifest, bytes); CheckpointError on failure (tmp removed).
    """
    root = Path(ckpt_root)
    name = rundir.checkpoint_name(snap.global_step)
    tmp = rundir.commit.tmp_dir(root, name)
    files: dict[str, tuple[int, str]] = {}
    with _discarding(tmp, "write"):
        rundir.commit.fresh_tmp_dir(root, name)
        for fname, obj in snap.files.items():
            base = sum(size for size, _ in files.values())
            files[fname] = write_member(tmp, fname, obj, lambda n: progress(base + n))
    final, manifest = commit_members(root, tmp, snap, files, meta=meta, world_size=1)
    return final, manifest, sum(size for size, _ in files.values())


@contextlib.contextmanager
def _discarding(tmp: Path, verb: str) -> Iterator[None]:
    """A failed write or commit leaves no temporary dir; storage errors become CheckpointError."""
    try:
        yield
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise CheckpointError(f"cannot {verb} {tmp}: {describe_os_error(e)}") from e
        raise


def manifest_of(snap: Snapshot, files: dict[str, FileEntry], meta: dict[str, Any], world_size: int = 1) -> Manifest:
    """The manifest of `snap` holding `files` (a disk checkpoint, or one rank's memory slot)."""
    return Manifest.create(files, step=snap.global_step, epoch=snap.epoch, batch_in_epoch=snap.batch_in_epoch,
                           kind=snap.kind, loss=snap.loss, meta=meta, exact=snap.exact, world_size=world_size,
                           sharded=snap.sharded)


def describe_os_error(e: OSError) -> str:
    """`ENOSPC: No space left on device`: the errno name first, for people and for tests."""
    code = errno.errorcode.get(e.errno or 0, "")
    return f"{code + ': ' if code else ''}{e.strerror or e}"


def load_file(ckpt_dir: Path, fname: str, into: Any = None, mapped: bool = False) -> Any:
    """torch.load one member with weights_only=True; CheckpointError names file and reason.

    A split member (memory snapshot format: `<fname>.tensors` + `<fname>.table`) has its tensors
    verified and copied straight into the tensors at the same places in `into` (a live state
    dict); a `mapped` plain member (mapped_load.wanted) is mapped and copied into `into` when its
    structure is `into`'s (its digest must have been checked already). When that filled every one
    of them and nothing else differs, `into` itself is returned (the state is already applied),
    else the state with fresh tensors where needed.
    """
    path = Path(ckpt_dir) / fname
    if path.with_name(fname + rundir.TENSORS_SUFFIX).exists():
        split = _Split(path, into)
        return split.finish(raw_read.read([split.member])[0][0])
    obj = None
    if mapped:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # a filesystem that cannot map it is no reason to reject the checkpoint
            mapped = False
    if obj is None:
        obj = _torch_load(path)
    if mapped:
        filled = mapped_load.fill(obj, into)
        if filled is None:   # structures differ: every tensor cloned off the mapping
            return map_leaves(obj, lambda v: v.clone() if isinstance(v, torch.Tensor) else v)
        same, live_for = filled
        return into if same else map_leaves(obj, lambda v: live_for[id(v)] if isinstance(v, torch.Tensor) else v)
    return obj


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refusals are UnpicklingError; corrupt zips RuntimeError
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path.name}: torch.load(weights_only=True) refused it: {type(e).__name__}: {first}") from e


class _Split:
    """A split member about to be read: its skeleton, the live tensors its entries go to, its
    open region (raw_read.prepare); `finish` turns the tensors read into the member's state."""

    def __init__(self, path: Path, into: Any) -> None:
        self.skeleton, self.into, self.targets = _torch_load(path), into, {}
        self.same = raw_tensors.match(self.skeleton, into, self.targets)
        self.member = raw_read.prepare(path.with_name(path.name + rundir.TENSORS_SUFFIX), self.targets)

    def finish(self, tensors: list) -> Any:
        if self.into is not None and self.same and all(t is self.targets.get(i) for i, t in enumerate(tensors)):
            return self.into
        return fill_refs(self.skeleton, tensors)


def fill_refs(obj: Any, tensors: list) -> Any:
    """`obj` with every TENSOR_REF marker i replaced by tensors[i] (the inverse of memory_snapshot.split)."""
    def leaf(v: Any) -> Any:
        if isinstance(v, str) and v.startswith(rundir.TENSOR_REF):
            return tensors[int(v[len(rundir.TENSOR_REF):])]
        return v
    return map_leaves(obj, leaf)


def raw_covered(files: dict[str, FileEntry]) -> list[str]:
    """Members whose whole-file digest is worth computing: not the raw tensor regions, whose
    tensors are each verified against their (digest-checked) table while they are loaded."""
    def covered(n: str) -> bool:
        return n.endswith(rundir.TENSORS_SUFFIX) and n[:-len(rundir.TENSORS_SUFFIX)] + rundir.TABLE_SUFFIX in files
    return [n for n in files if not covered(n)]


def rank_file(rank: int) -> str:
    """The per-rank member of a multi-rank checkpoint (that rank's trainer state, RNG, data position)."""
    return f"rank-{rank}.pt"


def write_member(tmp: Path, fname: str, obj: Any, progress: Callable[[int], None] = lambda n: None) -> tuple[int, str]:
    """Write one member into an uncommitted checkpoint dir; (size, digest). OSError on failure."""
    ent = _write_file(Path(tmp) / fname, obj, progress)
    return ent.size, ent.xxh3_128


def commit_members(ckpt_root: Path, tmp: Path, snap: Snapshot, files: dict[str, tuple[int, str]], *,
                   meta: dict[str, Any], world_size: int) -> tuple[Path, Manifest]:
    """Multi-rank commit (rank 0): MANIFEST.json listing every rank's members, rename, repoint latest.

    Every listed file is checked (size) before the manifest is written, so a checkpoint
    missing any rank's files is never committed. CheckpointError on failure (tmp removed).
    """
    rd_ckpts = Path(ckpt_root)
    name = rundir.checkpoint_name(snap.global_step)
    final = rd_ckpts / name
    with _discarding(tmp, "commit"):
        for fname, (size, _d) in files.items():
            if (tmp / fname).stat().st_size != size:
                raise CheckpointError(f"{tmp / fname} has not the size its rank reported")
        entries = {f: FileEntry(size, dig) for f, (size, dig) in sorted(files.items())}
        manifest = manifest_of(snap, entries, meta, world_size)
        rundir.commit.commit_dir(tmp, final, manifest.to_bytes(), repoint=manifest.exact)
    return final, manifest


def read_checkpoint(ckpt_dir: Path, *, root: Optional[Path] = None, model_only: bool = False,
                    names: Optional[list[str]] = None, verify: bool = True,
                    into: Optional[dict[str, Any]] = None) -> tuple[rundir.CheckpointInfo, dict[str, Any]]:
    """Verify digests (unless the caller just did), then load every member (or `names`) safely,
    split members straight into `into[name]` (see load_file); CheckpointError with the reason.

    What torch.load turns into fresh objects is hashed in a background thread while it loads (the
    hash was a fifth of a disk restore), and nothing is returned before that hash agrees; what is
    copied into the live `into` tensors (a split member's skeleton and table, a mapped member) is
    verified first."""
    try:
        info = rundir.inspect_checkpoint(Path(ckpt_dir), root=root)
        files = info.manifest.files
        if names is not None:
            names = [n for n in names if n in files or n == names[-1]]
        else:
            # DCP members (sharded checkpoints) are read by sharded.load, not torch.load.
            names = [MODEL_FILE] if model_only else [f for f in files if f.endswith(".pt")]
        mapped = {n for n in names if n in files and not is_split(n, files)
                  and mapped_load.wanted(info.path / n, (into or {}).get(n))}
        # Verified before they are read: what is copied into the live `into` tensors (the copy
        # cannot be undone). The rest is hashed while torch.load reads it.
        split = {p for n in names if is_split(n, files) for p in (n, n + rundir.TABLE_SUFFIX)}
        first = (split | mapped) if verify else set()
        rundir.verify_members(info, sorted(first))
    except rundir.InvalidCheckpoint as e:
        raise CheckpointError(e.reason) from e
    missing = next((n for n in names if n not in files), None)
    if missing is not None:
        raise CheckpointError(f"{missing} is not in the manifest")
    into = into or {}
    splits: dict[str, _Split] = {}
    try:
        for n in names:  # skeletons first: then every split member's tensors are read in one pass
            if is_split(n, files):
                splits[n] = _Split(info.path / n, into.get(n))
        with _BackgroundDigests(info, [n for n in raw_covered(files) if n not in first] if verify else []):
            # The small plain members unpickle on this thread while the readers start on the tensors.
            tensors, plain = raw_read.read([s.member for s in splits.values()], lambda: {
                n: load_file(info.path, n, into.get(n), mapped=n in mapped) for n in names if n not in splits})
    except raw_read.LiveStateChanged:
        raise
    except CheckpointError as e:
        # A plain member refused after live tensors were filled: the caller must know they changed.
        if any(s.member.touched for s in splits.values()):
            raise raw_read.LiveStateChanged(str(e)) from e
        raise
    finally:
        for s in splits.values():
            s.member.close()
    done = {n: s.finish(t) for (n, s), t in zip(splits.items(), tensors)}
    return info, {n: done[n] if n in splits else plain[n] for n in names}


def is_split(fname: str, files: dict[str, FileEntry]) -> bool:
    """A memory-snapshot member: its tensors are copied into live state as they are read."""
    return fname + rundir.TENSORS_SUFFIX in files and fname + rundir.TABLE_SUFFIX in files


class _BackgroundDigests:
    """The whole-file digests of a checkpoint's members `names`, hashed in a thread while the body
    loads them; leaving the body waits for it and raises a digest that differs, in place of the
    body's own CheckpointError (a corrupt file can make torch.load fail too, with a vaguer reason).
    A thread that died unexpectedly verified nothing: that is an error too."""

    def __init__(self, info: rundir.CheckpointInfo, names: list[str]) -> None:
        self._info, self._names = info, names
        self._error: Optional[str] = "its digests could not be computed"
        self._thread = threading.Thread(target=self._run, name="trainer_shim-verify", daemon=True) if names else None

    def _run(self) -> None:
        try:
            rundir.verify_members(self._info, self._names)
            self._error = None
        except rundir.InvalidCheckpoint as e:
            self._error = e.reason

    def __enter__(self) -> "_BackgroundDigests":
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, exc_type: Optional[type], *exc: Any) -> None:
        if self._thread is None:
            return
        self._thread.join()
        if self._error is not None and (exc_type is None or issubclass(exc_type, CheckpointError)):
            raise CheckpointError(self._error)
