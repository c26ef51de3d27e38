"""The integrations' rotation (which replaces the HF Trainer's save_total_limit) on real checkpoint dirs."""

from __future__ import annotations

from pathlib import Path

from trainer_shim._disk.retention import Retention
from trainer_shim.rundir import CheckpointKind, Manifest, commit, ensure_run_dir


def _checkpoint(root: Path, step: int, manifest: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(bytes([step % 256]) * 100)
    if manifest:
        manifest = Manifest.create(commit.hash_tree(d), step=step, epoch=0, batch_in_epoch=0,
                                   kind=CheckpointKind.STEP, loss=None)
        commit.commit_in_place(d, manifest.to_bytes())
    return d


def test_rotation_keeps_the_newest_the_resumed_one_and_anything_it_cannot_judge(tmp_path: Path) -> None:
    for s in (5, 10, 15, 20):
        _checkpoint(tmp_path, s)
    torn = _checkpoint(tmp_path, 25, manifest=False)  # e.g. being written, or torn: never rotated away
    resumed = tmp_path / "checkpoint-5"
    rd = ensure_run_dir(tmp_path / "run")
    retention = Retention(rd, lambda: [tmp_path], keep_last=2, keep_epochs=2, keep_best=0, background=False)
    retention.resumed_step = 5
    retention.rotate(protect={"checkpoint-20"})
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "run")
    assert left == ["checkpoint-15", "checkpoint-20", "checkpoint-25", "checkpoint-5"], left
    assert torn.exists() and resumed.exists()


def test_a_trainer_output_dir_outside_the_run_dir_is_searched_by_both_sides(tmp_path: Path) -> None:
    """output_dir != run dir: the callback records it; selection and `resilient-run checkpoints --verify` see it."""
    import json
    import subprocess

    from tests.conftest import PYTHON, REPO
    from tests.supervisor.helpers import sup_env
    from trainer_shim.rundir import checkpoint_roots, ensure_run_dir, newest_valid, record_extra_root

    out = tmp_path / "hf-output"
    _checkpoint(out, 10)
    (out / "checkpoint-20").mkdir()  # torn: the Trainer was killed in its save
    rd = ensure_run_dir(tmp_path / "run")
    assert newest_valid(checkpoint_roots(rd)) is None
    record_extra_root(rd, out)
    record_extra_root(rd, out)  # idempotent
    rejected: list = []
    info = newest_valid(checkpoint_roots(rd), on_reject=lambda p, r: rejected.append((p.name, r)))
    assert info is not None and info.path == out / "checkpoint-10"
    assert rejected == [("checkpoint-20", "no MANIFEST.json (incomplete or damaged)")]
    r = subprocess.run([PYTHON, "-m", "supervisor", "checkpoints", str(rd.root), "--verify", "--json"],
                       env=sup_env(), capture_output=True, text=True, timeout=60, cwd=REPO)
    listed = {c["name"]: c["valid"] for c in json.loads(r.stdout)}
    assert listed == {"checkpoint-10": True, "checkpoint-20": False}, r.stdout + r.stderr


def test_both_callbacks_take_the_same_options_the_config_file_names() -> None:
    """One declaration: the HF and Lightning callbacks share CallbackOptions' constructor and
    resume_from's signature, and their keywords are the contract's CALLBACK_OPTIONS (the config
    file's `callback:` keys); Lightning's callback is a real class."""
    import inspect

    from trainer_shim.integrations import hf, lightning
    from trainer_shim.rundir import CALLBACK_OPTIONS

    sig = {cls: inspect.signature(cls) for cls in (hf.ResilientCallback, lightning.ResilientCallback)}
    assert sig[hf.ResilientCallback] == sig[lightning.ResilientCallback]
    keywords = [n for n, p in sig[hf.ResilientCallback].parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert keywords == list(CALLBACK_OPTIONS)
    assert (inspect.signature(hf.ResilientCallback.resume_from)
            == inspect.signature(lightning.ResilientCallback.resume_from))
    assert lightning.ResilientCallback.__module__ == "trainer_shim.integrations.lightning"
    assert inspect.getsource(lightning.ResilientCallback).startswith("class ResilientCallback(")
