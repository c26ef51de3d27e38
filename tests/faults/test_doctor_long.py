"""`resilient-run doctor` on the framework integrations and a 2-rank torchrun job (`long` tests:
each is a baseline and an interrupted run of a real framework job, 30-45 s on the 2-core box)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import JOBS, REPO
from tests.supervisor.helpers import run_cli, sup_env
from trainer_shim.rundir import MARK_STEP

pytestmark = pytest.mark.long


def _doctor(tmp_path: Path, *job: str, steps: int = 12, kill_at: str = "7", env=None) -> dict:
    r = run_cli("doctor", "--steps", str(steps), "--kill-at", kill_at, "--json", "--keep", str(tmp_path / "keep"),
                *job, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["exact"] is True and out["divergence"] is None
    return out


def _interrupted_kinds(tmp_path: Path) -> list[str]:
    (scratch,) = (tmp_path / "keep").glob("resilient-doctor-*")
    lines = (scratch / "interrupted" / "events.jsonl").read_text().splitlines()
    return [json.loads(x)["kind"] for x in lines if '"attempt_ended"' in x]


def test_hf_trainer_example_is_exact(tmp_path):
    pytest.importorskip("transformers")
    user_out = tmp_path / "user-output"
    _doctor(tmp_path, str(REPO / "examples" / "hf_train.py"), "--output_dir", str(user_out))
    assert _interrupted_kinds(tmp_path) == ["signal", "success"]
    # Doctor mode redirects the Trainer's output_dir into the scratch run dir: no checkpoint of the
    # user's (nor one of the baseline run's, which the interrupted run would resume from).
    assert not user_out.exists(), "doctor left the (empty) output_dir the Trainer made"
    # Every step is compared by its own loss, not only the logging steps' (the Trainer logs averages).
    (scratch,) = (tmp_path / "keep").glob("resilient-doctor-*")
    rows = [json.loads(x) for x in (scratch / "baseline.digests.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r.get("at") == MARK_STEP]
    assert len(losses) == 12 and all(isinstance(v, float) for v in losses), losses


def test_lightning_example_is_exact(tmp_path):
    pytest.importorskip("lightning")
    _doctor(tmp_path, str(REPO / "examples" / "lightning_train.py"), kill_at="7,10")
    assert _interrupted_kinds(tmp_path) == ["signal", "crash", "success"]


def test_two_rank_torchrun_job_is_exact(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "torchrun is installed with torch"
    env = sup_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    _doctor(tmp_path, "--", torchrun, "--standalone", "--nproc-per-node", "2", str(JOBS / "ddp_train.py"),
            "--out-dir", str(tmp_path / "out"), env=env)
    assert _interrupted_kinds(tmp_path) == ["signal", "success"]


def test_a_generator_only_rank_1_draws_from_is_named_with_its_rank(tmp_path):
    # Rank 0's model diverges too (gradients are averaged), but the cause is rank 1's own.
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    env = sup_env(DDP_JITTER_RANK="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    r = run_cli("doctor", "--steps", "12", "--kill-at", "7", "--json", "--", str(torchrun), "--standalone",
                "--nproc-per-node", "2", str(JOBS / "ddp_train.py"), "--out-dir", str(tmp_path / "out"),
                cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    d = json.loads(r.stdout)["divergence"]
    assert d["message"].startswith("rank 1: ") and d["component"].startswith("uncaptured."), d
