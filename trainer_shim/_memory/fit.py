"""Whether the memory snapshot slots fit where their bytes come from, asked before they are made.

A slot's region is a tmpfs file that training writes through a shared mapping, and a page the
tmpfs cannot back is a SIGBUS at that write: with a slot dir too small for the slots, every
attempt died at its first snapshot and the supervisor crash-looped. So before the
first region of an attempt is created, the two slots' bytes are held against every place they
come out of, each with a margin, and where one is short memory snapshots are off for the
attempt (one line, an event, the heartbeat's `memory_snapshots_off_reason`); the regions themselves
reserve their pages when created (raw_tensors.create), so a shortage the check could not foresee
(another process filling the tmpfs meanwhile) is an error at creation, never a signal.

The places (`rooms`):
- the slot directory (statvfs free space; a ramfs reports no size and has no limit of its own),
- the host's memory (/proc/meminfo MemAvailable: tmpfs pages are RAM and swap is rare),
- the job's memory cgroup, when it has a limit (v2 memory.max, v1 memory.limit_in_bytes; the
  tightest of the process's cgroup and its ancestors), less its working set (usage minus the
  inactive file cache reclaim would give back): tmpfs pages are charged to the cgroup that
  touches them first, so a slot the limit cannot hold ends in an OOM kill.

Bytes the run's own slots already hold count as available everywhere (a restarted attempt writes
into the region files its predecessor left). Torch-free: the caller measures what the slots need.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional

from .. import rundir

MiB = 1 << 20
MARGIN_FRACTION = 0.10         # of the slots' bytes, kept free beyond them wherever they live
DIR_MARGIN_MIN = 4 * MiB       # the slots' small files (skeletons, tables, manifests, owner record)
MEMORY_MARGIN_MIN = 256 * MiB  # the training process's own growth beside the slots
_UNLIMITED = 1 << 62           # a cgroup v1 "no limit" is PAGE_COUNTER_MAX pages, just under 2**63

SLOT_DIR, HOST_MEMORY, MEMORY_CGROUP = "slot_dir", "host_memory", "memory_cgroup"


@dataclasses.dataclass(frozen=True)
class Room:
    """One place the slots' bytes come out of: `free` bytes left there now (of `size` in all)."""

    kind: str                  # SLOT_DIR, HOST_MEMORY or MEMORY_CGROUP
    where: str                 # the path (slot dir, cgroup dir) or "/proc/meminfo"
    free: int
    size: Optional[int] = None

    @property
    def margin_min(self) -> int:
        return DIR_MARGIN_MIN if self.kind == SLOT_DIR else MEMORY_MARGIN_MIN

    def margin(self, need: int) -> int:
        return max(self.margin_min, int(need * MARGIN_FRACTION))

    def describe(self) -> str:
        if self.kind == SLOT_DIR:
            return f"{self.where} ({rundir.ENV_SHM_DIR}) has {mib(self.free)} free of {mib(self.size or 0)}"
        if self.kind == HOST_MEMORY:
            return f"the host has {mib(self.free)} of memory available (MemAvailable)"
        return (f"the job's memory cgroup {self.where} has {mib(self.free)} left under its limit of "
                f"{mib(self.size or 0)}")


class Said:
    """How slots turned off are told: one line (stderr) and the MEMORY_SNAPSHOTS_OFF event's fields.
    `snapshots`: memory snapshots were asked for; else only async saves used the slots, and go
    synchronous."""

    snapshots: bool
    reason: str

    def fix(self) -> str:
        raise NotImplementedError

    @property
    def off_fix(self) -> str:
        return "or turn memory snapshots off (memory_every_steps=None)" if self.snapshots else "or async_save=False"

    def line(self) -> str:
        what = "memory snapshots off" if self.snapshots else "async saves synchronous (no memory slots)"
        return f"warning: {what} for this attempt: {self.reason}; training goes on with disk saves. Fix: {self.fix()}"

    def fields(self) -> dict:
        return {"reason": self.reason, "fix": self.fix(), "memory_snapshots": self.snapshots}


