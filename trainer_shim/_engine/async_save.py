"""Fast checkpoints: async disk saves and memory snapshots through shared-memory slots.

`init(async_save=True)`: a due save copies the state into a slot (memory_snapshot.Slot: the
preallocated buffers are the slot's mapped tensors) and returns; one writer THREAD (not a
forked process: no copy-on-write cost after a restore) hashes the slot, writes its manifest
(now it is a complete memory snapshot) and persists it to checkpoints/ with the one commit
protocol of a synchronous save (saving.save_snapshot: decide, copy each rank's share from its
slot, commit, `latest`, index, rotation; N ranks over a gloo group of the writers' own). At
most one save is in flight:

- a due *disk* save while one is in flight WAITS for it (a disk save is never dropped);
- a due *memory* snapshot (`memory_every_steps`) is finalized on the training thread (copy +
  hash: a kill -9 right after run.step() returns finds it complete); it goes into the slot the
  writer does not hold. Only while the writer still hashes the other slot is there no slot it
  may take: then it is skipped, with one `save_skipped` event per in-flight save.

Writer failures become `checkpoint_failed` events and a warning at the next run.step();
training continues. drain() (SIGTERM, finish(), an uncaught exception, interpreter exit) waits
for the in-flight save, bounded by `grace`.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Callable, Optional

from . import checkpoint as ckpt
from .._process import distributed
from . import restoring, saving, snapshot_store
from .. import rundir
from .engine import Trained
from .._process.messages import say
from ..errors import CollectiveTimeout
from .memory_snapshot import SlotError, Slots
from ..rundir import CheckpointInfo, CheckpointKind, Event, InvalidCheckpoint

DRAIN_GRACE = 30.0  # seconds finish()/SIGTERM/exceptions wait for an in-flight save


@dataclasses.dataclass
class _Job:
    slot: int
    snap: ckpt.Snapshot          # metadata only (files={}): the state is already in the slot
    persist: bool                # write it to checkpoints/ after finalizing
    finalized: bool = False      # the slot already has its manifest (a restored one)
    staged: bool = False         # its big tensors still wait in the staging buffers


class FastSaver:
    """Owned by a Run's engine (`engine.fast`); see the module docstring for the policy."""

    def __init__(self, run: Trained, save_now: Callable[[CheckpointKind], Any], *, async_save: bool,
                 memory_every: Optional[int],
                 grace: float = DRAIN_GRACE) -> None:
        self.run = run
        self.save_now = save_now          # the run's synchronous save (after a drain), when a slot cannot take it
        self.async_save = async_save
        self.memory_every = memory_every
        self.grace = grace
        self.world = run.engine.group.world_size
        self.slots = Slots(run.rd, run.rank if self.world > 1 else 0)
        for path, why in self.slots.prepare():  # SlotError: the caller turns fast saves off
            say(f"warning: memory snapshot {path} not trusted ({why}); replaced")
            run.engine.event(Event.CHECKPOINT_REJECTED, path=str(path), reason=f"memory snapshot not trusted: {why}")
        snapshot_store.own(run.rd, run.rank if self.world > 1 else 0)
        self._cv = threading.Condition()
        self._job: Optional[_Job] = None
        self._pinned_complete = False
        self._warnings: list[str] = []
        self._skip_reported = False
        self._closed = False
        self._offered: Any = None  # (slot info, same disk checkpoint or None) the restore loop is trying
        self._fatal: Optional[BaseException] = None  # the writer group failed: ends the process at run.step()
        # Multi-rank: the writer threads commit together over a gloo group of their own (every rank
        # creates it here, in the same order); the training thread keeps the run's group.
        self.wgroup = distributed.Dist(run.engine.group.timeout) if self.world > 1 and async_save else None
        self._thread = threading.Thread(target=self._loop, daemon=True, name="trainer_shim-async-save")
        self._thread.start()
        atexit.register(self.drain)

    @property
    def meta(self) -> dict[str, Any]:
        return {"git_commit": self.run.git_commit, "git_dirty": self.run.git_dirty}

    # --- training thread ------------------------------------------------------------------------

    def on_step(self, disk_due: bool) -> None:
        """run.step(): report writer failures, then take what is due."""
        self.report()
        step = self.run.global_step
        memory_due = bool(self.memory_every and step % self.memory_every == 0)
        if disk_due and self.async_save:
            # A due memory snapshot is this save's slot, finalized before run.step() returns.
            with self.run.engine.saves.stall(CheckpointKind.STEP):  # the stall only, not the background write
                self.save_async(CheckpointKind.STEP, finalize_now=memory_due)
            return
        # The memory snapshot first (a memory copy): a kill during the synchronous disk save then
        # resumes at this step, not at the previous snapshot. The other order made every kill
        # inside the save lose the step again, and three in a row read as a crash loop (poisoned).
        if memory_due:
            with self.run.engine.saves.stall(CheckpointKind.STEP, event=False):
                self.memory_snapshot()
        if disk_due:
            self.save_now(CheckpointKind.STEP)

    def report(self) -> None:
        """run.step(): the writers' fatal error, else their warnings."""
        if self._fatal is not None:  # the writers' group is unusable after a collective timeout
            raise self._fatal
        self._warn()

    def _warn(self) -> None:
        with self._cv:
            msgs, self._warnings = self._warnings, []
        for m in msgs:
            say(f"warning: {m}; training continues")

    def save_async(self, kind: CheckpointKind, finalize_now: bool = False) -> None:
        run = self.run
        run.engine.last_save_t = time.monotonic()
        existing = saving.reusable(run, run.global_step, True) if self.world == 1 else None  # N ranks: the writers decide
        if existing is not None:
            run.engine.retention.upgrade_kind(existing, kind)
            return
        with self._cv:
            while self._job is not None:  # at most one in flight: a due disk save waits
                self._cv.wait()
            idx = self.slots.target(None, False)
        snap = self._fill(idx, kind, staged=not finalize_now)
        ok = snap is not None and (not finalize_now or self._finalize(idx, snap))
        if self.world > 1:  # every rank's writer takes part in the commit, or none does
            ok = not run.engine.group.agree(not ok, False)[0]
        if not ok or snap is None:
            self.save_now(kind)  # a slot failed (e.g. /dev/shm full): save synchronously instead
            return
        self._submit(_Job(idx, snap, persist=True, finalized=finalize_now, staged=not finalize_now))

    def memory_snapshot(self) -> None:
        with self._cv:
            pinned = self._job.slot if self._job is not None else None
            idx = self.slots.target(pinned, self._pinned_complete)
            if idx is None:
                if not self._skip_reported:
                    self._skip_reported = True
                    self.run.engine.event(Event.SAVE_SKIPPED, step=self.run.global_step, target="memory",
                                    reason="the writer is still finalizing the other slot")
                return
        snap = self._fill(idx, CheckpointKind.STEP)
        if snap is not None:
            self._finalize(idx, snap)

    def _finalize(self, idx: int, snap: ckpt.Snapshot) -> bool:
        """Hash and write the manifest on the training thread: complete before run.step() returns."""
        try:
            self.slots.slots[idx].finalize(snap, self.meta, self.world)
        except OSError as e:
            self._fail_slot(idx, e)
            return False
        with self._cv:
            self.slots.newest = idx
        return True

    def _fill(self, idx: int, kind: CheckpointKind, staged: bool = False) -> Optional[ckpt.Snapshot]:
        run = self.run
        full = saving.snapshot(run, kind, True)
        try:
            self.slots.slots[idx].fill(full.files, self.slots.staging if staged else None)
        except (OSError, RuntimeError, SlotError) as e:
            self._fail_slot(idx, e)
            return None
        return dataclasses.replace(full, files={}, background=True)

    def _fail_slot(self, idx: int, e: BaseException) -> None:
        path = self.slots.slots[idx].path
        self.slots.slots[idx].invalidate()
        say(f"warning: memory snapshot at step {self.run.global_step} failed in {path}: {e}; training continues")
        self.run.engine.event(Event.CHECKPOINT_FAILED, path=str(path), error=f"{type(e).__name__}: {e}")

    def _submit(self, job: _Job) -> None:
        with self._cv:
            self._job = job
            self._pinned_complete = job.finalized
            self._skip_reported = False
            self._cv.notify_all()

    def drain(self, timeout: Optional[float] = None) -> bool:
        """Wait for the in-flight save (bounded); True when nothing is in flight any more."""
        deadline = time.monotonic() + (self.grace if timeout is None else timeout)
        with self._cv:
            while self._job is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cv.wait(left)
        self._warn()
        return True

    def close(self, free: bool) -> None:
        """finish(): wait for the writer; free the slots when the run's newest state is on disk."""
        self.drain()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        atexit.unregister(self.drain)
        if free:
            self.slots.free()
            snapshot_store.disown(self.run.rd, self.run.rank if self.world > 1 else 0)

    # --- restore ----------------------------------------------------------------------------------

    def before_restore(self) -> Optional["FastSaver"]:
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
        for info in snapshot_store.complete_slots(run.rd.root, run.rd.node,
                                                  on_reject=lambda p, r: restoring.reject(run, p, r)):
            same = disk is not None and info.step == disk.step and info.manifest.files == disk.manifest.files
            if info.step < disk_step or (info.step == disk_step and not same):
                return
            # Every digest is checked as it loads: the small members against the manifest, each
            # tensor against its table as it is read into the live state (raw_tensors: a bad one
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

    def loaded(self, path: Path) -> None:
        """The restore loop resumed from slot `path`: keep it, and persist it when it is not on disk."""
        info, disk = self._offered
        say(f"resumed from memory step {info.step}")
        self.slots.adopt(info.path)
        if disk is not None:
            self.run.resumed_from = str(disk.path)
        else:
            m = info.manifest
            self._submit(_Job(self.slots.newest, ckpt.Snapshot({}, info.step, m.epoch,  # type: ignore[arg-type]
                              m.batch_in_epoch, m.kind, m.loss, background=True),
                              persist=True, finalized=True))

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
                done = snapshot_store.persist_newest(run.rd, on_reject=lambda p, r: restoring.reject(run, p, r))
            except (OSError, rundir.ContractError) as e:
                say(f"warning: cannot persist the memory snapshot: {e}")
                done = None
            if done is not None:
                say(f"persisted memory snapshot of step {done[1].global_step} to {done[0]}")
        run.engine.group.barrier("memory snapshot persisted")

    # --- writer thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        try:  # Linux: a thread's own nice value; training keeps the CPU it needs
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (OSError, AttributeError):
            pass
        while True:
            with self._cv:
                while self._job is None and not self._closed:
                    self._cv.wait()
                if self._job is None:
                    return
                job = self._job
            try:
                self._run_job(job)
            except CollectiveTimeout as e:  # a peer's writer is gone: this process must end too
                self._fatal = e
                self._fail(job, str(e))
            except BaseException as e:  # never let the writer die silently
                self._fail(job, f"{type(e).__name__}: {e}")
            with self._cv:
                self._job = None
                self._pinned_complete = False
                self._cv.notify_all()

    def _run_job(self, job: _Job) -> None:
        slot = self.slots.slots[job.slot]
        if job.staged:
            slot.flush(self.slots.staging)
        if job.finalized:
            info = rundir.inspect_checkpoint(slot.path)
        else:
            info = CheckpointInfo(slot.path, slot.finalize(job.snap, self.meta, self.world))
            with self._cv:
                self.slots.newest = job.slot
                self._pinned_complete = True
        if job.persist:
            self._persist(job, info)

    def _persist(self, job: _Job, info: CheckpointInfo) -> None:
        """The one commit protocol (saving.save_snapshot: the same decisions as a synchronous save,
        e.g. an epoch-end save supersedes the step save of its step; the fallback root), each rank
        copying its share from its slot; the slot's manifest has the digests: nothing is hashed
        twice. N ranks commit together over the writers' group; one process over its no-op group."""
        run = self.run

        def copy(run: Trained, tmp: Path, snap: ckpt.Snapshot) -> saving.Report:
            mine: dict[str, tuple[int, str]] = {}
            try:
                for rel, ent in sorted(info.manifest.files.items()):
                    size = snapshot_store.copy_member(rundir.safe_member(info.path, rel), tmp / rel, run.engine.on_progress)
                    mine[rel] = (size, ent.xxh3_128)
            except OSError as e:
                return mine, f"rank {run.rank}: cannot write {tmp}: {ckpt.describe_os_error(e)}", set()
            except InvalidCheckpoint as e:  # still a report: the other ranks' writers wait for it
                return mine, f"rank {run.rank}: {e}", set()
            return mine, None, set()

        outcome = saving.save_snapshot(run, job.snap, self.wgroup, copy)
        if outcome.error is not None:  # each root's failure is an event already (background: true)
            self._fail(job, outcome.error, event=False)
        elif outcome.committed:
            run.engine.last_size = outcome.nbytes
            run.checkpoint_step = job.snap.global_step
            run.engine.hb.fields["checkpoint_step"] = job.snap.global_step

    def _fail(self, job: _Job, error: str, event: bool = True) -> None:
        path = self.run.rd.checkpoints / rundir.checkpoint_name(job.snap.global_step)
        if event:
            self.run.engine.event(Event.CHECKPOINT_FAILED, path=str(path), error=error, background=True)
        with self._cv:
            self._warnings.append(f"background checkpoint at step {job.snap.global_step} failed: {error}")


