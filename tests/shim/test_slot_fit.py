"""The fit check and the page reservation under memory snapshot slots, on a real 16 MiB tmpfs: the
check refuses slots that do not fit with the numbers and the fix in its words, counts what the run's
own slots hold already, and a region the tmpfs cannot back is an error at its creation that leaves
no file (never a SIGBUS at a write through its mapping)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import PYTHON, REPO, child_env, mounted_tmpfs
from trainer_shim import rundir
from trainer_shim._memory import fit
from trainer_shim._memory.slots import NoRoom, Slot

MiB = 1 << 20


def test_the_fit_check_refuses_slots_bigger_than_the_slot_dir_with_the_numbers(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "slots", "size=16m,mode=0700") as d:
        refusal = fit.check(24 * MiB, 0, 2, d)
        assert refusal == fit.Refusal(fit.Room(fit.SLOT_DIR, str(d), 16 * MiB, 16 * MiB), 24 * MiB, 0, 2)
        assert refusal.line() == (
            f"warning: memory snapshots off for this attempt: 2 slots need 24.0 MiB + a 4.0 MiB margin, but {d} "
            f"({rundir.ENV_SHM_DIR}) has 16.0 MiB free of 16.0 MiB; training goes on with disk saves. "
            f"Fix: a tmpfs of at least 28 MiB there (docker run --shm-size=28m for /dev/shm; mount -o remount,size=28m "
            f"{d} for one of your own), or {rundir.ENV_SHM_DIR} on a tmpfs with 28.0 MiB free, or turn memory "
            "snapshots off (memory_every_steps=None)")
        assert refusal.fields()["need_bytes"] == 24 * MiB and refusal.fields()["free_bytes"] == 16 * MiB
        # With async_save alone the same slots are not made: its saves go synchronous, said so.
        async_only = dataclasses.replace(refusal, snapshots=False).line()
        assert async_only.startswith("warning: async saves synchronous (no memory slots) for this attempt: 2 slots ")
        assert async_only.endswith("28.0 MiB free, or async_save=False")
        # The margin is 10 % of the slots, at least 4 MiB: 12 MiB of slots fit exactly, a page more does not.
        assert fit.check(12 * MiB, 0, 2, d) is None
        assert fit.check(12 * MiB + 4096, 0, 2, d) is not None
        # What the run's own slots hold already is theirs to rewrite: 10 MiB held + 6 MiB free fit 12 MiB.
        (d / "filler").write_bytes(b"\0" * (10 * MiB))
        assert fit.check(12 * MiB, 10 * MiB, 2, d) is None
        assert fit.check(12 * MiB, 0, 2, d).room.free == 6 * MiB


def test_host_memory_that_cannot_hold_the_slots_refuses_them_too(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        2097152 kB\nMemAvailable:     524288 kB\n")
    room = fit.host_room(meminfo)
    assert room == fit.Room(fit.HOST_MEMORY, str(meminfo), 512 * MiB)
    r = fit.Refusal(room, 400 * MiB, 0, 2)   # + a 256 MiB margin (10 % would be 40 MiB)
    assert r.reason == "2 slots need 400.0 MiB + a 256.0 MiB margin, but the host has 512.0 MiB of memory available (MemAvailable)"
    assert r.fix() == ("144.0 MiB more free memory on the host, less model state per process, or turn memory snapshots "
                       "off (memory_every_steps=None)")


def test_a_region_the_tmpfs_cannot_back_fails_at_creation_and_leaves_no_file(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "slots", "size=16m,mode=0700") as d:
        slot = Slot(d / "slot-0")
        assert slot.prepare() is None
        with pytest.raises(NoRoom, match=r"model\.pt\.tensors: no room for 20971520 bytes: ENOSPC: No space left on device$"):
            slot.fill({rundir.MODEL_FILE: {"w": torch.ones(5 * MiB)}})   # 20 MiB of float32
        assert os.listdir(slot.path) == []
        assert os.statvfs(d).f_bfree * os.statvfs(d).f_frsize == 16 * MiB   # nothing of it stays allocated
        slot.fill({rundir.MODEL_FILE: {"w": torch.ones(2 * MiB)}})   # 8 MiB: made, every page reserved
        region = slot.path / (rundir.MODEL_FILE + rundir.TENSORS_SUFFIX)
        assert os.stat(region).st_blocks * 512 == 8 * MiB
        # The tmpfs filled up by someone else: the next snapshot's small skeleton finds no room either,
        # an error (not torch.save's opaque one) that leaves no half-written file.
        st = os.statvfs(d)
        (d / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize))
        with pytest.raises(NoRoom, match=r"/model\.pt: no room for \d+ bytes: ENOSPC: No space left on device$"):
            slot.fill({rundir.MODEL_FILE: {"w": torch.zeros(2 * MiB)}})
        assert sorted(os.listdir(slot.path)) == [rundir.MODEL_FILE, rundir.MODEL_FILE + rundir.TENSORS_SUFFIX]


def _own_v1_memory_cgroup() -> Path:
    root = Path("/sys/fs/cgroup/memory")
    own = next((ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                if ln.split(":")[1] == "memory"), "/")
    return root / own.lstrip("/")


_ROOMS = """
import json
from pathlib import Path
from trainer_shim._memory import fit
room = next(r for r in fit.rooms(Path("/dev/shm")) if r.kind == fit.MEMORY_CGROUP)
refused_in = fit.check(room.free, 0, 2, Path("/dev/shm")).room.kind
fix = fit.Refusal(room, room.free, 0, 2).fix()   # the same measure (a second one may differ by a page)
print(json.dumps({"room": [room.where, room.free, room.size], "refused_in": refused_in, "fix": fix}))
"""


def test_a_memory_cgroup_limit_is_a_room_the_slots_must_fit_under(tmp_path: Path) -> None:
    """A process in a v1 memory cgroup limited to 900 MiB: the limit less its working set is a room,
    and slots as big as that room (plus the margin) are refused there, with the limit to raise."""
    cg = _own_v1_memory_cgroup() / f"rr-slot-fit-{os.getpid()}"
    try:
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(900 * MiB))
    except OSError as e:
        pytest.skip(f"no writable v1 memory cgroup at {cg.parent}: {e}")
    try:
        p = subprocess.run(["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec "$@"', "sh", PYTHON, "-c", _ROOMS],
                           env=child_env(PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    finally:
        cg.rmdir()   # its only process has exited
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout)
    where, free, size = got["room"]
    assert (where, size, got["refused_in"]) == (str(cg), 900 * MiB, fit.MEMORY_CGROUP)
    assert 0 < free < 900 * MiB   # the interpreter's own pages are charged to it
    # short = the slots (free) + a 256 MiB margin (more than 10 % of them) - free
    assert got["fix"] == ("a memory limit 256.0 MiB higher (docker run --memory, Kubernetes resources.limits.memory, "
                          "resilient-run --memory-limit), or turn memory snapshots off (memory_every_steps=None)")
