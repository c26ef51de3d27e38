"""Warm restarts: what the supervisor, its warm interpreter (trainer_shim._launch.warm) and the trainer exchange.

* The ready file (`RunDir.warm_ready(n)`): the warm interpreter for attempt N writes it once its
  imports are done, naming the modules it imported besides torch and the shim; it removes it while
  it imports more. The supervisor reads it when it hands the interpreter its attempt
  (`attempt_started` `warm_ready` and `preloaded`).
* The frameworks record (`RunDir.frameworks`): at its first step a trainer records which of
  PRELOAD_FRAMEWORKS it has imported, with its parent's pid, and its grandparent's when its parent
  runs the same Python (a Python launcher: `swift sft` runs the trainer as its child). The warm
  interpreter waiting for the next attempt imports them too, but only when that parent or that
  grandparent is its own (the supervisor): then the trainer ran in the attempt's own process or as
  a Python launcher's child, which the warm attempt runs in its own process (`_launch.inline`). Below
  a shell or another program the child starts cold all the same: importing would only cost memory.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable
from pathlib import Path
from typing import Optional

from .atomic import atomic_write_json, read_json
from .errors import ContractError

__all__ = ["PRELOAD_FRAMEWORKS", "record_frameworks", "frameworks_of_child", "write_warm_ready", "read_warm_ready"]

# The expensive imports of auto-attached jobs (seconds each), the only names a record may ask a warm
# interpreter to import: a file in the run dir never names arbitrary code to run.
PRELOAD_FRAMEWORKS = ("transformers", "transformers.trainer", "lightning.pytorch", "pytorch_lightning")


def record_frameworks(path: Path, loaded: Container[str], pid: int, parent: int) -> None:
    """Record which of PRELOAD_FRAMEWORKS are in `loaded` (sys.modules). Never raises: this only
    speeds up the next restart. Nothing is written for a job that imports none and had no record."""
    modules = [m for m in PRELOAD_FRAMEWORKS if m in loaded]
    try:
        if modules or path.exists():
            atomic_write_json(path, {"modules": modules, "pid": pid, "parent": parent,
                                     "grandparent": _python_parent_of(parent, pid)}, durable=False)
    except OSError:
        pass


def _python_parent_of(parent: int, pid: int) -> Optional[int]:
    """The parent of `parent` when `parent` runs the same executable as `pid` (a Python launcher of the
    trainer); None otherwise or when /proc cannot tell."""
    try:
        if os.readlink(f"/proc/{parent}/exe") != os.readlink(f"/proc/{pid}/exe"):
            return None
        with open(f"/proc/{parent}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])  # after "pid (comm) state": ppid
    except (OSError, ValueError, IndexError):
        return None


def frameworks_of_child(path: Path, parent: int) -> tuple[str, ...]:
    """The frameworks recorded by a trainer whose parent, or Python launcher's parent, was `parent`; ()
    otherwise (also for a missing or bad record)."""
    try:
        d = read_json(path)
    except ContractError:
        return ()
    if not isinstance(d, dict) or parent not in (d.get("parent"), d.get("grandparent")) \
            or not isinstance(d.get("modules"), list):
        return ()
    return tuple(m for m in PRELOAD_FRAMEWORKS if m in d["modules"])


def write_warm_ready(path: Path, preloaded: Iterable[str]) -> None:
    atomic_write_json(path, {"preloaded": list(preloaded)}, durable=False)


def read_warm_ready(path: Path) -> Optional[tuple[str, ...]]:
    """The modules a ready warm interpreter imported besides torch; None while it is not ready."""
    try:
        d = read_json(path)
    except ContractError:
        return None
    mods = d.get("preloaded") if isinstance(d, dict) else None
    return tuple(str(m) for m in mods) if isinstance(mods, list) else ()
