"""Failure kinds: how an attempt ended. The supervisor decides the kind; the kind travels in
`attempt_ended` events, RESILIENT_LAST_FAILURE, the YAML `policy:` keys and metrics labels.

Where the shim itself knows why it ended, it says so in the `type` of its error record
(errors/attempt-N.json), one of the *_ERROR_TYPE values here, besides its exit code.
"""

from __future__ import annotations

import enum

__all__ = ["Kind", "DIVERGED_ERROR_TYPE", "RESUME_REFUSED_ERROR_TYPE"]

DIVERGED_ERROR_TYPE = "trainer_shim.Diverged"             # a non-finite loss: the kind is `diverged`
RESUME_REFUSED_ERROR_TYPE = "trainer_shim.ResumeRefused"  # a --strict-resume refusal (EXIT_REFUSED): never retried


class Kind(str, enum.Enum):
    """How an attempt ended; every `attempt_ended` event carries exactly one."""

    SUCCESS = "success"              # exit 0: the job is done
    PREEMPTED = "preempted"          # exit 75 after a preempt checkpoint (a requested stop, SIGTERM)
    OOM = "oom"                      # kernel OOM killer, with cgroup or kernel-log evidence
    CUDA_OOM = "cuda_oom"            # torch.OutOfMemoryError in the error file
    HANG = "hang"                    # heartbeat went stale; we killed it
    STARTUP_TIMEOUT = "startup_timeout"  # no first heartbeat in time; we killed it
    CRASH = "crash"                  # non-zero exit, Python exception
    SIGNAL = "signal"                # killed by a signal, no OOM evidence
    RENDEZVOUS = "rendezvous"        # torchrun never joined its peers; no rank ran
    DIVERGED = "diverged"            # the shim saw a non-finite loss and exited EXIT_DIVERGED unsaved
