"""trainer_shim: heartbeats, atomic verified checkpoints and bit-exact resume for a training script.

`import trainer_shim` stays torch-free (the supervisor imports `trainer_shim.rundir`); the
torch-using API is loaded on first use of `init`, `load` or `Run`. One module per idea:

contract        rundir/      the run-dir contract both sides import (torch-free): layout, env, records,
                             events, manifest, selection of the newest valid checkpoint, step marks
the API         run          `init()` -> Run: a facade over the modules below; options (init's keywords)
                engine       the collaborators saving/restoring/async saves share (Engine, Reporter, say)
                hooks        signals (stop flag, stack dumps, fork tie) + excepthook, install/uninstall
                heartbeat    the heartbeat file, written by a background thread
                cursor, data the data cursor: epochs/batches, mid-epoch resume by index; rng: every RNG
saving          saving       ONE commit protocol for 1..N ranks (decide -> write -> manifest -> rename)
                checkpoint   member I/O: hashed, fsynced writes; safe weights_only reads
                retention    index upkeep, rotation (policy in rotation), background deletion
                async_save, memory_snapshot, snapshot_store   async saves and /dev/shm snapshots
                save_interval  save_every_seconds="auto" (Young/Daly)
restoring       restoring    ONE restore loop for 1..N ranks, with fallback on rejection; loading: load()
                provenance   git/args of a checkpoint and --strict-resume; resume_prompt: resume="ask"
                distributed  Solo (a world of one) and Dist: the same collectives; sharded: DCP (FSDP2)
insight         probe        doctor-mode digests, the "state changed after run.step()" warning
                divergence   on_nonfinite: a NaN loss ends the attempt before it is saved
launchers       standby, warm   a prestarted torchrun / a warm interpreter for the next attempt
frameworks      integrations/   HF Trainer and Lightning callbacks on the same machinery
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import rundir
from .errors import CheckpointError, ConfigError, ShimError

# What a training script relies on; every other module is the engine's inside (no stability promise).
__all__ = ["init", "load", "Run", "LoadResult", "ShimError", "CheckpointError", "ConfigError", "rundir"]

if TYPE_CHECKING:  # pragma: no cover
    from .loading import LoadResult
    from .run import Run, init, load

_LAZY = {"init": "run", "load": "run", "Run": "run", "LoadResult": "loading"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'trainer_shim' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value
