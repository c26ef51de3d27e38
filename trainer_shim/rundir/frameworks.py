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

__all__ = ["AUTO_INTERVAL", "DEFAULT_MTBF_HOURS", "HF_PREFIX", "parse_hf_checkpoint_name", "hf_checkpoint_name", "ROOTS_FILE", "roots_file",
           "read_extra_roots", "record_extra_root", "LIGHTNING_CKPT", "ATTACH_DIR", "CALLBACK_OPTIONS",
           "parse_callback_options"]

HF_PREFIX = "checkpoint-"
_HF_RE = re.compile(r"^checkpoint-(\d+)$")

# RUN_DIR/checkpoint_roots.json: {"roots": ["/abs/dir", ...]} — extra dirs holding checkpoint
# dirs (a Trainer's output_dir); written by the integration, read by both sides.
ROOTS_FILE = "checkpoint_roots.json"

# The one member of a Lightning checkpoint dir (Lightning's own checkpoint file).
LIGHTNING_CKPT = "lightning.ckpt"


# Auto-attach: the directory the supervisor prepends to a job's PYTHONPATH. Its sitecustomize
# makes every Python process of the job give its HF / Lightning Trainer the callback (the shim's
# _attach package; found from here because the supervisor may import only this contract).
ATTACH_DIR = Path(__file__).resolve().parents[1] / "_attach"

# The options of both framework callbacks (trainer_shim.integrations: the same keywords for the HF
# and the Lightning one) and of an auto-attached one (the config's `callback:` mapping), with their
# types; save_every_seconds also takes "auto" (Young/Daly).
CALLBACK_OPTIONS: dict[str, type] = {"save_every_steps": int, "save_every_seconds": float, "keep_last": int,
                                     "save_on_train_end": bool, "heartbeat_interval": float, "async_save": bool}
AUTO_INTERVAL = "auto"
# The "auto" intervals' prior mean time between failures, before a run dir has a history.
DEFAULT_MTBF_HOURS = 24.0


def parse_callback_options(value: object) -> tuple[tuple[str, object], ...]:
    """A mapping of callback options -> sorted (name, value) pairs; ValueError (one line) otherwise."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of {', '.join(CALLBACK_OPTIONS)}, got {value!r}")
    out = []
    for name, v in value.items():
        want = CALLBACK_OPTIONS.get(str(name))
        if want is None:
            raise ValueError(f"unknown callback option {name!r}; known: {', '.join(CALLBACK_OPTIONS)}")
        if name == "save_every_seconds" and v == AUTO_INTERVAL:
            out.append((str(name), v))
            continue
        ok = isinstance(v, bool) if want is bool else (
            isinstance(v, (int, float)) and not isinstance(v, bool) and (want is float or float(v).is_integer()))
        if not ok or (want is not bool and v <= 0):
            raise ValueError(f"callback option {name}: expected a positive {want.__name__}, got {v!r}")
        out.append((str(name), want(v)))
    return tuple(sorted(out))


def hf_checkpoint_name(step: int) -> str:
    return f"{HF_PREFIX}{step}"


def number_in(pattern: re.Pattern, name: str) -> Optional[int]:
    """The number `pattern`'s first group finds in a whole file name, None when it does not match."""
    m = pattern.match(name)
    return int(m.group(1)) if m else None


def parse_hf_checkpoint_name(name: str) -> Optional[int]:
    return number_in(_HF_RE, name)


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
