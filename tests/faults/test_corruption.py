"""Trials 5 and 10: damaged, forged or escaping checkpoints are refused and the older valid one is used.

Each case starts from the same interrupted run (checkpoints step-5 and step-10, built once),
damages step-10 (or `latest`, or adds an escaping entry), runs the supervisor to the end and
checks the job resumed from step-5, finished bit-exact and left a checkpoint_rejected event
naming the reason. Anything outside the run dir that a forged entry points at is untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import PYTHON
from tests.supervisor.helpers import ended_kinds, events, run_cli, sup_env
from trainer_shim import rundir

from .common import FAST, TOY, assert_bit_exact, assert_no_survivors, reference

JOB = ("--epochs", "2", "--samples", "96", "--batch-size", "8", "--save-every", "5")  # 24 steps


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A run dir a standalone toy run left after dying at step 11: step-5 and step-10 committed."""
    d = tmp_path_factory.mktemp("corruption-base")
    run = d / "run"
    p = subprocess.run([PYTHON, TOY, *JOB, "--run-dir", str(run), "--out", str(d / "unused.pt")],
                       env=sup_env(TOY_FAULTS="1:exit2@11"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    assert sorted(x.name for x in (run / "checkpoints").glob("step-*")) == ["step-00000005", "step-00000010"]
    return run


def _copy(base: Path, dest: Path) -> Path:
    shutil.copytree(base, dest, symlinks=True)
    idx = dest / "checkpoint_metadata.json"
    idx.write_text(idx.read_text().replace(str(base), str(dest)))  # the index names absolute dirs
    return dest


def _rewrite_manifest(ckpt: Path, **extra_files: dict) -> None:
    m = json.loads((ckpt / "MANIFEST.json").read_text())
    for rel in m["files"]:
        p = ckpt / rel
        m["files"][rel] = {"size": p.stat().st_size, "xxh3_128": rundir.digest_file(p)}
    m["files"].update(extra_files)
    (ckpt / "MANIFEST.json").write_text(json.dumps(m))


class Evil:
    marker = ""

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _damage(case: str, run: Path, outside: Path) -> str:
    """Apply one damage; returns a substring the rejection reason must contain."""
    ck = run / "checkpoints"
    new = ck / "step-00000010"
    if case == "truncate":
        f = new / "model.pt"
        os.truncate(f, f.stat().st_size // 2)
        return "truncated"
    if case == "zero_fill":
        f = new / "optimizer.pt"
        f.write_bytes(b"\0" * f.stat().st_size)
        return "digest mismatch"
    if case == "bit_flip":
        f = new / "model.pt"
        b = bytearray(f.read_bytes())
        b[len(b) // 2] ^= 0x10
        f.write_bytes(bytes(b))
        return "digest mismatch"
    if case == "no_manifest":
        (new / "MANIFEST.json").unlink()
        return "no MANIFEST.json"
    if case == "latest_dangles":
        shutil.rmtree(new)  # `latest` still names step-00000010
        assert os.readlink(ck / "latest") == "step-00000010"
        return "latest points to missing"
    if case == "malicious_pickle":
        Evil.marker = str(outside / "PWNED")
        torch.save({"rng": Evil(), "global_step": 10}, new / "trainer.pt")
        _rewrite_manifest(new)  # the digests are right: only the safe loader can refuse it
        return "weights_only"
    if case == "latest_outside":
        shutil.copytree(new, outside / "step-00000010")
        shutil.rmtree(new)
        (ck / "latest").unlink()
        os.symlink(outside / "step-00000010", ck / "latest")
        return "latest points outside"
    if case == "dir_symlink_outside":
        shutil.move(str(new), str(outside / "step-00000010"))
        os.symlink(outside / "step-00000010", new)
        return "resolves outside"
    if case == "manifest_dotdot":
        (ck / "x").write_bytes(b"bystander")
        _rewrite_manifest(new, **{"../x": {"size": 9, "xxh3_128": rundir.digest_file(ck / "x")}})
        return "unsafe path '../x'"
    raise AssertionError(case)


CASES = ["truncate", "zero_fill", "bit_flip", "no_manifest", "latest_dangles", "malicious_pickle",
         "latest_outside", "dir_symlink_outside", "manifest_dotdot"]


@pytest.mark.parametrize("case", CASES)
def test_damaged_newest_checkpoint_falls_back_to_the_older_one(tmp_path, base, case):
    ref = reference(tmp_path, *JOB)
    run = _copy(base, tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    why = _damage(case, run, outside)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    out = tmp_path / "weights.pt"
    r = run_cli("--run-dir", str(run), *FAST, TOY, *JOB, "--out", str(out), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run) == ["success"]
    ended = events(run, "attempt_ended")[0]
    assert Path(ended["resumed_from"]).name == "step-00000005", ended["resumed_from"]
    rejected = events(run, "checkpoint_rejected")
    assert any(why in e["reason"] for e in rejected), rejected
    assert_bit_exact(out, ref)
    assert not (outside / "PWNED").exists(), "the malicious pickle was executed"
    # Nothing outside the run dir was touched (read only, never deleted or rewritten).
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before
    if case == "manifest_dotdot":
        assert (run / "checkpoints" / "x").read_bytes() == b"bystander"
    assert_no_survivors(run, str(out))


def test_run_dirs_are_owner_only(tmp_path):
    run, out = tmp_path / "run", tmp_path / "weights.pt"
    old = os.umask(0o022)
    try:
        r = run_cli("--run-dir", str(run), *FAST, TOY, "--epochs", "1", "--out", str(out), env=sup_env())
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr[-2000:]
    dirs = [run, *(p for p in run.rglob("*") if p.is_dir() and not p.is_symlink())]
    assert len(dirs) >= 6  # root, checkpoints, heartbeats, logs, errors, step-*
    loose = {str(d): oct(stat.S_IMODE(d.stat().st_mode)) for d in dirs if stat.S_IMODE(d.stat().st_mode) != 0o700}
    assert not loose, f"run dir entries not owner-only: {loose}"
