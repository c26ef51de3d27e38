"""Supervisor behaviour with a real (torch-free) job process: kinds, restarts, give-up, hangs."""

from __future__ import annotations

import datetime
import json
import os
import signal
import time

import psutil
import pytest

from supervisor.insight import render
from trainer_shim.rundir import EXIT_NOT_STOPPED, EXIT_UNHEALTHY
from supervisor.insight.status import open_run_dir, read_status

from .helpers import (
    FAKE_JOB, alive, attempt_pids, ended_kinds, events, heartbeat, kill_group, run_cli, start_cli, sup_env,
    supervisor_state, wait_until,
)


def test_each_death_is_classified_and_a_crash_loop_gives_up(run_dir):
    env = sup_env(FAKE_PLAN="1:exit3,2:kill,3:oomerr", FAKE_STEPS="2", FAKE_STEP_S="0.05")
    r = run_cli("--run-dir", str(run_dir), "--backoff", "0", FAKE_JOB, env=env)
    assert r.returncode == 1, r.stderr
    assert ended_kinds(run_dir) == ["crash", "signal", "cuda_oom"]
    ended = events(run_dir, "attempt_ended")
    assert ended[0]["exit_code"] == 3 and ended[1]["signal"] == signal.SIGKILL
    assert "CUDA out of memory" in ended[2]["evidence"]
    assert "crash loop" in events(run_dir, "gave_up")[0]["reason"]
    # One log per attempt, the child's output in it, and the supervisor's lines prefixed.
    assert sorted(p.name for p in (run_dir / "logs").glob("attempt-*.log")) == [
        "attempt-0001.log", "attempt-0002.log", "attempt-0003.log"]
    log = (run_dir / "logs" / "attempt-0002.log").read_text().splitlines()
    assert "fake_job: attempt 2 action kill" in log
    # Each log says what the attempt was and how it ended (never an empty file).
    assert log[0].startswith("resilient-run: attempt 2 started at ") and log[0].endswith("resuming from scratch")
    assert log[-1] == "resilient-run: attempt 2 ended: signal (killed by SIGKILL; no OOM evidence in cgroup or kernel log)"
    assert supervisor_state(run_dir)["state"] == "failed"


