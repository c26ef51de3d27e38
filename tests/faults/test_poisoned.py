"""Trial 6: a checkpoint that crashes every attempt resuming from it is poisoned; the older one is used."""

from __future__ import annotations

from pathlib import Path

from tests.supervisor.helpers import ended_kinds, events, run_cli, sup_env

from tests.support import resumed_from
from trainer_shim import rundir

from .common import FAST, TOY, assert_bit_exact, assert_no_survivors, reference

JOB = ("--epochs", "2", "--samples", "96", "--batch-size", "8", "--save-every", "5")  # 24 steps


def test_poisoned_checkpoint_falls_back_to_the_older_one_after_three_attempts(tmp_path):
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    # Attempt 1 dies after the step-10 checkpoint; every attempt resuming from step 10 then crashes.
    env = sup_env(TOY_FAULTS="1:kill@12", TOY_CRASH_IF_RESUMED_FROM_STEP="10")
    r = run_cli("--run-dir", str(run_dir), *FAST, TOY, *JOB, "--out", str(out), env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["signal", "crash", "crash", "crash", "success"]
    starts = [Path(s).name if s else None for s in resumed_from(run_dir)]
    assert starts == [None, "step-00000010", "step-00000010", "step-00000010", "step-00000005"]
    ended = events(run_dir, "attempt_ended")
    assert [Path(e["resumed_from"]).name if e["resumed_from"] else None for e in ended] == starts
    assert [e["progressed"] for e in ended] == [True, False, False, False, True]
    rejected = events(run_dir, "checkpoint_rejected")
    assert len(rejected) == 1 and Path(rejected[0]["path"]).name == "step-00000010"
    assert rejected[0]["poisoned"] is True and "attempts in a row resumed from it" in rejected[0]["reason"]
    assert ended[0]["step"] == 12   # the step mark: the last step reached before the kill, not the last beat's
    assert "poisoned (crash right after resume)" in ended[1]["evidence"]
    assert_bit_exact(out, ref)
    assert_no_survivors(run_dir, str(out))


def test_a_poisoned_memory_snapshot_is_persisted_poisoned_and_never_restored_again(tmp_path):
    """With a memory snapshot every step: attempt 1 is killed right after step 10's snapshot; every
    attempt resuming from step 10 crashes. The restart after the kill leaves the persist to the next
    attempt; after attempts that made no new snapshot the supervisor persists it itself, as before, so
    the crash loop poisons a checkpoint on disk, and the slot of that step is never restored again:
    the next attempt resumes from the other slot, not the disk's step 5."""
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    env = sup_env(TOY_FAULTS="1:kill_settled@10", TOY_CRASH_IF_RESUMED_FROM_STEP="10", TOY_MEMORY_EVERY="1")
    r = run_cli("--run-dir", str(run_dir), *FAST, TOY, *JOB, "--out", str(out), env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["signal", "crash", "crash", "crash", "success"]
    ended = events(run_dir, "attempt_ended")
    resumed = [rundir.parse_checkpoint_name(Path(e["resumed_from"]).name) if e["resumed_from"] else None for e in ended]
    # ... then from the other slot (a step between the disk's step 5 and 10: a snapshot due while
    # the previous one is still hashed is skipped), never from step 10 again
    assert resumed[:4] == [None, 10, 10, 10] and 5 < resumed[4] < 10, resumed
    rejected = events(run_dir, "checkpoint_rejected")
    assert [(Path(e["path"]).name, e.get("poisoned")) for e in rejected] == [("step-00000010", True)], rejected
    assert_bit_exact(out, ref)
    assert_no_survivors(run_dir, str(out))
