"""A plain `.pt` member restored straight into the live tensors it belongs to: one copy, not two.

`torch.load` reads every tensor into fresh memory (each page faulted in and zeroed, then filled),
and `load_state_dict` copies it once more into the model. When the live state dict the restore
fills has exactly the member's containers, keys, shapes and dtypes (a run restoring its own
checkpoint), the member is mapped instead (`torch.load(mmap=True)`: its tensors read the page
cache) and each tensor is copied once, into its live counterpart; `load_state_dict` then has
nothing left to do, or only the other leaves to apply (an optimizer's scheduled lr). Measured on
a 256 MB model (bench/bench_shim.py): docs/explanation/benchmarks.md, "Disk save and restore".

The rules that keep this safe:
- the member's digest is checked before anything is copied (a copy into the model cannot be
  undone), by the caller (checkpoint.read_checkpoint);
- nothing returned aliases the file: where the structures differ, every tensor is cloned out of
  the mapping and `load_state_dict` reports the difference as before (a tensor mapping a deleted
  checkpoint would pin its disk space for the life of the process);
- only the zip format can be mapped; anything else (a legacy pickle) is read the usual way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

__all__ = ["wanted", "fill"]

_ZIP_MAGIC = b"PK\x03\x04"


def _fillable(t: Any) -> bool:
    """A live tensor a plain copy_ can fill (what raw_read fills too): CPU, strided, no autograd."""
    return (isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout == torch.strided
            and not t.requires_grad)


def _has_fillable(obj: Any) -> bool:
    if isinstance(obj, dict):
        return any(_has_fillable(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_fillable(v) for v in obj)
    return _fillable(obj)


def wanted(path: Path, live: Any) -> bool:
    """Map `path` rather than read it: the live state has tensors to fill and the file is a zip."""
    if live is None or not _has_fillable(live):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == _ZIP_MAGIC
    except OSError:
        return False


def _pair(got: Any, live: Any, out: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[bool, bool]:
    """Collect (mapped, live) tensor pairs. (fits, same): fits when `got` and `live` have the same
    containers and keys and every tensor a live one of its shape and dtype; same when, besides,
    every other leaf is equal (an optimizer's param_groups usually differ: lr, betas as scheduled)."""
    if isinstance(got, torch.Tensor):
        out.append((got, live))
        fits = _fillable(live) and live.shape == got.shape and live.dtype == got.dtype and got.layout == torch.strided
        return fits, fits
    if isinstance(got, dict):
        if not isinstance(live, dict) or got.keys() != live.keys():
            return False, False
        kids = [_pair(v, live[k], out) for k, v in got.items()]
    elif isinstance(got, (list, tuple)):
        if type(live) is not type(got) or len(live) != len(got):
            return False, False
        kids = [_pair(v, lv, out) for v, lv in zip(got, live)]
    else:
        try:
            return True, type(got) is type(live) and bool(got == live)
        except Exception:  # a leaf whose == is not a truth value: not provably the same
            return True, False
    return all(f for f, _ in kids), all(s for _, s in kids)


def fill(mapped: Any, live: Any) -> Optional[tuple[bool, dict[int, torch.Tensor]]]:
    """Copy the mapped member's tensors into `live`'s when their structures fit: (same, live_for)
    where same says nothing else differs (`live` is the restored state) and live_for maps id() of
    each mapped tensor to the live one now holding its values (where other leaves differ, the
    member with those substituted goes to load_state_dict). None when they do not fit: nothing was
    touched, and the caller clones the member out of the mapping for load_state_dict to judge."""
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    fits, same = _pair(mapped, live, pairs)
    if not fits:
        return None
    with torch.no_grad():
        for src, dst in pairs:
            dst.copy_(src)
    return same, {id(src): dst for src, dst in pairs}
