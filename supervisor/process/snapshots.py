"""The supervisor's part of memory snapshots: it outlives the trainer, so it keeps
the shared-memory slots across a restart, persists the newest one to checkpoints/ when the
trainer died before writing it (torch-free: a verified byte copy), and frees them at the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer_shim.rundir import ContractError, Event, RunDir, free_slots, persist_newest as persist_newest_slot


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


def free(rd: RunDir) -> None:
    free_slots(rd.root, rd.node)
