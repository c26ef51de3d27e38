"""Trial 3: hangs are killed with a stack dump of the blocked frame; a slow but progressing save is not."""

from __future__ import annotations

import threading
import time

import pytest

from tests.supervisor.helpers import ended_kinds, events, heartbeat, run_cli, sup_env

from .common import TOY, assert_bit_exact, assert_no_survivors, reference

JOB = ("--epochs", "2", "--samples", "96", "--batch-size", "8", "--save-every", "5")  # 24 steps


def _stacks(run_dir, pid: int) -> str:
    f = run_dir / "logs" / f"stacks-{pid}.txt"
    return f.read_text() if f.exists() else ""


@pytest.mark.parametrize("action, frame", [("hang", "inject"), ("deadlock", "inject"),
                                           ("worker_hang", "_try_get_data")])
def test_blocked_trainer_is_dumped_killed_and_resumed_bit_exact(tmp_path, action, frame):
    workers = ("--num-workers", "2") if action == "worker_hang" else ()
    ref = reference(tmp_path, *JOB, *workers)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    t0 = time.monotonic()
    r = run_cli("--run-dir", str(run_dir), "--backoff", "0", "--heartbeat-timeout", "2", "--grace-period", "2",
                TOY, *JOB, *workers, "--out", str(out), env=sup_env(TOY_FAULTS=f"1:{action}@13"), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["hang", "success"]
    hang = events(run_dir, "attempt_ended")[0]
    assert "heartbeat unchanged" in hang["evidence"]
    pid = events(run_dir, "attempt_started")[0]["pid"]
    dump = _stacks(run_dir, pid)
    assert frame in dump, f"{frame} not in the stack dump of pid {pid}:\n{dump[-3000:]}"
    if action == "worker_hang":
        # The main process waits on its workers' queue; the heartbeat stopped a few prefetched
        # batches after the worker blocked.
        assert "_next_data" in dump and hang["step"] < 24
    resume = events(run_dir, "attempt_started")[1]["resume_from"]
    assert resume and (action == "worker_hang" or resume.endswith("step-00000012"))  # the epoch-end save
    assert_bit_exact(out, ref)
    assert_no_survivors(run_dir, str(out))  # the workers too: they carry RESILIENT_RUN_DIR
    assert time.monotonic() - t0 < 120


# ~100 MB checkpoints (3 x 2896^2 fp32) written at 25 MB/s: each save takes ~4 s, twice the
# timeouts, but save_bytes advance every 16 MiB chunk (~0.7 s), so the heartbeat keeps changing.
# 4 steps: one such save (the step-4 save, which the epoch-end and final saves then reuse); a
# second one (8 steps) proved nothing more and cost ~4 s.
BIG = ("--hidden", "2896", "--epochs", "1", "--samples", "32", "--batch-size", "8", "--save-every", "4")


def test_slow_but_progressing_save_is_not_a_hang(tmp_path):
    ref = reference(tmp_path, *BIG)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    saves: list[float] = []
    stop = threading.Event()

    def watch_saves() -> None:
        began = None
        while not stop.is_set():
            hb = heartbeat(run_dir) or {}
            if hb.get("phase") == "saving" and began is None:
                began = time.monotonic()
            elif hb.get("phase") != "saving" and began is not None:
                saves.append(time.monotonic() - began)
                began = None
            time.sleep(0.02)

    w = threading.Thread(target=watch_saves, daemon=True)
    w.start()
    try:
        r = run_cli("--run-dir", str(run_dir), "--backoff", "0", "--heartbeat-timeout", "2", "--save-timeout", "2",
                    "--grace-period", "2", TOY, *BIG, "--out", str(out), env=sup_env(TOY_WRITE_MBPS="25"),
                    timeout=240)
    finally:
        stop.set()
        w.join(5)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["success"]
    assert saves and max(saves) > 2 * 1.5, f"saves were not slower than the timeout: {saves}"
    assert_bit_exact(out, ref)


def test_stalled_save_is_a_hang_with_the_write_on_the_stack(tmp_path):
    job = (*JOB, "--hidden", "600")  # a 1.4 MB weight: a large write the stall catches
    ref = reference(tmp_path, *job)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    r = run_cli("--run-dir", str(run_dir), "--backoff", "0", "--heartbeat-timeout", "2", "--save-timeout", "3",
                "--grace-period", "2", TOY, *job, "--out", str(out), env=sup_env(TOY_FAULTS="1:stall_save@7"),
                timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["hang", "success"]
    hang = events(run_dir, "attempt_ended")[0]
    assert "phase saving" in hang["evidence"] and hang["step"] == 10
    assert "_stalled_write" in _stacks(run_dir, events(run_dir, "attempt_started")[0]["pid"])
    assert events(run_dir, "attempt_started")[1]["resume_from"].endswith("step-00000005")
    assert_bit_exact(out, ref)
    assert_no_survivors(run_dir, str(out))
