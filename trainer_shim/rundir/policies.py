"""Contract facts of issue 16 (smarter policies): divergence, provenance refusal, learned timeouts.

Event names live in events.Event (DIVERGED, RESUME_MISMATCH, POLICY_APPLIED).
"""

from __future__ import annotations

__all__ = [
    "EXIT_DIVERGED", "KIND_DIVERGED", "DIVERGED_REASON", "DIVERGED_ERROR_TYPE", "RESUME_REFUSED_ERROR_TYPE",
    "ENV_STRICT_RESUME", "ON_NONFINITE_CHOICES", "LEARNED_TIMEOUTS_FILE",
]

# The shim exits with this when run.step(loss=...) saw a non-finite loss (EX_DATAERR): the state is
# not saved, and the supervisor classifies the attempt as `diverged`.
EXIT_DIVERGED = 65
KIND_DIVERGED = "diverged"
DIVERGED_REASON = "diverged"          # gave_up reason when divergence from fresh state repeats
DIVERGED_ERROR_TYPE = "trainer_shim.Diverged"             # `type` of the error record of a diverged attempt
RESUME_REFUSED_ERROR_TYPE = "trainer_shim.ResumeRefused"  # error record of a --strict-resume refusal (exit 2)

# "1": a provenance mismatch on resume is an exit-2 refusal (set by `resilient-run --strict-resume`).
ENV_STRICT_RESUME = "RESILIENT_STRICT_RESUME"

ON_NONFINITE_CHOICES = ("raise", "ignore", "skip")

# `--heartbeat-timeout auto`: per-phase heartbeat intervals the supervisor learned (inherited by restarts).
LEARNED_TIMEOUTS_FILE = "heartbeat_timeouts.json"
