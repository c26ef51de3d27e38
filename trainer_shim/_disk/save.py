"""The one commit protocol of a step's checkpoint, for a world of one as for N ranks (a world of
one is a group of size one: its barrier, broadcast and gather are no-ops), with typed decisions
and outcomes instead of tuples.

rank 0 picks the root and creates `.tmp-step-N` (`decide`); every rank writes its members there
(one process: all of them; else rank 0: model and rank-0.pt; the last rank: optimizer; rank R:
rank-R.pt; sharded: every rank its DCP shards); rank 0 gathers every rank's {file: (size,
digest)}, writes MANIFEST.json listing them all, renames, repoints latest and broadcasts the
outcome (`commit`). A storage failure on any rank fails the attempt in that root; the save moves
on to the next root (the fallback dir), and when none takes it, fails everywhere
(checkpoint_failed) while training continues. A collective timeout (CollectiveTimeout) ends the
process.

Decisions and outcomes travel through the group's broadcast (pickled): plain frozen dataclasses.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from pathlib import Path
from typing import Any, Callable, Optional

from . import members, retention
from .. import rundir
from .._session.engine import Trained
from .._session.messages import describe, say
from .._state import capture
from .._state.capture import sharded_module
from ..errors import CheckpointError
from ..rundir import CheckpointKind, rotation

__all__ = ["Action", "Decision", "Outcome", "decide", "commit", "save", "save_capture", "no_emergency_reason", "find_existing", "reusable",
           "ensure_space"]


class Action(str, enum.Enum):
    EXISTS = "exists"  # a committed checkpoint already stands for this step: keep it
    WRITE = "write"    # write into the temporary dir `path`
    NONE = "none"      # no root can take it (no space, cannot create): the save fails


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    path: Optional[Path] = None
    root: int = 0          # index into run.search_dirs of the root written to


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The checkpoint that stands for the step (`committed` if this save wrote it), or the error."""

    path: Optional[Path] = None
    committed: bool = False
    nbytes: int = 0
    error: Optional[str] = None
    retry_root: Optional[int] = None   # the write failed in one root: try this next one


def _failed(run: Trained, root: Path, error: str, cap: capture.Capture) -> None:
    run.engine.reporter.checkpoint_failed(root / rundir.checkpoint_name(cap.global_step), cap.global_step, error,
                                          background=cap.background)


def find_existing(run: Trained, step: int) -> Optional[Path]:
    """The committed checkpoint dir at `step` in any root, if one exists."""
    name = rundir.checkpoint_name(step)
    for d in run.search_dirs:
        if (d / name).is_dir():
            return d / name
    return None


def reusable(run: Trained, step: int, exact: bool, position: Optional[tuple[int, int]] = None) -> Optional[Path]:
    """The committed checkpoint at `step` that a save there may keep instead of writing, if any.

    One that must not stand for this run's state at the step is moved out of the way: an
    emergency one when an exact save comes (it was kept only for inspection), one this process
    rejected (a bit flip the size check cannot see) or that fails the size check, and one
    another world size wrote (before a reshard: a different timeline). `position` (epoch,
    batch_in_epoch) of the save: the run's own now, unless a background save says otherwise.
    """
    existing = find_existing(run, step)
    if existing is None:
        return None
    why = "rejected at resume" if os.path.realpath(existing) in run.engine.rejected_paths else None
    expected = False   # a replacement that is part of normal operation: not worth a message
    if why is None:
        try:
            m = rundir.inspect_checkpoint(existing).manifest
            if exact and not m.exact:
                why = "inexact (emergency)"
            elif m.world_size != run.world_size:
                why = f"written by {m.world_size} rank(s)"
            elif (m.epoch, m.batch_in_epoch) != (position or (run.epoch, run.batch_in_epoch)):
                # A step save on an epoch's last batch, before the epoch ended: the epoch-end
                # save at the same step records the truth (next epoch, batch 0, RNG after the
                # epoch body) so manifest, index and resume all agree.
                why = f"written at epoch {m.epoch} batch {m.batch_in_epoch}, before the epoch ended"
                expected = True
        except rundir.InvalidCheckpoint as e:
            why = f"invalid: {e.reason}"
    if why is None:
        return existing
    if expected:   # valid and committed: the new save supersedes it at its commit, never before
        return None
    try:
        rundir.commit.discard(existing)
    except OSError as e:
        say(f"warning: cannot replace checkpoint {existing} ({why}): {e}")
        return existing
    say(f"replacing checkpoint {existing} ({why})")
    return None


