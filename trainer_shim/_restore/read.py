"""Reading a checkpoint back: every member verified (digests hashed beside the load), loaded with
weights_only, split members (a memory snapshot's format) and mapped members copied straight into the
live tensors they belong to."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Optional

import torch

from .. import rundir
from . import mapped_load
from .._state.capture import map_leaves
from ..errors import CheckpointError, LiveStateChanged
from ..rundir import MODEL_FILE, FileEntry

__all__ = ["read_checkpoint", "load_file", "fill_refs", "raw_covered", "is_split"]


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
        from . import raw_read   # the memory snapshot format only: loaded when one is met

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
        from .._disk import raw_tensors
        from . import raw_read

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
            def plain_members() -> dict[str, Any]:
                return {n: load_file(info.path, n, into.get(n), mapped=n in mapped) for n in names if n not in splits}

            if splits:
                from . import raw_read

                tensors, plain = raw_read.read([s.member for s in splits.values()], plain_members)
            else:
                tensors, plain = [], plain_members()
    except LiveStateChanged:
        raise
    except CheckpointError as e:
        # A plain member refused after live tensors were filled: the caller must know they changed.
        if any(s.member.touched for s in splits.values()):
            raise LiveStateChanged(str(e)) from e
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
