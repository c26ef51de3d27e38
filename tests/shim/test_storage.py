"""A full disk never kills training or leaves an invalid checkpoint; fallback_dir catches the saves."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import mounted_tmpfs
from tests.support import finished_step, first_steps
from trainer_shim import rundir

from .helpers import assert_same_weights, events, run_toy, shim_lines


@pytest.fixture
def tiny_ckpt_fs(run_dir: Path) -> Iterator[Path]:
    """run_dir/checkpoints on a 32 KiB tmpfs: smaller than one toy checkpoint (~60 KB)."""
    rundir.ensure_run_dir(run_dir)
    with mounted_tmpfs(run_dir / "checkpoints", "size=32k,mode=0700") as mnt:
        yield mnt


def _no_invalid(ckpts: Path) -> None:
    assert not list(rundir.tmp_dirs(ckpts)), "partial tmp dir left behind"
    for _, path, _ in rundir.iter_checkpoint_dirs([ckpts]):
        rundir.inspect_checkpoint(path, full=True)


def test_enospc_keeps_training(run_dir: Path, tiny_ckpt_fs: Path, refs) -> None:
    ref = refs.get()
    p = run_toy(run_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    assert finished_step(run_dir) == 36
    _no_invalid(tiny_ckpt_fs)
    failed = events(run_dir, "checkpoint_failed")
    assert failed, "no checkpoint_failed event"
    errors = " | ".join(e["error"] for e in failed)
    assert "ENOSPC" in errors, errors          # the first save hits the real disk-full error
    assert "no_space:" in errors, errors       # later ones are refused up front by the free-space check
    assert all(e["path"] for e in failed)
    assert shim_lines(p, "training continues")
    assert_same_weights(ref / "final_weights.pt", run_dir / "final_weights.pt")


def test_fallback_dir_receives_checkpoints_and_resume_uses_it(run_dir: Path, tiny_ckpt_fs: Path, tmp_path: Path,
                                                              refs) -> None:
    ref = refs.get()
    fb = tmp_path / "fallback"
    p = run_toy(run_dir, "--fallback-dir", str(fb), faults="1:kill@17")
    assert p.returncode == -9
    _no_invalid(tiny_ckpt_fs)
    assert (fb / "checkpoints" / "step-00000015" / "MANIFEST.json").exists()
    idx = rundir.read_index(rundir.RunDir(run_dir))
    assert idx["step-00000015"]["dir"] == str(fb / "checkpoints" / "step-00000015")
    assert events(run_dir, "checkpoint_failed")

    p = run_toy(run_dir, "--fallback-dir", str(fb), attempt=2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert first_steps(run_dir)[2] == 16, p.stderr  # resumed from step 15, which the index places in fb
    assert_same_weights(ref / "final_weights.pt", run_dir / "final_weights.pt")
