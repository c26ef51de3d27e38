"""trainer_shim: heartbeats, atomic verified checkpoints and bit-exact resume for a training script.

`import trainer_shim` stays torch-free (the supervisor imports `trainer_shim.rundir`); the
torch-using API is loaded on first use of `init`, `load` or `Run`.

Where things live (one room per idea; each room's __init__ maps its modules);
rooms named `_x` are internal: a script relies only on `__all__`:

    integrations/  HF Trainer and Lightning callbacks over the same engine
    rundir/        the run-dir contract both sides import (torch-free): paths, env, records, events
    _loop/         the API a training loop calls: init() -> Run, its options, the resumed epoch iterator
                     cursor, options, resume_prompt, run
    _engine/       the checkpoint engine: the state it captures, commit, save, restore, retention
                     async_save, checkpoint, data, engine, loading, memory_snapshot, raw_read,
                     raw_tensors, restoring, retention, rng, rotation, saving, sharded, slot_maps,
                     slot_restore, snapshot_store
    _process/      the process around the loop: heartbeats, signals, hooks, collectives
                     distributed, heartbeat, hooks, messages, signals
    _policies/     judgements on a running job: divergence, provenance, when to save
                     divergence, memory_interval, provenance, save_interval, save_time
    _insight/      looking inside: doctor-mode probes, checkpoint export
                     export, probe
    _launch/       launchers the supervisor prestarts: a waiting torchrun, a warm interpreter
                     standby, warm
    _attach/       auto-attach: the bootstrap dir the supervisor puts first on a job's PYTHONPATH
                     sitecustomize
    errors         ShimError and its families: every exception a user may catch
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import rundir
from .errors import CheckpointError, ConfigError, ShimError

# What a training script relies on; every other module is the engine's inside (no stability promise).
__all__ = ["init", "load", "Run", "LoadResult", "ShimError", "CheckpointError", "ConfigError", "rundir"]

if TYPE_CHECKING:  # pragma: no cover
    from ._engine.loading import LoadResult
    from ._loop.run import Run, init, load

_LAZY = {"init": "_loop.run", "load": "_loop.run", "Run": "_loop.run", "LoadResult": "_engine.loading"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'trainer_shim' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value
