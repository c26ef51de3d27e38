"""Classify how an attempt ended: exactly one failure kind, with the evidence that decided it."""

from __future__ import annotations

import dataclasses
import signal
from typing import Optional

from trainer_shim.rundir import DIVERGED_ERROR_TYPE, EXIT_DIVERGED, EXIT_OK, EXIT_PREEMPTED, ErrorRecord, Kind

from ..process.below import DeathBelow
from ..process.launch import ProcessFailure, RendezvousFailure

# Kind is defined by the contract (the shim and the user's script read it too); re-exported here.
__all__ = ["Kind", "AttemptFacts", "classify", "is_cuda_oom"]


@dataclasses.dataclass(frozen=True)
class AttemptFacts:
    """What the supervisor observed about one ended attempt (plain data, so tests can build it)."""

    returncode: Optional[int]                 # Popen convention: negative = killed by that signal
    killed_for: Optional[Kind] = None         # Kind.HANG / Kind.STARTUP_TIMEOUT when we killed it
    stale_detail: str = ""                    # why we called it a hang
    oom_evidence: tuple[str, ...] = ()        # cgroup counter rise, kernel log lines
    error: Optional[ErrorRecord] = None       # errors/attempt-N[-rank-R].json written by the shim
    error_rank: Optional[int] = None          # the rank that wrote `error`
    stop_requested: bool = False
    rank_failures: tuple[ProcessFailure, ...] = ()   # torchrun's summary, root cause first
    ranks_stopped: Optional[str] = None       # multi-rank: every rank's last beat is `stopping` (detail)
    rendezvous_error: Optional[RendezvousFailure] = None   # torchrun died joining its peers
    below: Optional[DeathBelow] = None        # the trainer a signal killed below a launcher (its exit code said so)

    @property
    def exit_code(self) -> Optional[int]:
        return self.returncode if self.returncode is not None and self.returncode >= 0 else None

    @property
    def signal(self) -> Optional[int]:
        """The signal that killed the child, or the trainer below the launcher child."""
        if self.returncode is not None and self.returncode < 0:
            return -self.returncode
        return self.below.signal if self.below is not None else None

    def how(self) -> str:
        """How the attempt died, for the evidence: a trainer's death below its launcher, a signal or an exit code."""
        if self.below is not None:
            return f"{self.below.describe()} (launcher exit code {self.exit_code})"
        return f"killed by {_signame(self.signal)}" if self.signal else f"exit code {self.exit_code}"


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def is_cuda_oom(error: Optional[ErrorRecord]) -> bool:
    """The one test for a CUDA out-of-memory error record (torch.OutOfMemoryError or its message)."""
    if error is None:
        return False
    return (error.type.endswith("OutOfMemoryError") or "CUDA out of memory" in error.message
            or "CUDA error: out of memory" in error.message)


def _error_text(error: ErrorRecord) -> str:
    return f"{error.type}: {error.message[:200]}"


def classify(f: AttemptFacts) -> tuple[Kind, str]:
    """(kind, evidence) for one ended attempt; our own kill reasons win over the exit status."""
    if f.killed_for is Kind.HANG:
        return Kind.HANG, f.stale_detail or "heartbeat stale"
    if f.killed_for is Kind.CRASH:   # it recorded its exception, then did not exit: we ended it
        return Kind.CRASH, f"{_error_text(f.error) if f.error is not None else 'uncaught exception'}; {f.stale_detail}"
    if f.killed_for is Kind.STARTUP_TIMEOUT:
        return Kind.STARTUP_TIMEOUT, f.stale_detail or "no heartbeat after start"
    if f.returncode == EXIT_OK:
        return Kind.SUCCESS, f"exit code {EXIT_OK}"
    if f.returncode == EXIT_PREEMPTED:
        return Kind.PREEMPTED, f"exit code {EXIT_PREEMPTED} after a preempt checkpoint"
    if f.ranks_stopped and f.returncode is not None and f.returncode > 0:
        # torchrun, itself SIGTERMed, exits 1 even when every rank saved and exited 75.
        return Kind.PREEMPTED, f"exit code {f.exit_code} from torchrun; {f.ranks_stopped}"
    if f.ranks_stopped and f.signal is not None and f.stop_requested:
        # Saved and exiting when the grace period ran out: the preempt checkpoint is committed.
        return Kind.PREEMPTED, f"{f.ranks_stopped}; killed by {_signame(f.signal)} while exiting"
    if f.returncode == EXIT_DIVERGED or (f.error is not None and f.error.type == DIVERGED_ERROR_TYPE):
        return Kind.DIVERGED, f"exit code {f.exit_code}; " + (f.error.message[:200] if f.error else "non-finite loss")
    if f.error is not None and is_cuda_oom(f.error):
        return Kind.CUDA_OOM, _error_text(f.error)
    if f.oom_evidence:
        return Kind.OOM, f"{f.how()}; " + "; ".join(f.oom_evidence)
    if f.signal is not None:
        return Kind.SIGNAL, f"{f.how()}; no OOM evidence in cgroup or kernel log"
    if f.rendezvous_error and not f.rank_failures:
        why = " (another node's previous attempt had not ended yet)" if f.rendezvous_error.closed else ""
        return Kind.RENDEZVOUS, (f"exit code {f.exit_code}; torchrun could not join its peers: "
                                 f"{f.rendezvous_error.describe()}{why}")
    ranks = f"; {', '.join(pf.describe() for pf in f.rank_failures)}" if f.rank_failures else ""
    if f.rank_failures and f.rank_failures[0].signal is not None:
        # torchrun exits 1 when a rank died of a signal: the rank's death is what happened.
        return Kind.SIGNAL, f"exit code {f.exit_code}{ranks}; no OOM evidence in cgroup or kernel log"
    if f.error is not None:
        # Name the rank when it is not obvious: a multi-rank failure, or any rank but 0.
        named = f.error_rank is not None and (bool(f.rank_failures) or f.error_rank != 0)
        who = f"rank {f.error_rank} " if named else ""
        return Kind.CRASH, f"exit code {f.exit_code}{ranks}; {who}{_error_text(f.error)}"
    return Kind.CRASH, f"exit code {f.exit_code}{ranks}"
