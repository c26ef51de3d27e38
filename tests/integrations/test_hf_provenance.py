"""HF checkpoints carry the provenance and the batch position of the raw loop's: the arguments hash
(the command line and the TrainingArguments that shape training), the git state, the real batch of
the epoch; a resume with changed arguments warns, and under strict resume is refused (exit 2)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO
from tests.support import events, run_cli, sup_env
from trainer_shim import rundir
from trainer_shim.rundir import Event

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers not installed (pip install 'resilient-run[hf]')")

JOB = REPO / "examples" / "hf_train.py"


def _train(out: Path, epochs: int, **env: str) -> subprocess.CompletedProcess:
    # The loss is logged every 4 steps: a checkpoint between logs records the step its loss is from.
    return subprocess.run([PYTHON, str(JOB), "--output_dir", str(out), "--epochs", str(epochs), "--logging_steps", "4"],
                          env=sup_env(**env), capture_output=True, text=True, timeout=300, cwd=out.parent)


def _manifests(out: Path) -> dict[int, rundir.Manifest]:
    return {step: rundir.inspect_checkpoint(path).manifest
            for step, path, _ in rundir.iter_checkpoint_dirs([out])}


def test_hf_checkpoints_record_provenance_and_batch_and_a_changed_resume_is_judged(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = _train(out, 1)
    assert first.returncode == 0, first.stderr[-3000:]
    m = _manifests(out)
    # 96 samples, batches of 8: 12 batches (optimizer steps) an epoch, a save every 5 steps and at the
    # end, the newest two kept (save_total_limit=2).
    assert {s: (x.epoch, x.batch_in_epoch) for s, x in m.items()} == {10: (0, 10), 12: (1, 0)}
    assert {s: x.loss_step for s, x in m.items()} == {10: 8, 12: None}   # logged at 8; at 12 itself
    listed = run_cli("checkpoints", str(out), env=sup_env(COLUMNS="200"))
    row = next(ln for ln in listed.stdout.splitlines() if ln.lstrip().startswith("checkpoint-10"))
    assert f"{m[10].loss:.6g} @8" in row, listed.stdout
    hashes = {x.args_hash for x in m.values()}
    assert len(hashes) == 1 and None not in hashes, hashes

    same = _train(out, 1)   # the same command again: resumes the finished run, no mismatch
    assert same.returncode == 0, same.stderr[-3000:]
    assert not events(out, Event.RESUME_MISMATCH), same.stderr[-3000:]

    changed = _train(out, 2)   # other arguments: a warning and an event, training goes on
    assert changed.returncode == 0, changed.stderr[-3000:]
    warned = [ln for ln in changed.stderr.splitlines() if "different provenance" in ln]
    assert warned == [f"trainer_shim: warning: resuming checkpoint-12 written with different provenance: "
                      "arguments/config changed"], changed.stderr[-3000:]
    assert [e["differences"].keys() for e in events(out, Event.RESUME_MISMATCH)] == [{"args_hash": 0}.keys()]

    refused = _train(out, 3, **{rundir.ENV_STRICT_RESUME: "1"})   # strict: refused before any step
    assert refused.returncode == rundir.EXIT_REFUSED, refused.stderr[-3000:]
    lines = [ln for ln in refused.stderr.splitlines() if ln.startswith("trainer_shim: refusing to resume")]
    assert len(lines) == 1 and "arguments/config changed" in lines[0], refused.stderr[-3000:]
    assert max(_manifests(out)) == 24, "the refused attempt wrote no checkpoint"
