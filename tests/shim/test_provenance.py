"""Provenance: a resume with other arguments warns once (resume_mismatch); --strict-resume refuses."""

from __future__ import annotations

import subprocess

from tests.conftest import JOBS, PYTHON
from tests.supervisor.helpers import events, run_cli, sup_env
from trainer_shim import rundir
from trainer_shim._policies.provenance import args_hash

JOB = str(JOBS / "diverge_job.py")


def test_args_hash_covers_argv_and_config_file_contents(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lr: 1\n")
    a = args_hash(["--config", str(cfg)])
    assert a == args_hash(["--config", str(cfg)]) != args_hash(["--config", str(cfg), "--x"])
    cfg.write_text("lr: 2\n")
    assert args_hash(["--config", str(cfg)]) != a
    assert args_hash([f"--config={cfg}"]) != args_hash([f"--config={cfg}x"])


def test_resume_with_other_args_warns_once_and_strict_resume_refuses_unretried(tmp_path):
    run_dir = tmp_path / "run"
    env = sup_env(RESILIENT_RUN_DIR=str(run_dir))
    p = subprocess.run([PYTHON, JOB, "--steps", "10", "--save-every", "5"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    m = rundir.inspect_checkpoint(run_dir / "checkpoints" / "step-00000010").manifest
    assert m.args_hash == args_hash(["--steps", "10", "--save-every", "5"])
    p = subprocess.run([PYTHON, JOB, "--steps", "12", "--save-every", "5"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    warn = [ln for ln in p.stderr.splitlines() if "different provenance" in ln]
    assert warn == ["trainer_shim: warning: resuming step-00000010 written with different provenance: arguments/config changed"]
    (ev,) = events(run_dir, "resume_mismatch")
    assert set(ev["differences"]) == {"args_hash"} and ev["strict"] is False
    # Supervised with --strict-resume: exit 2 from the trainer, no retry, the checkpoint untouched.
    before = sorted(x.name for x in (run_dir / "checkpoints").iterdir())
    r = run_cli("--run-dir", str(run_dir), "--strict-resume", "--backoff", "0", JOB, "--steps", "14", timeout=120)
    assert r.returncode == 1, r.stderr[-2000:]
    refused = [ln for ln in r.stderr.splitlines() if ln.startswith("trainer_shim: refusing to resume")]
    assert len(refused) == 1 and "--strict-resume" in refused[0]
    assert [e["exit_code"] for e in events(run_dir, "attempt_ended")][-1] == 2
    assert len(events(run_dir, "attempt_started")) == 1
    assert "provenance" in events(run_dir, "gave_up")[-1]["reason"]
    assert sorted(x.name for x in (run_dir / "checkpoints").iterdir()) == before
