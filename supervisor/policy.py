"""Restart policy: backoff, give-up rules and crash-loop detection, as plain decisions on plain data."""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional

from .classify import Kind

__all__ = ["Action", "Decision", "RestartPolicy"]


class Action(str, enum.Enum):
    """What the supervisor does after an attempt ends."""

    DONE = "done"          # success: stop supervising
    RESTART = "restart"
    GIVE_UP = "give_up"
    STOP = "stop"          # stop was requested: exit resumable


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    delay_s: float = 0.0
    reason: str = ""
    poison: Optional[str] = None   # checkpoint path the crash loop condemns


@dataclasses.dataclass
class RestartPolicy:
    """Tracks consecutive no-progress attempts; decides restart, delay and poisoning."""

    max_restarts: int
    backoff: float
    backoff_max: float
    no_restart_exit_codes: tuple[int, ...]
    crash_loop_attempts: int
    restarts: int = 0
    no_progress: int = 0       # consecutive failed attempts that committed nothing newer
    failures_since_progress: int = 0

    def decide(
        self, kind: Kind, exit_code: Optional[int], *, progressed: bool, resumed_from: Optional[str],
        stop_requested: bool,
    ) -> Decision:
        if stop_requested:
            return Decision(Action.STOP, reason="stop requested")
        if kind is Kind.SUCCESS:
            return Decision(Action.DONE, reason="job succeeded")
        if exit_code is not None and exit_code in self.no_restart_exit_codes and kind is not Kind.PREEMPTED:
            return Decision(Action.GIVE_UP, reason=f"exit code {exit_code} is not retryable (--no-restart-exit-codes)")
        if progressed or kind is Kind.PREEMPTED:
            self.no_progress = 0
            self.failures_since_progress = 0
        else:
            self.no_progress += 1
        poison = None
        if self.no_progress >= self.crash_loop_attempts:
            if resumed_from is None:
                return Decision(Action.GIVE_UP, reason=(
                    f"crash loop: {self.no_progress} attempts in a row made no progress and there is "
                    "no older checkpoint to fall back to"))
            poison = resumed_from
            self.no_progress = 0
        if self.restarts >= self.max_restarts:
            return Decision(Action.GIVE_UP, reason=f"restarts exhausted ({self.restarts} of --max-restarts {self.max_restarts})")
        self.restarts += 1
        delay = 0.0
        if kind is not Kind.PREEMPTED and self.backoff > 0:
            delay = min(self.backoff * (2 ** self.failures_since_progress), self.backoff_max)
            self.failures_since_progress += 1
        return Decision(Action.RESTART, delay_s=delay, reason=kind.value, poison=poison)
