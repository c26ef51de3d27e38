"""Helpers for supervisor tests: run the real CLI as a subprocess and read the run dir it leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import psutil

from tests.conftest import JOBS, PYTHON, REPO, child_env
from trainer_shim.rundir import RunDir, read_events

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


def events(run_dir: Path, name: Optional[str] = None) -> list[dict]:
    evs = read_events(RunDir(run_dir))
    return [e for e in evs if name is None or e["event"] == name]


def ended_kinds(run_dir: Path) -> list[str]:
    return [e["kind"] for e in events(run_dir, "attempt_ended")]


def wait_until(pred, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def heartbeat(run_dir: Path, rank: int = 0) -> Optional[dict]:
    try:
        return json.loads((Path(run_dir) / "heartbeats" / f"rank-{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def supervisor_state(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / "supervisor.json").read_text())
    except (OSError, ValueError):
        return {}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def attempt_pids(run_dir: Path) -> list[int]:
    return [e["pid"] for e in events(run_dir, "attempt_started")]


def kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    p.wait(10)
