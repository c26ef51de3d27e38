"""Damaged or hostile checkpoints are refused with one line each and an older valid one is used."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

import trainer_shim
from trainer_shim import CheckpointError, rundir

from tests.support import first_steps, rejected, written_in

from .helpers import assert_same_weights, rewrite_manifest, run_toy


class _Evil:
    """Unpickling this would run a shell command that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant_evil(ckpt: Path, marker: Path) -> None:
    with open(ckpt / "model.pt", "wb") as f:
        pickle.dump({"weight": _Evil(marker)}, f)  # a legacy (non-zip) pickle...
    torch.save({"weight": _Evil(marker)}, ckpt / "optimizer.pt")  # ...and a zip one
    rewrite_manifest(ckpt)  # sizes and digests now match: only weights_only stands in the way


def test_corrupt_truncated_and_malicious_are_skipped(run_dir: Path, refs, tmp_path: Path) -> None:
    ref = refs.get()
    p = run_toy(run_dir, attempt=1, faults="1:kill@17")
    assert p.returncode == -9
    ck = run_dir / "checkpoints"
    assert {"step-00000010", "step-00000012", "step-00000015"} <= {x.name for x in ck.iterdir()}
    # newest: one flipped byte, same size (only the digest can tell)
    with open(ck / "step-00000015" / "model.pt", "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    # next: truncated
    with open(ck / "step-00000012" / "trainer.pt", "r+b") as f:
        f.truncate(50)
    marker = tmp_path / "pwned"
    _plant_evil(ck / "step-00000010", marker)

    p = run_toy(run_dir, attempt=2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not marker.exists(), "a pickle from disk was executed"
    ev = rejected(run_dir)
    assert [Path(e["path"]).name for e in ev] == ["step-00000015", "step-00000012", "step-00000010"], p.stderr
    assert "model.pt digest mismatch" in ev[0]["reason"]
    assert "trainer.pt" in ev[1]["reason"] and "truncated" in ev[1]["reason"]
    assert "weights_only" in ev[2]["reason"]
    assert first_steps(run_dir)[2] == 6, p.stderr  # attempt 2 resumed from step-00000005
    assert_same_weights(ref / "final_weights.pt", run_dir / "final_weights.pt")
    # Passing those steps again, the run writes them anew instead of keeping the damaged dirs.
    left = rundir.iter_checkpoint_dirs([ck])  # what rotation kept, step 12 (an epoch end) among them
    assert 12 in [step for step, _, _ in left]
    assert all(written_in(run_dir, path, 2) for step, path, _ in left if step in (10, 12, 15)), left
    for _step, path, _root in left:
        rundir.inspect_checkpoint(path, full=True)
    assert not marker.exists()


def test_load_refuses_malicious_and_loads_good(refs, tmp_path: Path) -> None:
    ref = refs.get()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    res = trainer_shim.load(ref, model=model)  # a run dir: newest valid checkpoint
    # the final save found step 36 committed by the epoch end: manifest stays, the index upgrades
    assert res.manifest.global_step == 36 and res.manifest.kind == rundir.CheckpointKind.EPOCH
    assert rundir.read_index(rundir.RunDir(ref))["step-00000036"]["kind"] == "final"
    final = torch.load(ref / "final_weights.pt", weights_only=True)
    assert all(torch.equal(final[k], v) for k, v in model.state_dict().items())

    import shutil
    bad = tmp_path / "step-00000036"
    shutil.copytree(res.path, bad)
    marker = tmp_path / "pwned"
    _plant_evil(bad, marker)
    with pytest.raises(CheckpointError, match="weights_only"):
        trainer_shim.load(bad, model=model)
    assert not marker.exists()


def test_a_flipped_tensor_byte_torch_load_accepts_is_refused_and_nothing_is_applied(tmp_path: Path) -> None:
    """The digests are hashed while torch.load reads the members: a byte flipped inside a tensor's
    data (which torch.load reads without complaint) must still refuse the checkpoint, and the model
    must keep its own weights."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    run = trainer_shim.init(model=model, run_dir=tmp_path / "run", save_on_epoch_end=False)
    run.global_step = 1
    path = run.save()
    run.finish()
    member = path / "model.pt"
    with open(member, "r+b") as f:
        f.seek(member.stat().st_size // 2)   # the weight's data: 256 KiB of the ~257 KiB file
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x01]))
    torch.load(member, weights_only=True)   # the damage is invisible to torch.load itself
    other = torch.nn.Linear(256, 256)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError, match="model.pt digest mismatch"):
        trainer_shim.load(path, model=other)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())
