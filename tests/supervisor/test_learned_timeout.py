"""`--heartbeat-timeout auto`: slow saves never trip the learned limit; a training hang is caught fast."""

from __future__ import annotations

import json
import re

import pytest

from supervisor.decisions.learned_timeout import FACTOR, TimeoutLearner, p99
from tests.conftest import JOBS, PYTHON
from trainer_shim.rundir import RunDir

from .helpers import ended_kinds, events, run_cli, sup_env

JOB = str(JOBS / "timing_job.py")
# The learned limit is max(floor, 5 x p99); with 50 ms steps 5 x p99 is well under a second, so the
# floor is the limit. At 2 s a busy box (parallel tests) stalled a training step past it: a false hang.
# Its value is not what is tested (the rule and the bound below are), so it leaves room for that.
FLOOR = 8.0


def run_timing_job(tmp_path, save_s: float, saves: int, timeout: float = 240):
    run_dir = tmp_path / "run"
    env = sup_env(RRTEST_STEPS=f"1:{saves * 10},2:10", RRTEST_STEP_S="0.05", RRTEST_SAVE_EVERY="10",
                  RRTEST_SAVE_S=str(save_s), RRTEST_HANG_ATTEMPT="1")
    r = run_cli("--run-dir", str(run_dir), "--heartbeat-timeout", "auto", "--heartbeat-timeout-floor", str(FLOOR),
                "--save-timeout", "60", "--backoff", "0", "--grace-period", "2", "--", PYTHON, JOB,
                env=env, timeout=timeout)
    return run_dir, r


def check_learned(run_dir, r, saves: int):
    assert r.returncode == 0, r.stderr[-3000:]
    # Attempt 1 went through every slow save, then hung in training; attempt 2 (with the learned limits
    # inherited from the run dir) saved again and finished.
    assert ended_kinds(run_dir) == ["hang", "success"]
    hang = events(run_dir, "attempt_ended")[0]
    assert hang["step"] == saves * 10
    assert "learned" in hang["evidence"] and "training intervals" in hang["evidence"], hang["evidence"]
    learned = json.loads((run_dir / "heartbeat_timeouts.json").read_text())["samples"]
    assert len(learned["saving"]) >= saves
    silent = float(re.search(r"unchanged for ([\d.]+)s", hang["evidence"]).group(1))
    bound = FACTOR * p99(learned["training"]) + FLOOR
    assert silent <= bound + 0.5, (silent, bound)   # + the supervisor's own wake-up slack


def test_slow_saves_survive_and_a_training_hang_is_caught_within_the_learned_limit(tmp_path):
    run_dir, r = run_timing_job(tmp_path, save_s=1.0, saves=3)
    check_learned(run_dir, r, 3)


def test_learner_rule_floor_and_persistence(tmp_path):
    rd = RunDir(tmp_path)
    t = TimeoutLearner(rd, floor=3.0)
    for _ in range(19):
        t.record("training", 0.1)
    assert t.limit("training") is None               # too few samples: the configured limit holds
    t.record("training", 0.1)
    lim = t.limit("training")
    assert lim is not None and lim.seconds == 3.0 and "floor 3s" in lim.rule
    for v in (8.0, 8.2, 7.9):
        t.record("saving", v)
    assert t.limit("saving").seconds == pytest.approx(FACTOR * 8.2)
    t.save(0.0, force=True)
    again = TimeoutLearner(rd, floor=3.0)            # a restart inherits what was learned
    assert again.limit("saving").seconds == pytest.approx(FACTOR * 8.2)
