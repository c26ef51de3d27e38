"""events.jsonl: the run's timeline, appended to by both sides, one JSON object per line.

Every line has `time`, `event` (an `Event` value) and `attempt`, plus the event's own fields.
A consumer compares `ev["event"]` with an `Event` member (a `str` enum: equal to its value).
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Iterable
from typing import Any, Optional

from .clock import now_iso
from .errors import ContractError
from .layout import RunDir

__all__ = ["Event", "POISONED", "DIVERGED_REASON", "append_event", "read_events", "next_attempt_number", "is_poisoning",
           "poisoned_checkpoints"]


class Event(str, enum.Enum):
    """Every event name written to events.jsonl (W: who writes it)."""

    ATTEMPT_STARTED = "attempt_started"            # W supervisor: pid, resume_from, command
    ATTEMPT_ENDED = "attempt_ended"                # W supervisor: kind, exit_code, signal, step, evidence...
    RESTARTING = "restarting"                      # W supervisor: delay_s, resume_from
    FINISHED = "finished"                          # W supervisor: the job succeeded
    STOPPED = "stopped"                            # W supervisor: a requested stop; saved, step
    GAVE_UP = "gave_up"                            # W supervisor: reason
    CHECKPOINT_REJECTED = "checkpoint_rejected"    # W both: path, reason[, poisoned]
    CHECKPOINT_FAILED = "checkpoint_failed"        # W shim: path, error
    CHECKPOINT_RESHARDED = "checkpoint_resharded"  # W shim: path, from_world_size, to_world_size
    # W rank 0 when a checkpoint save returns control to training: step, kind, `seconds` (the training
    # stall of this save; for an async save only the copy into memory, not the background write) and
    # `saving_seconds` (this attempt's cumulative stall, memory snapshots included).
    CHECKPOINT_SAVED = "checkpoint_saved"
    CHECKPOINT_PERSISTED_BY_SUPERVISOR = "checkpoint_persisted_by_supervisor"  # W supervisor: a slot made durable
    SAVE_SKIPPED = "save_skipped"                  # W shim: step, target, reason (a save not taken now)
    # W shim: the memory snapshot slots do not fit where they would live, so snapshots (and the slots
    # async saves go through) are off for this attempt: reason, fix, room (slot_dir, host_memory,
    # memory_cgroup), where, need_bytes, held_bytes, margin_bytes, free_bytes, size_bytes
    MEMORY_SNAPSHOTS_OFF = "memory_snapshots_off"
    FIRST_STEP = "first_step"                      # W shim: the first run.step() of an attempt (report's timings)
    RESUME_MISMATCH = "resume_mismatch"            # W shim: path, differences, strict
    # W shim: the framework's training began at another step than the checkpoint it was meant to
    # resume from (a resume point not passed to the Trainer): path, expected_step, actual_step.
    RESUME_STEP_MISMATCH = "resume_step_mismatch"
    POLICY_APPLIED = "policy_applied"              # W supervisor: the YAML policy rule of a failure kind
    DIVERGED = "diverged"                          # W shim: step, loss, resumed_from; then EXIT_DIVERGED
    # W supervisor (--mirror): a committed checkpoint is on object storage, manifest last: path, url,
    # bytes, seconds (the upload), lag_s (commit to mirrored)
    CHECKPOINT_MIRRORED = "checkpoint_mirrored"
    # W supervisor (--mirror): uploads stopped succeeding (once per outage; retried): path, error
    MIRROR_FAILED = "mirror_failed"
    # W supervisor (--mirror): a remote checkpoint downloaded, verified and committed into the run dir: url, path, seconds
    CHECKPOINT_RESTORED_FROM_MIRROR = "checkpoint_restored_from_mirror"

    def __str__(self) -> str:  # so f-strings and logs print the bare name
        return self.value


# The `reason` of a gave_up event when divergence from a fresh state repeats (restarting cannot help).
DIVERGED_REASON = "diverged"

# The field of a checkpoint_rejected event that marks a crash-loop (poisoned) checkpoint, which
# every later supervisor must keep skipping. Older run dirs said so only by a reason prefix.
POISONED = "poisoned"


def append_event(run_dir: RunDir, event: "Event | str", attempt: Optional[int], **fields: Any) -> dict:
    """Append one event line; O_APPEND with a single write keeps concurrent writers' lines whole."""
    rec = {"time": now_iso(), "event": str(event.value if isinstance(event, Event) else event),
           "attempt": attempt, **fields}
    line = (json.dumps(rec, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(run_dir.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return rec


def read_events(run_dir: RunDir) -> list[dict]:
    """All parseable events; a torn last line (writer killed mid-write) is skipped."""
    try:
        raw = run_dir.events.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ContractError(f"{run_dir.events}: {e.strerror or e}") from e
    out = []
    for line in raw.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def next_attempt_number(events: Iterable[dict]) -> int:
    """Attempt numbers continue across supervisor restarts on the same run dir."""
    last = 0
    for ev in events:
        a = ev.get("attempt")
        if isinstance(a, int) and ev.get("event") == Event.ATTEMPT_STARTED:
            last = max(last, a)
    return last + 1


def is_poisoning(ev: dict) -> bool:
    """Whether `ev` marks its checkpoint poisoned: the `poisoned` field, or an older run dir's reason prefix."""
    if ev.get("event") != Event.CHECKPOINT_REJECTED:
        return False
    return ev.get(POISONED) is True or str(ev.get("reason", "")).startswith(POISONED)


def poisoned_checkpoints(events: Iterable[dict]) -> set[str]:
    """Paths (as written) of every checkpoint a supervisor declared poisoned in this run dir's history."""
    return {str(ev.get("path")) for ev in events if is_poisoning(ev)}
