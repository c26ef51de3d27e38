"""trainer_shim: heartbeats, atomic verified checkpoints and bit-exact resume for a training script.

`import trainer_shim` stays torch-free (the supervisor imports `trainer_shim.rundir`); the
torch-using API is loaded on first use of `init`, `load` or `Run`.

Where things live (one room per idea; each room's __init__ maps its modules; rooms named `_x` are
internal: a script relies only on `__all__`). The rooms are layered: each imports only rooms below it.

    integrations/  HF Trainer and Lightning callbacks over the same engine
    _launch/       launchers the supervisor prestarts: a waiting torchrun, a warm interpreter
    _loop/         the raw loop's API: init() -> Run, its options, the resumed epoch iterator
    _insight/      looking inside: doctor-mode probes, checkpoint export
    _memory/       memory snapshots and async saves (loaded only when switched on)
    _restore/      the one restore loop, restore from memory, the readers, load()
    _disk/         checkpoints on disk: member files, the save and its commit, retention
    _state/        what a save captures: model/optimizer/RNG/data position, sharded state
    _policies/     judgements on a running job: divergence, provenance, when to save
    _trackers/     TensorBoard, W&B and MLflow continued across restarts (loaded when a job imports one)
    _session/      one process's session: heartbeat, signals, hooks, collectives, the engine's bookkeeping
    _attach/       auto-attach: the bootstrap dir the supervisor puts first on a job's PYTHONPATH
    rundir/        the run-dir contract both sides import (torch-free): paths, env, records, events
    errors         ShimError and its families: every exception a user may catch
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import rundir  # noqa: F401  - importable as trainer_shim.rundir for tools; not part of __all__
from .errors import (
    CheckpointError, CollectiveTimeout, ConfigError, LiveStateChanged, ShimError, WorldSizeMismatch,
)

# What a training script relies on; every other module is the engine's inside (no stability promise).
__all__ = ["init", "load", "Run", "LoadResult", "ShimError", "CheckpointError", "ConfigError",
           "CollectiveTimeout", "WorldSizeMismatch", "LiveStateChanged"]

if TYPE_CHECKING:  # pragma: no cover
    from ._loop.run import Run, init
    from ._restore.load import LoadResult, load

_LAZY = {"init": "_loop.run", "Run": "_loop.run", "load": "_restore.load", "LoadResult": "_restore.load"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'trainer_shim' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value
