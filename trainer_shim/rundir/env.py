"""Every RESILIENT_* environment variable, and RunEnv: the product environment, parsed once.

The supervisor sets these for the trainer (and `resilient-run doctor` for its runs), except
RESILIENT_SHM_DIR, which the user sets for both (`shm_dir`); nothing else reads `os.environ` for
them, so a value means the same thing everywhere (a bare `!= "0"` test once turned `false` into
*on*). Booleans follow one rule (`parse_bool`); a bad value is a one-line
EnvError naming the variable. Test-only knobs are not product settings and use the `RRTEST_`
prefix, never `RESILIENT_`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from .errors import EnvError
from .frameworks import parse_callback_options

__all__ = [
    "MARK_STEP", "MARK_BATCH", "MARK_EPOCH", "FAULT_KILL", "FAULT_RAISE", "parse_faults",
    "ENV_RUN_DIR", "ENV_ATTEMPT", "ENV_RESUME_FROM", "ENV_LAST_FAILURE", "ENV_ALLOW_RESHARD", "ENV_NODE",
    "ENV_STRICT_RESUME", "ENV_TRACKERS", "ENV_DOCTOR", "ENV_DOCTOR_FAULTS", "ENV_DOCTOR_STEPS", "ENV_CALLBACK", "ENV_NAMES",
    "ENV_SHM_DIR", "DEFAULT_SHM_DIR", "shm_dir", "RESUME_NONE", "RunEnv", "parse_bool", "LauncherEnv",
]

# --- doctor mode: the digest log the shim appends to and `resilient-run doctor` compares, and the
# faults the shim injects on itself (switched on by the ENV_DOCTOR* variables below) ------------

# Digest-log record kinds ("at" field): at run.step(), when the next batch is handed out, at epoch end.
MARK_STEP = "step"
MARK_BATCH = "batch"
MARK_EPOCH = "epoch_end"

FAULT_KILL = "kill"
FAULT_RAISE = "raise"


def parse_faults(spec: str) -> dict[int, str]:
    """'17:kill,41:raise' -> {17: 'kill', 41: 'raise'}; ValueError (one line) on bad input."""
    out: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        step, _, kind = part.partition(":")
        kind = kind or FAULT_KILL
        if not step.isdigit() or int(step) <= 0 or kind not in (FAULT_KILL, FAULT_RAISE):
            raise ValueError(f"bad fault {part!r}; use STEP[:kill|raise], e.g. 17:kill,41:raise")
        out[int(step)] = kind
    return out

ENV_RUN_DIR = "RESILIENT_RUN_DIR"          # the run dir, set by the supervisor for every attempt
ENV_ATTEMPT = "RESILIENT_ATTEMPT"          # 1-based attempt number
ENV_RESUME_FROM = "RESILIENT_RESUME_FROM"  # checkpoint dir chosen by the supervisor, or RESUME_NONE
# Kind (a Kind value) of the previous attempt's failure; set by the supervisor for the user's script.
ENV_LAST_FAILURE = "RESILIENT_LAST_FAILURE"
# True: a sharded (DCP) checkpoint may be resumed at another world size (model and optimizer
# reshard exactly; data order and per-rank RNG cannot continue the old world bitwise).
ENV_ALLOW_RESHARD = "RESILIENT_ALLOW_RESHARD"
# Node rank of the supervisor that launched this process; set only for a multi-node job, whose
# supervisors share the run dir and keep their own files in nodes/node-<N>/.
ENV_NODE = "RESILIENT_NODE"
# True: a provenance mismatch on resume is an exit-2 refusal (set by `resilient-run --strict-resume`).
ENV_STRICT_RESUME = "RESILIENT_STRICT_RESUME"
# The trackers' variables the supervisor set for this attempt (comma-separated, e.g.
# "WANDB_RUN_ID,WANDB_RESUME"): the ones the user did not set (rundir.trackers).
ENV_TRACKERS = "RESILIENT_TRACKERS"
# Doctor mode: the path of the per-step digest log (JSON lines) the shim appends to.
ENV_DOCTOR = "RESILIENT_DOCTOR"
# Faults the shim injects on itself in doctor mode: "17:kill,41:raise" (first time a step is reached).
ENV_DOCTOR_FAULTS = "RESILIENT_DOCTOR_FAULTS"
# In doctor mode the shim finishes the run cleanly once this step is reached.
ENV_DOCTOR_STEPS = "RESILIENT_DOCTOR_STEPS"
# Auto-attach: the options of the callback the job's Trainer is given (a JSON object, the config's
# `callback:` mapping; keys in frameworks.CALLBACK_OPTIONS).
ENV_CALLBACK = "RESILIENT_CALLBACK"
# Where memory snapshot slots live (a tmpfs; default /dev/shm). Set by the user, not the supervisor:
# the supervisor and its trainers inherit the same value. A tmpfs mounted with huge pages
# (`-o huge=within_size`) restores a slot faster than /dev/shm's 4 KiB pages (docs/how-to/fast-checkpoints.md).
ENV_SHM_DIR = "RESILIENT_SHM_DIR"

ENV_NAMES = (ENV_RUN_DIR, ENV_ATTEMPT, ENV_RESUME_FROM, ENV_LAST_FAILURE, ENV_ALLOW_RESHARD, ENV_NODE,
             ENV_STRICT_RESUME, ENV_DOCTOR, ENV_DOCTOR_FAULTS, ENV_DOCTOR_STEPS, ENV_CALLBACK, ENV_SHM_DIR,
             ENV_TRACKERS)
DEFAULT_SHM_DIR = "/dev/shm"

RESUME_NONE = "none"                       # the supervisor found nothing valid: start fresh

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


def shm_dir(environ: Mapping[str, str]) -> Path:
    """The slot directory RESILIENT_SHM_DIR names (as given: snapshots.check_shm_dir judges it), else /dev/shm."""
    value = (environ.get(ENV_SHM_DIR) or "").strip()
    return Path(value or DEFAULT_SHM_DIR)


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


def _parse_callback(value: Optional[str]) -> tuple[tuple[str, object], ...]:
    if value is None or not value.strip():
        return ()
    try:
        return parse_callback_options(json.loads(value))
    except ValueError as e:  # json.JSONDecodeError is a ValueError too
        raise EnvError(ENV_CALLBACK, value, f"a JSON object of callback options ({e})") from None


def _parse_faults(value: Optional[str]) -> tuple[tuple[int, str], ...]:
    try:
        return tuple(sorted(parse_faults(value or "").items()))
    except ValueError:
        raise EnvError(ENV_DOCTOR_FAULTS, value or "", "STEP[:kill|raise],... e.g. 17:kill,41:raise") from None


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
    last_failure: Optional[str] = None     # for the user's script; the shim does not act on it
    strict_resume: Optional[bool] = None   # None: unset, the init() argument decides
    doctor_log: Optional[str] = None       # set: doctor mode, digests appended to this file
    doctor_faults: tuple[tuple[int, str], ...] = ()   # (step, FAULT_KILL | FAULT_RAISE), by step
    doctor_steps: Optional[int] = None     # doctor mode ends the run cleanly at this step
    callback_options: tuple[tuple[str, object], ...] = ()   # the auto-attached callback's options, by name
    trackers: tuple[str, ...] = ()         # the trackers' variables the supervisor set (rundir.trackers)

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
            last_failure=environ.get(ENV_LAST_FAILURE) or None,
            strict_resume=parse_bool(ENV_STRICT_RESUME, environ.get(ENV_STRICT_RESUME)),
            doctor_log=environ.get(ENV_DOCTOR) or None,
            doctor_faults=_parse_faults(environ.get(ENV_DOCTOR_FAULTS)),
            doctor_steps=_parse_int(ENV_DOCTOR_STEPS, environ.get(ENV_DOCTOR_STEPS), minimum=1),
            callback_options=_parse_callback(environ.get(ENV_CALLBACK)),
            trackers=tuple(filter(None, (n.strip() for n in (environ.get(ENV_TRACKERS) or "").split(",")))),
        )


@dataclasses.dataclass(frozen=True)
class LauncherEnv:
    """What torchrun sets for each worker, read here with the product env so that every environment
    read of the shim lives in this module. A missing or malformed value means one process, as when
    the script runs alone."""

    rank: int = 0
    world_size: int = 1
    local_world_size: int = 0   # 0: not launched by torchrun

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "LauncherEnv":
        def num(name: str, default: int) -> int:
            try:
                return int(environ.get(name, default))
            except ValueError:
                return default
        return cls(num("RANK", 0), num("WORLD_SIZE", 1), num("LOCAL_WORLD_SIZE", 0))
