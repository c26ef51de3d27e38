"""checkpoint_metadata.json: the shim's index of committed checkpoints, for listing and fallback dirs.

Shape: {"<checkpoint dir name>": {"epoch", "global_step", "loss", "timestamp" (ISO 8601),
"is_best", "kind", "dir" (absolute dir; differs from the run dir's own for fallback saves)}}.
The index is a convenience: selection trusts the checkpoint dirs themselves, never the index.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .atomic import read_json
from .errors import ContractError
from .frameworks import read_extra_roots
from .layout import RunDir
from .manifest import Manifest

__all__ = ["index_entry", "read_index", "checkpoint_roots"]


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
