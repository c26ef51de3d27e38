"""SIGKILL at many moments (including mid-save) and resume: weights equal an uninterrupted run."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from trainer_shim import rundir

from tests.support import finished_step, first_steps, wait_until
from tests.save_modes import MODES, modes, shm_segments

from .helpers import assert_same_weights, chain, kill_group, run_toy, shim_lines, start_toy


@pytest.mark.parametrize("num_workers,epochs,kills", [
    # before any save, right after a step save, on an epoch boundary, twice in one epoch, last epoch
    pytest.param("0", "3", [3, 10, 12, 17, 19, 24, 31], marks=pytest.mark.long),   # ~27 s: make test-faults
    # odd and even resume points: batches land on different workers than before
    ("2", "2", [5, 13, 19]),
])
@pytest.mark.parametrize("save_mode", modes("sync"), indirect=True)
def test_sigkill_anywhere_resumes_bit_exact(run_dir: Path, refs, num_workers: str, epochs: str,
                                            kills: list[int], save_mode: str) -> None:
    ref = refs.get("--num-workers", num_workers, "--epochs", epochs)
    procs = chain(run_dir, kills, "--num-workers", num_workers, "--epochs", epochs)
    assert finished_step(run_dir) == 12 * int(epochs), procs[-1].stdout
    first = first_steps(run_dir)  # attempt -> its first step: N + 1 after resuming from step N
    for attempt, (killed_at, p) in enumerate(zip(kills, procs[1:]), start=2):
        if "memory" in save_mode:  # a snapshot every step: the kill right after run.step() loses nothing
            # (from the slot, or from a disk save of the same step, which is preferred to it)
            assert first[attempt] == killed_at + 1, p.stderr
        elif save_mode == "sync":
            # a resume (a fresh start while no save exists before step 5), never past the kill
            assert (1 < first[attempt] <= killed_at + 1) if killed_at >= 5 else first[attempt] == 1, p.stderr
    if num_workers != "0":
        assert any(shim_lines(p, "num_workers=2") for p in procs[1:])
    assert_same_weights(ref / "final_weights.pt", run_dir / "final_weights.pt")
    assert not shm_segments(run_dir), "shared-memory snapshot slots outlived the run"


def _wait_in_save(run_dir: Path, proc, timeout: float = 60.0) -> bool:
    """Poll until a checkpoint write is in flight (tmp dir or `saving` heartbeat)."""
    ckpts = rundir.RunDir(run_dir).checkpoints
    hb = rundir.RunDir(run_dir).heartbeat(0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(rundir.tmp_dirs(ckpts)):
            return True
        h = rundir.read_heartbeat(hb)
        if h and h.get("phase") == "saving":
            return True
        time.sleep(0.001)
    return False


# make test: sync and async without workers (test_sigkill_anywhere_resumes_bit_exact covers workers);
# every other pair is a long variant.
DURING_SAVE = [pytest.param(m, w, id=f"{m}-{w}", marks=() if m in ("sync", "async") and w == "0"
                            else pytest.mark.long) for m in MODES for w in ("0", "2")]   # (see above)


@pytest.mark.parametrize("save_mode,num_workers", DURING_SAVE, indirect=["save_mode"])
def test_sigkill_during_save_resumes_bit_exact(run_dir: Path, refs, num_workers: str, save_mode: str) -> None:
    args = ("--hidden", "1200", "--epochs", "1", "--samples", "80", "--save-every", "3", "--num-workers", num_workers)
    ref = refs.get(*args)
    hit = 0
    for attempt in (1, 2):
        proc = start_toy(run_dir, *args, attempt=attempt)
        if attempt == 2:  # let the resumed attempt commit one checkpoint, then catch the next save
            wait_until(lambda: proc.poll() is not None or any(rundir.tmp_dirs(run_dir / "checkpoints")), 60, 0.001)
            wait_until(lambda: proc.poll() is not None or not any(rundir.tmp_dirs(run_dir / "checkpoints")), 60, 0.001)
        in_save = _wait_in_save(run_dir, proc)
        proc.send_signal(signal.SIGKILL)
        kill_group(proc)
        if in_save:
            hit += 1
        for info in rundir.iter_checkpoint_dirs([run_dir / "checkpoints"]):
            rundir.inspect_checkpoint(info[1], full=True)  # every committed dir is whole
    assert hit >= 1, "never caught the job inside a save"
    p = run_toy(run_dir, *args, attempt=3)
    assert p.returncode == 0, p.stderr[-3000:]
    assert_same_weights(ref / "final_weights.pt", run_dir / "final_weights.pt")
    assert not list(rundir.tmp_dirs(run_dir / "checkpoints")), "leftover tmp dirs were not cleaned"
    assert not shm_segments(run_dir), "shared-memory snapshot slots outlived the run"
