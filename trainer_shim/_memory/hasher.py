"""Memory snapshots: run.step() copies into a free slot (or skips), the HASHER thread copies the
optimizer's tensors (late_copy), hashes the slot and writes its manifest last;
memory_every_steps="auto" measures what each one cost training (memory_interval).

Composed into the saver (saver.FastSaver), not mixed in: both hold the one `InFlight` (the
condition, the disk save in flight, the snapshot being hashed), and the hasher asks its `Owner` for
what the saver owns (the slots, filling one, reporting a failure, a slot dir out of room).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Optional, Protocol

from .late_copy import CHANGED_WHILE_COPIED, LateCopy
from .slots import NoRoom, Slots
from .._policies.memory_interval import AutoMemory
from .._session.engine import Trained
from .._session.messages import describe
from .writer import low_priority
from ..rundir import CheckpointKind, Event
from .._state import capture

__all__ = ["InFlight", "Owner", "SnapshotHasher"]


@dataclasses.dataclass
class InFlight:
    """What the training thread, the hasher and the writer share, under `cv`: at most one disk save
    (`job`) and one snapshot being hashed (`hashing`: its slot, capture and its copy's stall)."""

    cv: threading.Condition = dataclasses.field(default_factory=threading.Condition)
    job: Any = None
    hashing: Optional[tuple[int, capture.Capture, float]] = None
    closed: bool = False

    def idle(self) -> bool:
        return self.job is None and self.hashing is None

    def busy_slots(self) -> set[int]:
        """The slots a save or a hash holds (under `cv`)."""
        return ({self.job.slot} if self.job is not None else set()) | \
               ({self.hashing[0]} if self.hashing is not None else set())


class Owner(Protocol):
    """What the hasher asks of the saver it is composed into."""

    run: Trained
    world: int
    slots: Slots

    @property
    def meta(self) -> dict[str, Any]: ...
    def fill(self, idx: int, kind: CheckpointKind, staged: bool = False,
             protected: Optional[set[int]] = None) -> Optional[capture.Capture]: ...
    def fail(self, step: int, error: str, event: bool = True) -> None: ...
    def fail_slot(self, idx: int, e: BaseException) -> None: ...
    def out_of_room(self, e: NoRoom) -> None: ...


class SnapshotHasher:
    """Takes the due memory snapshots (training thread) and completes them (its own thread)."""

    def __init__(self, owner: Owner, flight: InFlight, memory_every: Optional[int],
                 auto_memory: Optional[AutoMemory]) -> None:
        self.owner, self.flight = owner, flight
        self.memory_every, self.auto_memory = memory_every, auto_memory
        run = owner.run
        # the optimizer's tensors are copied on the hasher while the next step computes
        self.late = LateCopy(flight.cv, run.optimizer) if (memory_every or auto_memory) and \
            LateCopy.usable(run.optimizer, owner.world) else None
        self.skipped = 0
        self._skip_reported = False
        self._last_step_t: Optional[float] = None
        self._last_memory_step = -1
        self.thread = threading.Thread(target=self._hash_loop, daemon=True, name="trainer_shim-snapshot-hash")
        self.thread.start()

    # --- training thread ------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        if self.auto_memory is None:
            return bool(self.memory_every and step % self.memory_every == 0)
        now = time.monotonic()
        if self._last_step_t is not None:
            self._observe_step(now - self._last_step_t)
            self.owner.run.engine.hb.set_memory_snapshots(every=self.auto_memory.every)
        self._last_step_t = now
        return step - self._last_memory_step >= self.auto_memory.every  # a skipped one is retried next step

    def snapshot(self) -> None:
        """One copy into a free slot; the hasher completes it. Skipped when no slot is free."""
        owner, flight = self.owner, self.flight
        with flight.cv:
            idx = owner.slots.target(flight.busy_slots()) if flight.hashing is None else None
            if idx is None:
                self._skip()
                return
        t0 = time.perf_counter()
        cap = owner.fill(idx, CheckpointKind.STEP, protected=self.late.protected() if self.late else None)
        if cap is not None and self.late is not None:
            self.late.begin(owner.slots.slots[idx])
        if cap is not None and owner.world > 1:
            # N ranks hash on the training thread: a kill then finds every rank's slot of this
            # step complete, and the supervisor merges slots of one step only.
            self._finalize_now(idx, cap)
        elif cap is not None:
            self._last_memory_step = cap.global_step
            with flight.cv:
                flight.hashing = (idx, cap, time.perf_counter() - t0)
                if self.auto_memory is not None:
                    self.auto_memory.snapshot_started()
                flight.cv.notify_all()

    def new_disk_save(self) -> None:
        """A disk save took a slot: a snapshot skipped for it is reported once again."""
        self._skip_reported = False

    def stop_snapshots(self) -> bool:
        """No more snapshots this attempt (the slots went off); whether any were asked for."""
        asked = bool(self.memory_every or self.auto_memory)
        self.memory_every = self.auto_memory = None
        return asked

    def settle(self) -> None:
        if self.late is not None:
            self.late.settle()

    def close(self) -> None:
        if self.late is not None:
            self.late.close()

    def _finalize_now(self, idx: int, cap: capture.Capture) -> None:
        owner = self.owner
        try:
            owner.slots.slots[idx].finalize(cap, owner.meta, owner.world)
        except OSError as e:
            owner.fail_slot(idx, e)
            return
        with self.flight.cv:
            owner.slots.done(idx)

    def _skip(self) -> None:
        run = self.owner.run
        self.skipped += 1
        run.engine.hb.set_memory_snapshots(skipped=self.skipped)
        if self.flight.job is not None and not self._skip_reported:  # the writer holds a slot: say so once
            self._skip_reported = True
            run.engine.event(Event.SAVE_SKIPPED, step=run.global_step, target="memory",
                             reason="the writer is still finalizing the other slot")

    # --- hasher thread ---------------------------------------------------------------------------

    def _hash_loop(self) -> None:
        """Complete each filled memory snapshot: copy its late tensors, hash it, write its manifest last."""
        low_priority()
        owner, flight = self.owner, self.flight
        while True:
            with flight.cv:
                while flight.hashing is None and not flight.closed:
                    flight.cv.wait()
                if flight.hashing is None:
                    return
                idx, cap, stall = flight.hashing
            slot, ok, cpu0 = owner.slots.slots[idx], False, time.thread_time()
            try:
                if self.late is not None:
                    self.late.copy()
                known = slot.hash_tensors()
                if self.late is None or self.late.verdict(lambda: flight.closed):
                    slot.commit(cap, owner.meta, owner.world, known)
                    ok = True
                    self._hashed(slot, stall, time.thread_time() - cpu0)
                else:
                    slot.invalidate()
                    owner.fail(cap.global_step, CHANGED_WHILE_COPIED)
            except BaseException as e:  # never let the hasher die silently; the slot stays incomplete
                slot.invalidate()
                if isinstance(e, OSError) and e.errno in NoRoom.ERRNOS:  # filled up since: slots off at run.step()
                    owner.out_of_room(NoRoom(slot.path, 0, describe(e)))
                owner.fail(cap.global_step, f"memory snapshot: {type(e).__name__}: {e}")
            with flight.cv:
                if ok:
                    owner.slots.done(idx)
                flight.hashing = None
                flight.cv.notify_all()

    def _hashed(self, slot: Any, stall: float, cpu: float) -> None:
        """Hasher: the snapshot is complete; its cost is settled at the next run.step() (_observe_step)."""
        if self.auto_memory is not None:  # a slot's first fill (it creates the file) is no measure
            self.auto_memory.snapshot_hashed(stall + (self.late.last_wait if self.late else 0.0) + cpu, not slot.created)

    def _observe_step(self, seconds: float) -> None:
        assert self.auto_memory is not None
        with self.flight.cv:
            hashing, writing = self.flight.hashing is not None, self.flight.job is not None
        self.auto_memory.observe_step(seconds, busy=hashing or writing, hashing=hashing)
