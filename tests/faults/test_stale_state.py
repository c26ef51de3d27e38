"""Found by the corruption trials: a heartbeat left by an earlier process must not pass for the new attempt's.

A standalone run of the script (no supervisor) also calls itself attempt 1, so its last
heartbeat (phase training, resumed_from null) matched the first supervised attempt: the
supervisor then timed that attempt's start-up by the training timeout and took its
resumed_from from the stale beat.
"""

from __future__ import annotations

import json
import os
import time

from tests.supervisor.helpers import FAKE_JOB, ended_kinds, events, run_cli, sup_env


def test_stale_heartbeat_from_a_standalone_run_is_not_the_new_attempts(run_dir):
    (run_dir / "heartbeats").mkdir(parents=True, mode=0o700)
    os.chmod(run_dir, 0o700)
    stale = {"pid": 999999, "rank": 0, "attempt": 1, "step": 40, "epoch": 1, "loss": 0.5, "phase": "training",
             "time": time.time(), "checkpoint_step": 40, "seq": 77, "resumed_from": None, "save_bytes": 0}
    (run_dir / "heartbeats" / "rank-0.json").write_text(json.dumps(stale))
    # Attempt 1 never beats: that is a startup timeout (15 s), not a hang of the stale beat (1 s). At
    # 5 s a busy box (parallel tests) also timed out attempts 2 and 3 before their first beat.
    r = run_cli("--run-dir", str(run_dir), "--backoff", "0", "--heartbeat-timeout", "1", "--startup-timeout", "15",
                "--grace-period", "1", FAKE_JOB, env=sup_env(FAKE_PLAN="1:silent", FAKE_STEPS="2", FAKE_STEP_S="0.05"))
    assert r.returncode == 0, r.stderr
    assert ended_kinds(run_dir) == ["startup_timeout", "success"], events(run_dir, "attempt_ended")[0]["evidence"]
