"""The raw loop's checkpoint engine: the collaborators that saving, restoring, async saves, the
probe, provenance and divergence share, passed to them explicitly with public attributes.

`Run` (the loop API) builds one `Engine` and hands it (as `run.engine`) to the modules it uses;
those modules never reach into the Run's own underscore attributes, and none of them imports
`run`: dependencies flow one way, run -> engine pieces -> contract.

Engine        the group (collectives), heartbeat, reporter, save timer, retention, fast saver, and
              the save/restore bookkeeping (last checkpoint size, rejected paths, ...)
Stream        where the training stream stands beyond step/epoch/batch (its loader, RNG, resume data)
Reporter      events and "trainer_shim: ..." lines: the one place that prints or appends an event
Trained       what the engine reads and sets on the training side (a Run is one)
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Protocol

from .. import rundir
from .heartbeat import Heartbeat
from .save_time import SaveTimer
from .messages import say
from ..rundir import Event

__all__ = ["say", "Reporter", "Stream", "Engine", "Trained", "Group", "Solo", "exit_at_once"]


class Group(Protocol):
    """The collectives of this process's world: `Solo` for a world of one, `distributed.Dist` (loaded
    only when WORLD_SIZE > 1) for a torch.distributed job."""

    rank: int
    world_size: int
    group: Any

    def guard(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any: ...
    def barrier(self, what: str) -> None: ...
    def broadcast(self, obj: Any, what: str) -> Any: ...
    def all_gather(self, obj: Any, what: str) -> list: ...
    def agree(self, stop: bool, save: bool) -> tuple[bool, bool]: ...
    def destroy(self) -> None: ...


class Solo:
    """A world of one: the Group interface with no torch.distributed call (nothing to agree on)."""

    rank = 0
    world_size = 1
    group = None

    def guard(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def barrier(self, what: str) -> None:
        pass

    def broadcast(self, obj: Any, what: str) -> Any:
        return obj

    def all_gather(self, obj: Any, what: str) -> list:
        return [obj]

    def agree(self, stop: bool, save: bool) -> tuple[bool, bool]:
        return stop, save

    def destroy(self) -> None:
        pass



class Reporter:
    """Appends this attempt's events to the run dir; a storage failure is a warning, never an error."""

    def __init__(self, rd: rundir.RunDir, attempt: int) -> None:
        self.rd = rd
        self.attempt = attempt

    def event(self, event: Event, **fields: Any) -> None:
        try:
            rundir.append_event(self.rd, event, self.attempt, **fields)
        except OSError as e:
            say(f"warning: cannot append to {self.rd.events}: {e}")

    def rejected(self, path: Path, reason: str) -> None:
        """A checkpoint this process refused to resume from: one warning, one checkpoint_rejected event."""
        say(f"warning: rejected checkpoint {path}: {reason}")
        self.event(Event.CHECKPOINT_REJECTED, path=str(path), reason=reason)

    def checkpoint_failed(self, path: Path, step: Optional[int], error: str, *, what: str = "checkpoint",
                          background: bool = False, event: bool = True, now: bool = True) -> str:
        """A checkpoint (or memory snapshot: `what`) of `step` at `path` that did not commit: one
        checkpoint_failed event (unless the writer recorded it already) and one warning in the same
        words for every front end and writer; training continues. `now=False`: the warning is
        returned for the training thread to say (a background writer's), not said here."""
        if event:
            self.event(Event.CHECKPOINT_FAILED, path=str(path), error=error, **({"background": True} if background else {}))
        kind = f"background {what}" if background else what
        line = f"warning: {kind}{'' if step is None else f' at step {step}'} failed in {path.parent}: {error}; " \
               "training continues"
        if now:
            say(line)
        return line


@dataclasses.dataclass
class Stream:
    """The training stream's position beyond step/epoch/batch (saved with, and restored into, a checkpoint)."""

    loader: Any = None                   # the loader of the training stream (for stateful ones)
    epoch_rng: Optional[dict] = None     # RNG right before this epoch's iterator was built
    resume: Optional[dict] = None        # mid-epoch resume data, used by run.batches()
    in_epochs: bool = False              # inside run.epochs()


# The engine's collaborators from rooms above this one, as the engine's users see them (protocols: a
# room below may not import the rooms that build them).

