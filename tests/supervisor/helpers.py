"""Helpers for supervisor tests: run the real CLI as a subprocess and read the run dir it leaves."""

from __future__ import annotations

from pathlib import Path

import psutil

from supervisor.process.warmable import WARM_MODULE
from tests.conftest import JOBS
from tests.support import (  # noqa: F401 - re-exported
    CLI, ended_kinds, events, heartbeat, kill_group, run_cli, start_cli, sup_env, supervisor_state, wait_until,
)

FAKE_JOB = str(JOBS / "fake_job.py")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def attempt_pids(run_dir: Path) -> list[int]:
    return [e["pid"] for e in events(run_dir, "attempt_started")]


def no_standby_left(marker: str) -> None:
    """No idle warm interpreter whose command line holds `marker` (a test's own path) is left running."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        assert not (WARM_MODULE in cmd and any(marker in c for c in cmd)), cmd
