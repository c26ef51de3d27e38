"""Restore: ONE loop for 1..N ranks that picks, verifies and applies a checkpoint, falling back on rejection.

The candidates, newest first: memory slots at least as new as the disk pick (a single process
with memory snapshots), then the supervisor's pick, then the newest valid disk checkpoint below
the last one refused. rank 0 chooses, the group agrees on it, every rank loads it; a checkpoint
any rank cannot apply is rejected (checkpoint_rejected) and the next candidate tried, on all
ranks. In a world of one the group's collectives are identities. These functions are the
training side's restore half: they read its configuration and set its position (step, epoch,
batch, RNG, state).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Optional, Protocol

from .._policies import provenance
from .._state import rng
from .. import rundir
from .._session.engine import Trained
from .._session.messages import say
from ..errors import CheckpointError, WorldSizeMismatch
from .._state.capture import sharded_module
from ..errors import LiveStateChanged
from ..rundir import EXIT_CRASH, EXIT_REFUSED, Event
from .._state import capture

__all__ = ["restore", "reject", "apply", "Candidate", "MemorySource", "Restored"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A checkpoint to try (broadcast from rank 0: plain and picklable)."""

    path: str
    memory: bool = False   # a memory slot: MemorySource.loaded/dropped follow its outcome


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


class MemorySource(Protocol):
    """Memory slots offered to the restore loop before the disk checkpoints (async_save.FastSaver)."""

    def candidates(self, requested: Optional[str]) -> Iterator[Path]: ...
    def loaded(self, path: Path) -> str: ...
    def dropped(self, path: Path) -> None: ...


def reject(run: Trained, path: Path, reason: str) -> None:
    """Record that this process refused `path` (a later save at its step must not reuse it)."""
    run.engine.rejected_paths.add(os.path.realpath(path))
    run.engine.reporter.rejected(path, reason)


def _candidates(run: Trained, requested: Optional[str], memory: Optional[MemorySource]) -> Iterator[Candidate]:
    """rank 0's candidates in order; the generator resumes only after the previous one was refused."""
    if memory is not None:
        for path in memory.candidates(requested):
            yield Candidate(str(path), memory=True)
    below: Optional[int] = None
    while True:  # the supervisor's pick first (one chooser for every front end), then older ones
        info = rundir.choose(run.search_dirs, requested, allow_inexact=run.options.resume_emergency,
                             below_step=below, on_reject=lambda p, r: reject(run, p, r))
        if info is None:
            return
        yield Candidate(str(info.path))
        requested, below = None, rundir.parse_checkpoint_name(info.path.name)


def restore(run: Trained, memory: Optional[MemorySource] = None) -> Optional[Restored]:
    """Load the newest loadable candidate on every rank, falling back to older ones (see the module
    doc); where training stands after it, None on a fresh start."""
    requested = run.env.resume_from
    # Every rank waits out a download of the pick (a new node): rank 0 alone would leave the others
    # in a broadcast bounded by the collective timeout, which a big download may outlast.
    rundir.wait_for_download(requested, on_wait=lambda p: _say_waiting(run, p))
    try:
        return _restore(run, requested, memory)
    finally:
        # A warm standby's prefaulted region the restore did not take is not held any longer. Only a
        # standby (trainer_shim._launch.warm) imports landing: without one there is nothing to release.
        landing = sys.modules.get(f"{__package__}.landing")
        if landing is not None:
            landing.release()


def _restore(run: Trained, requested: Optional[str], memory: Optional[MemorySource]) -> Optional[Restored]:
    group = run.engine.group
    pick = _candidates(run, requested, memory) if run.rank == 0 else iter(())
    while True:
        cand = group.broadcast(next(pick, None), "checkpoint choice")
        if cand is None:
            _start_fresh(run, " (supervisor: no valid checkpoint)" if requested == rundir.RESUME_NONE else "")
            return None
        path = Path(cand.path)
        errs, restored = _try(run, path)
        if not errs:
            assert restored is not None
            if cand.memory and memory is not None:
                restored = dataclasses.replace(restored, resumed_from=memory.loaded(path))
            return restored
        if run.rank == 0:
            alone = group.world_size == 1
            reject(run, path, "; ".join(e if alone else f"rank {r}: {e}" for r, e in errs))
            if cand.memory and memory is not None:
                memory.dropped(path)