class RetentionApi(Protocol):
    """_disk.retention.Retention: the index and rotation of the checkpoint roots."""

    committed_step: Optional[int]
    resumed_step: Optional[int]

    def add(self, path: Path, manifest: rundir.Manifest) -> None: ...
    def rotate(self, placeholder: Any = None, protect: Iterable[str] = ()) -> None: ...
    def upgrade_kind(self, path: Path, kind: rundir.CheckpointKind) -> None: ...
    def join(self) -> None: ...


class FastSaverApi(Protocol):
    """_memory.saver.FastSaver: memory snapshots and background disk writes."""

    committed_step: Optional[int]   # newest step its writer thread committed to disk

    def on_step(self, disk_due: bool) -> None: ...
    def drain(self, timeout: Optional[float] = None) -> bool: ...
    def close(self, free: bool) -> None: ...
    def before_restore(self) -> Any: ...


class ProvenanceApi(Protocol):
    """_policies.provenance.Provenance: what every manifest records of the code and arguments."""

    strict: bool

    @property
    def meta(self) -> dict[str, Any]: ...
    def settle(self) -> None: ...


class IntervalTuner(Protocol):
    """_policies.save_interval.AutoInterval: save_every_seconds="auto", re-tuned by every save's stall."""

    @property
    def interval_s(self) -> float: ...
    def observe_save(self, stall_s: float) -> float: ...


@dataclasses.dataclass
class Engine:
    """One training process's checkpoint machinery; built by `Run` in the order its parts need."""

    reporter: Reporter
    group: Group
    hb: Heartbeat = None  # type: ignore[assignment]  # set by the front end before anything beats
    saves: Optional[SaveTimer] = None              # set by the front end with the heartbeat
    retention: Optional[RetentionApi] = None       # from the first save or restore on
    fast: Optional[FastSaverApi] = None            # when async_save/memory_every_steps is on
    auto: Optional[IntervalTuner] = None           # save_every_seconds="auto"
    provenance: Optional[ProvenanceApi] = None     # recorded in every manifest
    stream: Stream = dataclasses.field(default_factory=Stream)
    last_size: int = 0                   # bytes of the last checkpoint (free-space check)
    last_save_t: float = dataclasses.field(default_factory=time.monotonic)
    rejected_paths: set = dataclasses.field(default_factory=set)  # real paths this process refused
    live_state_changed: bool = False     # a rejected checkpoint wrote into live tensors (restoring)
    dirty: bool = False                  # an optimizer.step() ran since the last run.step()
    finished: bool = False               # finished, or ended on purpose: no emergency checkpoint

    def event(self, event: Event, **fields: Any) -> None:
        self.reporter.event(event, **fields)

    def on_progress(self, nbytes: int) -> None:
        """Bytes written so far by the save in progress (shown in the heartbeat)."""
        self.hb.save_bytes = nbytes

    def reset(self) -> None:
        """Back to a fresh start's bookkeeping (before a restore)."""
        self.stream = Stream()
        self.last_size = 0
        self.last_save_t = time.monotonic()
        self.rejected_paths = set()
        self.live_state_changed = False
        self.dirty = False
        self.finished = False

    def exit_now(self, code: int) -> None:
        """End the process with `code` at once (see exit_at_once); nothing is saved on the way out."""
        self.finished = True
        exit_at_once(self.hb, code)


def exit_at_once(hb: Heartbeat, code: int) -> None:
    """End the process with `code` at once, its error record already written: os._exit, so that no
    atexit/excepthook path saves the state (diverged, or refused); DDP peers see the rank go."""
    hb.stop()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


class Trained(Protocol):
    """What the engine's modules read of the training side (they set nothing: the Run applies what they return)."""

    engine: Engine
    session: Any                  # the session core (_session.core.Session)
    rd: rundir.RunDir
    env: rundir.RunEnv
    launcher: rundir.LauncherEnv
    options: Any
    rank: int
    world_size: int
    sharded: bool
    allow_reshard: bool
    strict_resume: bool
    model: Any
    optimizer: Any
    scheduler: Any
    scaler: Any
    extra: dict
    state: dict
    global_step: int
    epoch: int
    batch_in_epoch: int
    loss: Optional[float]
    resumed_from: Optional[str]
    checkpoint_step: Optional[int]

    @property
    def search_dirs(self) -> list[Path]: ...
