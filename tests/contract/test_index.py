"""checkpoint_roots treats a run dir given relatively the same as the absolute dirs the index records."""

from __future__ import annotations

import os
from pathlib import Path

from trainer_shim.rundir import RunDir, atomic_write_json, checkpoint_roots, ensure_run_dir, iter_checkpoint_dirs


def test_a_relative_run_dir_lists_each_checkpoint_once(tmp_path: Path, monkeypatch) -> None:
    rd = ensure_run_dir(tmp_path / "runs" / "demo")
    (rd.checkpoint(4)).mkdir()
    fallback = tmp_path / "elsewhere" / "checkpoints"
    atomic_write_json(rd.index, {"step-00000004": {"global_step": 4, "dir": str(rd.checkpoint(4))},
                                 "step-00000009": {"global_step": 9, "dir": str(fallback / "step-00000009")}})
    monkeypatch.chdir(tmp_path)
    rel = RunDir(Path("runs/demo"))
    roots = checkpoint_roots(rel)
    # Before: [runs/demo/checkpoints, /abs/runs/demo/checkpoints, fallback] - every checkpoint listed twice.
    assert [os.path.realpath(r) for r in roots] == [os.path.realpath(rd.checkpoints), os.path.realpath(fallback)]
    assert roots[0] == rel.checkpoints
    assert [s for s, _, _ in iter_checkpoint_dirs(roots)] == [4]
