"""status / checkpoints / metrics as a user sees them while a real job runs and after it ends."""

from __future__ import annotations

import json
import signal
import subprocess

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import JOBS
from trainer_shim.rundir import EXIT_UNHEALTHY

from .helpers import CLI, FAKE_JOB, heartbeat, kill_group, run_cli, start_cli, sup_env, wait_until

TOY = str(JOBS / "toy_train.py")


def test_status_json_while_running_and_after_success(run_dir):
    p = start_cli("--run-dir", str(run_dir), "--heartbeat-timeout", "5", TOY, "--epochs", "2", "--step-sleep", "0.15")
    try:
        wait_until(lambda: (heartbeat(run_dir) or {}).get("step", 0) >= 6, timeout=60, what="step 6")
        r = run_cli("status", str(run_dir), "--json")
        assert r.returncode == 0, r.stdout
        st = json.loads(r.stdout)
        assert st["state"] == "running" and st["attempt"] == 1 and st["child_pid"]
        assert st["step"] >= 6 and st["heartbeat_age_s"] < 5
        assert st["latest_checkpoint"]["step"] >= 5
        human = run_cli("status", str(run_dir))
        assert "running" in human.stdout and "latest checkpoint" in human.stdout
        assert p.wait(120) == 0
    finally:
        kill_group(p)
    st = json.loads(run_cli("status", str(run_dir), "--json").stdout)
    assert st["state"] == "succeeded" and st["last_failure"] is None
    ck = run_cli("checkpoints", str(run_dir), "--json", "--verify")
    assert ck.returncode == 0
    rows = json.loads(ck.stdout)
    assert rows and all(r["valid"] for r in rows) and rows[0]["kind"] == "final" and rows[0]["is_latest"]


def test_status_reports_stale_heartbeat_with_exit_1(run_dir):
    p = start_cli("--run-dir", str(run_dir), "--heartbeat-timeout", "1", "--grace-period", "30", FAKE_JOB,
                  env=sup_env(FAKE_PLAN="1:hang", FAKE_STEPS="2", FAKE_STEP_S="0.05"))
    try:
        wait_until(lambda: heartbeat(run_dir), what="heartbeat")
        # The fake job ignores SIGTERM, so for the grace period it sits stale but alive.
        def stale():
            r = run_cli("status", str(run_dir), "--json")
            return r if r.returncode == EXIT_UNHEALTHY and json.loads(r.stdout)["state"] == "running" else None
        wait_until(stale, timeout=30, interval=0.2, what="stale status")
    finally:
        kill_group(p)


def test_metrics_textfile_is_valid_prometheus(run_dir):
    r = run_cli("--run-dir", str(run_dir), "--backoff", "0", FAKE_JOB, env=sup_env(FAKE_PLAN="1:kill", FAKE_STEPS="2"))
    assert r.returncode == 0
    fams = {f.name: f for f in text_string_to_metric_families((run_dir / "metrics.prom").read_text())}
    samples = {(s.name, s.labels.get("kind")): s.value for f in fams.values() for s in f.samples}
    assert samples[("resilient_run_up", None)] == 0
    assert samples[("resilient_run_attempts_total", None)] == 2
    assert samples[("resilient_run_failures_total", "signal")] == 1


def test_status_watch_refreshes_until_interrupted(run_dir):
    p = start_cli("--run-dir", str(run_dir), FAKE_JOB, env=sup_env(FAKE_STEPS="100000", FAKE_STEP_S="0.05"))
    try:
        wait_until(lambda: heartbeat(run_dir), what="heartbeat")
        w = subprocess.Popen([*CLI, "status", str(run_dir), "--watch", "--interval", "0.2"], env=sup_env(COLUMNS="100"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Three refreshes (a pipe gets one plain line each): the point is it keeps running. Read, not
        # slept for: a SIGINT before the CLI is up (slow imports on a busy box) would test nothing.
        lines = [w.stdout.readline() for _ in range(3)]
        assert all(lines) and w.poll() is None, lines
        w.send_signal(signal.SIGINT)
        out, _ = w.communicate(timeout=10)
        out = "".join(lines) + out
        assert w.returncode == 0
        assert "running" in out and "steps/s" in out
    finally:
        kill_group(p)
