"""Doctor mode (RESILIENT_DOCTOR*), the digest-log record kinds and the events `report` prices
failures with: first_step and checkpoint_saved (issue 15).
"""

from __future__ import annotations

__all__ = [
    "ENV_DOCTOR", "ENV_DOCTOR_FAULTS", "ENV_DOCTOR_STEPS", "EVENT_FIRST_STEP", "EVENT_CHECKPOINT_SAVED",
    "MARK_STEP", "MARK_BATCH", "MARK_EPOCH", "FAULT_KILL", "FAULT_RAISE", "parse_faults",
]

# Doctor mode (agreed name): the path of the per-step digest log (JSON lines) the shim appends to.
ENV_DOCTOR = "RESILIENT_DOCTOR"
# Faults the shim injects on itself in doctor mode: "17:kill,41:raise" (first time a step is reached).
ENV_DOCTOR_FAULTS = "RESILIENT_DOCTOR_FAULTS"
# In doctor mode the shim finishes the run cleanly once this step is reached.
ENV_DOCTOR_STEPS = "RESILIENT_DOCTOR_STEPS"

# Event the shim appends at the first run.step() of an attempt (report: restore and first-step times).
EVENT_FIRST_STEP = "first_step"
# Event rank 0 appends when a checkpoint save returns control to training: step, kind, `seconds` (the
# training stall of this save; for an async save only the copy into memory, not the background
# write) and `saving_seconds` (this attempt's cumulative stall, memory snapshots included).
EVENT_CHECKPOINT_SAVED = "checkpoint_saved"

# Digest-log record kinds ("at" field): at run.step(), when the next batch is handed out, at epoch end.
MARK_STEP = "step"
MARK_BATCH = "batch"
MARK_EPOCH = "epoch_end"

FAULT_KILL = "kill"
FAULT_RAISE = "raise"


def parse_faults(spec: str) -> dict[int, str]:
    """'17:kill,41:raise' -> {17: 'kill', 41: 'raise'}; ValueError (one line) on bad input."""
    out: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        step, _, kind = part.partition(":")
        kind = kind or FAULT_KILL
        if not step.isdigit() or int(step) <= 0 or kind not in (FAULT_KILL, FAULT_RAISE):
            raise ValueError(f"bad fault {part!r}; use STEP[:kill|raise], e.g. 17:kill,41:raise")
        out[int(step)] = kind
    return out
