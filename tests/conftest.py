"""Shared test helpers: every test runs the real thing (subprocesses, signals, files, torch)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
JOBS = REPO / "tests" / "jobs"
PYTHON = sys.executable


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A fresh, not yet created run dir path."""
    return tmp_path / "run"


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a job subprocess: ours, minus anything a supervisor would have set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESILIENT_")}
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Two cores: keep torch from oversubscribing when tests and helpers run side by side.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A real tmpfs at `path` (e.g. options "size=600k,mode=0700") for real ENOSPC/EROFS; skips if mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {r.stderr.strip() or r.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
