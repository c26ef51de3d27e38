"""HF Trainer and Lightning jobs under the real `resilient-run`: every fault ends bit-exact.

One supervised run per framework carries every fault of the issue, one per attempt
(tests/integrations/faults.py), and is compared with one uninterrupted run of the same job:
  attempt 1: kill -9 mid-epoch right after the newest checkpoint was truncated on disk
             -> that checkpoint is rejected (size), the older one is used
  attempt 2: kill -9 inside the framework's save, before our manifest
             -> the torn/unmanifested newest one is rejected (HF) or never visible (Lightning tmp dir)
  attempt 3: a hang inside the model's forward (training_step) -> `hang`, stacks dumped
  attempt 4: SIGTERM to the supervisor -> the trainer saves at the next step end, 75
  rerun:     resumes from the preempt checkpoint and finishes; final weights torch.equal the baseline.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import PYTHON, REPO
from trainer_shim.rundir import Event
from tests.supervisor.helpers import run_cli, start_cli, sup_env
from tests.support import (
    assert_equal_state, ended_kinds, events, first_steps, heartbeat, kill_group, wait_until, weights,
)

HERE = Path(__file__).resolve().parent
# grace: the stop must save and exit within it (a framework teardown is slow on a busy 2-core box)
FAST = ("--backoff", "0", "--heartbeat-timeout", "5", "--grace-period", "8")


def _needs(*mods: str):
    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed (pip install 'resilient-run[hf,lightning]')")


HF = dict(job=HERE / "hf_job.py", faults="1:truncate@17,2:savekill@25,3:hang@28,4:pause@32", pause=32)
PL = dict(job=HERE / "lightning_job.py", faults="1:truncate@23,2:savekill@30,3:hang@33,4:pause@42", pause=42)


def _args(spec: dict, run: Path, out: Path) -> list[str]:
    extra = ["--output_dir", str(run)] if spec is HF else []
    return [str(spec["job"]), *extra, "--out", str(out)]


def _start_baseline(spec: dict, d: Path) -> tuple[subprocess.Popen, Path]:
    """The uninterrupted run, started alongside the campaign (it waits on restarts most of the time)."""
    d.mkdir(parents=True)
    run, out = d / "run", d / "weights.pt"
    p = subprocess.Popen([PYTHON, *_args(spec, run, out)], env=sup_env(RESILIENT_RUN_DIR=str(run)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=d)
    return p, out


def _baseline(p: subprocess.Popen, out: Path) -> dict[str, torch.Tensor]:
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return weights(out)


def _campaign(spec: dict, tmp_path: Path) -> list[str]:
    base = _start_baseline(spec, tmp_path / "baseline")
    run, out = tmp_path / "run", tmp_path / "weights.pt"
    cli = ["run", "--run-dir", str(run), *FAST, *_args(spec, run, out)]
    env = sup_env(RRTEST_FAULTS=spec["faults"])
    p = start_cli(*cli, env=env, cwd=tmp_path)
    try:
        wait_until(lambda: (hb := heartbeat(run)) and hb.get("attempt") == 4 and hb.get("step") == spec["pause"],
                   timeout=240, interval=0.1, what="attempt 4 to reach the pause step")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    finally:
        kill_group(p)
        ref = _baseline(*base)
    assert p.returncode == 75, err[-3000:]
    assert ended_kinds(run) == ["signal", "signal", "hang", "preempted"], events(run)

    rejected = [e["reason"] for e in events(run, Event.CHECKPOINT_REJECTED)]
    assert any("truncated" in r for r in rejected), rejected
    starts = events(run, Event.ATTEMPT_STARTED)
    stacks = run / "logs" / f"stacks-{starts[2]['pid']}.txt"
    assert "in_forward" in stacks.read_text(), "the hung attempt's stacks were not dumped"

    r = run_cli(*cli, env=env, cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    ends = [(e["attempt"], e["kind"], e["evidence"], e.get("log_tail", [])[-5:]) for e in events(run, Event.ATTEMPT_ENDED)]
    assert [k for _, k, _, _ in ends[4:]] == ["success"], ends[4:]
    assert events(run, Event.ATTEMPT_STARTED)[-1]["resume_from"]
    assert not events(run, Event.RESUME_STEP_MISMATCH), "every attempt began at its checkpoint's step"
    assert_equal_state(weights(out), ref, "final weights vs the uninterrupted run")

    v = run_cli("checkpoints", str(run), "--verify", "--json", env=env)
    assert v.returncode == 0, v.stdout + v.stderr
    # Time spent saving (as `report` prices it): each committed save priced, the attempt's total running.
    saved = events(run, Event.CHECKPOINT_SAVED)
    assert saved and all(0 < e["seconds"] <= e["saving_seconds"] for e in saved), saved
    # The report prices a framework job as a native one: every attempt's first step is marked, so each
    # recovery is measured and useful time is counted.
    rep = run_cli("report", str(run), "--json", env=env)
    assert rep.returncode == 0, rep.stderr
    costs = json.loads(rep.stdout)
    assert sorted(first_steps(run)) == [c["attempt"] for c in costs["attempts"]], events(run, Event.FIRST_STEP)
    assert costs["useful_seconds"] > 0 and all(c["recover_total"] for c in costs["attempts"][1:]), costs
    return rejected


@_needs("transformers")
def test_hf_trainer_every_fault_bit_exact(tmp_path: Path) -> None:
    rejected = _campaign(HF, tmp_path)
    # The kill inside the Trainer's save left checkpoint-25 without our manifest: rejected, 20 used.
    assert any("no MANIFEST.json" in r for r in rejected), rejected
    # Attempt 4 held step 32's end until the stop came, so it stopped at step 33's end (the preempt
    # checkpoint) and the rerun resumed there and ran to step 36 (3 epochs of 12), saving at 35 and at
    # the end. Left: the Trainer's save_total_limit=2 newest saves, and the preempt checkpoint, which
    # rotation keeps apart from the step saves.
    run = tmp_path / "run"
    assert Path(events(run, Event.ATTEMPT_STARTED)[-1]["resume_from"]).name == "checkpoint-33"
    names = sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint-"))
    assert names == ["checkpoint-33", "checkpoint-35", "checkpoint-36"], names


@_needs("lightning")
def test_lightning_every_fault_bit_exact(tmp_path: Path) -> None:
    _campaign(PL, tmp_path)
    ckpts = tmp_path / "run" / "checkpoints"
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".tmp-")], "a torn save was left behind"


_IMPORTS = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # as if not installed: import raises ModuleNotFoundError, find_spec is None
import trainer_shim, trainer_shim.integrations, trainer_shim.rundir, supervisor.cli
heavy = [m for m in ("torch", "transformers", "lightning", "pytorch_lightning") if sys.modules.get(m) is not None]
assert not heavy, heavy
import {module}
assert "trainer_shim.integrations.{other}" not in sys.modules
print("ok", flush=True)
cb = {module}.ResilientCallback()
assert cb.resume_from(sys.argv[1]) is None       # fresh start; the session (and excepthook) is up
raise ValueError("boom in the training script")  # -> errors/attempt-1.json
"""


@_needs("transformers")
def test_hf_integration_imports_without_lightning_and_the_package_stays_light(tmp_path: Path) -> None:
    """`import trainer_shim` (and the supervisor) load no torch and no framework; the HF module
    imports with Lightning absent. (The reverse cannot be simulated here: Lightning's own
    dependency torchmetrics imports transformers whenever its metadata says it is installed.)"""
    code = _IMPORTS.format(blocked=("lightning", "pytorch_lightning"), module="trainer_shim.integrations.hf",
                           other="lightning")
    out = tmp_path / "out"
    r = subprocess.run([PYTHON, "-c", code, str(out)], env=sup_env(), capture_output=True, text=True, timeout=120,
                       cwd=REPO)
    assert r.returncode == 1 and r.stdout.strip() == "ok", r.stderr[-2000:]
    err = json.loads((out / "errors" / "attempt-1.json").read_text())
    assert err["type"] == "ValueError" and err["message"] == "boom in the training script", err
    assert "Traceback" in err["traceback"]
