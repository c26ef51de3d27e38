"""Trial 1: an external chaos killer SIGKILLs the trainer at random moments, many of them mid-save."""

from __future__ import annotations

import os
import signal

from pathlib import Path

import pytest

from tests.supervisor.helpers import ended_kinds, events, sup_env
from tests.support import resumed_from

from trainer_shim import rundir

from tests.save_modes import modes, save_mode, shm_segments  # noqa: F401  (fixture)

from .common import (
    FAST, TOY, assert_bit_exact, assert_no_survivors, faulted_run, reference, run_under_killer, verify_cli,
)

# ~10 MB checkpoints (hidden 900 with Adam: 3 x 900x900 fp32 + small), ~300 steps.
JOB = ("--hidden", "900", "--samples", "400", "--batch-size", "4", "--epochs", "3", "--save-every", "10",
       "--step-sleep", "0.01")
# The campaign (make test-faults) runs seeds 1-8 in every save mode (seed 2 found the epoch-end
# supersede race; a deterministic test below now places that kill). make test runs none of it
# (~27 s a seed): its chaos is test_memory_snapshots' async+memory seed 3, beside the placed kills.
# RRTEST_CHAOS_SEEDS=2,5 replays chosen seeds (each mode's `long` marker still applies).
SEEDS = [int(s) for s in os.environ.get("RRTEST_CHAOS_SEEDS", "").split(",") if s] or (
    [1] + [pytest.param(s, marks=pytest.mark.long) for s in range(2, 9)])   # every mode is long too (above)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("save_mode", modes(), indirect=True)
def test_chaos_sigkill_of_the_trainer_is_bit_exact(tmp_path, seed, save_mode):
    print(f"chaos seed {seed}")
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    kills = 6
    rc, stderr, killer = run_under_killer(run_dir, seed, kills, *FAST, TOY, *JOB, "--out", str(out), env=sup_env())
    print(f"seed {seed}: kills {killer.log}")
    assert rc == 0, stderr[-3000:]
    assert len(killer.log) == kills, f"seed {seed}: only {len(killer.log)} kills landed: {killer.log}"
    assert any(k["mid_save"] for k in killer.log), f"seed {seed}: no kill landed mid-save: {killer.log}"
    assert ended_kinds(run_dir) == ["signal"] * kills + ["success"], f"seed {seed}"
    ended = events(run_dir, "attempt_ended")
    assert all(e["signal"] == signal.SIGKILL for e in ended[:-1])
    # Never an invalid checkpoint: the supervisor's every choice was loaded as chosen (the shim
    # re-verifies digests and would have rejected and fallen back), and nothing was rejected.
    assert not events(run_dir, "checkpoint_rejected"), f"seed {seed}"
    starts = resumed_from(run_dir)
    assert [e["resumed_from"] for e in ended] == starts, f"seed {seed}"
    # Resume points only move forward (a fresh start only before the first commit).
    steps = [rundir.parse_checkpoint_name(Path(s).name) if s else -1 for s in starts]
    assert steps == sorted(steps), f"seed {seed}: resume went backwards: {starts}"
    assert_bit_exact(out, ref)
    assert verify_cli(run_dir).returncode == 0
    assert_no_survivors(run_dir, str(out))
    assert not shm_segments(run_dir), "shared-memory snapshot slots outlived the run"


def test_a_kill_inside_the_epoch_end_save_keeps_the_step_save_it_was_replacing(tmp_path):
    # 12 steps per epoch, a save every 4: run.step() saves step 12 on the epoch's last batch, then
    # the epoch-end save writes step 12 again (the truth: next epoch, batch 0) and supersedes the
    # first one at its commit. Killed at that save's first large write, the first one must stand
    # (deleting it up front left `latest` dangling and lost 4 steps; chaos sync-2).
    job = ("--hidden", "600", "--epochs", "2", "--samples", "96", "--batch-size", "8", "--save-every", "4")
    ref = reference(tmp_path, *job)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    faulted_run(run_dir, out, job, "1:kill_save@12", ["signal", "success"])
    step12 = run_dir.resolve() / "checkpoints" / rundir.checkpoint_name(12)
    assert events(run_dir, "attempt_started")[1]["resume_from"] == str(step12)
    assert rundir.inspect_checkpoint(step12).manifest.epoch == 1, "the epoch-end save did not supersede it"
    assert_bit_exact(out, ref)
