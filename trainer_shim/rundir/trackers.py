"""Experiment trackers across attempts: what makes a restarted run read as one run.

Each attempt of a supervised job re-runs the steps after the checkpoint it resumed from; without
help TensorBoard draws them twice, and W&B and MLflow start a new run per attempt. The run dir
keeps what all attempts must share, one file per value in ``RUN_DIR/trackers/`` (each written once,
by whoever comes first: an atomic create, so two nodes or two ranks cannot disagree):

* ``wandb_run_id``: the W&B run id of every attempt (made by the supervisor for the first attempt);
  the supervisor sets WANDB_RUN_ID to it and WANDB_RESUME=allow, each unless the user set it.
* ``mlflow_run_id``: the MLflow run the first attempt started (recorded by the shim's patch of
  ``mlflow.start_run``); later attempts get MLFLOW_RUN_ID, unless the user set it.
* ``tensorboard_logdir``: the first attempt's default log dir (torch's and HF's
  ``runs/<date>_<host>`` is made anew at every start); later attempts write into it.
* ``tensorboard_version``: the first attempt's Lightning TensorBoardLogger version (``version_N``,
  the next free one at every start) and its root; later attempts' loggers of that root take it.

The supervisor reads and writes these only through this module and never imports a tracker.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
import string
from collections.abc import MutableMapping
from pathlib import Path
from typing import Optional, Protocol

from .env import ENV_TRACKERS
from .layout import RUN_DIR_MODE

__all__ = ["ENV_WANDB_RUN_ID", "ENV_WANDB_RESUME", "ENV_MLFLOW_RUN_ID", "WANDB_RESUME_ALLOW", "TRACKERS_DIR",
           "WANDB_ID", "MLFLOW_ID", "TB_LOGDIR", "TB_VERSION", "recorded", "claim", "tracker_environ",
           "resume_tag", "default_logdir", "is_default_logdir"]

# The trackers' own variables (set by the supervisor for the job; read by W&B and MLflow themselves).
ENV_WANDB_RUN_ID = "WANDB_RUN_ID"
ENV_WANDB_RESUME = "WANDB_RESUME"
ENV_MLFLOW_RUN_ID = "MLFLOW_RUN_ID"
WANDB_RESUME_ALLOW = "allow"   # continue the run with this id when it exists, else create it

TRACKERS_DIR = "trackers"
WANDB_ID = "wandb_run_id"
MLFLOW_ID = "mlflow_run_id"
TB_LOGDIR = "tensorboard_logdir"
TB_VERSION = "tensorboard_version"   # "<version> <root>": a Lightning TensorBoardLogger's first version

# W&B run ids: its own default alphabet and length (8 of [a-z0-9]).
_ID_CHARS = string.ascii_lowercase + string.digits

_RUNS = "runs"
# torch's, tensorboardX's and HF's default log dir name: runs/<Mon>DD_HH-MM-SS_<hostname> (no comment).
_DEFAULT_LOGDIR = re.compile(r"^[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_(.+)$")


class _RunRoot(Protocol):
    @property
    def root(self) -> Path: ...


def _path(rd: _RunRoot, name: str) -> Path:
    return rd.root / TRACKERS_DIR / name


def recorded(rd: _RunRoot, name: str) -> Optional[str]:
    """The value recorded under `name`, None when there is none (or it cannot be read)."""
    try:
        value = _path(rd, name).read_text().strip()
    except OSError:
        return None
    return value or None


def claim(rd: _RunRoot, name: str, value: str) -> str:
    """Record `value` under `name` unless a value is there already; the recorded value. A hard link
    of a complete temp file creates the name atomically: the first writer wins, nobody sees a torn one."""
    path = _path(rd, name)
    path.parent.mkdir(mode=RUN_DIR_MODE, parents=True, exist_ok=True)   # owner-only, as the whole run dir
    tmp = path.with_name(f".{name}.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.write_text(value + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return recorded(rd, name) or value


def tracker_environ(env: MutableMapping[str, str], rd: _RunRoot) -> MutableMapping[str, str]:
    """An attempt's `env` with the trackers' run ids of this run dir, each only where the user set
    none; ENV_TRACKERS names the variables set here (the shim may drop an MLflow id that fails)."""
    ours = []
    if not env.get(ENV_WANDB_RUN_ID):
        env[ENV_WANDB_RUN_ID] = claim(rd, WANDB_ID, "".join(secrets.choice(_ID_CHARS) for _ in range(8)))
        ours.append(ENV_WANDB_RUN_ID)
    if not env.get(ENV_WANDB_RESUME):
        env[ENV_WANDB_RESUME] = WANDB_RESUME_ALLOW
        ours.append(ENV_WANDB_RESUME)
    mlflow = recorded(rd, MLFLOW_ID)
    if mlflow and not env.get(ENV_MLFLOW_RUN_ID):
        env[ENV_MLFLOW_RUN_ID] = mlflow
        ours.append(ENV_MLFLOW_RUN_ID)
    if ours:
        env[ENV_TRACKERS] = ",".join(ours)
    else:
        env.pop(ENV_TRACKERS, None)
    return env


def resume_tag(attempt: int) -> str:
    """The MLflow tag recording attempt N's resume; its value is the step it resumed from."""
    return f"resilient.resume.attempt-{attempt}"


def default_logdir(host: str) -> str:
    """The log dir torch's and tensorboardX's SummaryWriter() would make now (relative to the cwd)."""
    return os.path.join(_RUNS, datetime.datetime.now().strftime("%b%d_%H-%M-%S") + "_" + host)


def is_default_logdir(path: str, host: str) -> bool:
    """Whether `path` is named as a SummaryWriter's (or HF's) default log dir on `host`: runs/<date>_<host>."""
    p = Path(path)
    m = _DEFAULT_LOGDIR.match(p.name)
    return p.parent.name == _RUNS and m is not None and m.group(1) == host
