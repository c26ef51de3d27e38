"""Environment variables and exit codes the supervisor and the shim agree on.

The product variables are parsed once, into `RunEnv`; nothing else reads `os.environ` for them, so
a value means the same thing everywhere (a bare `!= "0"` test once turned `false` into *on*).
Test-only knobs are not product settings and use the `RRTEST_` prefix, never `RESILIENT_`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Optional

from .errors import EnvError

__all__ = [
    "ENV_RUN_DIR", "ENV_ATTEMPT", "ENV_RESUME_FROM", "ENV_LAST_FAILURE", "ENV_ALLOW_RESHARD", "ENV_NODE",
    "RESUME_NONE", "EXIT_PREEMPTED", "RunEnv", "parse_bool",
]

ENV_RUN_DIR = "RESILIENT_RUN_DIR"
ENV_ATTEMPT = "RESILIENT_ATTEMPT"          # 1-based attempt number
ENV_RESUME_FROM = "RESILIENT_RESUME_FROM"  # checkpoint dir chosen by the supervisor, or RESUME_NONE
# Kind of the previous attempt's failure; set by the supervisor for the user's script (the shim
# itself has no use for it, so RunEnv does not parse it).
ENV_LAST_FAILURE = "RESILIENT_LAST_FAILURE"
# True: a sharded (DCP) checkpoint may be resumed at another world size (model and optimizer
# reshard exactly; data order and per-rank RNG cannot continue the old world bitwise).
ENV_ALLOW_RESHARD = "RESILIENT_ALLOW_RESHARD"
# Node rank of the supervisor that launched this process; set only for a multi-node job, whose
# supervisors share the run dir and keep their own files in nodes/node-<N>/.
ENV_NODE = "RESILIENT_NODE"
RESUME_NONE = "none"                       # the supervisor found nothing valid: start fresh

# The shim exits with this after saving a preempt checkpoint (EX_TEMPFAIL: "try again later").
EXIT_PREEMPTED = 75

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_BOOL_WORDS = "1/true/yes/on or 0/false/no/off"


def parse_bool(name: str, value: Optional[str]) -> Optional[bool]:
    """None when unset or empty; True/False for the usual words (any case); EnvError otherwise."""
    if value is None or not value.strip():
        return None
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise EnvError(name, value, _BOOL_WORDS)


def _parse_int(name: str, value: Optional[str], *, minimum: int) -> Optional[int]:
    if value is None or not value.strip():
        return None
    try:
        n = int(value.strip())
    except ValueError:
        n = minimum - 1
    if n < minimum:
        raise EnvError(name, value, f"an integer >= {minimum}")
    return n


@dataclasses.dataclass(frozen=True)
class RunEnv:
    """The product environment of one trainer process, as the supervisor set it (all optional)."""

    run_dir: Optional[str] = None
    attempt: int = 1
    # The supervisor's choice: a checkpoint dir, RESUME_NONE ("start fresh"), or None (not
    # supervised: the shim searches the run dir itself).
    resume_from: Optional[str] = None
    node: Optional[int] = None
    allow_reshard: Optional[bool] = None   # None: unset, the init() argument decides

    @property
    def fresh_start_requested(self) -> bool:
        return self.resume_from == RESUME_NONE

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "RunEnv":
        """Parse every product variable once; EnvError (one line, names the variable) on a bad value."""
        return cls(
            run_dir=environ.get(ENV_RUN_DIR) or None,
            attempt=_parse_int(ENV_ATTEMPT, environ.get(ENV_ATTEMPT), minimum=1) or 1,
            resume_from=environ.get(ENV_RESUME_FROM) or None,
            node=_parse_int(ENV_NODE, environ.get(ENV_NODE), minimum=0),
            allow_reshard=parse_bool(ENV_ALLOW_RESHARD, environ.get(ENV_ALLOW_RESHARD)),
        )