def ensure_space(run: Trained, root: Path, cap: capture.Capture) -> bool:
    """Free space >= 1.2 x last checkpoint + min_free_bytes, rotating first if that makes room."""
    need = int(1.2 * run.engine.last_size) + int(run.options.min_free_bytes or 0)
    if need <= 0:
        return True
    free = retention.free_bytes(root)
    if free is None or free >= need:
        return True
    name = rundir.checkpoint_name(cap.global_step)
    run.engine.retention.rotate(placeholder=rotation.Entry(name, cap.global_step, cap.kind, cap.loss, cap.exact))
    free = retention.free_bytes(root)
    if free is None or free >= need:
        return True
    _failed(run, root, f"no_space: need {need} bytes free, have {free}", cap)
    return False


def decide(run: Trained, cap: capture.Capture, start: int = 0) -> Decision:
    """rank 0: keep an existing checkpoint at the capture's step, or create the temporary dir in
    the first root (from `start` on) that can take it."""
    step = cap.global_step
    existing = reusable(run, step, cap.exact, (cap.epoch, cap.batch_in_epoch)) if start == 0 else None
    if existing is not None:
        run.engine.retention.upgrade_kind(existing, cap.kind)
        return Decision(Action.EXISTS, existing)
    name = rundir.checkpoint_name(step)
    probe = dataclasses.replace(cap, files={})
    roots = run.search_dirs
    for index in range(start, len(roots)):
        root = roots[index]
        if not ensure_space(run, root, probe):
            continue
        try:
            draft = rundir.commit.Draft.open(root, name)
        except OSError as e:
            _failed(run, root, f"cannot create {rundir.commit.tmp_dir(root, name)}: {e.strerror or e}", cap)
            continue
        return Decision(Action.WRITE, draft.path, index)
    return Decision(Action.NONE)


Report = tuple[dict[str, tuple[int, str]], Optional[str], set[str]]
Writer = Callable[["Trained", Path, capture.Capture], Report]


def _write_mine(run: Trained, tmp: Path, cap: capture.Capture) -> Report:
    """This rank's members (and DCP shards): ({file: (size, digest)}, error, files DCP's metadata names)."""
    mine: dict[str, tuple[int, str]] = {}
    err: Optional[str] = None
    written = 0
    try:
        for fname, obj in cap.files.items():
            base = written
            mine[fname] = members.write_member(tmp, fname, obj, lambda n: run.engine.on_progress(base + n))
            written += mine[fname][0]
    except OSError as e:
        err = f"{_who(run)}cannot write {tmp / fname}: {describe(e)}"
    except RuntimeError as e:
        err = f"{_who(run)}{type(e).__name__}: {e}"
    referenced: set[str] = set()
    if run.sharded:  # collective: every rank takes part even after its own failure
        try:
            base = written
            shards, referenced = run.engine.group.guard(
                "sharded checkpoint write", sharded_module().save, tmp, run.model, run.optimizer, rank=run.rank,
                group=run.engine.group.group, progress=lambda n: run.engine.on_progress(base + n))
            mine.update({f: (e.size, e.xxh3_128) for f, e in shards.items()})
        except (OSError, CheckpointError) as e:
            err = err or f"{_who(run)}{type(e).__name__}: {e}"
    return mine, err, referenced


def _who(run: Trained) -> str:
    return f"rank {run.rank}: " if run.engine.group.world_size > 1 else ""