def make(run: Trained, save_now: Callable[[CheckpointKind], Any], async_save: bool,
         memory_every: Optional[int]) -> Optional[FastSaver]:
    """The saver for init(async_save=..., memory_every_steps=...), or None: saves stay synchronous."""
    if not async_save and not memory_every:
        return None
    if run.sharded:
        say("warning: async_save/memory_every_steps are not supported for sharded (DCP) saves yet; "
             "this run saves synchronously")
        return None
    if memory_every and run.world_size > 1 and run.launcher.local_world_size != run.world_size:
        # Another node's ranks keep their slots in their own /dev/shm: no process sees a whole snapshot.
        say("warning: memory_every_steps is single-node only; memory snapshots are off for this run")
        memory_every = None
        if not async_save:
            return None
    try:
        return FastSaver(run, save_now, async_save=async_save, memory_every=memory_every)
    except SlotError as e:
        say(f"warning: memory snapshots off: {e}; this run saves synchronously")
        run.engine.event(Event.CHECKPOINT_REJECTED, path=str(e.path), reason=f"memory snapshot not trusted: {e}")
        try:  # our own other slot: to disk if it is newer, then gone
            snapshot_store.persist_newest(run.rd)
        except (OSError, rundir.ContractError) as err:
            say(f"warning: cannot persist the memory snapshot: {err}")
        snapshot_store.free(run.rd.root, run.rd.node)
        return None
