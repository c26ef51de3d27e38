"""Heartbeat file writer: the training loop only stamps fields; a background thread does the I/O.

Liveness is judged by the supervisor from `seq` changes, so this thread never beats on its
own while training (a hung loop must go stale). The one exception is a running save: it then
beats every interval, but only if save_bytes advanced (a stuck save goes stale too).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Optional

from .. import rundir
from .messages import say
from ..rundir import HeartbeatRecord, Phase


class Heartbeat:
    """Owns heartbeats/rank-<R>.json for this process."""

    def __init__(self, path: Path, *, rank: int, attempt: int, interval: float, node: Optional[int] = None) -> None:
        self.path = Path(path)
        self.interval = max(0.0, float(interval))
        # The fields the loop stamps; every write goes through HeartbeatRecord, so a key the
        # contract does not know fails here, in the shim's tests, not silently in the supervisor.
        # `node` is set only in a multi-node job: a node's supervisor judges only its own ranks.
        self._fields: dict[str, Any] = HeartbeatRecord(pid=os.getpid(), rank=rank, attempt=attempt, node=node).to_json()
        self.save_bytes = 0          # bumped by the checkpoint writer, read by the thread
        self._saving = False
        self._last_bytes = 0
        self._lock = threading.Lock()  # serialises file writes and seq
        self._wake = threading.Event()
        self._stop = False
        self._warned = False
        self._thread: Optional[threading.Thread] = None

    # --- what the next beat says (typed setters; every field is the contract's HeartbeatRecord) -----

    def value(self, name: str) -> Any:
        """A field as the next beat will write it."""
        return self._fields[name]

    def progress(self, step: int, epoch: int, loss: Optional[float] = None,
                 phase: Optional[Phase] = Phase.TRAINING) -> bool:
        """Where training stands (a loss or phase of None keeps the last one); True when the phase changed."""
        f = self._fields
        changed = phase is not None and f["phase"] != phase.value
        f["step"], f["epoch"] = step, epoch
        if phase is not None:
            f["phase"] = phase.value
        if loss is not None:
            f["loss"] = loss
        return changed

    def set_epoch(self, epoch: int) -> None:
        self._fields["epoch"] = epoch

    def set_loss(self, loss: Optional[float], step: Optional[int] = None) -> None:
        """The newest loss; `step`: the step it was logged at, when a framework logs every N steps."""
        self._fields["loss"] = loss
        if step is not None:
            self._fields["loss_step"] = step

    def set_checkpoint(self, step: Optional[int], resumed_from: Optional[str] = None) -> None:
        """The newest committed checkpoint's step (and, after a restore, the checkpoint resumed)."""
        self._fields["checkpoint_step"] = step
        if resumed_from is not None:
            self._fields["resumed_from"] = resumed_from

    def set_total_steps(self, total: int) -> None:
        self._fields["total_steps"] = int(total)

    def set_save_interval(self, seconds: float) -> None:
        self._fields["save_interval_s"] = round(seconds, 3)

    def set_memory_snapshots(self, *, every: Optional[int] = None, skipped: Optional[int] = None,
                             off: Optional[str] = None) -> None:
        """memory_every_steps="auto"'s current interval; the snapshots skipped (one still hashing); why
        they are off for this attempt (`status` shows it)."""
        if every is not None:
            self._fields["memory_every_steps"] = every
        if skipped is not None:
            self._fields["memory_snapshots_skipped"] = skipped
        if off is not None:
            with self._lock:  # a key the beats did not carry yet: not while the writer reads the fields
                self._fields["memory_snapshots_off_reason"] = off

    # --- main-thread side ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="trainer_shim-heartbeat", daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Ask the writer thread for one beat with the current fields (never blocks)."""
        self._wake.set()

    def write_now(self, **fields: Any) -> None:
        """Synchronous beat, for phases that must be on disk before we go on (starting, stopping, finished)."""
        self._fields.update(fields)
        self._write()

    def begin_save(self) -> None:
        self.save_bytes = 0
        self._last_bytes = 0
        self._fields["save_bytes"] = 0
        self._fields["phase"] = Phase.SAVING.value
        self._saving = True
        self._write()

    def end_save(self, **fields: Any) -> None:
        self._saving = False
        self._fields.update(fields)
        self._fields["phase"] = Phase.TRAINING.value
        self._fields["save_bytes"] = self.save_bytes
        self._write()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    # --- writer thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        # Wakes every interval, but outside a save a timeout never writes anything.
        while not self._stop:
            woke = self._wake.wait(timeout=self.interval or 1.0)
            if self._stop:
                return
            if woke:
                self._wake.clear()
                self._write()
            elif self._saving:
                cur = self.save_bytes
                if cur != self._last_bytes:
                    self._last_bytes = cur
                    self._fields["save_bytes"] = cur
                    self._write()

    def _write(self) -> None:
        with self._lock:
            self._fields["seq"] += 1
            self._fields["time"] = rundir.now_iso()
            rec = HeartbeatRecord(**self._fields).to_json()
            try:
                rundir.atomic_write_json(self.path, rec, durable=False)
            except OSError as e:
                # A lost heartbeat must never stop training; say so once.
                if not self._warned:
                    self._warned = True
                    say(f"warning: cannot write heartbeat {self.path}: {e}")
