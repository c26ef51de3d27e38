"""Process hooks: a stack file exists only when something was dumped into it."""

from __future__ import annotations

import signal
from pathlib import Path

from trainer_shim import rundir

from tests.support import wait_until

from .helpers import kill_group, run_toy, start_toy


def test_no_stack_file_unless_something_is_dumped(run_dir: Path) -> None:
    p = run_toy(run_dir, "--epochs", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    assert list((run_dir / "logs").glob("stacks-*.txt")) == []


def test_sigusr1_creates_the_stack_file_with_the_dump(run_dir: Path) -> None:
    rd = rundir.RunDir(run_dir)
    proc = start_toy(run_dir, "--step-sleep", "0.05")
    try:
        wait_until(lambda: (rundir.read_heartbeat(rd.heartbeat(0)) or {}).get("phase") == "training", 60,
                   what="a training heartbeat")
        stacks = rd.stacks_file(proc.pid)
        assert not stacks.exists()
        proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: stacks.exists() and "most recent call first" in stacks.read_text(), 30,
                   what="the stack dump")
    finally:
        kill_group(proc)


def test_step_mark_records_the_last_step_reached_not_the_last_beat(run_dir: Path) -> None:
    # Beats are rate-limited (1 s): a SIGKILL right after run.step() 13 leaves an older heartbeat step.
    p = run_toy(run_dir, faults="1:kill@13")
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    rd = rundir.RunDir(run_dir)
    assert rundir.read_step_mark(rd.step_mark(0)) == 13
    assert rundir.reached_step(rd, 0, 1) == 13


_TWO_RUNS = r"""
import json, signal, sys
import torch
import trainer_shim

before = (signal.getsignal(signal.SIGTERM), sys.excepthook)
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
first = trainer_shim.init(model=model, optimizer=opt, run_dir=sys.argv[1] + "/a")
second = trainer_shim.init(model=model, optimizer=opt, run_dir=sys.argv[1] + "/b")
out = {
    # The second Run's hooks replace the first's instead of chaining behind them.
    "sigterm_is_second": signal.getsignal(signal.SIGTERM) == second.session.stop._handle,
    "first_flag_off": signal.getsignal(signal.SIGTERM) != first.session.stop._handle,
    "optimizer_hooks": len(opt._optimizer_step_post_hooks),
}
second.session.hooks.uninstall()
out["restored"] = (signal.getsignal(signal.SIGTERM), sys.excepthook) == before
try:
    trainer_shim.init(model=model, keep_lsat=2, run_dir=sys.argv[1] + "/c")
except TypeError as e:  # init()'s keywords are a real signature
    out["unknown_option"] = str(e)
print(json.dumps(out))
"""


def test_a_second_run_replaces_the_first_runs_hooks_and_uninstall_restores(tmp_path: Path) -> None:
    import json
    import subprocess

    from tests.conftest import PYTHON, REPO, child_env

    env = child_env()
    env["PYTHONPATH"] = str(REPO)
    p = subprocess.run([PYTHON, "-c", _TWO_RUNS, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["sigterm_is_second"] and out["first_flag_off"] and out["restored"], out
    assert out["optimizer_hooks"] == 1, out
    assert out["unknown_option"] == "init() got an unknown option 'keep_lsat'; did you mean 'keep_last'?"
