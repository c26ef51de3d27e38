"""Processes you can tell apart: in `ps` the supervisor, the trainer and the idle warm standby each
carry a title naming what they are and the run dir (rundir.titles), and `status` names the
trainer's pid first and its step from the step mark (the heartbeat lags it)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from tests.conftest import JOBS
from trainer_shim.rundir import ENV_RUN_DIR, RunDir, read_step_mark, read_warm_ready

from supervisor.insight.render import describe_trainer_pids
from supervisor.insight.status import StatusReport

from .helpers import (
    FAKE_JOB, ended_kinds, events, heartbeat, kill_group, run_cli, start_cli, sup_env, supervisor_state, wait_until,
)

TOY = str(JOBS / "toy_train.py")


def title_of(pid: int) -> str:
    """What `ps -o args` shows: /proc/PID/cmdline, its NULs as spaces, the padding dropped."""
    return " ".join(a for a in psutil.Process(pid).cmdline() if a)


def pgrep(pattern: str) -> set[int]:
    r = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return {int(x) for x in r.stdout.split()}


def status_rows(rd: Path) -> list[list[str]]:
    """`resilient-run status RUN_DIR`'s table rows, split on blanks, in order (the title above them,
    wrapped to the terminal's width, left out: rows start at the edge with a known label)."""
    labels = tuple(f"{k} " for k in ("trainer pid", "state", "attempt", "restarts", "supervisor pid", "step"))
    lines = run_cli("status", str(rd)).stdout.splitlines()
    return [line.split() for line in lines if line.startswith(labels)]


def test_supervisor_trainer_and_standby_are_told_apart_by_their_titles(tmp_path: Path) -> None:
    rd, out = tmp_path / "run", tmp_path / "out.pt"
    # Attempt 1 slowed to ~12 s: time for the standby to import torch and for the checks below.
    p = start_cli("--run-dir", str(rd), "--backoff", "0", TOY, "--out", str(out), "--step-sleep", "0.3",
                  env=sup_env(TOY_STEP_SLEEP_ATTEMPT="1"))
    try:
        sup = p.pid
        trainer_head = f"resilient-run trainer rank 0 attempt 1 {rd} ("

        def all_titled():
            hb = heartbeat(rd) or {}
            standby = [c.pid for c in psutil.Process(sup).children() if c.pid != hb.get("pid")]
            if not hb.get("step") or read_warm_ready(RunDir(rd).warm_ready(2)) is None or len(standby) != 1:
                return None
            titles = (title_of(sup), title_of(hb["pid"]), title_of(standby[0]))
            return (hb["pid"], standby[0], titles) if titles[1].startswith(trainer_head) else None

        trainer, standby, (t_sup, t_trainer, t_standby) = wait_until(all_titled, timeout=120, interval=0.2,
                                                                     what="the trainer titled, the standby ready")
        assert t_sup == f"resilient-run supervisor {rd}"
        assert t_standby == f"resilient-run standby {rd} (waiting)"
        assert "toy_train.py" in t_trainer and t_trainer.endswith(")"), t_trainer
        # The case: of the three, a search for the job's script finds the trainer alone.
        assert pgrep("toy_train.py") & {sup, trainer, standby} == {trainer}
        # The title borrowed no environment: tools that find a job's processes by it still do.
        assert psutil.Process(trainer).environ()[ENV_RUN_DIR] == str(rd)
        # `status` names that same pid first: the one to kill by hand.
        rows = status_rows(rd)
        assert rows[0] == ["trainer", "pid", str(trainer)], rows

        os.kill(trainer, signal.SIGKILL)
        # Attempt 2 runs in the standby's process, which now says so.
        wait_until(lambda: title_of(standby).startswith(f"resilient-run trainer rank 0 attempt 2 {rd} ("),
                   timeout=60, what="the standby retitled as attempt 2's trainer")
        assert p.wait(180) == 0
    finally:
        kill_group(p)
    assert ended_kinds(rd) == ["signal", "success"]
    assert [e["pid"] for e in events(rd, "attempt_started")] == [trainer, standby]


def test_status_lists_the_trainer_pid_first_and_the_step_of_the_step_mark(run_dir: Path) -> None:
    # fake_job sets its step mark every step but beats only at steps 1 and 5, then stops at step 7
    # (hangs, silent; the heartbeat timeout is far away): the mark says 7, the heartbeat 5.
    p = start_cli("--run-dir", str(run_dir), "--heartbeat-timeout", "120", FAKE_JOB,
                  env=sup_env(FAKE_PLAN="1:hang", FAKE_STEPS="7", FAKE_STEP_S="0.05", FAKE_BEAT_EVERY="5"))
    try:
        wait_until(lambda: read_step_mark(RunDir(run_dir).step_mark(0)) == 7 and (heartbeat(run_dir) or {}).get("step") == 5,
                   timeout=60, what="step mark 7, heartbeat step 5")
        trainer = supervisor_state(run_dir)["child_pid"]
        st = json.loads(run_cli("status", str(run_dir), "--json").stdout)
        assert next(iter(st)) == "trainer_pids" and st["trainer_pids"] == {"0": trainer}
        assert (st["step"], st["heartbeat_step"]) == (7, 5)
        rows = status_rows(run_dir)
        assert rows[0] == ["trainer", "pid", str(trainer)] and ["step", "7"] in rows, rows
    finally:
        kill_group(p)


def test_several_ranks_are_listed_by_rank() -> None:
    rep = StatusReport(state="running", supervisor_pid=10, child_pid=11, attempt=1, restarts=0, heartbeat_age_s=0.1,
                       step=7, epoch=0, loss=None, last_failure=None, latest_checkpoint=None, trainer_pid=12,
                       trainer_pids={1: 13, 0: 12})
    assert describe_trainer_pids(rep) == ("trainer pids", "rank 0: 12, rank 1: 13")
    not_yet = dataclasses.replace(rep, trainer_pids=None, trainer_pid=None)   # no rank has beaten yet
    assert describe_trainer_pids(not_yet) == ("trainer pid", "11")   # the launcher's


_WITHOUT = r"""
import sys
sys.modules["setproctitle"] = None   # as if not installed: `import setproctitle` raises ImportError
import torch, trainer_shim
model = torch.nn.Linear(2, 2)
run = trainer_shim.init(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
run.step()
run.finish()
print(open("/proc/self/cmdline", "rb").read().split(b"\0")[1].decode())
"""


def test_without_setproctitle_the_shim_trains_untitled(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", _WITHOUT], env=sup_env(**{ENV_RUN_DIR: str(tmp_path / "run")}),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1] == "-c"   # the command line as it was: python -c ...
