"""trainer_shim: heartbeats, atomic verified checkpoints and bit-exact resume for a training script.

`import trainer_shim` stays torch-free (the supervisor imports `trainer_shim.rundir`); the
torch-using API is loaded on first use of `init`, `load` or `Run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import rundir
from .errors import CheckpointError, ShimError

__all__ = ["init", "load", "Run", "ShimError", "CheckpointError", "rundir"]

if TYPE_CHECKING:  # pragma: no cover
    from .run import Run, init, load

_LAZY = {"init": "run", "load": "run", "Run": "run"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'trainer_shim' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value
