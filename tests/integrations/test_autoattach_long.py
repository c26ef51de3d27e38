"""Long variants of auto-attach: a Lightning script with no resilient-run code, and doctor on a job
whose Trainer starts afresh although a checkpoint was chosen."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON
from tests.integrations.test_integrations import _needs
from tests.supervisor.helpers import run_cli, sup_env
from tests.support import assert_equal_state, ended_kinds, events, first_steps, weights
from trainer_shim.rundir import EXIT_NOT_EXACT, Event

pytestmark = pytest.mark.long

HERE = Path(__file__).resolve().parent


@_needs("lightning")
def test_lightning_script_without_resilient_code_resumes_bit_exact(tmp_path: Path) -> None:
    (tmp_path / "baseline").mkdir()
    ref_out = tmp_path / "baseline" / "weights.pt"
    base = subprocess.Popen([PYTHON, str(HERE / "lightning_job.py"), "--out", str(ref_out)],
                            env=sup_env(RESILIENT_RUN_DIR=str(tmp_path / "baseline" / "run")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path / "baseline")
    config = tmp_path / "job.yaml"
    config.write_text("callback:\n  save_every_steps: 5\n")
    run, out = tmp_path / "run", tmp_path / "weights.pt"
    r = run_cli("run", "--config", str(config), "--run-dir", str(run), "--backoff", "0", str(HERE / "lightning_job.py"),
                "--out", str(out), "--callback", "none", env=sup_env(RRTEST_FAULTS="1:kill@12"), cwd=tmp_path,
                timeout=300)
    _, err = base.communicate(timeout=300)
    assert base.returncode == 0, err[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run) == ["signal", "success"], events(run)
    assert first_steps(run)[2] == 11, events(run, Event.FIRST_STEP)   # step-00000010, then step 11
    assert not events(run, Event.RESUME_STEP_MISMATCH)
    assert_equal_state(weights(out), weights(ref_out), "final weights vs the uninterrupted run")


@_needs("transformers")
def test_doctor_fails_when_the_trainer_starts_afresh_despite_a_chosen_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "w.pt"
    r = run_cli("doctor", "--json", "--steps", "20", "--kill-at", "12", str(HERE / "hf_job.py"),
                "--output_dir", str(tmp_path / "out"), "--out", str(out), "--callback", "fresh",
                env=sup_env(), cwd=tmp_path, timeout=600)
    assert r.returncode == EXIT_NOT_EXACT, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["divergence"]["component"] == "resume", res
    assert "instead of resuming" in res["divergence"]["message"], res
