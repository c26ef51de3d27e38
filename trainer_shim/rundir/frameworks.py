"""Framework layouts: where HF Trainer and Lightning checkpoints live, and how both sides find them.

Framework checkpoints live where the framework puts them:
* HF Trainer: ``<output_dir>/checkpoint-<N>/`` (N = global step, no padding). The callback adds
  our MANIFEST.json to each one after the Trainer finished writing it. When output_dir is not
  the run dir, the callback records output_dir in ``RUN_DIR/checkpoint_roots.json`` so the
  supervisor, ``status`` and ``checkpoints`` search it too.
* Lightning: ``RUN_DIR/checkpoints/step-XXXXXXXX/lightning.ckpt`` (the native layout; one member).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Protocol

from .atomic import atomic_write_json, read_json
from .errors import ContractError



class _RunRoot(Protocol):
    """What this module needs of a layout.RunDir (layout imports this module: no import back)."""

    @property
    def root(self) -> Path: ...

__all__ = ["HF_PREFIX", "parse_hf_checkpoint_name", "hf_checkpoint_name", "ROOTS_FILE", "roots_file",
           "read_extra_roots", "record_extra_root", "LIGHTNING_CKPT"]

HF_PREFIX = "checkpoint-"
_HF_RE = re.compile(r"^checkpoint-(\d+)$")

# RUN_DIR/checkpoint_roots.json: {"roots": ["/abs/dir", ...]} — extra dirs holding checkpoint
# dirs (a Trainer's output_dir); written by the integration, read by both sides.
ROOTS_FILE = "checkpoint_roots.json"

# The one member of a Lightning checkpoint dir (Lightning's own checkpoint file).
LIGHTNING_CKPT = "lightning.ckpt"


def hf_checkpoint_name(step: int) -> str:
    return f"{HF_PREFIX}{step}"


def parse_hf_checkpoint_name(name: str) -> Optional[int]:
    m = _HF_RE.match(name)
    return int(m.group(1)) if m else None


def roots_file(rd: _RunRoot) -> Path:
    return rd.root / ROOTS_FILE


def read_extra_roots(rd: _RunRoot) -> list[Path]:
    """Extra checkpoint roots recorded in the run dir (never raises: a bad file lists nothing)."""
    try:
        d = read_json(roots_file(rd))
    except ContractError:
        return []
    roots = d.get("roots") if isinstance(d, dict) else None
    return [Path(r) for r in roots if isinstance(r, str) and r] if isinstance(roots, list) else []


def record_extra_root(rd: _RunRoot, root: Path) -> None:
    """Add `root` (absolute) to checkpoint_roots.json, atomically; a no-op when already there."""
    root = Path(os.path.abspath(root))
    have = read_extra_roots(rd)
    if root in have:
        return
    atomic_write_json(roots_file(rd), {"roots": [str(p) for p in [*have, root]]})
