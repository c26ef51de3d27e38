"""What a save captures: the model, optimizer, scheduler, scaler, extras, RNG and data position of
one training process at one step, on the CPU, keyed by the member file it goes into.

The capture is synchronous: `to_cpu()` copies device tensors but only *references* CPU tensors,
so whoever writes a capture must finish before training mutates them again (the memory slots copy
them into their own buffers first: trainer_shim._memory.slots).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

import torch

from . import data, rng
from .. import rundir
from ..rundir import CheckpointKind

if TYPE_CHECKING:  # pragma: no cover
    from .._session.engine import Trained

__all__ = ["Capture", "capture", "map_leaves", "to_cpu", "check_plain", "rank_file",
           "sharded_module"]


@dataclasses.dataclass
class Capture:
    """Everything one checkpoint holds, already on CPU, keyed by the file it goes into."""

    files: dict[str, Any]
    global_step: int
    epoch: int
    batch_in_epoch: int
    kind: CheckpointKind
    loss: Optional[float]
    exact: bool = True
    sharded: bool = False  # model/optimizer go through DCP (sharded.save), not into `files`
    background: bool = False  # committed by the async writer thread (its failures say so)



def map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """`obj` with `fn` applied to every leaf of its dicts, lists and tuples; the one walk over a state.

    A rebuilt dict keeps the `_metadata` that `load_state_dict` consults (module versions)."""
    if isinstance(obj, dict):
        new = type(obj)((k, map_leaves(v, fn)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            new._metadata = obj._metadata  # type: ignore[attr-defined]
        return new
    if isinstance(obj, list):
        return [map_leaves(v, fn) for v in obj]
    if isinstance(obj, tuple):
        return tuple(map_leaves(v, fn) for v in obj)
    return fn(obj)


def _cpu_leaf(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True) if obj.device.type != "cpu" else obj.detach()
    return obj


def to_cpu(obj: Any) -> Any:
    """Copy device tensors to CPU (they may change under an async GPU stream); CPU ones by reference."""
    return map_leaves(obj, _cpu_leaf)



_PLAIN = (int, float, str, bool, type(None))


def check_plain(obj: Any, where: str) -> Any:
    """Return `obj` made weights_only-loadable (NumPy scalars/arrays converted) or raise TypeError."""
    if isinstance(obj, _PLAIN) or isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, dict):
        return {k: check_plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, list):
        return [check_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(check_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    mod = type(obj).__module__
    if mod == "numpy":
        import numpy as np

        if isinstance(obj, np.ndarray):
            return torch.from_numpy(obj.copy())
        if isinstance(obj, np.generic):
            return obj.item()
    raise TypeError(f"{where} holds a {type(obj).__qualname__}; run.state takes numbers, strings, "
                    "None, lists/dicts of them and tensors")


def rank_file(rank: int) -> str:
    """The per-rank member of a multi-rank checkpoint (that rank's trainer state, RNG, data position)."""
    return f"rank-{rank}.pt"


def big_members(run: Trained) -> dict[str, Any]:
    """The model and optimizer state dicts this rank saves, their tensors where they live (not
    copied: what a memory snapshot slot needs is measured on them before any copy exists)."""
    out: dict[str, Any] = {}
    # Multi-rank: DDP replicas are identical, so each is written once, and by different ranks
    # (model: rank 0, optimizer: the last rank) so the two biggest members are written in
    # parallel. Sharded: every rank's shards go through DCP in the write itself.
    single = run.engine.group.world_size == 1
    if run.model is not None and not run.sharded and (single or run.rank == 0):
        out[rundir.MODEL_FILE] = run.model.state_dict()
    if run.optimizer is not None and not run.sharded and (single or run.rank == run.world_size - 1):
        out[rundir.OPTIMIZER_FILE] = run.optimizer.state_dict()
    return out


def capture(run: Trained, kind: CheckpointKind, exact: bool) -> Capture:
    """Collect state (CPU tensors by reference, device tensors copied); the write is synchronous."""
    files: dict[str, Any] = {name: to_cpu(state) for name, state in big_members(run).items()}
    stream = run.engine.stream.loader  # kept across epochs: a stateful loader's state matters at epoch ends too
    trainer = {
        "format": rundir.FORMAT_VERSION,
        "global_step": run.global_step, "epoch": run.epoch, "batch_in_epoch": run.batch_in_epoch,
        "loss": run.loss,
        "scheduler": run.scheduler.state_dict() if run.scheduler is not None else None,
        "scaler": run.scaler.state_dict() if run.scaler is not None else None,
        "extra": {k: v.state_dict() for k, v in run.extra.items() if v is not None},
        "state": check_plain(run.state, "run.state"),
        "rng": rng.capture(),
        "epoch_rng": run.engine.stream.epoch_rng if run.batch_in_epoch > 0 else None,
        "loader_state": stream.state_dict() if stream is not None and data.is_stateful(stream) else None,
    }
    files[rundir.TRAINER_FILE if run.engine.group.world_size == 1 else rank_file(run.rank)] = to_cpu(trainer)
    return Capture(files, run.global_step, run.epoch, run.batch_in_epoch, kind, run.loss, exact,
                         sharded=run.sharded)


def sharded_module() -> Any:
    """The DCP module, imported on first use (it costs ~0.6 s and only sharded runs need it)."""
    from . import sharded

    return sharded
