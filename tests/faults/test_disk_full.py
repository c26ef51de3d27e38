"""Trial 4: the run dir lives on a tiny tmpfs, so checkpoint writes hit a real ENOSPC."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import mounted_tmpfs
from tests.supervisor.helpers import ended_kinds, events, run_cli, sup_env

from .common import (
    FAST, TOY, assert_bit_exact, assert_no_survivors, checkpoint_steps, faulted_run, reference, tmp_dirs, verify_cli,
)

# ~850 KB checkpoints (hidden 256 with Adam) on a 600 KB filesystem: every save runs out of space.
JOB = ("--hidden", "256", "--epochs", "2", "--samples", "96", "--batch-size", "8", "--save-every", "5")


@pytest.fixture
def small_fs(tmp_path):
    with mounted_tmpfs(tmp_path / "small", "size=600k,mode=0700") as mnt:
        yield mnt


def test_enospc_saves_fail_training_continues_and_nothing_partial_is_chosen(tmp_path, small_fs):
    ref = reference(tmp_path, *JOB)
    run_dir, out = small_fs / "run", tmp_path / "weights.pt"
    faulted_run(run_dir, out, JOB, "1:kill@12", ["signal", "success"], timeout=180)
    failed = events(run_dir, "checkpoint_failed")
    assert failed and all("ENOSPC" in e["error"] or "no_space" in e["error"] for e in failed), failed
    assert any("ENOSPC" in e["error"] for e in failed)  # a real write ran out of space
    # Nothing was ever committed, so the restart started fresh rather than from a partial write.
    assert [e["resume_from"] for e in events(run_dir, "attempt_started")] == [None, None]
    assert checkpoint_steps(run_dir) == [] and tmp_dirs(run_dir) == []
    assert verify_cli(run_dir).returncode == 0
    assert_bit_exact(out, ref)
    assert_no_survivors(run_dir, str(out))


def test_full_run_dir_saves_land_in_the_fallback_dir_and_resume_uses_it(tmp_path, small_fs):
    ref = reference(tmp_path, *JOB)
    run_dir, out, roomy = small_fs / "run", tmp_path / "weights.pt", tmp_path / "roomy"
    r = run_cli("--run-dir", str(run_dir), *FAST, TOY, *JOB, "--fallback-dir", str(roomy), "--out", str(out),
                env=sup_env(TOY_FAULTS="1:kill@12"), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["signal", "success"]
    assert any("ENOSPC" in e["error"] for e in events(run_dir, "checkpoint_failed"))
    resume = events(run_dir, "attempt_started")[1]["resume_from"]
    assert resume == str(roomy / "checkpoints" / "step-00000010"), resume
    assert Path(events(run_dir, "attempt_ended")[1]["resumed_from"]) == Path(resume)
    assert checkpoint_steps(run_dir) == [] and checkpoint_steps(run_dir, roomy / "checkpoints")
    assert verify_cli(run_dir).returncode == 0
    assert_bit_exact(out, ref)
    assert_no_survivors(run_dir, str(out))
