"""Decisions around each ended attempt: divergence fallback, per-kind budgets, policy actions.

Plain state and plain results; the supervisor (agent.py) only emits what `judge` and `apply`
return. Kept apart from policy.RestartPolicy, which stays the generic backoff/crash-loop rule.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Mapping, Optional

from trainer_shim.rundir import (
    DIVERGED_REASON, ENV_STRICT_RESUME, MANIFEST_NAME, RESUME_REFUSED_ERROR_TYPE, RunDir, checkpoint_roots,
    iter_checkpoint_dirs, parse_checkpoint_name,
)

from ..process.attempts import AttemptResult
from .classify import Kind
from ..config import Config
from .divergence import DivergenceTracker
from .failure_policy import KindRule, apply_rule
from ..insight.notify import child_environ
from ..process.launch import attach_environ

__all__ = ["Judgement", "SmartRestarts"]


@dataclasses.dataclass(frozen=True)
class Judgement:
    poison: tuple[str, ...] = ()
    poison_reason: str = ""
    give_up: Optional[str] = None     # gave_up reason
    detail: str = ""


class SmartRestarts:
    """The current argv/env of attempts (as policy actions changed them) and the policy verdicts."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.command: tuple[str, ...] = tuple(config.command)
        self.env: dict[str, str] = {ENV_STRICT_RESUME: "1"} if config.strict_resume else {}
        self.rules: dict[str, KindRule] = {r.kind: r for r in config.policy}
        self.divergence = DivergenceTracker(config.divergence_window)

    def judge(self, kind: Kind, *, failures_of_kind: int, diverged_step: Optional[int], resumed_from: Optional[str],
              resumed_step: Optional[int], newer: tuple[str, ...], error_type: Optional[str] = None) -> Judgement:
        """Called for every failed attempt before the restart policy decides."""
        if error_type == RESUME_REFUSED_ERROR_TYPE:   # whatever --no-restart-exit-codes says: a retry refuses again
            return Judgement(give_up="resume refused: checkpoint provenance differs (--strict-resume)")
        j = Judgement()
        if kind is Kind.DIVERGED:
            v = self.divergence.judge(diverged_step=diverged_step, resumed_from=resumed_from,
                                      resumed_step=resumed_step, newer=newer)
            j = Judgement(poison=v.poison, poison_reason=v.reason,
                          give_up=DIVERGED_REASON if v.give_up else None, detail=v.reason)
            if v.give_up:
                return j
        else:
            self.divergence.reset()
        rule = self.rules.get(kind.value)
        if rule is not None and rule.max_restarts is not None and failures_of_kind > rule.max_restarts:
            return dataclasses.replace(j, give_up=(
                f"restarts after {kind.value} exhausted ({rule.max_restarts} of policy.{kind.value}.max_restarts)"))
        return j

    def judge_attempt(self, result: AttemptResult, rd: RunDir, failures_of_kind: int) -> Judgement:
        """`judge` for a failed attempt, with the facts gathered from its result and the run dir."""
        err = result.error.record if result.error else None
        resumed_step = parse_checkpoint_name(Path(result.resumed_from).name) if result.resumed_from else None
        newer: tuple[str, ...] = ()
        if result.kind is Kind.DIVERGED:  # what the diverged attempt itself committed after its resume point
            newer = newer_checkpoints(iter_checkpoint_dirs(checkpoint_roots(rd)), resumed_step,
                                      since=time.time() - result.duration_s - 1.0)
        return self.judge(result.kind, failures_of_kind=failures_of_kind,
                          diverged_step=err.step if err is not None and err.step is not None else result.step,
                          resumed_from=result.resumed_from, resumed_step=resumed_step, newer=newer,
                          error_type=err.type if err is not None else None)

    def apply(self, kind: Kind) -> Optional[dict]:
        """Change the next attempts' argv/env per the kind's rule; the `policy_applied` fields, or None."""
        rule = self.rules.get(kind.value)
        if rule is None or (not rule.env and not rule.args):
            return None
        self.command, self.env, rendered = apply_rule(rule, self.command, self.env)
        return {"kind": kind.value, "env": dict(rule.env), "args": rendered, "command": list(self.command)}

    def attempt_env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {**env, **self.env}

    def base_env(self) -> dict[str, str]:
        """Every attempt's environment before the run-dir contract's variables: ours (minus the
        supervisor's own service variables), the config's `env`, and the policy actions' changes."""
        env = child_environ(os.environ)
        env.update(self.attempt_env(self.config.env_dict))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return attach_environ(env, self.config.auto_attach, self.config.callback)


def newer_checkpoints(found: list[tuple[int, Path, Path]], above: Optional[int], since: float) -> tuple[str, ...]:
    """Checkpoint dirs of rundir.iter_checkpoint_dirs with a step above `above` (all when None) that
    were committed at or after wall time `since` (by the diverged attempt, not an earlier lineage)."""
    out = []
    for step, p, _ in found:
        if above is not None and step <= above:
            continue
        try:
            if (p / MANIFEST_NAME).stat().st_mtime >= since:
                out.append(str(p))
        except OSError:
            continue
    return tuple(out)
