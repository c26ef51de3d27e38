"""The integrations' rotation (which replaces the HF Trainer's save_total_limit) on real checkpoint dirs."""

from __future__ import annotations

from pathlib import Path

from trainer_shim.integrations._session import hash_tree, make_manifest, rotate, write_manifest
from trainer_shim.rundir import CheckpointKind


def _checkpoint(root: Path, step: int, manifest: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(bytes([step % 256]) * 100)
    if manifest:
        write_manifest(d, make_manifest(hash_tree(d), step=step, epoch=0, batch_in_epoch=0,
                                        kind=CheckpointKind.STEP, loss=None))
    return d


def test_rotation_keeps_the_newest_the_resumed_one_and_anything_it_cannot_judge(tmp_path: Path) -> None:
    for s in (5, 10, 15, 20):
        _checkpoint(tmp_path, s)
    torn = _checkpoint(tmp_path, 25, manifest=False)  # e.g. being written, or torn: never rotated away
    resumed = tmp_path / "checkpoint-5"
    deleted = rotate([tmp_path], keep_last=2, protected=[tmp_path / "checkpoint-20", resumed])
    assert deleted == ["checkpoint-10"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["checkpoint-15", "checkpoint-20", "checkpoint-25", "checkpoint-5"], left
    assert torn.exists() and resumed.exists()