@dataclasses.dataclass(frozen=True)
class Refusal(Said):
    """The slots do not fit in `room`: `need` bytes for `slots` slots, `held` of them already held."""

    room: Room
    need: int
    held: int
    slots: int
    snapshots: bool = True

    @property
    def margin(self) -> int:
        return self.room.margin(self.need)

    @property
    def short(self) -> int:
        """Bytes missing in the room for the slots and their margin."""
        return self.need + self.margin - self.held - self.room.free

    @property
    def reason(self) -> str:  # type: ignore[override]
        held = f", {mib(self.held)} of it held already" if self.held else ""
        return (f"{self.slots} slots need {mib(self.need)} + a {mib(self.margin)} margin{held}, "
                f"but {self.room.describe()}")

    def fix(self) -> str:
        if self.room.kind == SLOT_DIR:
            total = -(-((self.room.size or 0) + self.short) // MiB)   # the size the tmpfs needs, in whole MiB
            return (f"a tmpfs of at least {total} MiB there (docker run --shm-size={total}m for /dev/shm; "
                    f"mount -o remount,size={total}m {self.room.where} for one of your own), or "
                    f"{rundir.ENV_SHM_DIR} on a tmpfs with {mib(self.need + self.margin - self.held)} free, "
                    f"{self.off_fix}")
        if self.room.kind == HOST_MEMORY:
            return f"{mib(self.short)} more free memory on the host, less model state per process, {self.off_fix}"
        return (f"a memory limit {mib(self.short)} higher (docker run --memory, Kubernetes resources.limits.memory, "
                f"resilient-run --memory-limit), {self.off_fix}")

    def fields(self) -> dict:
        return {**super().fields(), "room": self.room.kind, "where": self.room.where, "need_bytes": self.need,
                "held_bytes": self.held, "margin_bytes": self.margin, "free_bytes": self.room.free,
                "size_bytes": self.room.size}


@dataclasses.dataclass(frozen=True)
class Unreserved(Said):
    """A slot file found no room (slots.NoRoom: its region's pages could not be reserved, or a small
    member not written) although the check let the slots in: something else took the room meanwhile."""

    path: str
    nbytes: int
    error: str
    snapshots: bool = True

    @property
    def reason(self) -> str:  # type: ignore[override]
        size = f" for {mib(self.nbytes)}" if self.nbytes else ""
        return f"no room{size} at {self.path}: {self.error}"

    def fix(self) -> str:
        return (f"room for the slots where they live (df {Path(self.path).parent.parent}, free -m), "
                f"{rundir.ENV_SHM_DIR} on a bigger tmpfs, {self.off_fix}")

    def fields(self) -> dict:
        return {**super().fields(), "room": None, "where": self.path, "need_bytes": self.nbytes}


def mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


def check(need: int, held: int, slots: int, shm_dir: Path) -> Optional[Refusal]:
    """The first room the slots (`need` bytes, `held` of them already there) do not fit in, or None."""
    for room in rooms(shm_dir):
        if need + room.margin(need) > room.free + held:
            return Refusal(room, need, held, slots)
    return None


def rooms(shm_dir: Path) -> list[Room]:
    """Every place the slots' bytes come out of that has a limit this process can read."""
    out = [r for r in (dir_room(shm_dir), host_room()) if r is not None]
    return out + cgroup_rooms()


def dir_room(path: Path) -> Optional[Room]:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    if st.f_blocks == 0:   # ramfs: no size of its own, only the host's memory bounds it
        return None
    return Room(SLOT_DIR, str(path), st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def host_room(meminfo: Path = Path("/proc/meminfo")) -> Optional[Room]:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return Room(HOST_MEMORY, str(meminfo), int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_rooms() -> list[Room]:
    """The tightest limited memory cgroup above this process, in each hierarchy that has one (v2, v1)."""
    own = _own_cgroups()
    out = []
    for root, rel, files in _hierarchies(own):
        tight = min((r for r in _levels(Path(root), rel, files) if r is not None), key=lambda r: r.free, default=None)
        if tight is not None:
            out.append(tight)
    return out


def _own_cgroups() -> dict[str, str]:
    """Controller ("" for v2, "memory" for v1) -> this process's cgroup path."""
    out = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(","):
                out[c] = path
    except (OSError, ValueError):
        pass
    return out


# (limit, usage, memory.stat key of the reclaimable inactive file cache) per cgroup version
_V2 = ("memory.max", "memory.current", "inactive_file")
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def _hierarchies(own: dict[str, str]) -> list[tuple[str, str, tuple[str, str, str]]]:
    out = []
    for mnt, fstype, opts in rundir.mounts():
        if fstype == "cgroup2" and "" in own:
            out.append((mnt, own[""], _V2))
        elif fstype == "cgroup" and "memory" in opts.split(",") and "memory" in own:
            out.append((mnt, own["memory"], _V1))
    return out


def _levels(root: Path, rel: str, files: tuple[str, str, str]) -> list[Optional[Room]]:
    """The process's cgroup and each ancestor up to the hierarchy's root (a container whose own
    cgroup is mounted as the root sees a path that does not exist below it: those levels are None)."""
    d, out = root / rel.lstrip("/"), []
    while True:
        out.append(_level(d, files))
        if d == root or root not in d.parents:
            return out
        d = d.parent


def _level(d: Path, files: tuple[str, str, str]) -> Optional[Room]:
    limit_f, usage_f, inactive_key = files
    try:
        raw = (d / limit_f).read_text().strip()
        if raw == "max" or int(raw) >= _UNLIMITED:
            return None
        limit, usage = int(raw), int((d / usage_f).read_text())
        inactive = 0
        for line in (d / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    except (OSError, ValueError):
        return None
    return Room(MEMORY_CGROUP, str(d), max(0, limit - (usage - inactive)), limit)
