"""Memory snapshots that survive the trainer: a kill -9 after a snapshot completed loses nothing,
one while its background hash still runs falls back to the previous snapshot, the supervisor
persists the newest complete one, a half-written or untrusted slot is never used, no slot is left."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import mounted_tmpfs
from tests.save_modes import MODES, PLAIN, shm_segments
from tests.shim.helpers import run_toy, shim_lines
from tests.support import ended_kinds, events, first_steps, kill_group, run_cli, start_cli, sup_env
from trainer_shim import rundir

from .common import TOY, assert_bit_exact, assert_no_survivors, reference, run_under_killer, verify_cli

MEM = {"TOY_MEMORY_EVERY": "1"}
# FAST, but a loaded 2-core box can take seconds to tear torch down after `finished`: no false hangs.
SUP = ("--backoff", "0", "--heartbeat-timeout", "30", "--grace-period", "2")
SMALL = ("--epochs", "2", "--save-every", "100")


def _supervised(tmp_path: Path, faults: str, **env: str) -> tuple[Path, Path, Path]:
    """The toy under the supervisor with a snapshot every step and `faults`; it must end in success.
    Returns (run dir, final weights, the uninterrupted run's weights)."""
    ref = reference(tmp_path, *SMALL)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    p = start_cli("--run-dir", str(run_dir), *SUP, TOY, *SMALL, "--out", str(out),
                  env=sup_env(**MEM, TOY_FAULTS=faults, **env))
    try:
        rc = p.wait(180)
    finally:
        kill_group(p)
    assert rc == 0, p.stderr.read()[-3000:]
    return run_dir, out, ref


def _resumed(run_dir: Path) -> list[str]:
    return [e.get("resumed_from") for e in events(run_dir, "attempt_ended")]


def _ckpt(run_dir: Path, step: int) -> str:
    return str(run_dir.resolve() / "checkpoints" / rundir.checkpoint_name(step))


def test_kill9_with_a_snapshot_every_step_loses_nothing_and_the_next_attempt_persists_it(tmp_path: Path) -> None:
    """The restart does not wait for the snapshot to reach the disk: the next attempt restores it
    from memory and its writer persists it as checkpoints/step-N beside its first steps."""
    run_dir, out, ref = _supervised(tmp_path, "1:kill_settled@7,2:kill_settled@17")
    assert ended_kinds(run_dir) == ["signal", "signal", "success"]
    assert not events(run_dir, rundir.Event.CHECKPOINT_PERSISTED_BY_SUPERVISOR)
    assert _resumed(run_dir)[1:] == [_ckpt(run_dir, 7), _ckpt(run_dir, 17)]
    assert {7, 17} <= {rundir.parse_checkpoint_name(p.name) for p in (run_dir / "checkpoints").iterdir()}
    # Each resumed attempt went on right after its killed step: nothing was lost.
    assert first_steps(run_dir) == {1: 1, 2: 8, 3: 18}
    assert_bit_exact(out, ref)
    assert verify_cli(run_dir).returncode == 0
    assert not shm_segments(run_dir), "the supervisor left its shared-memory slots behind"


def test_kill9_while_the_snapshot_is_still_hashed_resumes_from_the_previous_one(tmp_path: Path) -> None:
    """run.step() 12 returned with its snapshot copied but not yet hashed: the slot of step 12 has
    no manifest, so the next attempt restores step 11's (and persists it) and redoes step 12."""
    run_dir, out, ref = _supervised(tmp_path, "1:kill_hashing@12")
    assert ended_kinds(run_dir) == ["signal", "success"]
    assert _resumed(run_dir)[1:] == [_ckpt(run_dir, 11)]
    assert not events(run_dir, "checkpoint_rejected"), "the incomplete slot was offered"
    assert first_steps(run_dir) == {1: 1, 2: 12}
    assert_bit_exact(out, ref)
    assert not shm_segments(run_dir)


def test_slots_on_a_huge_page_tmpfs_named_by_resilient_shm_dir_resume_exact(tmp_path: Path) -> None:
    """RESILIENT_SHM_DIR puts the slots on the user's own tmpfs (here one with huge pages): the
    kill -9 resumes from memory there, bit-exact, and /dev/shm never holds a slot of the run."""
    with mounted_tmpfs(tmp_path / "slots", "size=256m,mode=0700,huge=within_size") as slots:
        run_dir, out, ref = _supervised(tmp_path, "1:kill_settled@9", RESILIENT_SHM_DIR=str(slots))
        assert ended_kinds(run_dir) == ["signal", "success"]
        assert first_steps(run_dir) == {1: 1, 2: 10}
        assert_bit_exact(out, ref)
        log = (run_dir / "logs" / "attempt-0002.log").read_text()
        assert f"resumed from {slots / rundir.slot_prefix(run_dir.resolve(), None)}" in log, log[-2000:]
        assert not list(slots.iterdir()), "the supervisor left its slots behind"
    assert not shm_segments(run_dir)


def test_a_resilient_shm_dir_on_a_disk_is_refused_before_anything_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    p = run_cli("--run-dir", str(run_dir), TOY, *SMALL, env=sup_env(RESILIENT_SHM_DIR=str(tmp_path)))
    assert p.returncode == rundir.EXIT_USAGE, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "RESILIENT_SHM_DIR=" in lines[0] and "mount -t tmpfs" in lines[0], p.stderr
    assert not run_dir.exists()


def _killed_standalone(run_dir: Path) -> tuple[list[Path], int]:
    """Attempt 1 killed right after step 17's snapshot completed (a snapshot due every step, one
    skipped while the previous one is still hashed): the newest slot holds step 17; the older
    slot's step is returned."""
    p = run_toy(run_dir, *SMALL[:2], "--save-every", "5", faults="1:kill_settled@17", env={**PLAIN, **MEM})
    assert p.returncode == -9, p.stderr[-2000:]
    slots = sorted(shm_segments(run_dir), key=lambda s: rundir.read_json(s / rundir.MANIFEST_NAME)["global_step"])
    steps = [rundir.read_json(s / rundir.MANIFEST_NAME)["global_step"] for s in slots]
    assert len(steps) == 2 and steps[1] == 17 and 14 <= steps[0] < 17, steps
    return slots, steps[0]


# loose_mode is long: foreign_owner takes the same untrusted-slot path in make test
@pytest.mark.parametrize("damage", ["half_written", pytest.param("loose_mode", marks=pytest.mark.long), "foreign_owner"])
def test_a_half_written_or_untrusted_slot_is_never_used(tmp_path: Path, damage: str) -> None:
    args = (*SMALL[:2], "--save-every", "5")
    run_dir = tmp_path / "run"
    (older, newest), older_step = _killed_standalone(run_dir)
    if damage == "half_written":  # what fill() leaves until finalize(): data changing, no manifest
        (newest / rundir.MANIFEST_NAME).unlink()
    elif damage == "loose_mode":
        os.chmod(newest, 0o755)
    else:
        os.chown(newest, 65534, 65534)   # memory snapshots off for this attempt: a disk checkpoint, no slot
    try:
        p = run_toy(run_dir, *args, attempt=2, env={**PLAIN, **MEM})
        assert p.returncode == 0, p.stderr[-3000:]
        # Resumed from the older slot (or the disk save of step 15): never from the slot of step 17.
        assert first_steps(run_dir)[2] == max(older_step, 15) + 1, p.stderr
        if damage != "half_written":
            rejected = events(run_dir, "checkpoint_rejected")
            assert rejected and "not trusted" in rejected[0]["reason"], rejected
        if damage == "foreign_owner":
            assert not shim_lines(p, "resumed from memory"), p.stderr   # no record says where a resume came from
            assert newest.exists(), "a foreign slot was touched"
        assert_bit_exact(run_dir / "final_weights.pt", reference(tmp_path, *args))
    finally:
        if damage == "foreign_owner":
            shutil.rmtree(newest, ignore_errors=True)
    assert not shm_segments(run_dir)


JOB = ("--hidden", "900", "--samples", "400", "--batch-size", "4", "--epochs", "3", "--save-every", "10",
       "--step-sleep", "0.01")


# make test: one seed with 3 kills in async+memory; the long variants: seeds 1-10 with 10 kills in every fast mode.
CHAOS = [pytest.param("async+memory", 3, 3, id="async+memory-3")] + [
    pytest.param(m, seed, 10, id=f"{m}-{seed}-kills10", marks=pytest.mark.long)   # the seed sweep: long
    for m in MODES if m != "sync" for seed in range(1, 11)]


@pytest.mark.parametrize("mode,seed,kills", CHAOS)
def test_chaos_kill9_with_async_saves_and_memory_snapshots_is_bit_exact(tmp_path: Path, mode: str, seed: int,
                                                                         kills: int) -> None:
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    # Half of the kills wait for a write (a .tmp-step-* dir: the background persist).
    rc, stderr, killer = run_under_killer(run_dir, seed, kills, *SUP, TOY, *JOB, "--out", str(out),
                                          env=sup_env(**MODES[mode]), timeout=400)
    assert rc == 0, stderr[-3000:]
    assert len(killer.log) == kills, killer.log
    assert ended_kinds(run_dir) == ["signal"] * kills + ["success"]
    assert not events(run_dir, "checkpoint_rejected"), "a .tmp-* or half-written snapshot was offered"
    chosen = [e.get("resume_from") for e in events(run_dir, "attempt_started")]
    assert not any(rundir.TMP_PREFIX in (c or "") for c in chosen)
    assert_bit_exact(out, ref)
    assert verify_cli(run_dir).returncode == 0
    assert_no_survivors(run_dir, str(out))
    assert not shm_segments(run_dir), "shared-memory snapshot slots outlived the run"


def test_a_rerun_writes_its_snapshots_into_the_slot_files_its_predecessor_left(tmp_path: Path) -> None:
    """A restarted process's first snapshots rewrite the slots' region files in place (their pages
    already exist in /dev/shm) instead of allocating new ones on its first steps, and stay exact."""
    args = ("--hidden", "256", *SMALL)
    run_dir = tmp_path / "run"
    p = run_toy(run_dir, *args, faults="1:kill_settled@7", env={**PLAIN, **MEM})
    assert p.returncode == -9, p.stderr[-2000:]
    regions = {s / (rundir.OPTIMIZER_FILE + rundir.TENSORS_SUFFIX): None for s in shm_segments(run_dir)}
    regions = {r: os.stat(r).st_ino for r in regions}
    assert len(regions) == 2
    p = run_toy(run_dir, *args, attempt=2, faults="2:kill_settled@10", env={**PLAIN, **MEM})
    assert p.returncode == -9 and shim_lines(p, "resumed from memory step 7"), p.stderr[-2000:]
    assert {r: os.stat(r).st_ino for r in regions} == regions, "a snapshot after the restart made a new region file"
    p = run_toy(run_dir, *args, attempt=3, env={**PLAIN, **MEM})
    assert p.returncode == 0, p.stderr[-2000:]
    assert_bit_exact(run_dir / "final_weights.pt", reference(tmp_path, *args))
    assert not shm_segments(run_dir)
