"""Restore: ONE loop for 1..N ranks that picks, verifies and applies a checkpoint, falling back on rejection.

The candidates, newest first: memory slots at least as new as the disk pick (a single process
with memory snapshots), then the supervisor's pick, then the newest valid disk checkpoint below
the last one refused. rank 0 chooses, the group agrees on it, every rank loads it; a checkpoint
any rank cannot apply is rejected (checkpoint_rejected) and the next candidate tried, on all
ranks. In a world of one the group's collectives are identities. These functions are the
training side's restore half: they read its configuration and set its position (step, epoch,
batch, RNG, state).

Applying a candidate (`apply`) is loaded only when there is one: a fresh start reads no checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol

from .. import rundir
from .._session.engine import Trained
from .._session.messages import say
from ..errors import CheckpointError, WorldSizeMismatch
from ..rundir import EXIT_CRASH, EXIT_REFUSED, Event

if TYPE_CHECKING:  # pragma: no cover
    from .apply import Restored

__all__ = ["restore", "reject", "Candidate", "MemorySource"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A checkpoint to try (broadcast from rank 0: plain and picklable)."""

    path: str
    memory: bool = False   # a memory slot: MemorySource.loaded/dropped follow its outcome


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
    from . import apply   # a fresh start applies nothing

    err = None if alone else apply.verify_share(run, path)
    errs = [(r, e) for r, e in enumerate(group.all_gather(err, "checkpoint verification")) if e]
    if errs:
        return errs, None
    restored = None
    try:
        restored = apply.apply(run, path, verify=alone)
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


