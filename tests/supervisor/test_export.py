"""`resilient-run export`: verified, consolidated, one file; bad input is exit 2 in one line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import PYTHON, REPO, child_env
from tests.shim.test_sharded_single import JOB as SHARDED_JOB
from tests.support import invoke_cli
from trainer_shim import rundir

from .helpers import run_cli


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory) -> Path:
    tmp_path = tmp_path_factory.mktemp("export")
    script = tmp_path / "job.py"
    script.write_text(SHARDED_JOB)
    rd = tmp_path / "run"
    p = subprocess.run([PYTHON, str(script), str(rd)], env=child_env(REPO=str(REPO)), capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    return rd


def test_sharded_checkpoint_exports_to_torch_and_safetensors_equal_to_the_trained_weights(tmp_path, sharded_run):
    rd = sharded_run
    final = torch.load(rd / "final.pt", weights_only=True)
    (ckpt,) = [p for p in (rd / "checkpoints").iterdir() if p.name == "step-00000006"]
    assert rundir.inspect_checkpoint(ckpt).manifest.sharded is True
    r = run_cli("export", str(ckpt), str(tmp_path / "model.pt"), "--model-only", timeout=180)
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "model.pt", weights_only=True)
    assert got.keys() == final.keys() and all(torch.equal(got[k], final[k]) for k in final)
    r = run_cli("export", str(ckpt), str(tmp_path / "full.safetensors"), "--format", "safetensors", timeout=180)
    assert r.returncode == 0, r.stderr
    st = load_file(str(tmp_path / "full.safetensors"))
    assert all(torch.equal(st[f"model.{k}"], final[k]) for k in final)
    assert any(k.startswith("optimizer.state.") and k.endswith("exp_avg") for k in st)   # Adam's moments came along


def test_corrupt_checkpoint_is_refused_in_one_line_and_nothing_written(tmp_path, sharded_run):
    ckpt = tmp_path / "step-00000006"
    shutil.copytree(sharded_run / "checkpoints" / "step-00000006", ckpt)
    victim = next(p for p in ckpt.iterdir() if p.name.endswith(".distcp"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    # Both are refused before the converting child starts: the CLI runs in this process.
    r = invoke_cli("export", str(ckpt), str(tmp_path / "out.pt"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "digest mismatch" in lines[0]
    assert not (tmp_path / "out.pt").exists()
    r = invoke_cli("export", str(ckpt), str(tmp_path / "out.x"), "--format", "onnx")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--format must be one of torch, safetensors" in r.stderr


def test_an_output_path_that_cannot_be_written_is_one_line_naming_it(sharded_run):
    out = "/proc/rrtest-no-such-dir/model.pt"   # /proc refuses a new directory even to root
    r = run_cli("export", str(sharded_run), out, timeout=180)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"resilient-run: error: cannot write {out}: ") and "writable directory" in lines[0]
    assert "Traceback" not in r.stderr
