"""Memory snapshots, the part of async_save.FastSaver that takes and completes them: run.step()
copies into a free slot (or skips), the HASHER thread copies the optimizer's tensors (late_copy),
hashes the slot and writes its manifest last; memory_every_steps="auto" measures what each one
cost training (memory_interval). A mixin: FastSaver provides run, world, slots, the condition `_cv`,
the in-flight `_job`/`_hashing`, late, auto_memory, `_no_room` (a slot file found no room: the
slots go off at the next run.step()) and the writer's _fill/_fail/_fail_slot/_busy."""

from __future__ import annotations

import time
from typing import Any, Optional

from .late_copy import CHANGED_WHILE_COPIED
from .slots import NoRoom
from .._session.messages import describe
from .writer import low_priority
from ..rundir import CheckpointKind, Event
from .._state import capture



class SnapshotHasher:
    run: Any
    world: int
    slots: Any
    late: Any
    auto_memory: Any
    memory_every: Optional[int]
    skipped: int
    _cv: Any
    _job: Any
    _hashing: Any
    _closed: bool
    _no_room: Optional[NoRoom]
    _skip_reported: bool
    _last_step_t: Optional[float]
    _last_memory_step: int

    # --- training thread ------------------------------------------------------------------------

    def _memory_due(self, step: int) -> bool:
        if self.auto_memory is None:
            return bool(self.memory_every and step % self.memory_every == 0)
        now = time.monotonic()
        if self._last_step_t is not None:
            self._observe_step(now - self._last_step_t)
            self.run.engine.hb.set_memory_snapshots(every=self.auto_memory.every)
        self._last_step_t = now
        return step - self._last_memory_step >= self.auto_memory.every  # a skipped one is retried next step

    def memory_snapshot(self) -> None:
        """One copy into a free slot; the hasher completes it. Skipped when no slot is free."""
        with self._cv:
            idx = self.slots.target(self._busy()) if self._hashing is None else None
            if idx is None:
                self._skip()
                return
        t0 = time.perf_counter()
        cap = self._fill(idx, CheckpointKind.STEP, protected=self.late.protected() if self.late else None)
        if cap is not None and self.late is not None:
            self.late.begin(self.slots.slots[idx])
        if cap is not None and self.world > 1:
            # N ranks hash on the training thread: a kill then finds every rank's slot of this
            # step complete, and the supervisor merges slots of one step only.
            self._finalize_now(idx, cap)
        elif cap is not None:
            self._last_memory_step = cap.global_step
            with self._cv:
                self._hashing = (idx, cap, time.perf_counter() - t0)
                if self.auto_memory is not None:
                    self.auto_memory.snapshot_started()
                self._cv.notify_all()

    def _finalize_now(self, idx: int, cap: capture.Capture) -> None:
        try:
            self.slots.slots[idx].finalize(cap, self.meta, self.world)
        except OSError as e:
            self._fail_slot(idx, e)
            return
        with self._cv:
            self.slots.done(idx)

    def _skip(self) -> None:
        self.skipped += 1
        self.run.engine.hb.set_memory_snapshots(skipped=self.skipped)
        if self._job is not None and not self._skip_reported:  # the writer holds a slot: say so once
            self._skip_reported = True
            self.run.engine.event(Event.SAVE_SKIPPED, step=self.run.global_step, target="memory",
                                  reason="the writer is still finalizing the other slot")

    # --- hasher thread ---------------------------------------------------------------------------

    def _hash_loop(self) -> None:
        """Complete each filled memory snapshot: copy its late tensors, hash it, write its manifest last."""
        low_priority()
        while True:
            with self._cv:
                while self._hashing is None and not self._closed:
                    self._cv.wait()
                if self._hashing is None:
                    return
                idx, cap, stall = self._hashing
            slot, ok, cpu0 = self.slots.slots[idx], False, time.thread_time()
            try:
                if self.late is not None:
                    self.late.copy()
                known = slot.hash_tensors()
                if self.late is None or self.late.verdict(lambda: self._closed):
                    slot.commit(cap, self.meta, self.world, known)
                    ok = True
                    self._hashed(slot, stall, time.thread_time() - cpu0)
                else:
                    slot.invalidate()
                    self._fail(cap.global_step, CHANGED_WHILE_COPIED)
            except BaseException as e:  # never let the hasher die silently; the slot stays incomplete
                slot.invalidate()
                if isinstance(e, OSError) and e.errno in NoRoom.ERRNOS:  # filled up since: slots off at run.step()
                    self._no_room = NoRoom(slot.path, 0, describe(e))
                self._fail(cap.global_step, f"memory snapshot: {type(e).__name__}: {e}")
            with self._cv:
                if ok:
                    self.slots.done(idx)
                self._hashing = None
                self._cv.notify_all()

    def _hashed(self, slot: Any, stall: float, cpu: float) -> None:
        """Hasher: the snapshot is complete; its cost is settled at the next run.step() (_observe_step)."""
        if self.auto_memory is not None:  # a slot's first fill (it creates the file) is no measure
            self.auto_memory.snapshot_hashed(stall + (self.late.last_wait if self.late else 0.0) + cpu, not slot.created)

    def _observe_step(self, seconds: float) -> None:
        assert self.auto_memory is not None
        with self._cv:
            hashing, writing = self._hashing is not None, self._job is not None
        self.auto_memory.observe_step(seconds, busy=hashing or writing, hashing=hashing)

    def _settle(self) -> None:
        if self.late is not None:
            self.late.settle()
