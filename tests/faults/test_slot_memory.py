"""No memory left behind: a standalone run killed with kill -9 leaves its memory snapshot slots in
/dev/shm; `status` shows what they hold, `slots --free` takes it back (persisting the newest
first), a stale group (owner dead, run dir gone) is removed by the next run, and a live owner's
slots are never freed by anyone else."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, child_env
from tests.save_modes import PLAIN, shm_segments
from tests.shim.helpers import TOY, committed, run_toy
from tests.support import kill_group, run_cli, wait_until
from trainer_shim import rundir

MEM = {**PLAIN, "TOY_MEMORY_EVERY": "1"}
ARGS = ("--epochs", "2", "--save-every", "5")


def _killed(run_dir: Path) -> None:
    # Killed once step 17's snapshot is complete (hashed in the background; one may be skipped
    # while the previous is still hashed, so the older slot holds an earlier step).
    p = run_toy(run_dir, *ARGS, faults="1:kill_settled@17", env=MEM)
    assert p.returncode == -9, p.stderr[-2000:]
    assert len(shm_segments(run_dir)) == 2


def test_a_killed_standalone_runs_slots_show_in_status_and_slots_free_takes_them_back(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _killed(run_dir)
    st = run_cli("status", str(run_dir), "--json")
    mem = json.loads(st.stdout)["memory_slots"]
    assert mem["live_owner_pid"] is None and mem["bytes"] > 0, mem
    steps = sorted(s["step"] for s in mem["slots"])
    assert steps[0] < steps[1] == 17, mem
    shown = " ".join(run_cli("status", str(run_dir)).stdout.split())   # a narrow table wraps the row
    assert "memory slots" in shown and "owner gone; free: resilient-run slots RUN_DIR --free" in shown
    assert committed(run_dir)[-1] == rundir.checkpoint_name(15)

    freed = run_cli("slots", str(run_dir), "--free")
    assert freed.returncode == 0, freed.stderr
    assert not shm_segments(run_dir)
    assert not [p for p in rundir.SHM_DIR.iterdir() if p.name.startswith(rundir.slot_prefix(run_dir, None))]
    # Nothing lost: the newest slot (step 17, newer than the disk's 15) went to checkpoints/ first.
    assert committed(run_dir)[-1] == rundir.checkpoint_name(17), freed.stderr
    assert "freed" in freed.stderr and "step 17" in freed.stderr
    assert json.loads(run_cli("status", str(run_dir), "--json").stdout)["memory_slots"] is None


def test_stale_slots_of_a_deleted_run_are_listed_and_freed_by_free_stale(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    _killed(gone)
    slots = shm_segments(gone)
    shutil.rmtree(gone)   # nobody can rerun it: its owner is dead and its run dir is gone
    listing = json.loads(run_cli("slots", "--json").stdout)
    mine = [g for g in listing if g["run_dir"] == str(gone.resolve())]
    assert mine and "run dir" in mine[0]["stale"] and mine[0]["bytes"] > 0, listing
    freed = run_cli("slots", "--free-stale")
    assert freed.returncode == 0 and str(gone.resolve()) in freed.stdout, freed.stdout + freed.stderr
    assert not any(s.exists() for s in slots)


@pytest.mark.long   # make test: the same stale rule through `slots --free-stale` (above)
def test_stale_slots_of_a_deleted_run_are_freed_by_the_next_run(tmp_path: Path) -> None:
    gone, later = tmp_path / "gone", tmp_path / "later"
    _killed(gone)
    slots = shm_segments(gone)
    shutil.rmtree(gone)
    p = run_toy(later, "--epochs", "1", env=MEM)
    assert p.returncode == 0, p.stderr[-2000:]
    assert not any(s.exists() for s in slots), "the stale slots of a deleted run survived the next run"
    assert "freed" in p.stderr and "stale memory snapshots" in p.stderr


def test_a_live_owners_slots_are_never_freed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([PYTHON, str(TOY), "--epochs", "50", "--step-sleep", "0.05", "--run-dir", str(run_dir)],
                            env=child_env(**MEM), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        owner = rundir.owner_path(run_dir, None, 0)
        wait_until(lambda: owner.exists() and any((s / rundir.MANIFEST_NAME).exists() for s in shm_segments(run_dir)),
                   timeout=120, what="a complete slot and its owner record")
        refused = run_cli("slots", str(run_dir), "--free")
        assert refused.returncode == rundir.EXIT_USAGE
        assert f"running process {proc.pid}" in refused.stderr and "Traceback" not in refused.stderr
        run_cli("slots", "--free-stale")
        g = rundir.run_slots(run_dir)
        assert g.slots and g.live_owner == proc.pid
        assert rundir.stale_reason(g, after_s=0) is None   # however old: a live owner's slots stay
        st = json.loads(run_cli("status", str(run_dir), "--json").stdout)
        assert st["memory_slots"]["live_owner_pid"] == proc.pid
    finally:
        kill_group(proc)
    rundir.free_slots(run_dir)
