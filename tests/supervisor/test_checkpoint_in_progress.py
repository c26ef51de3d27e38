"""`checkpoints --verify` while a framework writes its newest `checkpoint-N/`: shown as writing, not INVALID.

A HF Trainer names its checkpoint dir before its files are in, and our manifest comes last, so during
every save the newest dir has no manifest. While its writer runs that is a save in progress (exit 0);
once the writer is gone, the same dir is a torn save (INVALID, exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import invoke_cli
from trainer_shim.rundir import (
    EXIT_INVALID_CHECKPOINT, CheckpointKind, HeartbeatRecord, Manifest, Phase, atomic_write_json, commit, ensure_run_dir, record_extra_root,
)


def _hf_run(tmp_path: Path, writer_pid: int) -> Path:
    rd = ensure_run_dir(tmp_path / "run")
    out = tmp_path / "output"
    for step in (5, 10):
        d = out / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(bytes([step]) * 1000)
        if step == 5:
            m = Manifest.create(commit.hash_tree(d), step=step, epoch=0, batch_in_epoch=0, kind=CheckpointKind.STEP,
                                loss=None)
            commit.commit_in_place(d, m.to_bytes())
    record_extra_root(rd, out)
    hb = HeartbeatRecord(pid=writer_pid, step=10, phase=Phase.SAVING.value)
    atomic_write_json(rd.heartbeat(0), hb.to_json())
    return rd.root


def test_the_newest_checkpoint_of_a_live_writer_is_writing(tmp_path: Path) -> None:
    run = _hf_run(tmp_path, os.getpid())  # this process stands for the trainer inside its save
    r = invoke_cli("checkpoints", str(run), "--verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["checkpoint-10"]["writing"] and not rows["checkpoint-10"]["valid"], rows
    assert rows["checkpoint-10"]["problem"] is None and rows["checkpoint-5"]["valid"], rows
    table = invoke_cli("checkpoints", str(run), "--verify")
    assert table.returncode == 0 and "INVALID" not in table.stdout, table.stdout
    assert [ln.split()[-1] for ln in table.stdout.splitlines() if ln.startswith("checkpoint-10")] == ["writing"]


def test_the_same_checkpoint_without_its_writer_is_invalid(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run = _hf_run(tmp_path, int(gone.stdout))
    r = invoke_cli("checkpoints", str(run), "--verify", "--json")
    assert r.returncode == EXIT_INVALID_CHECKPOINT, r.stdout + r.stderr
    row = next(row for row in json.loads(r.stdout) if row["name"] == "checkpoint-10")
    assert not row["writing"] and "no MANIFEST.json" in row["problem"], row
