"""Doctor mode: the digest log the shim appends to and `resilient-run doctor` compares, and the
faults the shim injects on itself. The variables that switch it on live in env.py (RunEnv)."""

from __future__ import annotations

__all__ = ["MARK_STEP", "MARK_BATCH", "MARK_EPOCH", "FAULT_KILL", "FAULT_RAISE", "parse_faults"]

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
