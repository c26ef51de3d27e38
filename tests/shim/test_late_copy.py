"""Pipelined memory snapshots: the optimizer's tensors are copied while the next step's forward,
backward and optimizer step run, yet the snapshot is the state run.step() returned at, bit for
bit (BatchNorm statistics that forward changes included); a job that changes a weight in place
outside optimizer.step() loses that one snapshot, is told once, and later snapshots stay exact."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import JOBS, PYTHON, child_env
from tests.save_modes import PLAIN
from trainer_shim import rundir
from trainer_shim._memory.late_copy import CHANGED_WHILE_COPIED

from .helpers import events

JOB = JOBS / "late_copy_job.py"


def _job(run_dir: Path, expect: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(JOB), *args, "--run-dir", str(run_dir), "--expect", str(expect)],
                          env=child_env(**PLAIN), capture_output=True, text=True, timeout=180)


def _snap_then_restore(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    run_dir, expect = tmp_path / "run", tmp_path / "expect.pt"
    snap = _job(run_dir, expect, "snap", *args)
    assert snap.returncode == -9, snap.stderr[-3000:]
    assert json.loads(snap.stdout.splitlines()[0]) == {"pipelined": True}
    p = _job(run_dir, expect, "restore")
    assert p.returncode == 0, p.stderr[-3000:]
    return snap, json.loads(p.stdout.strip().splitlines()[-1])


def test_a_snapshot_copied_beside_the_next_step_restores_the_state_of_its_own_step(tmp_path: Path) -> None:
    _, got = _snap_then_restore(tmp_path, "--steps", "6")
    assert got == {"step": 6, "equal": True}


def test_a_weight_changed_outside_the_optimizer_drops_that_snapshot_once_and_later_ones_stay_exact(
        tmp_path: Path) -> None:
    snap, got = _snap_then_restore(tmp_path, "--steps", "6", "--mutate-at", "3")
    assert got == {"step": 6, "equal": True}
    said = [ln for ln in (snap.stdout + snap.stderr).splitlines() if CHANGED_WHILE_COPIED in ln]
    assert len(said) == 1, snap.stderr[-2000:]
    failed = events(tmp_path / "run", rundir.Event.CHECKPOINT_FAILED)
    assert [CHANGED_WHILE_COPIED in e["error"] for e in failed] == [True], failed
