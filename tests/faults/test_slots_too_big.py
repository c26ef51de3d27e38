"""Memory snapshot slots that fit or are not made: a slot dir too small for the two slots turns
memory snapshots off for each attempt (one line and one event naming the numbers and the fix, the
heartbeat's reason in `status`) instead of a SIGBUS at the first write into a slot, which made every
attempt die at its first snapshot and the supervisor give up. Training goes on with disk saves, a
kill -9 resumes from the disk, and the finished weights are the uninterrupted run's."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.conftest import mounted_tmpfs
from tests.support import events, first_steps, run_cli, sup_env
from trainer_shim import rundir

from .common import TOY, assert_bit_exact, reference

MiB = 1 << 20
PAGE = 4096
HIDDEN = 1024
# 2 epochs of 12 steps, disk saves at the epoch ends (steps 12 and 24) only.
JOB = ("--hidden", str(HIDDEN), "--epochs", "2", "--save-every", "100")
SUP = ("--backoff", "0", "--heartbeat-timeout", "30", "--grace-period", "2")


def _region(sizes: list[int]) -> int:
    """A slot's region file for tensors of `sizes` bytes: each 64-byte aligned, the last unpadded, whole pages."""
    offset = end = 0
    for n in sizes:
        end = offset + n
        offset += -(-n // 64) * 64
    return -(-end // PAGE) * PAGE


def _toy_slots_bytes() -> int:
    """What the toy's two slots need: its model's float32 parameters, and Adam's step, exp_avg and
    exp_avg_sq for each (tests/jobs/toy_train.py: Linear(16, H), Linear(H, H), Linear(H, 1))."""
    params = [16 * HIDDEN, HIDDEN, HIDDEN * HIDDEN, HIDDEN, HIDDEN, 1]
    model = _region([4 * n for n in params])
    optimizer = _region([b for n in params for b in (4, 4 * n, 4 * n)])
    return 2 * (model + optimizer)


def test_slots_bigger_than_the_slot_dir_are_not_made_and_a_kill9_run_ends_exact_without_a_sigbus(tmp_path: Path) -> None:
    need = _toy_slots_bytes()
    assert need == 25_649_152   # ~24.5 MiB: more than the 16 MiB tmpfs, while one slot alone would fit
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    with mounted_tmpfs(tmp_path / "slots", "size=16m,mode=0700") as slots:
        p = run_cli("--run-dir", str(run_dir), *SUP, TOY, *JOB, "--out", str(out), timeout=240,
                    env=sup_env(TOY_MEMORY_EVERY="1", TOY_FAULTS="1:kill@17", RESILIENT_SHM_DIR=str(slots)))
        assert p.returncode == 0, p.stderr[-3000:]
        assert not list(slots.iterdir()), "a slot file was left on the tmpfs"

    # The supervisor's record of how each attempt ended: the one kill -9, then success; no SIGBUS.
    ended = [(e["kind"], e["signal"]) for e in events(run_dir, rundir.Event.ATTEMPT_ENDED)]
    assert ended == [("signal", signal.SIGKILL), ("success", None)]
    assert first_steps(run_dir) == {1: 1, 2: 13}   # attempt 2 resumed from the epoch-end save of step 12
    assert_bit_exact(out, ref)
    assert not events(run_dir, rundir.Event.CHECKPOINT_FAILED)

    # One event per attempt, at its first due snapshot, with the numbers; the owner record written
    # beside the slots at init() takes one page of the tmpfs.
    off = events(run_dir, rundir.Event.MEMORY_SNAPSHOTS_OFF)
    got = [(e["attempt"], e["step"], e["memory_snapshots"], e["room"], e["where"], e["need_bytes"], e["held_bytes"],
            e["margin_bytes"], e["free_bytes"], e["size_bytes"]) for e in off]
    assert got == [(a, s, True, "slot_dir", str(slots), need, 0, 4 * MiB, 16 * MiB - PAGE, 16 * MiB)
                   for a, s in ((1, 1), (2, 13))]
    reason = (f"2 slots need 24.5 MiB + a 4.0 MiB margin, but {slots} ({rundir.ENV_SHM_DIR}) has 16.0 MiB free "
              "of 16.0 MiB")
    fix = (f"a tmpfs of at least 29 MiB there (docker run --shm-size=29m for /dev/shm; mount -o remount,size=29m "
           f"{slots} for one of your own), or {rundir.ENV_SHM_DIR} on a tmpfs with 28.5 MiB free, or turn memory "
           "snapshots off (memory_every_steps=None)")
    assert [(e["reason"], e["fix"]) for e in off] == [(reason, fix)] * 2

    # One line per attempt in its log, the same words.
    line = f"trainer_shim: warning: memory snapshots off for this attempt: {reason}; training goes on with disk saves. Fix: {fix}"
    for attempt in (1, 2):
        log = (run_dir / "logs" / f"attempt-{attempt:04d}.log").read_text()
        assert [ln for ln in log.splitlines() if "memory snapshots off" in ln] == [line], log[-3000:]

    st = run_cli("status", str(run_dir), "--json")
    assert json.loads(st.stdout)["memory_snapshots_off_reason"] == reason, st.stderr
