"""Long variants of auto-attach: a Lightning script with no resilient-run code, and doctor on a job
whose Trainer starts afresh although a checkpoint was chosen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations.test_callback_options import lightning_killed_once
from tests.integrations.test_integrations import _needs
from tests.supervisor.helpers import run_cli, sup_env
from tests.support import events, first_steps
from trainer_shim.rundir import EXIT_NOT_EXACT, Event

pytestmark = pytest.mark.long

HERE = Path(__file__).resolve().parent


@_needs("lightning")
def test_lightning_script_without_resilient_code_resumes_bit_exact(tmp_path: Path) -> None:
    run = lightning_killed_once(tmp_path, "callback:\n  save_every_steps: 5\n")
    assert first_steps(run)[2] == 11, events(run, Event.FIRST_STEP)   # step-00000010, then step 11
    assert not events(run, Event.RESUME_STEP_MISMATCH)


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
