"""Classify how an attempt ended: exactly one failure kind, with the evidence that decided it."""

from __future__ import annotations

import dataclasses
import enum
import signal
from typing import Optional

from trainer_shim.rundir import DIVERGED_ERROR_TYPE, EXIT_DIVERGED, KIND_DIVERGED
from trainer_shim.rundir import EXIT_PREEMPTED

__all__ = ["Kind", "AttemptFacts", "classify"]


class Kind(str, enum.Enum):
    """How an attempt ended; every `attempt_ended` event carries exactly one."""

    SUCCESS = "success"
    PREEMPTED = "preempted"
    OOM = "oom"                      # kernel OOM killer, with cgroup or kernel-log evidence
    CUDA_OOM = "cuda_oom"            # torch.OutOfMemoryError in the error file
    HANG = "hang"                    # heartbeat went stale; we killed it
    STARTUP_TIMEOUT = "startup_timeout"
    CRASH = "crash"                  # non-zero exit, Python exception
    SIGNAL = "signal"                # killed by a signal, no OOM evidence
    RENDEZVOUS = "rendezvous"        # torchrun never joined its peers; no rank ran
    DIVERGED = KIND_DIVERGED         # the shim saw a non-finite loss and exited EXIT_DIVERGED unsaved


@dataclasses.dataclass(frozen=True)
class AttemptFacts:
    """What the supervisor observed about one ended attempt (plain data, so tests can build it)."""

    returncode: Optional[int]                 # Popen convention: negative = killed by that signal
    killed_for: Optional[str] = None          # "hang" / "startup_timeout" when we killed it
    stale_detail: str = ""                    # why we called it a hang
    oom_evidence: tuple[str, ...] = ()        # cgroup counter rise, kernel log lines
    error: Optional[dict] = None              # errors/attempt-N.json written by the shim
    stop_requested: bool = False
    rank_failures: tuple[str, ...] = ()       # torchrun's summary: "rank 1 (pid 12) killed by SIGKILL"
    ranks_stopped: Optional[str] = None       # multi-rank: every rank's last beat is `stopping` (detail)
    rendezvous_error: Optional[str] = None    # torchrun's last line: "RendezvousClosedError"

    @property
    def exit_code(self) -> Optional[int]:
        return self.returncode if self.returncode is not None and self.returncode >= 0 else None

    @property
    def signal(self) -> Optional[int]:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _is_cuda_oom(error: Optional[dict]) -> bool:
    if not error:
        return False
    typ = str(error.get("type", ""))
    msg = str(error.get("message", ""))
    return typ.endswith("OutOfMemoryError") or "CUDA out of memory" in msg or "CUDA error: out of memory" in msg


def classify(f: AttemptFacts) -> tuple[Kind, str]:
    """(kind, evidence) for one ended attempt; our own kill reasons win over the exit status."""
    if f.killed_for == "hang":
        return Kind.HANG, f.stale_detail or "heartbeat stale"
    if f.killed_for == "startup_timeout":
        return Kind.STARTUP_TIMEOUT, f.stale_detail or "no heartbeat after start"
    if f.returncode == 0:
        return Kind.SUCCESS, "exit code 0"
    if f.returncode == EXIT_PREEMPTED:
        return Kind.PREEMPTED, f"exit code {EXIT_PREEMPTED} after a preempt checkpoint"
    if f.ranks_stopped and f.returncode is not None and f.returncode > 0:
        # torchrun, itself SIGTERMed, exits 1 even when every rank saved and exited 75.
        return Kind.PREEMPTED, f"exit code {f.exit_code} from torchrun; {f.ranks_stopped}"
    if f.returncode == EXIT_DIVERGED or (f.error and f.error.get("type") == DIVERGED_ERROR_TYPE):
        return Kind.DIVERGED, f"exit code {f.exit_code}; " + str((f.error or {}).get("message", "non-finite loss"))[:200]
    if _is_cuda_oom(f.error):
        return Kind.CUDA_OOM, f"{f.error.get('type')}: {str(f.error.get('message', ''))[:200]}"  # type: ignore[union-attr]
    if f.oom_evidence:
        how = f"killed by {_signame(f.signal)}" if f.signal else f"exit code {f.exit_code}"
        return Kind.OOM, f"{how}; " + "; ".join(f.oom_evidence)
    if f.signal is not None:
        return Kind.SIGNAL, f"killed by {_signame(f.signal)}; no OOM evidence in cgroup or kernel log"
    if f.rendezvous_error and not f.rank_failures:
        why = (" (another node's previous attempt had not ended yet)" if f.rendezvous_error.startswith("RendezvousClosedError")
               else "")
        return Kind.RENDEZVOUS, f"exit code {f.exit_code}; torchrun could not join its peers: {f.rendezvous_error}{why}"
    ranks = f"; {', '.join(f.rank_failures)}" if f.rank_failures else ""
    if f.rank_failures and " killed by " in f.rank_failures[0]:
        # torchrun exits 1 when a rank died of a signal: the rank's death is what happened.
        return Kind.SIGNAL, f"exit code {f.exit_code}{ranks}; no OOM evidence in cgroup or kernel log"
    if f.error:
        who = f"rank {f.error['rank']} " if isinstance(f.error.get("rank"), int) and f.rank_failures else ""
        if isinstance(f.error.get("rank"), int) and f.error["rank"] != 0:
            who = f"rank {f.error['rank']} "
        return Kind.CRASH, f"exit code {f.exit_code}{ranks}; {who}{f.error.get('type')}: {str(f.error.get('message', ''))[:200]}"
    return Kind.CRASH, f"exit code {f.exit_code}{ranks}"
