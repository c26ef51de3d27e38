"""Fast checkpoints: async disk saves and memory snapshots through shared-memory slots.

`init(async_save=True)`: a due save copies the state into a slot (memory_snapshot.Slot: the
preallocated buffers are the slot's mapped tensors) and returns; one writer THREAD (not a
forked process: no copy-on-write cost after a restore) hashes the slot, writes its manifest
(now it is a complete memory snapshot) and persists it to checkpoints/ with the one commit
protocol of a synchronous save (saving.save_capture: decide, copy each rank's share from its
slot, commit, `latest`, index, rotation; N ranks over a gloo group of the writers' own). At
most one save is in flight:

- a due *disk* save while one is in flight WAITS for it (a disk save is never dropped);
- a due *memory* snapshot (`memory_every_steps`) costs run.step() one copy into the slot's
  mapped buffers, of what the optimizer does not own when it is a torch optimizer in one process
  (late_copy: the HASHER thread copies the optimizer's tensors beside the next step's forward and
  backward); the hasher hashes the slot and writes its manifest (only then is it complete:
  a kill -9 before that finds the previous snapshot, and restore/the supervisor never use the
  incomplete one). It goes into a slot nobody holds that is not the only complete one; when there
  is none (the previous snapshot is still being hashed, or the writer still finalizes the other
  slot) it is SKIPPED, not waited for: counted in the heartbeat's `memory_snapshots_skipped`, with
  one `save_skipped` event per in-flight disk save. N ranks hash on the training thread instead
  (a kill then finds every rank's slot of the step complete: slots are merged by step).

Before an attempt's first slot region is made (its first due snapshot or async save), the slots
are held against the room they need (fit: slot dir, host memory, memory cgroup); where they do
not fit, or a region's pages cannot be reserved, the slots are off for the attempt: no memory
snapshots, synchronous disk saves, one line and a `memory_snapshots_off` event.

Writer failures become `checkpoint_failed` events and a warning at the next run.step();
training continues. drain() (SIGTERM, finish(), an uncaught exception, interpreter exit) waits
for the in-flight save, bounded by `grace`.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from .._session import distributed
from .._disk import save as saving
from .. import rundir
from .._session.engine import Trained
from .._session.messages import describe, say
from ..errors import CollectiveTimeout
from . import fit
from .slots import NoRoom, SlotError, Slots, disown_slots, own_slots
from .._restore.from_memory import SlotRestore
from .hasher import InFlight, SnapshotHasher
from .._policies.memory_interval import AutoMemory
from .._policies.save_interval import AUTO, mtbf_for
from .writer import serve, stop
from ..rundir import CheckpointInfo, CheckpointKind, Event, InvalidCheckpoint
from .._state import capture

DRAIN_GRACE = 30.0  # seconds finish()/SIGTERM/exceptions wait for an in-flight save


@dataclasses.dataclass
class _Job:
    slot: int
    cap: capture.Capture          # metadata only (files={}): the state is already in the slot
    persist: bool                # write it to checkpoints/ after finalizing
    finalized: bool = False      # the slot already has its manifest (a restored one)
    staged: bool = False         # its big tensors still wait in the staging buffers


N_RANKS_EVERY = 10  # memory_every_steps="auto" with N ranks (no per-rank tuning: their steps must match)


class FastSaver:
    """Owned by a Run's engine (`engine.fast`); see the module docstring for the policy."""

    def __init__(self, run: Trained, save_now: Callable[[CheckpointKind], Any], *, async_save: bool,
                 memory_every: Optional[int | str],
                 grace: float = DRAIN_GRACE) -> None:
        self.run = run
        self.save_now = save_now          # the run's synchronous save (after a drain), when a slot cannot take it
        self.async_save = async_save
        self.grace = grace
        self.world = run.engine.group.world_size
        auto_memory: Optional[AutoMemory] = None
        if memory_every == AUTO:  # Young/Daly from each snapshot's cost (memory_interval)
            auto_memory = AutoMemory(mtbf_for(run.rd, run.options.mtbf_hours))
            run.engine.hb.set_memory_snapshots(every=auto_memory.every)
        self.slots = Slots(run.rd, run.rank if self.world > 1 else 0)
        for path, why in self.slots.prepare():  # SlotError: the caller turns fast saves off
            say(f"warning: memory snapshot {path} not trusted ({why}); replaced")
            run.engine.event(Event.CHECKPOINT_REJECTED, path=str(path), reason=f"memory snapshot not trusted: {why}")
        own_slots(run.rd, run.rank if self.world > 1 else 0)
        self.flight = InFlight()   # the save in flight and the snapshot being hashed, under one condition
        self.committed_step: Optional[int] = None   # newest step the writer thread committed to disk
        if memory_every:
            run.engine.hb.set_memory_snapshots(skipped=0)  # present from the start: beats never see the dict grow
        self._warnings: list[str] = []
        self._fatal: Optional[BaseException] = None  # the writer group failed: ends the process at run.step()
        self._fit_checked = False                    # the slots were held against the room they need (fit)
        self._no_room: Optional[NoRoom] = None       # the writer could not reserve a region: slots off at run.step()
        self.off: Optional[str] = None               # why the slots are off for this attempt
        # Multi-rank: the writer threads commit together over a gloo group of their own (every rank
        # creates it here, in the same order); the training thread keeps the run's group.
        self.wgroup = distributed.Dist(run.engine.group.timeout) if self.world > 1 and async_save else None
        self._thread = threading.Thread(target=self._loop, daemon=True, name="trainer_shim-async-save")
        self._thread.start()
        self.hasher = SnapshotHasher(self, self.flight, memory_every if isinstance(memory_every, int) else None,
                                     auto_memory)
        atexit.register(self.drain)

    @property
    def meta(self) -> dict[str, Any]:
        return self.run.engine.provenance.meta

    # --- training thread ------------------------------------------------------------------------

    def on_step(self, disk_due: bool) -> None:
        """run.step(): report writer failures, then take what is due."""
        self.hasher.settle()
        self.report()
        step = self.run.global_step
        memory_due = self.hasher.due(step)
        if (memory_due or (disk_due and self.async_save)) and not self._fit_checked:
            self._check_fit()  # before the attempt's first region is made: it may turn both off
            memory_due = memory_due and self.off is None
        if disk_due and self.async_save:
            # A due memory snapshot is this save's slot (complete once the writer finalizes it).
            with self.run.engine.saves.stall(CheckpointKind.STEP):  # the stall only, not the background write
                self.save_async(CheckpointKind.STEP)
            return
        # The memory snapshot first (a memory copy, hashed while the synchronous disk save writes):
        # a kill during that save then resumes at this step, not at the previous snapshot. The other
        # order made every kill inside the save lose the step again, and three in a row read as a
        # crash loop (poisoned).
        if memory_due:
            with self.run.engine.saves.stall(CheckpointKind.STEP, event=False):
                self.hasher.snapshot()
        if disk_due:
            self.save_now(CheckpointKind.STEP)

    def report(self) -> None:
        """run.step(): the writers' fatal error, else their warnings."""
        if self._fatal is not None:  # the writers' group is unusable after a collective timeout
            raise self._fatal
        self._warn()
        if self._no_room is not None and self.off is None:
            self._slots_off(fit.Unreserved(str(self._no_room.path), self._no_room.nbytes, self._no_room.error))

    def _check_fit(self) -> None:
        """Do the slots fit where their bytes come from (fit: the slot dir, host memory, the memory
        cgroup)? Measured with the state as it is now, whose optimizer state exists after step 1.
        One node's ranks share the dir and the memory: their slots are counted together, and if
        one rank finds them short, all turn them off (their snapshots must hold the same steps)."""
        self._fit_checked = True
        need, held, n = self.slots.need(capture.big_members(self.run)), self.slots.held(), len(self.slots.slots)
        if self.world > 1:
            shares = self.run.engine.group.all_gather((need, held), "memory snapshot slot sizes")
            need, held, n = sum(s[0] for s in shares), sum(s[1] for s in shares), n * self.world
        refusal = fit.check(need, held, n, rundir.SHM_DIR)
        if self.world > 1:
            refusal = next((r for r in self.run.engine.group.all_gather(refusal, "slot fit") if r is not None), None)
        if refusal is not None:
            self._slots_off(refusal)

    def _slots_off(self, why: "fit.Refusal | fit.Unreserved") -> None:
        """No slots for the rest of the attempt: no memory snapshots, synchronous disk saves. Said
        once (a line and an event from rank 0; every rank's heartbeat); the slots are freed once
        nothing in them is newer than the disk (a restored snapshot's persist finishes first)."""
        run = self.run
        why = dataclasses.replace(why, snapshots=self.hasher.stop_snapshots())
        self.off, self.async_save = why.reason, False
        run.engine.hb.set_memory_snapshots(off=why.reason)
        if run.rank == 0 or isinstance(why, fit.Unreserved):  # a rank's own failure is said by that rank
            say(why.line())
            run.engine.event(Event.MEMORY_SNAPSHOTS_OFF, step=run.global_step, **why.fields())
        self.drain()
        if self.world == 1:  # N ranks' slots were merged to disk before the restore
            try:
                rundir.persist_newest(run.rd)
            except (OSError, rundir.ContractError) as err:
                say(f"warning: cannot persist the memory snapshot: {err}")
        self.slots.free()
        disown_slots(run.rd, run.rank if self.world > 1 else 0)

    def _warn(self) -> None:
        with self.flight.cv:
            msgs, self._warnings = self._warnings, []
        for m in msgs:
            say(m)

    def save_async(self, kind: CheckpointKind) -> None:
        run = self.run
        run.engine.last_save_t = time.monotonic()
        existing = saving.reusable(run, run.global_step, True) if self.world == 1 else None  # N ranks: the writers decide
        if existing is not None:
            run.engine.retention.upgrade_kind(existing, kind)
            return
        self.hasher.settle()
        with self.flight.cv:
            while not self.flight.idle():  # one in flight: a due disk save waits
                self.flight.cv.wait()
            idx = self.slots.target(set())
        cap = self.fill(idx, kind, staged=True) if idx is not None else None
        ok = cap is not None
        if self.world > 1:  # every rank's writer takes part in the commit, or none does
            ok = not run.engine.group.agree(not ok, False)[0]
        if not ok or cap is None:
            self.save_now(kind)  # a slot failed (e.g. /dev/shm full): save synchronously instead
            return
        self._submit(_Job(idx, cap, persist=True, staged=True))

    def fill(self, idx: int, kind: CheckpointKind, staged: bool = False,
              protected: Optional[set[int]] = None) -> Optional[capture.Capture]:
        run = self.run
        full = capture.capture(run, kind, True)
        with self.flight.cv:
            self.slots.filling(idx)
        try:
            self.slots.slots[idx].fill(full.files, self.slots.staging if staged else None, protected)
        except NoRoom as e:  # the room the fit check saw was taken meanwhile
            self.slots.slots[idx].invalidate()
            self._slots_off(fit.Unreserved(str(e.path), e.nbytes, e.error))
            return None
        except (OSError, RuntimeError, SlotError) as e:
            self.fail_slot(idx, e)
            return None
        return dataclasses.replace(full, files={}, background=True)

    def fail_slot(self, idx: int, e: BaseException) -> None:
        path = self.slots.slots[idx].path
        self.slots.slots[idx].invalidate()
        self.run.engine.reporter.checkpoint_failed(path, self.run.global_step, describe(e), what="memory snapshot")

    def out_of_room(self, e: NoRoom) -> None:
        """A writer or the hasher found the slot dir full: the slots go off at the next run.step()."""
        self._no_room = e

    def _submit(self, job: _Job) -> None:
        with self.flight.cv:
            self.flight.job = job
            self.hasher.new_disk_save()
            self.flight.cv.notify_all()

    def drain(self, timeout: Optional[float] = None) -> bool:
        """Wait for the in-flight save and snapshot hash (bounded); True when nothing is in flight any more."""
        deadline = time.monotonic() + (self.grace if timeout is None else timeout)
        self.hasher.settle()
        with self.flight.cv:
            while not self.flight.idle():
                left = deadline - time.monotonic()
                if left <= 0 or not (self._thread.is_alive() and self.hasher.thread.is_alive()):
                    return False
                self.flight.cv.wait(left)
        self._warn()
        return True

    def close(self, free: bool) -> None:
        """finish(): wait for the writer; free the slots when the run's newest state is on disk."""
        self.drain()
        stop(self.flight.cv, self._mark_closed, (self._thread, self.hasher.thread), self.grace)
        self.hasher.close()
        atexit.unregister(self.drain)
        if free:
            self.slots.free()
            disown_slots(self.run.rd, self.run.rank if self.world > 1 else 0)

    def before_restore(self) -> Optional[SlotRestore]:
        """The restore loop's memory source: these slots (None for N ranks: merged to disk first)."""
        return SlotRestore(self.run, self.slots, self.persist_restored).before_restore()

    def persist_restored(self, info: CheckpointInfo) -> None:
        """SlotRestore.loaded(): the restored slot is not on disk yet: the writer persists it."""
        m = info.manifest
        self._submit(_Job(self.slots.newest, capture.Capture({}, info.step, m.epoch,  # type: ignore[arg-type]
                          m.batch_in_epoch, m.kind, m.loss, background=True),
                          persist=True, finalized=True))

    # --- writer thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        serve(self.flight.cv, lambda: self.flight.job, lambda: self.flight.closed, self._run_reported, self._job_done)

    def _run_reported(self, job: _Job) -> None:
        try:
            self._run_job(job)
        except CollectiveTimeout as e:  # a peer's writer is gone: this process must end too
            self._fatal = e
            self.fail(job.cap.global_step, str(e))
        except NoRoom as e:  # this save is lost (as any writer failure); run.step() turns the slots off
            self.out_of_room(e)
            self.fail(job.cap.global_step, str(e))
        except BaseException as e:  # never let the writer die silently
            self.fail(job.cap.global_step, f"{type(e).__name__}: {e}")

    def _job_done(self) -> None:
        self.flight.job = None

    def _mark_closed(self) -> None:
        self.flight.closed = True

    def _run_job(self, job: _Job) -> None:
        slot = self.slots.slots[job.slot]
        if job.staged:
            slot.flush(self.slots.staging)
        if job.finalized:
            info = rundir.inspect_checkpoint(slot.path)
        else:
            info = CheckpointInfo(slot.path, slot.finalize(job.cap, self.meta, self.world))
            with self.flight.cv:
                self.slots.done(job.slot)
        if job.persist:
            self._persist(job, info)

    def _persist(self, job: _Job, info: CheckpointInfo) -> None:
        """The one commit protocol (saving.save_capture: the same decisions as a synchronous save,
        e.g. an epoch-end save supersedes the step save of its step; the fallback root), each rank
        copying its share from its slot; the slot's manifest has the digests: nothing is hashed
        twice. N ranks commit together over the writers' group; one process over its no-op group."""
        run = self.run

        def copy(run: Trained, tmp: Path, cap: capture.Capture) -> saving.Report:
            mine: dict[str, tuple[int, str]] = {}
            try:
                for rel, ent in sorted(info.manifest.files.items()):
                    size = rundir.commit.copy_member(rundir.safe_member(info.path, rel), tmp / rel, run.engine.on_progress)
                    mine[rel] = (size, ent.xxh3_128)
            except OSError as e:
                return mine, f"rank {run.rank}: cannot write {tmp}: {describe(e)}", set()
            except InvalidCheckpoint as e:  # still a report: the other ranks' writers wait for it
                return mine, f"rank {run.rank}: {e}", set()
            return mine, None, set()

        outcome = saving.save_capture(run, job.cap, self.wgroup, copy)
        if outcome.error is not None:  # each root's failure is an event already (background: true)
            self.fail(job.cap.global_step, outcome.error, event=False)
        elif outcome.committed:
            run.engine.last_size = outcome.nbytes
            self.committed_step = job.cap.global_step   # the Run reads it (Run.checkpoint_step)
            run.engine.hb.set_checkpoint(job.cap.global_step)

    def fail(self, step: int, error: str, event: bool = True) -> None:
        """Writer or hasher thread: the event now, the warning at the next run.step()."""
        line = self.run.engine.reporter.checkpoint_failed(self.run.rd.checkpoints / rundir.checkpoint_name(step), step,
                                                          error, background=True, event=event, now=False)
        with self.flight.cv:
            self._warnings.append(line)


def make(run: Trained, save_now: Callable[[CheckpointKind], Any], async_save: bool,
         memory_every: Optional[int | str]) -> Optional[FastSaver]:
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
    if memory_every == AUTO and run.world_size > 1:
        # Every rank must snapshot the same steps (their slots are merged by step): a fixed interval.
        say(f"warning: memory_every_steps='auto' is single-process only; {N_RANKS_EVERY} steps for this job")
        memory_every = N_RANKS_EVERY
    try:
        return FastSaver(run, save_now, async_save=async_save, memory_every=memory_every)
    except SlotError as e:
        say(f"warning: memory snapshots off: {e}; this run saves synchronously")
        run.engine.event(Event.CHECKPOINT_REJECTED, path=str(e.path), reason=f"memory snapshot not trusted: {e}")
        try:  # our own other slot: to disk if it is newer, then gone
            rundir.persist_newest(run.rd)
        except (OSError, rundir.ContractError) as err:
            say(f"warning: cannot persist the memory snapshot: {err}")
        rundir.free_slots(run.rd.root, run.rd.node)
        return None
