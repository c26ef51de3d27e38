"""Restart policy: backoff, give-up rules and crash-loop detection, as plain decisions on plain data."""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional

from .classify import Kind
from ..config import Config

__all__ = ["Action", "Decision", "RestartPolicy"]

RENDEZVOUS_RETRY_S = 1.0   # first delay before rejoining a closed rendezvous: a peer's teardown takes about that


class Action(str, enum.Enum):
    """What the supervisor does after an attempt ends."""

    DONE = "done"          # success: stop supervising
    RESTART = "restart"
    GIVE_UP = "give_up"
    STOP = "stop"          # stop was requested: exit resumable


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do after an attempt ends: the restart policy's answer, which decisions.decide
    completes with what the smarter judgements (divergence, per-kind budgets) condemn."""

    action: Action
    delay_s: float = 0.0
    reason: str = ""                               # the gave_up reason (or the policy's for other actions)
    detail: str = ""
    poison: tuple[tuple[str, str], ...] = ()       # (checkpoint, why): never resume from it again
    crash_loop: bool = False                       # the restart policy condemned the checkpoint resumed from


@dataclasses.dataclass
class RestartPolicy:
    """Tracks consecutive no-progress attempts; decides restart, delay and poisoning."""

    max_restarts: int
    backoff: float
    backoff_max: float
    no_restart_exit_codes: tuple[int, ...]
    crash_loop_attempts: int
    rendezvous_window: float = 0.0   # seconds rendezvous failures in a row are retried without counting
    restarts: int = 0
    no_progress: int = 0       # consecutive failed attempts that committed nothing newer
    failures_since_progress: int = 0
    rendezvous_since: Optional[float] = None  # when the current run of rendezvous failures began
    rendezvous_failures: int = 0

    @classmethod
    def for_config(cls, config: "Config", rendezvous_window: float) -> "RestartPolicy":
        return cls(max_restarts=config.max_restarts, backoff=config.backoff, backoff_max=config.backoff_max,
                   no_restart_exit_codes=config.no_restart_exit_codes,
                   crash_loop_attempts=config.crash_loop_attempts, rendezvous_window=rendezvous_window)

    def decide(
        self, kind: Kind, exit_code: Optional[int], *, progressed: bool, resumed_from: Optional[str],
        stop_requested: bool, now: float = 0.0,
    ) -> Decision:
        if stop_requested:
            return Decision(Action.STOP, reason="stop requested")
        if kind is Kind.SUCCESS:
            return Decision(Action.DONE, reason="job succeeded")
        if kind is Kind.RENDEZVOUS:
            decision = self._rejoin(now)
            if decision is not None:
                return decision
        else:
            self.rendezvous_since, self.rendezvous_failures = None, 0
        if exit_code is not None and exit_code in self.no_restart_exit_codes and kind is not Kind.PREEMPTED:
            return Decision(Action.GIVE_UP, reason=f"exit code {exit_code} is not retryable (--no-restart-exit-codes)")
        if progressed or kind is Kind.PREEMPTED:
            self.no_progress = 0
            self.failures_since_progress = 0
        elif kind is not Kind.RENDEZVOUS:  # no rank loaded the checkpoint: no evidence against it
            self.no_progress += 1
        poison: tuple[tuple[str, str], ...] = ()
        if self.no_progress >= self.crash_loop_attempts:
            if resumed_from is None:
                return Decision(Action.GIVE_UP, reason=(
                    f"crash loop: {self.no_progress} attempts in a row made no progress and there is "
                    "no older checkpoint to fall back to"))
            poison = ((resumed_from, f"{self.crash_loop_attempts} attempts in a row resumed from it and made no progress"),)
            self.no_progress = 0
        if self.restarts >= self.max_restarts:
            return Decision(Action.GIVE_UP, reason=f"restarts exhausted ({self.restarts} of --max-restarts {self.max_restarts})")
        self.restarts += 1
        delay = 0.0
        if kind is not Kind.PREEMPTED and self.backoff > 0:
            delay = min(self.backoff * (2 ** self.failures_since_progress), self.backoff_max)
            self.failures_since_progress += 1
        return Decision(Action.RESTART, delay_s=delay, reason=kind.value, poison=poison, crash_loop=bool(poison))

    def _rejoin(self, now: float) -> Optional[Decision]:
        """A free restart while the peers may still be ending their attempt (None once the window is over).

        No rank ran, so the attempt says nothing about the checkpoint (no crash-loop count) and is no
        failure of the job's (no restart spent): on several nodes it is the normal race of a node that
        restarts before its peers have torn down the rendezvous it would join.
        """
        if self.rendezvous_since is None:
            self.rendezvous_since = now
        if now - self.rendezvous_since > self.rendezvous_window:
            return None
        delay = min(RENDEZVOUS_RETRY_S * (2 ** self.rendezvous_failures), max(self.backoff_max, RENDEZVOUS_RETRY_S))
        self.rendezvous_failures += 1
        return Decision(Action.RESTART, delay_s=delay, reason=f"{Kind.RENDEZVOUS.value} (not counted: peers may still be ending their attempt)")
