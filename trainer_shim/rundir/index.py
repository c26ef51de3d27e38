"""checkpoint_metadata.json: the shim's index of committed checkpoints, for listing and fallback dirs.

Shape: {"<checkpoint dir name>": {"epoch", "global_step", "loss", "timestamp" (ISO 8601),
"is_best", "kind", "dir" (absolute dir; differs from the run dir's own for fallback saves)}}.
The index is a convenience: selection trusts the checkpoint dirs themselves, never the index.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .atomic import atomic_write_json, read_json
from .errors import ContractError
from .frameworks import read_extra_roots
from .layout import RunDir
from .manifest import CheckpointKind, Manifest
from .rotation import Entry, best_names

__all__ = ["index_entry", "read_index", "write_index", "add_to_index", "checkpoint_roots"]


def index_entry(manifest: Manifest, *, is_best: bool, directory: Path) -> dict:
    return {
        "epoch": manifest.epoch, "global_step": manifest.global_step, "loss": manifest.loss,
        "timestamp": manifest.created_at, "is_best": is_best, "kind": manifest.kind.value,
        "dir": str(directory),
    }


def read_index(run_dir: RunDir) -> dict:
    try:
        idx = read_json(run_dir.index)
    except ContractError:
        return {}
    return idx if isinstance(idx, dict) else {}


def write_index(run_dir: RunDir, idx: dict, keep_best: int = 1) -> None:
    """The one writer of the index: `is_best` marks the `keep_best` of lowest loss (the rotation
    policy's rule); OSError/TypeError/ValueError propagate (the caller decides how much it matters)."""
    idx = {n: e for n, e in idx.items() if isinstance(e, dict)}  # drop foreign junk
    entries = []
    for n, e in idx.items():
        try:
            kind = CheckpointKind(e.get("kind", "step"))
        except ValueError:
            kind = CheckpointKind.STEP
        loss = e.get("loss") if isinstance(e.get("loss"), (int, float)) else None
        entries.append(Entry(n, int(e.get("global_step") or 0), kind, loss, kind is not CheckpointKind.EMERGENCY))
    best = best_names(entries, keep_best)
    for n in idx:
        idx[n]["is_best"] = n in best
    # Not fsynced while it names only the run dir's own checkpoints: selection trusts the dirs,
    # never the index, and a lost update costs nothing (~4 fsyncs off every save). It must
    # survive a power cut once it names a fallback dir: that is how checkpoint_roots finds it.
    own = str(run_dir.checkpoints)
    durable = any(os.path.dirname(str(e.get("dir", ""))) != own for e in idx.values())
    atomic_write_json(run_dir.index, idx, durable=durable)


def add_to_index(run_dir: RunDir, path: Path, manifest: Manifest, keep_best: int = 1) -> None:
    """Record a committed checkpoint in the index (rotation is the next save's business)."""
    idx = read_index(run_dir)
    idx[path.name] = index_entry(manifest, is_best=False, directory=path)
    write_index(run_dir, idx, keep_best)


def checkpoint_roots(run_dir: RunDir, extra: Iterable[Path] = ()) -> list[Path]:
    """Checkpoints dirs to search: the run dir's own first, then fallback dirs the index names.

    Dirs are compared by their real path: the index records absolute dirs, and a run dir given
    relatively (`resilient-run checkpoints runs/demo`) must not list its own checkpoints twice.
    """
    roots: list[Path] = []
    seen: set[str] = set()
    index_dirs = (entry.get("dir") if isinstance(entry, dict) else None for entry in read_index(run_dir).values())
    fallbacks = [Path(d).parent for d in index_dirs if isinstance(d, str) and d]
    # ... and the dirs a framework integration recorded (a HF Trainer's output_dir).
    for p in (run_dir.checkpoints, *map(Path, extra), *fallbacks, *read_extra_roots(run_dir)):
        key = os.path.realpath(p)
        if key not in seen:
            seen.add(key)
            roots.append(p)
    return roots
