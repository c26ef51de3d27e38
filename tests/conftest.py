"""Shared test helpers: every test runs the real thing (subprocesses, signals, files, torch)."""

from __future__ import annotations

import os
import sys
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