def _ts(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def test_the_event_step_is_the_last_step_reached_not_the_last_heartbeats(run_dir):
    # Beats on steps 1 and 5 only; the job is SIGKILLed right after step 8.
    env = sup_env(FAKE_PLAN="1:kill", FAKE_STEPS="8", FAKE_BEAT_EVERY="5", FAKE_STEP_S="0")
    r = run_cli("--run-dir", str(run_dir), "--backoff", "0", FAKE_JOB, env=env)
    assert r.returncode == 0, r.stderr
    killed, done = events(run_dir, "attempt_ended")
    assert (killed["kind"], killed["step"]) == ("signal", 8)
    assert killed["failure_time"] == killed["detected_time"] and _ts(killed["detected_time"]) <= _ts(killed["time"])
    assert (done["kind"], done["step"], done["failure_time"]) == ("success", 8, None)


def test_hang_and_startup_timeout_are_killed_and_restarted(run_dir):
    env = sup_env(FAKE_PLAN="1:hang,2:silent", FAKE_STEPS="3", FAKE_STEP_S="0.05")
    # The start-up timeout must also let attempts 1 and 3 start: at 2.5 s a busy box (parallel tests)
    # failed attempt 3 before its first heartbeat. Its length is not what is tested; the bounds are.
    startup = 10.0
    t0 = time.monotonic()
    r = run_cli("--run-dir", str(run_dir), "--backoff", "0", "--heartbeat-timeout", "1.5",
                "--startup-timeout", str(startup), "--grace-period", "1", FAKE_JOB, env=env)
    assert r.returncode == 0, r.stderr
    assert ended_kinds(run_dir) == ["hang", "startup_timeout", "success"]
    hang = events(run_dir, "attempt_ended")[0]
    assert "heartbeat unchanged" in hang["evidence"]
    # The fake job ignores SIGTERM, so the hang path needed SIGKILL after the grace period.
    assert hang["signal"] == signal.SIGKILL
    # Recovery's first parts: detect = heartbeat-timeout after the last beat; stop = stack dump + grace.
    failed, detected, ended = (_ts(hang[k]) for k in ("failure_time", "detected_time", "time"))
    assert 1.5 <= detected - failed < 1.5 + 3, hang
    assert 2 + 1 <= ended - detected < 2 + 1 + 3, hang
    # Bound: heartbeat-timeout + 2 s stack-dump wait + grace + 1 s per hang, plus start-up.
    assert time.monotonic() - t0 < (1.5 + 2 + 1 + 1) + (startup + 1 + 1) + 10
    for pid in attempt_pids(run_dir):
        assert not alive(pid)


def test_non_retryable_exit_code_gives_up_at_once(run_dir):
    r = run_cli("--run-dir", str(run_dir), FAKE_JOB, env=sup_env(FAKE_PLAN="*:exit2", FAKE_STEPS="1"))
    assert r.returncode == 1
    assert ended_kinds(run_dir) == ["crash"]
    assert "not retryable" in events(run_dir, "gave_up")[0]["reason"]


def test_restarts_exhausted(run_dir, tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("crash_loop_attempts: 10\nbackoff: 0\n")
    r = run_cli("--config", str(cfg), "--run-dir", str(run_dir), "--max-restarts", "2", FAKE_JOB,
                env=sup_env(FAKE_PLAN="*:kill", FAKE_STEPS="1"))
    assert r.returncode == 1
    assert ended_kinds(run_dir) == ["signal"] * 3
    assert "restarts exhausted" in events(run_dir, "gave_up")[0]["reason"]


def test_backoff_doubles(run_dir, tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("crash_loop_attempts: 10\n")
    r = run_cli("--config", str(cfg), "--run-dir", str(run_dir), "--backoff", "0.2", "--max-restarts", "3",
                FAKE_JOB, env=sup_env(FAKE_PLAN="*:exit1", FAKE_STEPS="1"))
    assert r.returncode == 1
    assert [e["delay_s"] for e in events(run_dir, "restarting")] == [0.2, 0.4, 0.8]


def test_attempt_numbers_continue_across_supervisors(run_dir):
    env = sup_env(FAKE_PLAN="1:exit1", FAKE_STEPS="1")
    assert run_cli("--run-dir", str(run_dir), "--backoff", "0", FAKE_JOB, env=env).returncode == 0
    assert run_cli("--run-dir", str(run_dir), FAKE_JOB, env=env).returncode == 0
    assert [e["attempt"] for e in events(run_dir, "attempt_started")] == [1, 2, 3]
    assert len(list((run_dir / "logs").glob("attempt-*.log"))) == 3


def test_second_supervisor_is_refused_and_stop_exits_75(run_dir):
    env = sup_env(FAKE_STEPS="100000", FAKE_STEP_S="0.05")
    p = start_cli("--run-dir", str(run_dir), FAKE_JOB, env=env)
    try:
        wait_until(lambda: heartbeat(run_dir), what="first heartbeat")
        second = run_cli("--run-dir", str(run_dir), FAKE_JOB, env=env)
        assert second.returncode == 3
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"supervisor pid {p.pid}" in lines[0], second.stderr
        st = run_cli("status", str(run_dir))
        assert st.returncode == 0 and "running" in st.stdout
        child = supervisor_state(run_dir)["child_pid"]
        stop = run_cli("stop", str(run_dir))
        assert stop.returncode == 0, stop.stderr
        assert p.wait(30) == 75
        assert not alive(child)
        assert ended_kinds(run_dir) == ["preempted"]
        assert events(run_dir, "stopped")[0]["saved"] is True
        st = run_cli("status", str(run_dir), "--json")
        assert st.returncode == EXIT_UNHEALTHY and json.loads(st.stdout)["state"] == "stopped", st.stdout
    finally:
        kill_group(p)


def test_a_trainer_that_saved_but_hangs_in_its_exit_is_killed_and_counts_as_saved(run_dir):
    env = sup_env(FAKE_STEPS="100000", FAKE_STEP_S="0.05", FAKE_EXIT_HANGS="1")
    p = start_cli("--run-dir", str(run_dir), "--grace-period", "1", FAKE_JOB, env=env)
    try:
        wait_until(lambda: heartbeat(run_dir), what="first heartbeat")
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 75
    finally:
        kill_group(p)
    ended = events(run_dir, "attempt_ended")[0]
    assert ended["kind"] == "preempted" and "killed by SIGKILL while exiting" in ended["evidence"], ended
    assert events(run_dir, "stopped")[0]["saved"] is True


def test_sigkill_of_supervisor_takes_the_trainer_down(run_dir):
    p = start_cli("--run-dir", str(run_dir), FAKE_JOB, env=sup_env(FAKE_STEPS="100000", FAKE_STEP_S="0.05"))
    try:
        wait_until(lambda: heartbeat(run_dir), what="first heartbeat")
        child = supervisor_state(run_dir)["child_pid"]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        wait_until(lambda: not alive(child), timeout=5, what="trainer to die with its supervisor")
        st = run_cli("status", str(run_dir), "--json")
        assert st.returncode == EXIT_UNHEALTHY and json.loads(st.stdout)["state"] == "not_running", st.stdout
        # The last beat said training; with its supervisor gone the trainer is gone too, and status says so.
        shown = dict(render.status_rows(read_status(open_run_dir(run_dir))))
        assert shown["phase"] == "exited (last heartbeat: training)" and shown["supervisor pid"].endswith("(exited)")
    finally:
        kill_group(p)


def test_leftover_trainer_is_killed_but_a_stranger_survives(run_dir):
    import json
    import subprocess
    import sys

    # A "trainer" left behind by a dead supervisor (recorded with its real start time) ...
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    # ... and a stranger whose pid is recorded with a wrong start time (pid reuse / forgery).
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        run_dir.mkdir(mode=0o700)
        p = psutil.Process(leftover.pid)
        rec = {"state": "running", "supervisor_pid": 999999, "child_pid": leftover.pid,
               "child_create_time": p.create_time(), "child_cmdline": p.cmdline()}
        (run_dir / "supervisor.json").write_text(json.dumps(rec))
        r = run_cli("--run-dir", str(run_dir), "--grace-period", "1", FAKE_JOB, env=sup_env(FAKE_STEPS="1"))
        assert r.returncode == 0
        assert f"stopping trainer pid {leftover.pid} left over" in r.stderr
        assert leftover.wait(5) is not None

        forged = {**rec, "child_pid": stranger.pid, "child_create_time": 12345.0}
        (run_dir / "supervisor.json").write_text(json.dumps(forged))
        r = run_cli("--run-dir", str(run_dir), FAKE_JOB, env=sup_env(FAKE_STEPS="1"))
        assert r.returncode == 0
        assert f"pid {stranger.pid} recorded in supervisor.json is no longer our trainer" in r.stderr
        assert stranger.poll() is None
        # `stop` must not signal a forged supervisor pid either.
        (run_dir / "supervisor.json").write_text(json.dumps({**forged, "supervisor_pid": stranger.pid}))
        assert run_cli("stop", str(run_dir)).returncode == EXIT_NOT_STOPPED
        assert stranger.poll() is None
    finally:
        for q in (leftover, stranger):
            q.kill()
            q.wait()


def test_kernel_oom_kill_in_memory_limit_cgroup_is_classified_oom(run_dir):
    r = run_cli("--run-dir", str(run_dir), "--backoff", "0", "--memory-limit", "300M", FAKE_JOB,
                env=sup_env(FAKE_PLAN="1:alloc", FAKE_STEPS="1"))
    if "needs a writable memory cgroup" in r.stderr:
        pytest.skip(f"no writable memory cgroup here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert ended_kinds(run_dir) == ["oom", "success"]
    ev = events(run_dir, "attempt_ended")[0]
    assert "oom_kill rose" in ev["evidence"] and ev["signal"] == signal.SIGKILL
    # The cgroup is removed afterwards.
    assert "resilient-run-" not in open("/proc/self/cgroup").read()