def _finish(run: Trained, decision: Decision, cap: capture.Capture, reports: list, referenced: set[str]) -> Outcome:
    """rank 0: commit what every rank reported, or discard the temporary dir (and say where to retry)."""
    tmp = decision.path
    assert tmp is not None
    errs = [e for _, e in reports if e]
    files: dict[str, tuple[int, str]] = {}
    for m, _ in reports:
        files.update(m)
    lost = sorted(referenced - set(files))
    if lost and not errs:  # DCP's metadata names shards no rank reported writing
        errs.append(f"shards missing from every rank's report: {', '.join(lost[:5])}")
    draft = rundir.commit.Draft(tmp.parent, rundir.checkpoint_name(cap.global_step))
    if not errs:
        try:
            manifest = members.commit_members(draft, cap, files, world_size=run.engine.group.world_size,
                                              meta=run.engine.provenance.meta)
            final = draft.final
            run.engine.retention.committed_step = cap.global_step  # before rotating: the resumed one may go now
            run.engine.retention.add(final, manifest)
            run.engine.retention.rotate()
            return Outcome(final, committed=True, nbytes=sum(sz for sz, _ in files.values()))
        except CheckpointError as e:
            errs.append(str(e))
    draft.discard()
    # What got written before the failure is a lower bound of the next one's size (free-space check).
    run.engine.last_size = max(run.engine.last_size, run.engine.hb.save_bytes)
    _failed(run, tmp.parent, "; ".join(errs), cap)
    more = decision.root + 1 < len(run.search_dirs)
    return Outcome(error="; ".join(errs), retry_root=decision.root + 1 if more else None)


def commit(run: Trained, cap: capture.Capture, decision: Optional[Decision], group: Any = None,
           write: Optional[Writer] = None) -> Outcome:
    """Every rank: agree on rank 0's decision, write this rank's share, and learn the outcome.

    `group`: the run's shim group unless a background writer has its own; `write`: this rank's
    members from `cap` unless they come from elsewhere (a memory slot)."""
    group = group or run.engine.group
    group.barrier(f"checkpoint barrier at step {cap.global_step}")
    decision = group.broadcast(decision, "checkpoint decision")
    if decision.action is Action.EXISTS:
        return Outcome(decision.path)
    if decision.action is not Action.WRITE:
        return Outcome(error="no checkpoint root can take it")
    tmp = decision.path
    mine, err, referenced = (write or _write_mine)(run, tmp, cap)
    reports = group.all_gather((mine, err), "checkpoint file reports")
    outcome = _finish(run, decision, cap, reports, referenced) if run.rank == 0 else None
    return group.broadcast(outcome, "checkpoint outcome")


def save(run: Trained, kind: CheckpointKind, exact: bool = True) -> Outcome:
    """Every rank, at the same step: the whole protocol, root after root until one takes it."""
    return save_capture(run, capture.capture(run, kind, exact))


def save_capture(run: Trained, cap: capture.Capture, group: Any = None, write: Optional[Writer] = None) -> Outcome:
    """save() of a capture taken earlier (a background writer's: its step, not the run's now)."""
    decision = decide(run, cap) if run.rank == 0 else None
    while True:
        outcome = commit(run, cap, decision, group, write)
        if outcome.retry_root is None:
            return outcome
        decision = decide(run, cap, outcome.retry_root) if run.rank == 0 else None


def no_emergency_reason(run: Trained) -> Optional[str]:
    """Why a crash at this moment gets no (inexact) emergency checkpoint, or None if it may have one."""
    if run.engine.group.world_size > 1:
        # The other ranks are not in this save's collectives: an emergency checkpoint cannot commit.
        return "multi-rank runs save only at steps all ranks agree on"
    if run.optimizer is None:
        return "without an optimizer the shim cannot tell whether the weights match the step"
    if run.engine.dirty:
        return f"optimizer.step() ran after run.step() {run.global_step}, so the weights match no step"
    if find_existing(run, run.global_step) is not None:
        return f"step {run.global_step} already has one"
    return None
