"""The cheap warning outside doctor mode: parameters/buffers changed between run.step() and the next batch."""

from __future__ import annotations

import subprocess

from tests.conftest import JOBS, PYTHON, REPO, child_env

WARNING = "model parameters or buffers changed after run.step() at step 10"


def _run(tmp_path, mode: str) -> subprocess.CompletedProcess:
    env = child_env(RESILIENT_RUN_DIR=str(tmp_path / mode), PYTHONPATH=str(REPO))
    return subprocess.run([PYTHON, str(JOBS / "doctor_job.py"), mode, "3"], env=env, capture_output=True,
                          text=True, timeout=300)


def test_change_after_step_warns_once(tmp_path):
    r = _run(tmp_path, "bn")  # BatchNorm forward in train mode after run.step() at steps 10 and 20
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("changed after run.step()") == 1
    assert WARNING in r.stderr and "Call run.step() after the last change to training state" in r.stderr


def test_clean_loop_does_not_warn(tmp_path):
    r = _run(tmp_path, "exact")
    assert r.returncode == 0, r.stderr
    assert "changed after run.step()" not in r.stderr
