"""A requested stop as `status` and `stop` show it: stopped and resumable, not a failure, no live phase."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from supervisor.insight import render
from supervisor.insight.status import open_run_dir, read_status
from tests.conftest import JOBS
from trainer_shim import rundir
from trainer_shim.rundir import EXIT_UNHEALTHY

from .helpers import FAKE_JOB, events, heartbeat, kill_group, run_cli, start_cli, sup_env, wait_until

TOY = str(JOBS / "toy_train.py")
LAUNCHER = str(Path(__file__).parents[1] / "integrations" / "launcher.py")


def _rows(out: str) -> dict[str, str]:
    """`status`'s table as {label: value} (labels are the known row names, values the rest of the line)."""
    rows = {}
    for line in out.splitlines():
        for label in ("state", "phase", "last failure", "supervisor pid"):
            if line.startswith(label + " "):
                rows[label] = line[len(label):].strip()
    return rows


def _stopped_at_step_6(run_dir, *command: str, while_running=lambda: None):
    """Run the toy (`command` before it: a launcher), `while_running()` at step 6, then `resilient-run stop`."""
    p = start_cli("--run-dir", str(run_dir), "--heartbeat-timeout", "30", *command, TOY, "--epochs", "50",
                  "--save-every", "4" if not command else "100", "--step-sleep", "0.05")
    try:
        wait_until(lambda: (heartbeat(run_dir) or {}).get("step", 0) >= 6, timeout=90, what="step 6")
        while_running()
        stop = run_cli("stop", str(run_dir), timeout=120)
        assert stop.returncode == 0, stop.stderr
        assert p.wait(60) == 75
    finally:
        kill_group(p)
    return stop


def test_stop_then_status_says_stopped_resumable_not_preempted(run_dir):
    stop = _stopped_at_step_6(run_dir)
    [stopped] = events(run_dir, "stopped")
    assert stopped["saved"] is True
    want = f"stopped (resumable, checkpoint step {stopped['step']})"
    assert want in stop.stderr, stop.stderr
    st = run_cli("status", str(run_dir))
    assert st.returncode == EXIT_UNHEALTHY, st.stdout  # not running: a monitor must not call it healthy
    rows = _rows(st.stdout)
    assert rows["state"] == want, st.stdout
    assert rows["last failure"] == "-", st.stdout
    assert rows["phase"] == "exited (last heartbeat: stopping)", st.stdout
    assert rows["supervisor pid"].endswith("(exited)"), st.stdout
    assert "ETA" not in st.stdout and "goodput" not in st.stdout, st.stdout  # no failure, nothing left running
    js = json.loads(run_cli("status", str(run_dir), "--json").stdout)
    assert js["state"] == "stopped" and js["last_failure"] is None
    assert js["stop"] == {"attempt": 1, "saved": True, "step": stopped["step"]}


def test_stop_below_a_launcher_asks_the_trainer_not_the_launcher(run_dir):
    """`-- python launcher.py python toy_train.py` (a launcher as `swift sft` is one: it would die of
    SIGTERM at once): the stop goes to the trainer, which saves at once; the launcher passes its 75 on."""
    def pids_apart() -> None:
        js = json.loads(run_cli("status", str(run_dir), "--json").stdout)
        [started] = events(run_dir, "attempt_started")
        assert js["child_pid"] == started["pid"] and js["trainer_pid"] == heartbeat(run_dir)["pid"] != started["pid"]
        rows = dict(render.status_rows(read_status(open_run_dir(run_dir))))
        assert rows["launcher pid"] == str(started["pid"]) and rows["trainer pid"] == str(js["trainer_pid"])

    _stopped_at_step_6(run_dir, "--", sys.executable, LAUNCHER, sys.executable, while_running=pids_apart)
    [ended] = events(run_dir, "attempt_ended")
    # Not "killed by SIGTERM" (the launcher's death) but the trainer's own preempt exit, passed on.
    assert ended["kind"] == "preempted" and ended["exit_code"] == 75 and ended["signal"] is None, ended
    [stopped] = events(run_dir, "stopped")
    # Saved at once, at whatever step the stop reached it (not at the next periodic save, every 100
    # steps): the trainer's last heartbeat is at that step, and so is its newest checkpoint.
    assert stopped["saved"] is True
    hb = heartbeat(run_dir)
    assert hb["phase"] == "stopping" and hb["step"] == hb["checkpoint_step"] == stopped["step"], (hb, stopped)
    newest = rundir.newest_valid([rundir.RunDir(run_dir).checkpoints])
    assert newest is not None and newest.step == stopped["step"], (newest, stopped)


def test_stop_during_backoff_keeps_the_real_failure(run_dir):
    """Stopped while waiting to restart a failed attempt: that failure is still the last failure."""
    p = start_cli("--run-dir", str(run_dir), "--backoff", "60", FAKE_JOB,
                  env=sup_env(FAKE_PLAN="1:exit3", FAKE_STEPS="2", FAKE_STEP_S="0.01"))
    try:
        wait_until(lambda: events(run_dir, "restarting"), timeout=30, what="restarting")
        stop = run_cli("stop", str(run_dir), timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert p.wait(30) == 75
    finally:
        kill_group(p)
    rep = read_status(open_run_dir(run_dir))
    assert rep.last_failure is not None and rep.last_failure["kind"] == "crash", rep
    assert rep.stop is not None and rep.stop["saved"] is False
    assert dict(render.status_rows(rep))["state"] == "stopped (no checkpoint; a rerun starts from scratch)"
