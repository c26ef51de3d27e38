"""Helpers for the distributed tests: run tests/jobs/ddp_train.py under the real supervisor (weights: tests/support.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tests.conftest import JOBS
from tests.support import ended_kinds, run_cli, sup_env

DDP_JOB = str(JOBS / "ddp_train.py")
FAST = ["--backoff", "0", "--heartbeat-timeout", "5", "--grace-period", "20"]


def ddp_run(tmp: Path, name: str, *job_args: str, faults: str = "", nproc: int = 2, extra: tuple[str, ...] = (),
            env: Optional[dict[str, str]] = None, timeout: float = 150):
    """Run the job under the supervisor CLI in tmp/name/{run,out}; returns (process, run dir, out dir)."""
    (tmp / name).mkdir(parents=True, exist_ok=True)
    rd, out = tmp / name / "run", tmp / name / "out"
    p = run_cli("--nproc-per-node", str(nproc), "--run-dir", str(rd), *FAST, *extra, DDP_JOB, "--out-dir", str(out),
                *job_args, env=sup_env(DDP_FAULTS=faults, **(env or {})), timeout=timeout)
    return p, rd, out


def recovered_run(tmp: Path, name: str, *job_args: str, kinds: Sequence[str], **kw) -> tuple[Path, Path]:
    """ddp_run that must exit 0 after attempts ending as `kinds` (in order); returns (run dir, out dir)."""
    p, rd, out = ddp_run(tmp, name, *job_args, **kw)
    assert p.returncode == 0, p.stderr[-3000:]
    assert ended_kinds(rd) == list(kinds), p.stderr[-3000:]
    return rd, out

