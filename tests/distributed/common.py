"""Helpers for the distributed tests: run tests/jobs/ddp_train.py under the real supervisor and compare weights."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import JOBS
from tests.supervisor.helpers import run_cli, sup_env

DDP_JOB = str(JOBS / "ddp_train.py")
FAST = ["--backoff", "0", "--heartbeat-timeout", "5", "--grace-period", "20"]


def ddp_run(tmp: Path, name: str, *job_args: str, faults: str = "", extra: tuple[str, ...] = (), timeout: float = 150):
    (tmp / name).mkdir(parents=True, exist_ok=True)
    rd, out = tmp / name / "run", tmp / name / "out"
    p = run_cli("--nproc-per-node", "2", "--run-dir", str(rd), *FAST, *extra, DDP_JOB, "--out-dir", str(out), *job_args,
                env=sup_env(DDP_FAULTS=faults), timeout=timeout)
    return p, rd, out


def assert_same_weights(out: Path, ref: Path) -> None:
    for r in (0, 1):
        a = torch.load(ref / f"final-rank-{r}.pt", weights_only=True)
        b = torch.load(out / f"final-rank-{r}.pt", weights_only=True)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"rank {r} {k} differs from the uninterrupted run"
