"""The callbacks' shared options at work: an auto-attached Lightning job with only a time interval
(`callback: {save_every_seconds: ...}`) checkpoints on time, is killed, and resumes bit-exact; one
with no interval at all is told it gets save_every_seconds='auto'."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import PYTHON
from tests.integrations.test_integrations import _needs
from tests.supervisor.helpers import run_cli, sup_env
from tests.support import assert_equal_state, ended_kinds, events, first_steps, weights
from trainer_shim.rundir import Event

HERE = Path(__file__).resolve().parent


def lightning_killed_once(tmp_path: Path, callback_yaml: str) -> Path:
    """An auto-attached Lightning job (no resilient-run code) under the supervisor with the config
    file's `callback:` mapping, SIGKILLed at step 12, beside the same job uninterrupted: both
    finish, the attempts end signal then success, and the final weights are equal bit for bit.
    Returns the run dir."""
    (tmp_path / "baseline").mkdir()
    ref_out = tmp_path / "baseline" / "weights.pt"
    base = subprocess.Popen([PYTHON, str(HERE / "lightning_job.py"), "--out", str(ref_out)],
                            env=sup_env(RESILIENT_RUN_DIR=str(tmp_path / "baseline" / "run")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path / "baseline")
    config = tmp_path / "job.yaml"
    config.write_text(callback_yaml)
    run, out = tmp_path / "run", tmp_path / "weights.pt"
    r = run_cli("run", "--config", str(config), "--run-dir", str(run), "--backoff", "0", str(HERE / "lightning_job.py"),
                "--out", str(out), "--callback", "none", env=sup_env(RRTEST_FAULTS="1:kill@12"), cwd=tmp_path,
                timeout=300)
    _, err = base.communicate(timeout=300)
    assert base.returncode == 0, err[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run) == ["signal", "success"], events(run)
    assert_equal_state(weights(out), weights(ref_out), "final weights vs the uninterrupted run")
    return run


@_needs("lightning")
def test_an_auto_attached_lightning_job_saves_on_time_and_resumes_bit_exact(tmp_path: Path) -> None:
    # Due at every step: no step count is configured, only the time.
    run = lightning_killed_once(tmp_path, "callback:\n  save_every_seconds: 0.001\n")
    assert first_steps(run)[2] >= 11, events(run, Event.FIRST_STEP)   # a timed save at step 10 or later


@_needs("lightning")
def test_an_auto_attached_lightning_job_without_an_interval_gets_the_auto_one(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "weights.pt"
    r = run_cli("run", "--run-dir", str(run), "--backoff", "0", str(HERE / "lightning_job.py"),
                "--out", str(out), "--callback", "none", env=sup_env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [line for line in r.stderr.splitlines() if "auto-attach:" in line]
    assert said == ["trainer_shim: auto-attach: this Lightning job checkpoints every save_every_seconds='auto' "
                    "(Young/Daly); set `callback: {save_every_steps: N}` in the config file for a fixed interval"], said
