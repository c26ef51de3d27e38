"""A real torch job under the real supervisor: every kind of death in one run, weights bit-exact."""

from __future__ import annotations

import torch

from tests.conftest import JOBS
from tests.faults.common import reference

from .helpers import alive, attempt_pids, ended_kinds, events, run_cli, sup_env

TOY = str(JOBS / "toy_train.py")


def _assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_kill_raise_exit_hang_cuda_oom_then_success_bit_exact(tmp_path, run_dir):
    ref = reference(tmp_path)  # cached per args: test_warm_restart compares with the same run
    out = tmp_path / "weights.pt"
    faults = "1:kill@7,2:raise@14,3:exit3@20,4:hang@27,5:cuda_oom@31"
    # 10 s: the interpreter's exit after sys.exit(3) (heartbeats end at finalization) is counted as
    # heartbeat silence, and on a busy box (parallel tests) it took over 2 s, then over 3 s, and read
    # as a hang. The timeout's length is not what is tested here (the kinds are); the hang at 27 is
    # still caught, 10 s after its last beat.
    r = run_cli("--run-dir", str(run_dir), "--backoff", "0", "--heartbeat-timeout", "10", "--grace-period", "2",
                TOY, "--out", str(out), env=sup_env(TOY_FAULTS=faults), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["signal", "crash", "crash", "hang", "cuda_oom", "success"]
    _assert_equal(torch.load(out), ref)
    # Every attempt resumed from a checkpoint the supervisor chose (none fresh after the first).
    starts = events(run_dir, "attempt_started")
    assert starts[0]["resume_from"] is None and all(s["resume_from"] for s in starts[1:])
    # The hang left a stack dump naming the blocked frame.
    hang_pid = starts[3]["pid"]
    assert "inject" in (run_dir / "logs" / f"stacks-{hang_pid}.txt").read_text()
    for pid in attempt_pids(run_dir):
        assert not alive(pid)

def test_a_crash_that_never_exits_is_a_crash_not_a_hang(tmp_path, run_dir):
    """The trainer records its uncaught exception, then its interpreter never ends (a thread blocks
    the shutdown): the supervisor ends it after the grace period and calls it what it was."""
    r = run_cli("--run-dir", str(run_dir), "--backoff", "0", "--heartbeat-timeout", "2", "--grace-period", "1",
                TOY, "--epochs", "1", env=sup_env(TOY_FAULTS="1:raise_linger@5"), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["crash", "success"], events(run_dir, "attempt_ended")
    evidence = events(run_dir, "attempt_ended")[0]["evidence"]
    assert evidence.startswith("RuntimeError: injected crash; rank 0 heartbeat unchanged for "), evidence
    assert evidence.endswith("still running 1s after its uncaught exception"), evidence
    for pid in attempt_pids(run_dir):
        assert not alive(pid)


# SIGTERM/SIGKILL to the supervisor with DataLoader workers: tests/faults/test_stops.py.
