"""Data-position resume across loader kinds, deep skips without loading, and the supervisor env."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer_shim._state import data
from trainer_shim import rundir

from tests.support import first_steps

from .helpers import VARIANT, assert_same_weights, run_job, run_toy, shim_lines


def test_resumed_loader_yields_the_same_tail_without_touching_skipped_items() -> None:
    touched: list[int] = []

    class Spy(TensorDataset):
        def __getitem__(self, i):
            touched.append(i)
            return super().__getitem__(i)

    loader = DataLoader(Spy(torch.arange(40.0)), batch_size=4, shuffle=True)
    torch.manual_seed(1)
    start = torch.get_rng_state()
    full = [b[0].tolist() for b in loader]
    torch.set_rng_state(start)
    touched.clear()
    new, skip = data.resumed_loader(loader, 3)
    it = iter(new)
    skip.prime()
    assert touched == [], "skipping loaded data"
    assert len(new) == 7
    assert [b[0].tolist() for b in it] == full[3:]
    assert list(data.skip_plain([1, 2, 3, 4], 2)) == [3, 4]
    assert list(data.skip_plain(iter(range(5)), 3)) == [3, 4]


@pytest.mark.parametrize("loader,kills", [("dist", [7, 11]), ("stateful", [7, 17]), ("list", [7, 15])])
def test_loader_kinds_resume_bit_exact(tmp_path: Path, loader: str, kills: list[int]) -> None:
    ref = tmp_path / "ref"
    p = run_job(VARIANT, ref, "--loader", loader)
    assert p.returncode == 0, p.stderr[-3000:]
    rd = tmp_path / "run"
    faults = ",".join(f"{i + 1}:kill@{s}" for i, s in enumerate(kills))
    for attempt in range(1, len(kills) + 2):
        p = run_job(VARIANT, rd, "--loader", loader, attempt=attempt, faults=faults)
        assert p.returncode == (0 if attempt > len(kills) else -9), p.stderr[-3000:]
    assert first_steps(rd)[len(kills) + 1] > 1, p.stderr  # the last attempt resumed
    assert_same_weights(ref / "final_weights.pt", rd / "final_weights.pt")


def test_skipping_5000_batches_of_a_slow_dataset_is_fast(tmp_path: Path) -> None:
    rd = tmp_path / "run"
    args = ("--loader", "slow", "--samples", "5100", "--batch-size", "1", "--epochs", "1", "--save-every", "5000")
    p = run_job(VARIANT, rd, *args, faults="1:kill@5001", env={"VARIANT_SLEEP": "0"})
    assert p.returncode == -9, p.stderr[-3000:]
    expect = re.search(r"batch 5000 index (\[\d+\])", p.stdout).group(1)
    p = run_job(VARIANT, rd, *args, attempt=2, env={"VARIANT_SLEEP": "0.001"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert first_steps(rd)[2] == 5001, p.stderr  # resumed from step 5000
    m = re.search(r"first batch after ([\d.]+) s index (\[\d+\])", p.stdout)
    assert m.group(2) == expect, "resumed at the wrong batch"
    assert float(m.group(1)) < 0.5, f"skip took {m.group(1)} s: consumed batches were loaded"


def test_crash_after_optimizer_step_saves_no_emergency(tmp_path: Path) -> None:
    rd = tmp_path / "run"
    p = run_job(VARIANT, rd, "--crash-dirty-at", "8")
    assert p.returncode == 1
    assert shim_lines(p, "no emergency checkpoint: optimizer.step() ran after run.step() 7")
    assert not rundir.RunDir(rd).checkpoint(7).exists()
    assert rundir.RunDir(rd).error_file(1).exists()


def test_standalone_default_run_dir_and_resume_from_env(tmp_path: Path, refs) -> None:
    ref = refs.get()
    p = run_toy(None, cwd=tmp_path, faults="1:exit3@20")  # no supervisor env, no --run-dir
    assert p.returncode == 3
    rd = tmp_path / "runs" / "toy_train"
    assert (rd / "checkpoints" / "step-00000020").is_dir()
    assert (rd.stat().st_mode & 0o777) == 0o700
    assert first_steps(rd)[1] == 1, p.stderr  # a fresh start
    # the supervisor names an older checkpoint: it is used, not the newest
    p = run_toy(None, cwd=tmp_path, attempt=2, faults="2:exit3@14",
                env={rundir.ENV_RESUME_FROM: str(rd / "checkpoints" / "step-00000010"), rundir.ENV_RUN_DIR: str(rd)})
    assert p.returncode == 3 and first_steps(rd)[2] == 11, p.stderr
    # "none" means start fresh even though checkpoints exist
    p = run_toy(None, cwd=tmp_path, attempt=3, env={rundir.ENV_RESUME_FROM: rundir.RESUME_NONE,
                                                    rundir.ENV_RUN_DIR: str(rd)})
    assert p.returncode == 0 and first_steps(rd)[3] == 1, p.stderr
    assert_same_weights(ref / "final_weights.pt", rd / "final_weights.pt")
