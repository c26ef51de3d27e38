"""Restoring from memory snapshot slots: the part of async_save.FastSaver the restore loop calls
(restoring.restore): which complete slots to offer before the disk, what becomes of the one it
loaded (kept; persisted when it is not on disk) or refused (its manifest removed), and the N-rank
merge to disk. Composed by the memory saver (trainer_shim._memory.saver.FastSaver.before_restore),
which hands it the run, its slots and how to persist the slot it resumed from."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

from . import landing, loop as restoring, slot_maps
from .. import rundir
from .._session.messages import say
from ..rundir import CheckpointInfo, InvalidCheckpoint


class SlotRestore:
    """The memory source (loop.MemorySource) of one run: its slots (`_memory.slots.Slots`), and
    `persist_restored(info)`, which has a slot the run resumed from written to disk."""

    def __init__(self, run: Any, slots: Any, persist_restored: Callable[[CheckpointInfo], None]) -> None:
        self.run = run
        self.world = run.engine.group.world_size
        self.slots = slots
        self.persist_restored = persist_restored
        self._offered: Any = None  # (slot info, same disk checkpoint or None) the restore loop is trying

    def before_restore(self) -> Optional["SlotRestore"]:
        """The memory source for restoring.restore (one process), or None after N ranks' slots
        were merged to disk (the disk restore then picks them)."""
        if self.world > 1:
            self._persist_merged()
            return None
        return self

    def candidates(self, requested: Optional[str]) -> Iterator[Path]:
        """The complete slots, newest first, while one is newer than the disk pick (or the same
        checkpoint: same step and digests); restoring.restore tries them before the disk."""
        run = self.run
        disk = self._disk_pick(requested)
        disk_step = disk.step if disk is not None else -1
        for info in rundir.complete_slots(run.rd.root, run.rd.node,
                                                  on_reject=lambda p, r: restoring.reject(run, p, r)):
            same = disk is not None and info.step == disk.step and info.manifest.files == disk.manifest.files
            if info.step < disk_step or (info.step == disk_step and not same):
                return
            # Every digest is checked as it loads: the small members against the manifest, each
            # tensor against its table as it is read into the live state (raw_read: a bad one
            # is overwritten by the fallback, or ends the attempt when none is left).
            self._offered = (info, disk if same else None)
            yield info.path

    def _disk_pick(self, requested: Optional[str]) -> Optional[CheckpointInfo]:
        if requested == rundir.RESUME_NONE:
            return None
        if requested:
            try:
                return rundir.inspect_checkpoint(Path(requested))
            except InvalidCheckpoint:
                return None
        return rundir.newest_valid(self.run.search_dirs)

    def loaded(self, path: Path) -> str:
        """The restore loop resumed from slot `path`: keep it, and persist it when it is not on disk.
        Returns the checkpoint the attempt stands for (the disk one, or the step-N it is persisted to)."""
        info, disk = self._offered
        ahead, through = landing.landed(), slot_maps.read_through()
        said = ([f"{ahead / 2**20:.1f} MiB into memory the warm standby had faulted in"] if ahead else []) \
            + ([f"{through / 2**20:.1f} MiB out of its mapping of the slot"] if through else [])
        say(f"resumed from memory step {info.step}" + (f" ({', '.join(said)})" if said else ""))
        self.slots.adopt(info.path)
        if disk is not None:
            return str(disk.path)
        self.persist_restored(info)
        # Named as the checkpoint its writer persists it to (the supervisor leaves that to this
        # attempt after a kill: supervisor.process.snapshots.restart_persists), so the step it
        # resumed at reads the same in heartbeats, reports and crash-loop decisions either way.
        return str(self.run.rd.checkpoints / rundir.checkpoint_name(info.step))

    def dropped(self, path: Path) -> None:
        """The restore loop refused slot `path`: never picked again (by a later attempt or the
        supervisor's persist), it is no longer complete."""
        (path / rundir.MANIFEST_NAME).unlink(missing_ok=True)

    def _persist_merged(self) -> None:
        """N ranks: every rank's slot of the newest step they all hold goes to disk as one
        checkpoint (the supervisor has normally done it already), which the disk restore picks."""
        run = self.run
        if run.rank == 0:
            try:
                done = rundir.persist_newest(run.rd, on_reject=lambda p, r: restoring.reject(run, p, r))
            except (OSError, rundir.ContractError) as e:
                say(f"warning: cannot persist the memory snapshot: {e}")
                done = None
            if done is not None:
                say(f"persisted memory snapshot of step {done[1].global_step} to {done[0]}")
        run.engine.group.barrier("memory snapshot persisted")
