"""Helpers for supervisor tests: run the real CLI as a subprocess and read the run dir it leaves."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional

import psutil

from tests.conftest import JOBS, PYTHON, REPO, child_env
from tests.support import ended_kinds, events, heartbeat, kill_group, supervisor_state, wait_until  # noqa: F401 - re-exported

FAKE_JOB = str(JOBS / "fake_job.py")
CLI = [PYTHON, "-m", "supervisor"]


def sup_env(**extra: str) -> dict[str, str]:
    env = child_env(**extra)
    env["PYTHONPATH"] = str(REPO)
    return env


def run_cli(*args: str, env: Optional[dict] = None, timeout: float = 120, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=env or sup_env(), capture_output=True, text=True, timeout=timeout, cwd=cwd)


def start_cli(*args: str, env: Optional[dict] = None, cwd: Optional[Path] = None) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *args], env=env or sup_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd, start_new_session=True)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def attempt_pids(run_dir: Path) -> list[int]:
    return [e["pid"] for e in events(run_dir, "attempt_started")]
