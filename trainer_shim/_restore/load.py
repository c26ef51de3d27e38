"""`load()`: verify and load a finished (or any) checkpoint outside a training run."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from .. import rundir
from ..errors import CheckpointError
from . import read
from .._state.capture import sharded_module

__all__ = ["LoadResult", "load"]


def _live_states(model: Any, optimizer: Any, files: dict[str, Any]) -> dict[str, Any]:
    """The state dicts a plain checkpoint's members may be copied straight into: such a member is
    verified whole before the copy. Not a memory snapshot's split member: its tensors are verified
    one by one as they land, and a bad one would leave the model partly overwritten; a restore can
    fall back to an older checkpoint then, a caller of load() would be left with that model."""
    live = {}
    for name, obj in ((rundir.MODEL_FILE, model), (rundir.OPTIMIZER_FILE, optimizer)):
        if obj is not None and not read.is_split(name, files):
            live[name] = obj.state_dict()
    return live


@dataclasses.dataclass
class LoadResult:
    """What `load()` found: the checkpoint, its manifest, and the model state dict."""

    path: Path
    manifest: rundir.Manifest
    model_state: dict
    missing_keys: list[str]
    unexpected_keys: list[str]


def load(path_or_run_dir: os.PathLike | str, model: Any = None, *, optimizer: Any = None,
         map_location: Any = "cpu", strict: bool = True) -> LoadResult:
    """Verify and safely load a checkpoint (a checkpoint dir, a checkpoints dir or a run dir) into `model`.

    When the checkpoint's model state has exactly the structure of `model`'s (CPU, map_location
    cpu), it is copied straight into the model's tensors and `model_state` is the model's own state
    dict; otherwise `model_state` holds fresh tensors, loaded into the model by load_state_dict."""
    p = Path(path_or_run_dir)
    if not (p / rundir.MANIFEST_NAME).exists():
        roots = [p / rundir.CHECKPOINTS] if (p / rundir.CHECKPOINTS).is_dir() else [p]
        info = rundir.newest_valid(roots)
        if info is None:
            raise CheckpointError(f"no valid checkpoint under {p}")
        p = info.path
    try:
        manifest = rundir.inspect_checkpoint(p).manifest
    except rundir.InvalidCheckpoint as e:
        raise CheckpointError(e.reason) from e
    on_cpu = map_location in (None, "cpu", torch.device("cpu"))
    live: dict[str, Any] = {}
    if manifest.sharded:  # a DCP set: load it in this one process (resharded to full tensors)
        info, _ = read.read_checkpoint(p, names=[])
        if model is not None and (optimizer is not None or strict):
            sharded_module().load(info.path, model, optimizer)
            return LoadResult(info.path, info.manifest, model.state_dict(), [], [])
        sd = sharded_module().full_model_state(info.path)
        files: dict[str, Any] = {}
    else:
        # As a restore does: members whose structure is the live state's are copied straight into
        # it (checkpoint.load_file), one copy instead of torch.load's and load_state_dict's.
        live = _live_states(model, optimizer, manifest.files) if on_cpu else {}
        info, files = read.read_checkpoint(p, model_only=optimizer is None, into=live)
        sd = files[rundir.MODEL_FILE]
    if not on_cpu:
        sd = {k: v.to(map_location) if isinstance(v, torch.Tensor) else v for k, v in sd.items()}
    missing: list[str] = []
    unexpected: list[str] = []
    if model is not None and sd is not live.get(rundir.MODEL_FILE):   # else: already in the model
        res = model.load_state_dict(sd, strict=strict)
        missing, unexpected = list(res.missing_keys), list(res.unexpected_keys)
    opt_sd = files.get(rundir.OPTIMIZER_FILE)
    if optimizer is not None and opt_sd is not None and opt_sd is not live.get(rundir.OPTIMIZER_FILE):
        optimizer.load_state_dict(opt_sd)
    return LoadResult(info.path, info.manifest, sd, missing, unexpected)