def _say_waiting(run: Trained, path: Path) -> None:
    if run.rank == 0:
        say(f"waiting for {path}: the supervisor is still downloading it from the mirror")


def _try(run: Trained, path: Path) -> tuple[list[tuple[int, str]], Optional[Restored]]:
    """Verify and apply `path` on every rank; (rank, error) of each rank that could not, and what
    this rank restored."""
    group = run.engine.group
    # Many ranks split the hashing of the files; one process verifies what it reads.
    alone = group.world_size == 1
    err = None if alone else _verify_share(run, path)
    errs = [(r, e) for r, e in enumerate(group.all_gather(err, "checkpoint verification")) if e]
    if errs:
        return errs, None
    restored = None
    try:
        restored = apply(run, path, verify=alone)
    except WorldSizeMismatch as e:
        _world_size_refused(run, path, e)
    except CheckpointError as e:
        err = str(e)
    return [(r, e) for r, e in enumerate(group.all_gather(err, "restore outcome")) if e], restored


def _start_fresh(run: Trained, why: str) -> None:
    """Fresh start, unless a rejected checkpoint already wrote into the live model (see
    raw_read): then this attempt cannot start from the user's own initial state; it ends, and
    the next one (the bad slot's manifest gone) starts fresh for real."""
    # Every rank ends (a peer left starting fresh would wait for the ended one's collectives).
    if any(run.engine.group.all_gather(run.engine.live_state_changed, "live state check")):
        say("error: a rejected checkpoint had already overwritten part of the live state and no valid "
             "checkpoint is left to replace it; ending this attempt so the next one starts fresh")
        run.engine.group.destroy()
        raise SystemExit(EXIT_CRASH)  # a crash to the supervisor: restarted under the usual policy
    if run.rank == 0:
        say(f"starting fresh in {run.rd.root}{why}")


def _world_size_refused(run: Trained, path: Path, e: Exception) -> None:
    say(f"error: cannot resume from {path}: {e}")
    if run.rank == 0:
        run.engine.event(Event.CHECKPOINT_REJECTED, path=str(path), reason=str(e))
    run.engine.group.destroy()
    raise SystemExit(EXIT_REFUSED)  # a configuration problem: retrying cannot help


def _verify_share(run: Trained, path: Path) -> Optional[str]:
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
    from . import read   # a fresh start reads no checkpoint

    info, files = read.read_checkpoint(path, names=names, verify=verify, into=live)
    tr = files.get(mine)
    if not isinstance(tr, dict) or "rng" not in tr:
        raise CheckpointError(f"{mine} lacks trainer state")
    if info.manifest.sharded:
        if run.model is None:
            raise CheckpointError("a sharded checkpoint needs init(model=...) to load into")
        run.engine.group.guard("sharded checkpoint load", sharded_module().load, path, run.model, run.optimizer,
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
    run.engine.retention.resumed_step = m.global_step
    run.engine.last_size = sum(f.size for f in m.files.values())
    say(f"resumed from {info.path} (step {m.global_step}, epoch {m.epoch}, batch {k})"
         + ("" if m.exact else " [inexact emergency checkpoint]")
         + (f" [resharded from {m.world_size} to {run.world_size} rank(s): not bit-exact]" if reshard else ""))
    if reshard and run.rank == 0:
        run.engine.event(Event.CHECKPOINT_RESHARDED, path=str(info.path), from_world_size=m.world_size,
                   to_world_size=run.world_size, batch_in_epoch=k)
    provenance.check_resume(run, info.path, m)
    return Restored(m.global_step, m.epoch, k, tr.get("loss", m.loss), dict(tr.get("state") or {}), str(info.path))
