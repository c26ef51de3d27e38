"""A step save that falls on an epoch's last batch: one truth in manifest, index and resume."""

from __future__ import annotations

import json
from pathlib import Path

from trainer_shim import rundir

from tests.support import first_steps

from .helpers import assert_same_weights, manifest, run_toy


def test_step_save_at_epoch_end_records_next_epoch_batch_0(run_dir: Path) -> None:
    # 96 samples / batch 8 = 12 batches per epoch: every step save at 12 falls on an epoch end.
    p = run_toy(run_dir, "--save-every", "12", faults="1:kill@25")
    assert p.returncode != 0
    ck = run_dir / "checkpoints" / rundir.checkpoint_name(24)
    m = manifest(ck)
    assert (m["kind"], m["epoch"], m["batch_in_epoch"]) == ("epoch", 2, 0), m
    idx = json.loads(rundir.RunDir(run_dir).index.read_text())
    assert idx[ck.name]["kind"] == "epoch" and idx[ck.name]["epoch"] == 2
    p = run_toy(run_dir, "--save-every", "12", attempt=2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert first_steps(run_dir)[2] == 25, p.stderr  # resumed from the epoch-end checkpoint of step 24
    ref = run_toy(run_dir.parent / "ref", "--save-every", "12")
    assert ref.returncode == 0
    assert_same_weights(run_dir.parent / "ref" / "final_weights.pt", run_dir / "final_weights.pt")
