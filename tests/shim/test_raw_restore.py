"""Memory snapshots in the raw layout: a restart reads the bytes straight into the live
tensors, materialises optimizer state that does not exist yet, and trains on bit-exact; a corrupt
tensor rejects the slot and the disk checkpoint replaces whatever it touched, or, with none left,
the attempt ends and the next starts fresh; a slot persisted to disk loads with the one reader."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

import trainer_shim
from trainer_shim.errors import CheckpointError
from tests.conftest import JOBS, PYTHON, child_env
from tests.save_modes import PLAIN, shm_segments
from trainer_shim import rundir

from .helpers import events
from trainer_shim._restore import read

JOB = JOBS / "raw_restore_job.py"


def _job(run_dir: Path, expect: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(JOB), *args, "--run-dir", str(run_dir), "--expect", str(expect)],
                          env=child_env(**PLAIN), capture_output=True, text=True, timeout=180)


def _snapped(tmp_path: Path, *args: str) -> tuple[Path, Path]:
    run_dir, expect = tmp_path / "run", tmp_path / "expect.pt"
    p = _job(run_dir, expect, "snap", *args)
    assert p.returncode == -9, p.stderr[-2000:]
    return run_dir, expect


def _restored(run_dir: Path, expect: Path, *args: str) -> dict:
    p = _job(run_dir, expect, "restore", *args)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_restart_copies_the_snapshot_into_the_live_tensors_bit_exact(tmp_path: Path) -> None:
    run_dir, expect = _snapped(tmp_path)
    slot = rundir.complete_slots(run_dir)[0].path
    assert (slot / (rundir.MODEL_FILE + rundir.TABLE_SUFFIX)).exists(), "the slot is not in the raw layout"
    # Optimizer state exists (one step of the new process's own): everything lands in place.
    warm = _restored(run_dir, expect, "--warm-optimizer")
    assert warm["step"] == 3 and warm["equal"] and warm["next_equal"] and not warm["initial"], warm
    want = torch.load(expect, weights_only=True)[3]
    assert warm["in_place"] == sorted(want), "a restored tensor is not the live tensor it replaces"
    assert not shm_segments(run_dir), "finish() left the memory slots behind"


def test_optimizer_state_that_does_not_exist_yet_is_materialised_and_trains_on_bit_exact(tmp_path: Path) -> None:
    run_dir, expect = _snapped(tmp_path)
    cold = _restored(run_dir, expect)  # its optimizer state lands on one fresh anonymous region
    assert cold["step"] == 3 and cold["equal"] and cold["next_equal"], cold
    assert not cold["dcp_imported"], "a non-sharded restart imported torch.distributed.checkpoint"
    assert cold["in_place"] == sorted(k for k in torch.load(expect, weights_only=True)[3] if k.startswith("model."))


def _flip_middle_byte(region: Path) -> None:
    with open(region, "r+b") as f:
        f.seek(region.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def test_a_persisted_slot_loads_on_disk_and_a_corrupt_tensor_falls_back_to_disk_bit_exact(tmp_path: Path) -> None:
    run_dir, expect = _snapped(tmp_path, "--save-every", "2")  # on disk: step 2; in memory: 2 and 3
    # The supervisor's torch-free copy (elsewhere: not a resume candidate) reads back with the one reader.
    final = rundir.persist_slot(rundir.complete_slots(run_dir)[0], tmp_path / "elsewhere")
    assert final is not None
    _info, files = read.read_checkpoint(final)  # every digest: whole files and each tensor
    want = torch.load(expect, weights_only=True)[3]
    for k, v in files[rundir.MODEL_FILE].items():
        assert torch.equal(v, want[f"model.{k}"]), k
    for i, st in files[rundir.OPTIMIZER_FILE]["state"].items():
        assert torch.equal(st["exp_avg_sq"], want[f"opt.{i}.exp_avg_sq"]), i
    # A flipped byte in each slot's optimizer tensors: the model (read first, straight into the
    # live tensors) is already overwritten when the digest fails; the disk checkpoint replaces it all.
    for slot in shm_segments(run_dir):
        _flip_middle_byte(slot / (rundir.OPTIMIZER_FILE + rundir.TENSORS_SUFFIX))
    got = _restored(run_dir, expect, "--warm-optimizer")
    assert got["step"] == 2 and got["equal"] and got["next_equal"], got
    reasons = [e["reason"] for e in events(run_dir, rundir.Event.CHECKPOINT_REJECTED)]
    # Only the step-3 slot is tried: the step-2 one is no newer than the disk checkpoint.
    assert len(reasons) == 1 and "tensor" in reasons[0] and "digest mismatch" in reasons[0], reasons
    assert not shm_segments(run_dir)


def test_a_corrupt_tensor_with_no_disk_checkpoint_ends_the_attempt_and_the_next_starts_fresh(tmp_path: Path) -> None:
    run_dir, expect = _snapped(tmp_path)
    for slot in shm_segments(run_dir):
        _flip_middle_byte(slot / (rundir.OPTIMIZER_FILE + rundir.TENSORS_SUFFIX))
    p = _job(run_dir, expect, "restore", "--warm-optimizer")
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert p.returncode == 1 and len(errors) == 1 and "overwritten part of the live state" in errors[0], p.stderr
    assert not rundir.complete_slots(run_dir), "a rejected slot can still be picked"
    got = _restored(run_dir, expect)
    assert got["step"] == 0 and got["initial"], f"the next attempt did not start fresh: {got}"
    assert not shm_segments(run_dir)


def test_load_of_a_persisted_slot_with_a_corrupt_model_tensor_leaves_the_model_untouched(tmp_path: Path) -> None:
    # load() copies a plain member straight into the model only after its whole-file digest; a
    # split member's tensors are checked one by one as they land, so load() reads them aside.
    run_dir, _ = _snapped(tmp_path)
    try:
        final = rundir.persist_slot(rundir.complete_slots(run_dir)[0], tmp_path / "elsewhere")
    finally:
        rundir.free_slots(run_dir)   # the killed job's slots: only the persisted copy is used
    assert final is not None
    _flip_middle_byte(final / (rundir.MODEL_FILE + rundir.TENSORS_SUFFIX))
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="digest mismatch"):
        trainer_shim.load(final, model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "load() overwrote part of the model"
