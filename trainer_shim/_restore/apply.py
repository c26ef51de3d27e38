"""Applying one checkpoint: its members read (and verified), loaded into the model, optimizer,
scheduler, scaler, extras and RNGs, and where training stands returned as `Restored`.

The restore loop (`loop`) imports this module only when it has a candidate to try: a fresh start
reads no checkpoint.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from . import read
from .._policies import provenance
from .._state import capture, rng
from .. import rundir
from .._session.engine import Trained
from .._session.messages import say
from ..errors import CheckpointError, LiveStateChanged, WorldSizeMismatch
from ..rundir import Event

__all__ = ["Restored", "apply", "verify_share"]


@dataclasses.dataclass(frozen=True)
class Restored:
    """Where training stands after a restore, for the Run to take (the restore writes nothing into it)."""

    global_step: int
    epoch: int
    batch_in_epoch: int
    loss: Optional[float]
    state: dict
    resumed_from: str      # the checkpoint it stands for (a memory slot: the step-N it is persisted to)

    @property
    def checkpoint_step(self) -> int:
        return self.global_step


def verify_share(run: Trained, path: Path) -> Optional[str]:
    """Hash this rank's share of a multi-rank checkpoint's files (ranks split the work by size)."""
    def share(files: dict[str, rundir.FileEntry]) -> list[str]:
        load = [0] * run.world_size
        picked: list[str] = []
        for name in sorted(files, key=lambda n: (-files[n].size, n)):  # greedy: biggest to least loaded
            r = min(range(run.world_size), key=lambda i: (load[i], i))
            load[r] += files[name].size
            if r == run.rank:
                picked.append(name)
        return picked

    try:
        rundir.inspect_checkpoint(path, full=True, digest_only=share)
    except rundir.InvalidCheckpoint as e:
        return e.reason
    return None


def _refuse_world_size(run: Trained, m: rundir.Manifest) -> None:
    was, now = m.world_size, run.world_size
    if not m.sharded:
        raise WorldSizeMismatch(f"it was written by {was} rank(s), this run has {now}; only sharded (DCP) "
                                f"checkpoints can be resharded: run with {was} rank(s)")
    if not run.allow_reshard:
        raise WorldSizeMismatch(
            f"it was written by {was} rank(s), this run has {now}; its model and optimizer would reshard "
            f"exactly, but data order and per-rank RNG cannot continue a {was}-rank run bit-exactly: run "
            f"with {was} rank(s), or set {rundir.ENV_ALLOW_RESHARD}=1 to resume at {now}")


def _load_members(run: Trained, path: Path, verify: bool) -> tuple[rundir.CheckpointInfo, dict, bool]:
    """Read (and verify) this rank's members and load model, optimizer, scheduler, scaler, extras."""
    try:
        hm = rundir.inspect_checkpoint(path).manifest
    except rundir.InvalidCheckpoint as e:
        raise CheckpointError(e.reason) from e
    reshard = hm.world_size != run.world_size
    if reshard:
        _refuse_world_size(run, hm)
    if rundir.TRAINER_FILE in hm.files:  # written by one process
        mine = rundir.TRAINER_FILE
    else:  # per-rank state; a rank the old world did not have continues from rank 0's
        mine = capture.rank_file(run.rank if run.rank < hm.world_size else 0)
    names = [mine] if hm.sharded else [rundir.MODEL_FILE, rundir.OPTIMIZER_FILE, mine]
    # Live state dicts: a memory snapshot's tensors are copied straight into them (no unpickling).
    live = {} if hm.sharded else {
        rundir.MODEL_FILE: run.model.state_dict() if run.model is not None else None,
        rundir.OPTIMIZER_FILE: run.optimizer.state_dict() if run.optimizer is not None else None}
    info, files = read.read_checkpoint(path, names=names, verify=verify, into=live)
    tr = files.get(mine)
    if not isinstance(tr, dict) or "rng" not in tr:
        raise CheckpointError(f"{mine} lacks trainer state")
    if info.manifest.sharded:
        if run.model is None:
            raise CheckpointError("a sharded checkpoint needs init(model=...) to load into")
        run.engine.group.guard("sharded checkpoint load", capture.sharded_module().load, path, run.model, run.optimizer,
                         group=run.engine.group.group)
        run.engine.dirty = False  # DCP initialises a fresh optimizer's state with a zero-lr step
    elif run.model is not None:
        if rundir.MODEL_FILE not in files:
            raise CheckpointError(f"{rundir.MODEL_FILE} missing")
        if files[rundir.MODEL_FILE] is not live[rundir.MODEL_FILE]:  # else: already copied in place
            run.model.load_state_dict(files[rundir.MODEL_FILE])
    if run.optimizer is not None and rundir.OPTIMIZER_FILE in files:
        run.optimizer.load_state_dict(files[rundir.OPTIMIZER_FILE])
    for obj, key in ((run.scheduler, "scheduler"), (run.scaler, "scaler")):
        if obj is not None and tr.get(key) is not None:
            obj.load_state_dict(tr[key])
    for k, obj in run.extra.items():
        if obj is not None and k in (tr.get("extra") or {}):
            obj.load_state_dict(tr["extra"][k])
    return info, tr, reshard


def apply(run: Trained, path: Path, verify: bool) -> Restored:
    """Load `path` into the model, optimizer, scheduler, scaler, extras and RNGs; where training
    stands is returned, for the Run to take."""
    try:
        info, tr, reshard = _load_members(run, path, verify)
    except LiveStateChanged:
        run.engine.live_state_changed = True  # only a later complete load may clear this
        raise
    run.engine.live_state_changed = False  # every live tensor the failed load touched is overwritten now
    m = info.manifest
    # Resharded: each rank's share of an epoch changes with the world size; resume at the
    # same fraction of the epoch (the global sample count) in the new world's batches.
    k = m.batch_in_epoch * m.world_size // run.world_size if reshard else m.batch_in_epoch
    if run.rank >= m.world_size:  # a rank the old world lacked starts from rank 0's RNGs: make them its own
        tr = {**tr, "rng": rng.derive(tr["rng"], run.rank),
              "epoch_rng": rng.derive(tr["epoch_rng"], run.rank) if tr.get("epoch_rng") else None}
    rng.restore(tr["rng"])
    if k > 0 or tr.get("loader_state") is not None:
        run.engine.stream.resume = {"epoch": m.epoch, "batch_in_epoch": k, "epoch_rng": tr.get("epoch_rng"),
                              "step_rng": tr["rng"], "loader_state": tr.get("loader_state")}
    run.engine.last_size = sum(f.size for f in m.files.values())
    say(f"resumed from {info.path} (step {m.global_step}, epoch {m.epoch}, batch {k})"
         + ("" if m.exact else " [inexact emergency checkpoint]")
         + (f" [resharded from {m.world_size} to {run.world_size} rank(s): not bit-exact]" if reshard else ""))
    if reshard and run.rank == 0:
        run.engine.event(Event.CHECKPOINT_RESHARDED, path=str(info.path), from_world_size=m.world_size,
                   to_world_size=run.world_size, batch_in_epoch=k)
    provenance.check_resume(run.engine.provenance, info.path, m, run.session, run.engine.exit_now)
    return Restored(m.global_step, m.epoch, k, tr.get("loss", m.loss), dict(tr.get("state") or {}), str(info.path))
