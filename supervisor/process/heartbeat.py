"""Heartbeat watching: file events (watchdog) plus a timer, judged on our own monotonic clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from trainer_shim.rundir import HeartbeatRecord, Phase, RunDir, read_heartbeat_record

from ..decisions.classify import Kind
from ..config import Config

__all__ = ["allowance", "Stale", "HeartbeatMonitor", "HeartbeatEvents", "EXIT_FLOOR_S"]

EXIT_FLOOR_S = 15.0   # the least a process whose work is committed gets to exit


def allowance(phase: Optional[str], config: Config) -> float:
    """Seconds a heartbeat may stay unchanged in `phase` before the job counts as hung.

    Loading a big checkpoint (`starting`) and a long fsync (`saving`) legitimately go quiet
    longer than a training step may.
    """
    if phase == Phase.STARTING.value:
        return max(config.heartbeat_timeout, config.startup_timeout)
    if phase == Phase.SAVING.value:
        return max(config.heartbeat_timeout, config.save_timeout)
    if phase in (Phase.FINISHED.value, Phase.STOPPING.value):
        # The final (or preempt) checkpoint is committed; only the exit is left, and interpreter,
        # process-group and DataLoader teardown take seconds on a loaded box (a bare `import
        # torch` took 1.1 s to exit under load 5 here). Nothing is at risk while it exits, so it
        # gets at least EXIT_FLOOR_S; a process that never exits must still not hold the job forever.
        return max(config.heartbeat_timeout, config.grace_period, EXIT_FLOOR_S)
    return config.heartbeat_timeout


@dataclasses.dataclass(frozen=True)
class Stale:
    """A verdict that the attempt is not alive: `kind` is Kind.HANG or Kind.STARTUP_TIMEOUT."""

    kind: Kind
    detail: str
    rank: Optional[int] = None


@dataclasses.dataclass
class _Track:
    key: Any
    changed_at: float
    record: HeartbeatRecord


class HeartbeatMonitor:
    """Per-rank liveness of one attempt: a heartbeat is alive while its content keeps changing.

    Change is observed, and timed, here: the trainer's wall-clock `time` field and the file's
    mtime are never trusted, so clock jumps on either side cannot fake a hang or hide one.
    """

    def __init__(self, run_dir: RunDir, attempt: int, config: Config, spawned_at: float, learner: Any = None) -> None:
        self.run_dir, self.attempt, self.config, self.spawned_at = run_dir, attempt, config, spawned_at
        self.tracks: dict[int, _Track] = {}
        self.learner = learner   # learned_timeout.TimeoutLearner under --heartbeat-timeout auto

    def observe(self, now: float) -> None:
        """Read every rank's heartbeat and note which changed since the last look."""
        for _, path in self.run_dir.heartbeat_files():
            hb = read_heartbeat_record(path)
            if hb is None or hb.attempt != self.attempt or not self.run_dir.owns_heartbeat(hb):
                continue  # torn, left over from an earlier attempt, or another node's rank
            key = (hb.pid, hb.seq, hb.step, hb.phase, hb.save_bytes)
            t = self.tracks.get(hb.rank)
            if t is None or t.key != key:
                if t is not None and self.learner is not None:
                    self.learner.record(t.record.phase, now - t.changed_at)
                self.tracks[hb.rank] = _Track(key, now, hb)

    def restart_clock(self, now: float) -> None:
        """Judge the attempt as if it started at `now`: time it could not have used to beat (its
        trainer waited for the download of its checkpoint) counts against neither its start-up nor
        the phase it is in."""
        self.spawned_at = now
        for t in self.tracks.values():
            t.changed_at = now

    @property
    def first(self) -> Optional[HeartbeatRecord]:
        """Rank 0's latest heartbeat (or any rank's when rank 0 has none)."""
        if 0 in self.tracks:
            return self.tracks[0].record
        return next(iter(self.tracks.values())).record if self.tracks else None

    def verdict(self, now: float) -> Optional[Stale]:
        if not self.tracks:
            waited = now - self.spawned_at
            if waited > self.config.startup_timeout:
                return Stale(Kind.STARTUP_TIMEOUT, f"no heartbeat {waited:.1f}s after start (--startup-timeout {self.config.startup_timeout:g})")
            return None
        for rank, t in sorted(self.tracks.items()):
            # `finished` is judged too: a process that never exits after finish() (a worker
            # join that blocks) must not hold the job forever.
            phase = t.record.phase
            limit, rule = self._limit(phase)
            age = now - t.changed_at
            if age > limit:
                return Stale(Kind.HANG, f"rank {rank} heartbeat unchanged for {age:.1f}s (phase {phase}, step {t.record.step}, "
                                     f"limit {limit:g}s{rule})", rank)
        return None

    def next_deadline(self, now: float) -> float:
        """When the earliest verdict could change, so the loop can sleep until then."""
        if not self.tracks:
            return self.spawned_at + self.config.startup_timeout
        return min(t.changed_at + self._limit(t.record.phase)[0] for t in self.tracks.values())

    def _limit(self, phase: Optional[str]) -> tuple[float, str]:
        """(seconds, how the rule reads in a hang's evidence)."""
        learned = self.learner.limit(phase) if self.learner is not None else None
        if learned is not None:
            return learned.seconds, f", {learned.rule}"
        return allowance(phase, self.config), ""


# A finished write: the shim renames into place; other writers close after writing.
_WRITE_EVENTS = frozenset({"created", "moved", "closed"})


class HeartbeatEvents:
    """Wakes the supervisor loop on heartbeat file events; the loop's timer covers NFS, where inotify is blind."""

    def __init__(self, directory: Path, wake: Callable[[], None]) -> None:
        self._observer: Any = None
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:  # pragma: no cover - watchdog is a hard dependency
            return

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                # Only writes count: watchdog also reports opens and read-only closes, and our
                # own reads of the heartbeat would then wake us in a busy loop.
                if event.event_type in _WRITE_EVENTS:
                    wake()

        try:
            self._observer = Observer()
            try:
                from watchdog.events import FileClosedEvent, FileCreatedEvent, FileMovedEvent

                self._observer.schedule(_Handler(), str(directory), recursive=False, event_filter=[
                    FileCreatedEvent, FileMovedEvent, FileClosedEvent])
            except (ImportError, TypeError):  # watchdog < 4 has no event_filter
                self._observer.schedule(_Handler(), str(directory), recursive=False)
            self._observer.daemon = True
            self._observer.start()
        except OSError:
            self._observer = None  # inotify limits reached: the timer alone still works

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
            self._observer = None
