"""Typed records of the small JSON files the two sides exchange, with their to/from JSON.

Readers are tolerant where the file is rewritten while being read (heartbeats): they return None
instead of failing. `from_json` accepts what older versions wrote; `to_json` writes today's shape.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Any, Optional

from .atomic import read_json
from .errors import ContractError

__all__ = [
    "Phase", "HEARTBEAT_FIELDS", "HeartbeatRecord", "read_heartbeat", "read_heartbeat_record",
    "RunState", "SupervisorState", "ErrorRecord", "StandbyMessage",
]


class Phase(str, enum.Enum):
    """Heartbeat phase: starting -> training <-> saving | evaluating -> stopping | finished."""

    STARTING = "starting"
    TRAINING = "training"
    SAVING = "saving"
    EVALUATING = "evaluating"  # a framework's evaluation; judged with the heartbeat timeout
    STOPPING = "stopping"
    FINISHED = "finished"


def _opt_int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_str(v: Any) -> Optional[str]:
    return v if isinstance(v, str) else None


@dataclasses.dataclass(frozen=True)
class HeartbeatRecord:
    """heartbeats/rank-<R>.json, rewritten atomically by the shim.

    The supervisor judges liveness by *changes* it observes (`seq` increments on every write),
    timed on its own monotonic clock; `time` (wall clock) is informative only. `step` is the step
    of the last beat (beats are rate-limited: the step mark has the last step really reached).
    """

    pid: int
    rank: int = 0
    attempt: int = 1
    step: int = 0
    epoch: int = 0
    loss: Optional[float] = None
    phase: str = Phase.STARTING.value
    time: Optional[str] = None
    checkpoint_step: Optional[int] = None     # newest committed checkpoint, or None
    seq: int = 0
    resumed_from: Optional[str] = None        # dir actually loaded, after any fallback; None when fresh
    save_bytes: Optional[int] = 0             # bytes written so far while phase is "saving"
    node: Optional[int] = None                # set only in a multi-node job
    total_steps: Optional[int] = None         # the run's length in steps, once the shim knows it (progress, ETA)
    save_interval_s: Optional[float] = None   # the current automatic save interval, when there is one
    memory_snapshots_skipped: Optional[int] = None  # due memory snapshots skipped (the previous one still hashing)
    memory_every_steps: Optional[int] = None  # the current memory snapshot interval, with memory_every_steps="auto"
    loss_step: Optional[int] = None           # the step `loss` was logged at (a framework logs every N steps)
    memory_snapshots_off_reason: Optional[str] = None  # why this attempt takes no memory snapshots (slots too big)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        for k in _OMITTED_WHEN_NONE:  # keys a beat carries only once they have a value
            if d[k] is None:
                del d[k]
        return d

    @classmethod
    def from_json(cls, d: Any) -> Optional["HeartbeatRecord"]:
        """The record, or None when `d` is not a heartbeat (no integer pid).

        A field of the wrong type, or missing, takes its default (a reader must not fail on a beat
        that an older or newer shim wrote); unknown keys are ignored.
        """
        if not isinstance(d, dict) or _opt_int(d.get("pid")) is None:
            return None
        kw = {f.name: d[f.name] for f in dataclasses.fields(cls)
              if f.name in d and _HB_CHECKS[f.name](d[f.name])}
        return cls(**kw)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# Per field: does a JSON value fit it? (None only where the field is Optional.)
_HB_CHECKS: dict[str, Any] = {
    **dict.fromkeys(("pid", "rank", "attempt", "step", "epoch", "seq"), _is_int),
    **dict.fromkeys(("checkpoint_step", "save_bytes", "node", "total_steps", "memory_snapshots_skipped",
                     "memory_every_steps", "loss_step"), lambda v: v is None or _is_int(v)),
    **dict.fromkeys(("loss", "save_interval_s"), lambda v: v is None or _is_num(v)),
    "phase": lambda v: isinstance(v, str),
    **dict.fromkeys(("time", "resumed_from", "memory_snapshots_off_reason"), lambda v: v is None or isinstance(v, str)),
}
_OMITTED_WHEN_NONE = ("node", "total_steps", "save_interval_s", "memory_snapshots_skipped", "memory_every_steps",
                      "loss_step", "memory_snapshots_off_reason")

HEARTBEAT_FIELDS = tuple(f.name for f in dataclasses.fields(HeartbeatRecord) if f.name not in _OMITTED_WHEN_NONE)


def read_heartbeat(path: Path) -> Optional[dict]:
    """The heartbeat as a dict, or None when absent or torn (a reader never fails on it)."""
    try:
        hb = read_json(path)
    except ContractError:
        return None
    return hb if isinstance(hb, dict) else None


def read_heartbeat_record(path: Path) -> Optional[HeartbeatRecord]:
    """The heartbeat as a typed record, or None when absent, torn or not a heartbeat."""
    return HeartbeatRecord.from_json(read_heartbeat(path))


class RunState(str, enum.Enum):
    """supervisor.json's `state`.

    STARTING -> RUNNING (an attempt's child is up) -> RESTARTING (it ended; backoff) -> RUNNING ...
    and from any of them to a final state: SUCCEEDED (exit 0), FAILED (gave up, exit 1) or
    STOPPED (stop requested and the child saved, exit 75).
    """

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def final(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED)


@dataclasses.dataclass(frozen=True)
class SupervisorState:
    """supervisor.json, rewritten atomically by the live supervisor (and read by `status`/`stop`).

    The child's pid comes with its create time and command line, so a later supervisor can tell
    a leftover trainer from an unrelated process that reused the pid.
    """

    state: str
    supervisor_pid: int
    node: Optional[int] = None
    host: Optional[str] = None
    supervisor_create_time: Optional[float] = None
    child_pid: Optional[int] = None
    child_create_time: Optional[float] = None
    child_cmdline: Optional[list[str]] = None
    attempt: Optional[int] = None
    restarts: int = 0
    started_at: Optional[str] = None
    updated_at: Optional[str] = None
    config: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> "SupervisorState":
        if not isinstance(d, dict) or not isinstance(d.get("state"), str) or _opt_int(d.get("supervisor_pid")) is None:
            raise ContractError("supervisor.json is not a supervisor state (needs state and supervisor_pid)")
        # An optional field of the wrong type takes its default: readers (status, stop) must not fail on it.
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d and _SUP_CHECKS[f.name](d[f.name])})

    @classmethod
    def read(cls, path: Path) -> "SupervisorState":
        """Parse supervisor.json; ContractError (one line) when missing, unreadable or malformed."""
        d = read_json(path)
        try:
            return cls.from_json(d)
        except ContractError as e:
            raise ContractError(f"{path}: {e}") from e


_SUP_CHECKS: dict[str, Any] = {
    "state": lambda v: isinstance(v, str),
    **dict.fromkeys(("supervisor_pid", "restarts"), _is_int),
    **dict.fromkeys(("node", "child_pid", "attempt"), lambda v: v is None or _is_int(v)),
    **dict.fromkeys(("host", "started_at", "updated_at"), lambda v: v is None or isinstance(v, str)),
    **dict.fromkeys(("supervisor_create_time", "child_create_time"), lambda v: v is None or _is_num(v)),
    "child_cmdline": lambda v: v is None or (isinstance(v, list) and all(isinstance(a, str) for a in v)),
    "config": lambda v: isinstance(v, dict),
}


@dataclasses.dataclass(frozen=True)
class ErrorRecord:
    """errors/attempt-N[-rank-R].json: a trainer's uncaught exception (written by the shim)."""

    type: str
    message: str
    traceback: str = ""
    step: Optional[int] = None
    time: Optional[str] = None
    loss: Optional[str] = None           # a divergence: the non-finite loss, as repr() wrote it
    resumed_from: Optional[str] = None   # a divergence: the checkpoint this attempt started from

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> Optional["ErrorRecord"]:
        """The record, or None when `d` is not one (a reader reports what it can, never fails)."""
        if not isinstance(d, dict) or not isinstance(d.get("type"), str):
            return None
        return cls(type=d["type"], message=str(d.get("message", "")), traceback=str(d.get("traceback") or ""),
                   step=_opt_int(d.get("step")), time=_opt_str(d.get("time")), loss=_opt_str(d.get("loss")),
                   resumed_from=_opt_str(d.get("resumed_from")))


@dataclasses.dataclass(frozen=True)
class StandbyMessage:
    """The one stdin line the supervisor sends a prestarted launcher (trainer_shim._launch.standby)."""

    env: dict[str, str]

    def to_line(self) -> bytes:
        return (json.dumps({"env": self.env}) + "\n").encode()

    @classmethod
    def from_line(cls, line: "str | bytes") -> Optional["StandbyMessage"]:
        """The message, or None for an empty line / EOF (the standby is not needed)."""
        if not line.strip():
            return None
        d = json.loads(line)
        if not isinstance(d, dict) or not isinstance(d.get("env"), dict):
            raise ContractError("standby message has no env object")
        return cls({str(k): str(v) for k, v in d["env"].items()})
