"""What to do after an attempt ends: one Decision from the policy judgements (divergence
fallback, per-kind budgets, refused resumes) followed by the generic restart policy."""

from __future__ import annotations

import dataclasses
import time

from trainer_shim.rundir import RunDir

from ..process.attempts import AttemptResult
from .classify import Kind
from .policy import Action, Decision, RestartPolicy
from .smart_restarts import SmartRestarts

__all__ = ["Decision", "decide"]


def decide(result: AttemptResult, *, policy: RestartPolicy, smart: SmartRestarts, rd: RunDir,
           failures_of_kind: int, poisoned: set[str], stop_requested: bool) -> Decision:
    """The decision on `result`; `policy` and `smart` keep their own counters across calls."""
    poison: list[tuple[str, str]] = []
    if result.kind is not Kind.SUCCESS and not stop_requested:
        j = smart.judge_attempt(result, rd, failures_of_kind)
        poison += [(p, j.poison_reason) for p in j.poison if p not in poisoned]
        if j.poison:
            policy.no_progress = 0   # the fallback is this failure's answer; no second crash-loop poisoning
        if j.give_up is not None:
            return Decision(Action.GIVE_UP, reason=j.give_up, detail=j.detail, poison=tuple(poison))
    # Under torchrun the rank's own exit code (e.g. 2: a configuration error) decides, not torchrun's 1.
    code = result.rank_exit_code if result.rank_exit_code is not None else result.exit_code
    d = policy.decide(result.kind, code, progressed=result.progressed, resumed_from=result.resumed_from,
                      stop_requested=stop_requested, now=time.monotonic())
    return dataclasses.replace(d, poison=(*poison, *d.poison))

