"""Every exit code of the product, in one place: the trainer's (which the supervisor classifies)
and the commands' (which scripts and service managers read).

Two processes that agree on a number agree on this module; a bare number anywhere else is a
second copy that can drift.
"""

from __future__ import annotations

__all__ = [
    "EXIT_OK", "EXIT_CRASH", "EXIT_REFUSED", "EXIT_DIVERGED", "EXIT_PREEMPTED",
    "EXIT_GAVE_UP", "EXIT_USAGE", "EXIT_LOCKED", "EXIT_STOPPED", "EXIT_SUPERVISOR_GONE",
    "EXIT_UNHEALTHY", "EXIT_INVALID_CHECKPOINT", "EXIT_NOT_STOPPED", "EXIT_INTERRUPTED",
    "EXIT_EXACT", "EXIT_NOT_EXACT", "EXIT_DOCTOR_FAILED", "EXIT_BAD_INPUT", "EXIT_NOT_RECOVERED",
]

EXIT_OK = 0               # success, for the trainer and every command

# --- the trainer process (shim) ---------------------------------------------------------------
# An attempt that cannot go on but may succeed when restarted: the usual restart policy applies.
EXIT_CRASH = 1
# A configuration problem retrying cannot fix (a refused resume, a world size that may not reshard);
# the supervisor's default --no-restart-exit-codes holds this code.
EXIT_REFUSED = 2
# run.step(loss=...) saw a non-finite loss (EX_DATAERR): nothing is saved; the kind is `diverged`.
EXIT_DIVERGED = 65
# A preempt checkpoint was saved (EX_TEMPFAIL: "try again later"); the kind is `preempted`.
EXIT_PREEMPTED = 75

# --- `resilient-run run` (and the other commands where noted) -----------------------------------
EXIT_GAVE_UP = 1          # restarts exhausted, non-retryable exit, crash loop with nothing older
EXIT_USAGE = 2            # bad usage, config or run dir; `status` on a path that is not a run dir
EXIT_LOCKED = 3           # another live supervisor holds the run dir
EXIT_STOPPED = 75         # stopped on request after the child saved: resumable (like EXIT_PREEMPTED)
# A forked child whose supervisor died between fork and exec (before it could die with it) exits
# with this instead of running an unsupervised job.
EXIT_SUPERVISOR_GONE = 111

# --- `resilient-run status`, `checkpoints --verify`, `stop` --------------------------------------
# A command's codes are read one command at a time, so each names what it means for that command.
# These three keep 1, the shell's "no" (as grep and test answer): the liveness probes and scripts
# that test `status` already read it, and it clashes with nothing of theirs (none of the three
# gives up a job, and 2 stays bad usage for all of them).
EXIT_UNHEALTHY = 1           # `status`: not running with a fresh heartbeat and not succeeded (any node)
EXIT_INVALID_CHECKPOINT = 1  # `checkpoints --verify`: a checkpoint failed its manifest or digest check
EXIT_NOT_STOPPED = 1         # `stop`: no live supervisor here, or it still ran after --timeout

# --- every command ------------------------------------------------------------------------------
# Ctrl-C before the command handles signals itself (the shell's 128 + SIGINT); a running `run`
# handles SIGINT as a stop request and exits EXIT_STOPPED instead.
EXIT_INTERRUPTED = 130

# --- `resilient-run doctor` ---------------------------------------------------------------------
EXIT_EXACT = 0            # the interrupted run matched the uninterrupted one bit for bit
EXIT_NOT_EXACT = 1
EXIT_DOCTOR_FAILED = 3    # a run could not be completed, so nothing was compared

# --- `resilient-run drill` --------------------------------------------------------------------
# The fault was injected but no next attempt took a step: the supervisor gave up, the run ended or
# stopped, or the supervisor's own allowances ran out. 1, as for the other commands' "no" answers.
EXIT_NOT_RECOVERED = 1

# --- `python -m trainer_shim._insight.export` (run by `resilient-run export`) ----------------------------
EXIT_BAD_INPUT = 2        # not a valid checkpoint, bad format, unwritable output
