"""Zero-code framework jobs: the supervisor's bootstrap gives every HF / Lightning Trainer the
callback and the resume point, so a script with no resilient-run line resumes bit-exactly."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from tests.conftest import PYTHON
from tests.integrations.test_integrations import _needs
from tests.supervisor.helpers import run_cli, sup_env
from tests.support import assert_equal_state, ended_kinds, events, first_steps, weights
from trainer_shim.rundir import Event

HERE = Path(__file__).resolve().parent
HF_JOB = HERE / "hf_job.py"
FAST = ("--backoff", "0", "--heartbeat-timeout", "30")


def _hf_baseline(d: Path) -> tuple[subprocess.Popen, Path]:
    """The uninterrupted run (explicit callback, no supervisor), started alongside the supervised one."""
    d.mkdir(parents=True)
    out = d / "weights.pt"
    p = subprocess.Popen([PYTHON, str(HF_JOB), "--output_dir", str(d / "run"), "--out", str(out)],
                         env=sup_env(RESILIENT_RUN_DIR=str(d / "run")), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, cwd=d)
    return p, out


def _finish(p: subprocess.Popen, out: Path) -> dict[str, torch.Tensor]:
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return weights(out)


@_needs("transformers")
def test_hf_script_without_resilient_code_resumes_bit_exact(tmp_path: Path) -> None:
    base = _hf_baseline(tmp_path / "baseline")
    run, out = tmp_path / "run", tmp_path / "weights.pt"
    r = run_cli("run", "--run-dir", str(run), *FAST, str(HF_JOB), "--output_dir", str(run), "--out", str(out),
                "--callback", "none", env=sup_env(RRTEST_FAULTS="1:kill@12"), cwd=tmp_path, timeout=240)
    ref = _finish(*base)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run) == ["signal", "success"], events(run)
    assert first_steps(run)[2] == 11, events(run, Event.FIRST_STEP)   # checkpoint-10, then step 11
    assert_equal_state(weights(out), ref, "final weights vs the uninterrupted run")
