"""Divergence guard: a checkpoint that trains into NaN is condemned; fresh divergence gives up."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from supervisor.decisions.classify import AttemptFacts, Kind, classify
from supervisor.decisions.divergence import DivergenceTracker
from tests.conftest import JOBS, PYTHON
from trainer_shim.rundir import EXIT_DIVERGED, ErrorRecord

from .helpers import ended_kinds, events, run_cli, sup_env

JOB = str(JOBS / "diverge_job.py")
FAST = ("--backoff", "0", "--heartbeat-timeout", "30", "--grace-period", "2")


def _starts(run_dir: Path) -> list:
    return [Path(e["resume_from"]).name if e["resume_from"] else None for e in events(run_dir, "attempt_started")]


def test_checkpoint_that_trains_into_nan_is_condemned_and_the_older_one_finishes_bit_exact(tmp_path):
    ref_out = tmp_path / "ref.pt"
    p = subprocess.run([PYTHON, JOB, "--out", str(ref_out)], env=sup_env(RESILIENT_RUN_DIR=str(tmp_path / "ref")),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    # Attempt 1 crashes after the step-30 checkpoint; resuming from step 30 trains into NaN.
    env = sup_env(RRTEST_CRASH_AT="1:32", RRTEST_NAN_AFTER_RESUME_FROM="30")
    r = run_cli("--run-dir", str(run_dir), *FAST, JOB, "--out", str(out), env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["crash", "diverged", "success"]   # 2 extra attempts after the crash
    assert _starts(run_dir) == [None, "step-00000030", "step-00000020"]
    rejected = events(run_dir, "checkpoint_rejected")
    # The resumed-from checkpoint first; any checkpoint the diverged attempt itself wrote after it
    # (a time-based save at step 32 may or may not land) is condemned with it.
    names = [Path(e["path"]).name for e in rejected]
    assert names[0] == "step-00000030" and all("step-00000030" < n < "step-00000033" for n in names[1:]), names
    assert rejected[0]["poisoned"] is True
    assert rejected[0]["reason"].startswith("diverged at step 33, 3 steps after resuming from it")
    shim_ev = events(run_dir, "diverged")
    assert len(shim_ev) == 1 and shim_ev[0]["step"] == 33 and shim_ev[0]["loss"] == "nan"
    got, ref = torch.load(out, weights_only=True), torch.load(ref_out, weights_only=True)
    assert all(torch.equal(got[k], ref[k]) for k in ref)


def test_divergence_from_scratch_gives_up_bounded_and_policy_halves_the_batch(tmp_path):
    run_dir = tmp_path / "run"
    cfg = tmp_path / "job.yaml"
    cfg.write_text("policy:\n  diverged:\n    env: {RRTEST_POLICY_MARK: 'on'}\n"
                   "    args: [--batch-size, '{batch_size / 2}']\n")
    r = run_cli("--run-dir", str(run_dir), "--config", str(cfg), *FAST, JOB, "--batch-size", "8",
                env=sup_env(RRTEST_NAN_AT="3"), timeout=240)
    assert r.returncode == 1, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["diverged", "diverged"]
    gave_up = events(run_dir, "gave_up")
    assert len(gave_up) == 1 and gave_up[0]["reason"] == "diverged"
    assert "fresh start" in gave_up[0]["detail"]
    applied = events(run_dir, "policy_applied")
    assert len(applied) == 1 and applied[0]["args"] == ["--batch-size", "4"]
    assert applied[0]["env"] == {"RRTEST_POLICY_MARK": "on"}
    cmds = [e["command"] for e in events(run_dir, "attempt_started")]
    assert cmds[0][-2:] == ["--batch-size", "8"] and cmds[1][-2:] == ["--batch-size", "4"]
    assert not list((run_dir / "checkpoints").glob("step-*"))   # the diverged state was never saved


def test_classify_exit_65_as_diverged():
    kind, evidence = classify(AttemptFacts(returncode=EXIT_DIVERGED))
    assert kind is Kind.DIVERGED and "65" in evidence
    # Under torchrun the launcher exits 1; the rank's error record says what happened.
    kind, _ = classify(AttemptFacts(returncode=1, error=ErrorRecord(type="trainer_shim.Diverged", message="nan")))
    assert kind is Kind.DIVERGED


def test_tracker_window_and_bounded_fresh_retries():
    t = DivergenceTracker(window=200)
    v = t.judge(diverged_step=230, resumed_from="c/step-00000030", resumed_step=30, newer=("c/step-00000040",))
    assert v.poison == ("c/step-00000030", "c/step-00000040") and not v.give_up
    assert t.judge(diverged_step=500, resumed_from="c/step-00000030", resumed_step=30).poison == ()  # outside the window
    assert not t.judge(diverged_step=5, resumed_from=None, resumed_step=None).give_up
    assert t.judge(diverged_step=5, resumed_from=None, resumed_step=None).give_up


def test_skip_does_not_count_the_step_and_trains_on(tmp_path):
    env = sup_env(RESILIENT_RUN_DIR=str(tmp_path / "run"), RRTEST_NAN_AT="3")
    p = subprocess.run([PYTHON, JOB, "--steps", "5", "--save-every", "100", "--on-nonfinite", "skip"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "finished step 5 skipped 1" in p.stdout
    assert [ln for ln in p.stderr.splitlines() if "step skipped" in ln] == [
        "trainer_shim: non-finite loss nan after step 2: step skipped (on_nonfinite='skip'); "
        "later skips are counted in run.skipped_steps"]
