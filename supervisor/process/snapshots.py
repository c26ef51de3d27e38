"""The supervisor's part of memory snapshots: it outlives the trainer, so it keeps
the shared-memory slots across a restart, persists the newest one to checkpoints/ when the
trainer died before writing it (torch-free: a verified byte copy), and frees them at the end;
`slots --free` frees a run's slots (persisting the newest first) for a user."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from trainer_shim.rundir import (
    MANIFEST_NAME, ContractError, Event, RunDir, complete_slots, free_group, free_slots, lock_pid, newest_complete,
    persist_newest as persist_newest_slot, run_slots, snapshot_slot_ranks,
)

from ..errors import RunDirError


def persist_newest(rd: RunDir, emit: Callable[..., Any], say: Callable[[str], None],
                   reject: Callable[[Path, str], None]) -> None:
    """After an attempt ends (or at startup, for a dead supervisor's slots): never lose a snapshot."""
    try:
        done = persist_newest_slot(rd, on_reject=reject)
    except (OSError, ContractError) as e:
        say(f"warning: cannot persist the memory snapshot: {e}")
        emit(Event.CHECKPOINT_FAILED, path=str(rd.checkpoints), error=f"memory snapshot: {e}")
        return
    if done is not None:
        path, manifest = done
        say(f"persisted memory snapshot of step {manifest.global_step} to {path}")
        emit(Event.CHECKPOINT_PERSISTED_BY_SUPERVISOR, path=str(path), step=manifest.global_step)


def newest_step(rd: RunDir) -> Optional[int]:
    """The step of the newest complete memory snapshot of a one-process job (None: none, or N ranks')."""
    try:
        slots = newest_complete(rd.root, rd.node)
    except (OSError, ContractError):
        return None
    return slots[0].step if slots is not None and len(slots) == 1 else None


def restart_persists(rd: RunDir, at_start: Optional[int]) -> bool:
    """The next attempt can persist the newest snapshot itself: one process's, made by the attempt
    that just ended (newer than the newest one when it started). The next attempt restores it from
    memory (it is newer than any disk checkpoint) and its writer persists it beside its first steps,
    so the restart need not wait for the copy to disk. Otherwise (N ranks' slots to merge, or an
    attempt that made no snapshot: a crash loop must find the checkpoint it poisons on disk) the
    supervisor persists it before the next choice."""
    now = newest_step(rd)
    return now is not None and (at_start is None or now > at_start)


def drop_step(rd: RunDir, step: int) -> None:
    """A checkpoint of `step` is poisoned: its memory snapshot (every rank's) is no longer complete,
    so no trainer restores it in place of the older checkpoint the supervisor chose."""
    for rank in snapshot_slot_ranks(rd.root, rd.node):
        for info in complete_slots(rd.root, rd.node, rank=rank):
            if info.step == step:
                (info.path / MANIFEST_NAME).unlink(missing_ok=True)


def free(rd: RunDir) -> None:
    free_slots(rd.root, rd.node)


def free_run_slots(rd: RunDir, persist: bool = True) -> tuple[int, Optional[str]]:
    """`slots RUN_DIR --free`: (bytes freed, what was persisted first). The newest complete slot
    goes to checkpoints/ first when it is newer than every disk checkpoint (unless `persist` is
    off), as the supervisor does after an attempt dies; a live owner's or supervisor's slots are
    refused (RunDirError, exit 2): only they know whether a write is in flight."""
    group = run_slots(rd.root, rd.node)
    pid = group.live_owner
    if pid is not None:
        raise RunDirError(f"the memory snapshots of {rd.root} belong to the running process {pid}; "
                          f"stop it first (they are freed when it finishes)")
    holder = lock_pid(rd)
    if holder is not None:
        raise RunDirError(f"a supervisor (pid {holder}) runs {rd.root} and uses its memory snapshots; "
                          f"stop it first: resilient-run stop {rd.root}")
    saved = None
    if persist and group.slots:
        try:
            done = persist_newest_slot(rd)
        except (OSError, ContractError) as e:
            raise RunDirError(f"cannot persist the newest memory snapshot of {rd.root} ({e}); "
                              f"free a disk or pass --discard to drop it") from None
        if done is not None:
            saved = f"step {done[1].global_step} to {done[0]}"
    freed = group.bytes
    free_group(group)
    free_slots(rd.root, rd.node)   # and whatever a racing writer left under the run's names
    return freed, saved

