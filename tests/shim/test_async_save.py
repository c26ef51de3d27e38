"""init(async_save=True): isolation of the snapshot, writer failures, waiting at the end."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

import trainer_shim
from trainer_shim import rundir
from tests.conftest import JOBS, PYTHON, child_env
from tests.save_modes import PLAIN, shm_segments

from .helpers import assert_same_weights, events, run_toy, shim_lines
from trainer_shim._restore import read


def test_updates_after_step_returns_never_leak_into_the_async_checkpoint(run_dir: Path) -> None:
    p = subprocess.run([PYTHON, str(JOBS / "async_job.py"), "--run-dir", str(run_dir)], env=child_env(),
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "save in flight: True" in p.stdout, "the mutation did not race a background write"
    want = torch.load(run_dir / "expected.pt", weights_only=True)
    got = trainer_shim.load(run_dir / "checkpoints" / "step-00000004", optimizer=None)
    for k, v in want["model"].items():
        assert torch.equal(got.model_state[k], v), f"{k}: an update made after run.step() leaked in"
    _info, files = read.read_checkpoint(run_dir / "checkpoints" / "step-00000004")
    for i, st in want["optimizer"]["state"].items():
        assert torch.equal(files[rundir.OPTIMIZER_FILE]["state"][i]["exp_avg"], st["exp_avg"])
    assert not events(run_dir, "checkpoint_failed")
    assert not shm_segments(run_dir), "finish() left shared-memory slots behind"


def test_background_write_failure_is_an_event_and_a_warning_and_training_continues(run_dir: Path, refs) -> None:
    args = ("--epochs", "1", "--save-every", "5")
    ref = refs.get(*args)
    blocker = run_dir / "checkpoints" / ".tmp-step-00000005"  # a file where the writer needs its dir
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the way\n")
    p = run_toy(run_dir, *args, env={**PLAIN, "TOY_ASYNC_SAVE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    failed = events(run_dir, "checkpoint_failed")
    assert [e.get("background") for e in failed] == [True], failed
    assert failed[0]["path"].endswith("step-00000005")
    assert shim_lines(p, "background checkpoint at step 5 failed"), p.stderr
    assert (run_dir / "checkpoints" / "step-00000010").is_dir(), "later saves stopped after the failure"
    assert_same_weights(ref / "final_weights.pt", run_dir / "final_weights.pt")
    assert not shm_segments(run_dir)


@pytest.mark.parametrize("fault,code", [("raise", 1), ("sigterm", 75)])
def test_an_exception_or_sigterm_waits_for_the_save_in_flight(run_dir: Path, fault: str, code: int) -> None:
    # The fault strikes right after run.step() 10 handed its save to the writer thread.
    try:
        p = run_toy(run_dir, "--epochs", "1", "--save-every", "5", faults=f"1:{fault}@10",
                    env={**PLAIN, "TOY_ASYNC_SAVE": "1"})
    finally:
        left = shm_segments(run_dir)
        rundir.free_slots(run_dir)  # a crash keeps its slots for the next start (no supervisor here)
    assert p.returncode == code, p.stderr[-3000:]
    assert not left if fault == "sigterm" else left, "a standalone stop frees the slots, a crash keeps them"
    info = rundir.inspect_checkpoint(run_dir / "checkpoints" / "step-00000010", full=True)
    assert info.manifest.exact, "the in-flight save was replaced by an emergency one"
    assert not list(rundir.tmp_dirs(run_dir / "checkpoints"))
    assert not events(run_dir, "checkpoint_failed")
