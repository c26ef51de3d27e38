"""Who holds memory in /dev/shm, and when it may be taken back.

A memory snapshot slot outlives the process that wrote it (that is its point: a kill -9 loses
nothing). A run with a supervisor gets its slots freed when the supervisor stops; a standalone
run (no supervisor) that is killed and never rerun would hold them until reboot. So every rank
that takes memory snapshots records itself beside its slots, in
`/dev/shm/resilient-run-<hash>-[r<R>-]owner.json` ({pid, start_ticks, run_dir, node, rank}),
and a slot group (one run dir's, or one node's, slots) is **stale** when

  * no recorded owner process is alive (pid and start time: a reused pid is not the owner), and
  * no live supervisor holds the run dir's supervisor.lock, and
  * the run dir is gone, or nothing in the slots changed for STALE_AFTER_S (24 h).

Stale slots are removed by any later run that takes memory snapshots (at its start) and by
`resilient-run slots --free-stale`. A live owner's slots are never freed by anyone but itself.
Slots without an owner record (written before owners were recorded) are judged by age alone.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Optional

from .atomic import atomic_write_json
from .clock import process_start_ticks
from .layout import RunDir
from .manifest import MANIFEST_NAME, Manifest
from .snapshots import OWNER_NAME, SHM_DIR, SNAPSHOT_PREFIX, remove_slot, slot_prefix

STALE_AFTER_S = 24 * 3600.0
_HASH_LEN = 16


def owner_path(run_root: Path, node: Optional[int] = None, rank: int = 0) -> Path:
    tag = f"r{rank}-" if rank else ""
    return SHM_DIR / f"{slot_prefix(run_root, node)}{tag}{OWNER_NAME}"


def owner_alive(pid: object, start_ticks: object) -> bool:
    """The recorded process still runs: same pid and start time (a reused pid is someone else), not
    a zombie. /proc, not psutil: the owner record is written on the restore path, where psutil's
    import (~40 ms) would be paid by every restart."""
    if not isinstance(pid, int) or not isinstance(start_ticks, int) or pid <= 0:
        return False
    return process_start_ticks(pid) == start_ticks


def record_owner(run_root: Path, node: Optional[int] = None, rank: int = 0) -> None:
    """This process holds the slots of (run_root, node, rank); OSError propagates (caller warns)."""
    path = owner_path(run_root, node, rank)
    rec = {"pid": os.getpid(), "start_ticks": process_start_ticks(), "run_dir": os.path.realpath(run_root),
           "node": node, "rank": rank}
    atomic_write_json(path, rec, durable=False)  # RAM-backed like the slots: no fsync


@dataclasses.dataclass
class SlotUse:
    """One slot directory: the memory it holds (tmpfs blocks) and the step it holds if complete."""

    path: str
    bytes: int
    step: Optional[int]
    mtime: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class SlotGroup:
    """Every slot (all ranks) of one run dir or node, and the owners recorded for them."""

    prefix: str
    slots: list[SlotUse] = dataclasses.field(default_factory=list)
    owners: list[dict] = dataclasses.field(default_factory=list)
    paths: list[Path] = dataclasses.field(default_factory=list)   # every name of the group, owners too

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.slots)

    @property
    def run_dir(self) -> Optional[str]:
        return next((o["run_dir"] for o in self.owners if isinstance(o.get("run_dir"), str)), None)

    @property
    def live_owner(self) -> Optional[int]:
        return next((o["pid"] for o in self.owners if owner_alive(o.get("pid"), o.get("start_ticks"))), None)

    @property
    def touched(self) -> float:
        return max([s.mtime for s in self.slots] + [0.0])

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "run_dir": self.run_dir, "live_owner_pid": self.live_owner,
                "owners": [{k: o.get(k) for k in ("pid", "rank", "node")} for o in self.owners],
                "slots": [s.to_json() for s in self.slots]}


def _slot_use(path: Path) -> SlotUse:
    total, mtime = 0, 0.0
    try:
        st = os.lstat(path)
        mtime = st.st_mtime
        for ent in os.scandir(path):
            fst = ent.stat(follow_symlinks=False)
            total += fst.st_blocks * 512   # what tmpfs really holds (a sparse tail holds nothing)
            mtime = max(mtime, fst.st_mtime)
    except OSError:
        pass
    try:
        step: Optional[int] = Manifest.from_json(json.loads((path / MANIFEST_NAME).read_bytes())).global_step
    except (OSError, ValueError, UnicodeDecodeError):
        step = None   # being written (no manifest yet) or not a slot we can read: held, not usable
    return SlotUse(str(path), total, step, mtime)


def _read_owner(path: Path) -> Optional[dict]:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def slot_groups(only_prefix: Optional[str] = None) -> list[SlotGroup]:
    """This user's slot groups in SHM_DIR (others' are not ours to count or touch), biggest first."""
    groups: dict[str, SlotGroup] = {}
    try:
        entries = list(os.scandir(SHM_DIR))
    except OSError:
        return []
    for ent in entries:
        name = ent.name
        if not name.startswith(SNAPSHOT_PREFIX):
            continue
        prefix = name[:len(SNAPSHOT_PREFIX) + _HASH_LEN + 1]
        if (only_prefix is not None and prefix != only_prefix) or len(name) <= len(prefix):
            continue
        try:
            if ent.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
        except OSError:
            continue
        g = groups.setdefault(prefix, SlotGroup(prefix))
        g.paths.append(Path(ent.path))
        if name.endswith(OWNER_NAME):
            rec = _read_owner(Path(ent.path))
            if rec is not None:
                g.owners.append(rec)
        elif ent.is_dir(follow_symlinks=False):
            g.slots.append(_slot_use(Path(ent.path)))
    return sorted(groups.values(), key=lambda g: g.bytes, reverse=True)


def run_slots(run_root: Path, node: Optional[int] = None) -> SlotGroup:
    """The slots of one run dir (node): empty when it has none."""
    prefix = slot_prefix(run_root, node)
    found = slot_groups(prefix)
    return found[0] if found else SlotGroup(prefix)


def lock_pid(rd: RunDir) -> Optional[int]:
    """The pid of the live supervisor holding rd's supervisor.lock (-1 if it wrote none), else None.

    The one probe of the lock: the stale-slot rule here and the supervisor's `stop` both ask it."""
    try:
        fd = os.open(rd.lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raw = os.read(fd, 64).decode(errors="replace").strip()
        return int(raw) if raw.isdigit() else -1
    finally:
        os.close(fd)   # closing drops our shared lock too
    return None


def _supervised(run_dir: str, node: Optional[int]) -> bool:
    rd = RunDir(Path(run_dir))
    return lock_pid(rd if node is None else rd.for_node(node)) is not None


def stale_reason(g: SlotGroup, now: Optional[float] = None, after_s: float = STALE_AFTER_S) -> Optional[str]:
    """Why `g` may be removed (see the module docstring), or None while someone may still use it."""
    pid = g.live_owner
    if pid is not None:
        return None
    node = next((o.get("node") for o in g.owners if isinstance(o.get("node"), int)), None)
    if g.run_dir is not None and os.path.isdir(g.run_dir) and _supervised(g.run_dir, node):
        return None
    if not g.slots:
        return "its owner is dead and it holds no slot"
    if g.run_dir is not None and not os.path.isdir(g.run_dir):
        return f"its run dir {g.run_dir} is gone and its owner is dead"
    idle = (time.time() if now is None else now) - g.touched
    if idle >= after_s:
        who = "its owner is dead" if g.owners else "no owner recorded"
        return f"unchanged for {idle / 3600:.1f} h and {who}"
    return None


def free_group(g: SlotGroup) -> None:
    """Remove every slot and owner record of `g` (the caller decided it may)."""
    for path in g.paths:
        remove_slot(path)


def free_stale(keep: Optional[str] = None, after_s: float = STALE_AFTER_S) -> list[tuple[SlotGroup, str]]:
    """Remove every stale group of this user's (but `keep`, a prefix); (group, reason) of each removed."""
    out = []
    for g in slot_groups():
        if g.prefix == keep:
            continue
        why = stale_reason(g, after_s=after_s)
        if why is not None:
            free_group(g)
            out.append((g, why))
    return out
