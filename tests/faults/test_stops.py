"""Trial 7: stopping the supervisor (SIGTERM, SIGKILL) and a second supervisor on the same run dir."""

from __future__ import annotations

import os
import signal
import time

import psutil

from supervisor.insight import render
from supervisor.insight.status import open_run_dir, read_status
from tests.supervisor.helpers import (
    ended_kinds, events, heartbeat, kill_group, run_cli, start_cli, supervisor_state, wait_until,
)

from .common import FAST, TOY, assert_bit_exact, assert_no_survivors, reference

# 2 DataLoader workers, slow enough steps to stop it in the middle of an epoch.
JOB = ("--epochs", "3", "--samples", "96", "--batch-size", "8", "--save-every", "5", "--num-workers", "2",
       "--step-sleep", "0.05")


def _start(run_dir, out, *flags):
    p = start_cli("--run-dir", str(run_dir), *FAST, *flags, TOY, *JOB, "--out", str(out))
    wait_until(lambda: (heartbeat(run_dir) or {}).get("step", 0) >= 8, timeout=60, what="step 8")
    workers = [c.pid for c in psutil.Process(supervisor_state(run_dir)["child_pid"]).children(recursive=True)]
    assert len(workers) == 2, workers
    return p, workers


def test_sigterm_to_supervisor_loses_no_step_exits_75_and_rerun_is_bit_exact(tmp_path):
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    # The trainer exits right after its save, but tearing down torch and two DataLoader workers took
    # over FAST's 2 s grace on a loaded 2-core box (SIGKILL: kind signal); a user's default is 30 s.
    p, workers = _start(run_dir, out, "--grace-period", "20")
    try:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 75
    finally:
        kill_group(p)
    assert ended_kinds(run_dir) == ["preempted"]
    hb = heartbeat(run_dir)
    assert hb["phase"] == "stopping"
    newest = max(int(d.name.split("-")[1]) for d in (run_dir / "checkpoints").glob("step-*"))
    assert newest == hb["step"]  # zero lost steps: the preempt checkpoint is at the last beat's step
    assert events(run_dir, "stopped")[0]["saved"] is True
    shown = dict(render.status_rows(read_status(open_run_dir(run_dir))))  # what `status` prints now
    assert shown["state"] == f"stopped (resumable, checkpoint step {newest})", shown
    assert shown["last failure"] == "-" and shown["phase"] == "exited (last heartbeat: stopping)", shown
    assert_no_survivors(run_dir, str(out))
    r = run_cli("--run-dir", str(run_dir), *FAST, TOY, *JOB, "--out", str(out), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["preempted", "success"]
    assert events(run_dir, "attempt_started")[1]["resume_from"].endswith(f"step-{newest:08d}")
    assert_bit_exact(out, ref)
    assert_no_survivors(run_dir, str(out))


def test_sigkill_of_supervisor_takes_trainer_and_workers_down_and_rerun_recovers(tmp_path):
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    p, workers = _start(run_dir, out)
    trainer = supervisor_state(run_dir)["child_pid"]
    try:
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        # No orphan: the trainer (PDEATHSIG) and its DataLoader workers (their parent watchdog).
        assert_no_survivors(run_dir, str(out), timeout=10)
        gone_in = time.monotonic() - t0
    finally:
        kill_group(p)
    print(f"trainer and workers gone {gone_in:.2f}s after the supervisor's SIGKILL")
    assert gone_in < 3, gone_in  # workers die with the trainer (PDEATHSIG), not by torch's watchdog
    r = run_cli("--run-dir", str(run_dir), *FAST, TOY, *JOB, "--out", str(out), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    # The killed supervisor never wrote attempt 1's end; the rerun is attempt 2 and resumes.
    starts = events(run_dir, "attempt_started")
    assert [s["attempt"] for s in starts] == [1, 2] and starts[1]["resume_from"]
    assert trainer not in [s["pid"] for s in starts[1:]]
    assert ended_kinds(run_dir) == ["success"]
    assert_bit_exact(out, ref)
    assert_no_survivors(run_dir, str(out))


def test_second_supervisor_on_the_same_run_dir_exits_3_and_changes_nothing(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    p, _ = _start(run_dir, out)
    try:
        before = supervisor_state(run_dir)["child_pid"]
        second = run_cli("--run-dir", str(run_dir), *FAST, TOY, *JOB, "--out", str(out))
        assert second.returncode == 3
        assert f"supervisor pid {p.pid}" in second.stderr
        assert supervisor_state(run_dir)["child_pid"] == before and psutil.pid_exists(before)
        assert len(events(run_dir, "attempt_started")) == 1
    finally:
        kill_group(p)
    assert_no_survivors(run_dir, str(out))
