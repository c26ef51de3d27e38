"""Memory cgroups for `--memory-limit` and the kernel's OOM-kill evidence (cgroup counters, kernel log)."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

from trainer_shim.rundir import mounts

from ..errors import SupervisorError

__all__ = ["MemoryCgroup", "CgroupError", "KernelLog", "MemoryLimit", "memory_limit_of"]


class CgroupError(SupervisorError):
    """A memory cgroup for --memory-limit could not be created."""


def _own_cgroups(pid: "int | str" = "self") -> dict[str, str]:
    """Controller list (v1: 'memory', v2: '') -> the cgroup path of process `pid` (default: this one)."""
    out = {}
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in ctrls.split(","):
                    out[c] = path
    except OSError:
        pass
    return out


@dataclasses.dataclass
class MemoryCgroup:
    """A fresh memory cgroup holding the job's tree, with a readable OOM-kill counter."""

    path: Path
    version: int

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> "MemoryCgroup":
        """cgroup v2 where the memory controller is delegated and writable, else v1; CgroupError if neither."""
        reasons = []
        for make in (cls._create_v2, cls._create_v1):
            try:
                cg = make(name)
            except OSError as e:
                reasons.append(f"{e.filename or ''}: {e.strerror}")
                continue
            if cg is None:
                continue
            try:
                cg.set_limit(limit_bytes)
            except OSError as e:
                cg.remove()
                reasons.append(f"cannot set limit in {cg.path}: {e.strerror}")
                continue
            return cg
        why = "; ".join(reasons) or "no writable cgroup v2 memory controller or v1 memory hierarchy"
        raise CgroupError(f"--memory-limit needs a writable memory cgroup ({why}); run as root or drop --memory-limit")

    @classmethod
    def _create_v2(cls, name: str) -> Optional["MemoryCgroup"]:
        root = next((m for m, t, _ in mounts() if t == "cgroup2"), None)
        own = _own_cgroups().get("")
        if root is None or own is None:
            return None
        parent = Path(root) / own.lstrip("/")
        try:
            controllers = (parent / "cgroup.controllers").read_text().split()
        except OSError:
            return None
        if "memory" not in controllers:
            return None
        if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
            # Enabling fails in a non-root cgroup that holds processes (no internal processes rule);
            # then the memory controller is not delegated to us and v1 is tried.
            try:
                (parent / "cgroup.subtree_control").write_text("+memory")
            except OSError:
                return None
        path = parent / name
        path.mkdir(exist_ok=True)
        return cls(path, 2)

    @classmethod
    def _create_v1(cls, name: str) -> Optional["MemoryCgroup"]:
        root = next((m for m, t, o in mounts() if t == "cgroup" and "memory" in o.split(",")), None)
        if root is None:
            return None
        own = _own_cgroups().get("memory", "/")
        parent = Path(root) / own.lstrip("/")
        if not parent.is_dir():
            parent = Path(root)  # our cgroup path is from another namespace's view
        path = parent / name
        path.mkdir(exist_ok=True)
        return cls(path, 1)

    def set_limit(self, limit: int) -> None:
        """Cap the group's memory (and its swap: swapping would turn an OOM into a crawl)."""
        if self.version == 2:
            (self.path / "memory.max").write_text(str(limit))
            swap = self.path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")  # swapping would turn an OOM into a crawl
        else:
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                try:
                    memsw.write_text(str(limit))
                except OSError:
                    pass

    def oom_kills(self) -> int:
        """The kernel's count of OOM kills in this cgroup (v2 memory.events, v1 memory.oom_control)."""
        fname = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            text = (self.path / fname).read_text()
        except OSError:
            return 0
        m = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        return int(m.group(1)) if m else 0

    @property
    def counter_name(self) -> str:
        return "memory.events oom_kill" if self.version == 2 else "memory.oom_control oom_kill"

    def remove(self, timeout: float = 5.0) -> None:
        """rmdir once empty (the kernel refuses while a process remains); best effort."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    return
                time.sleep(0.05)


# v1 reports "no limit" as the largest page-aligned int64 (9223372036854771712), not as a word.
_V1_UNLIMITED = 1 << 62


@dataclasses.dataclass(frozen=True)
class MemoryLimit:
    """The memory limit a process runs under: its own cgroup (which a process joins to be charged
    alongside it) and the nearest cgroup on the way up to the hierarchy's root that sets a limit."""

    cgroup: MemoryCgroup      # the process's own memory cgroup
    limit_bytes: int
    limited_at: Path          # where the limit is set: `cgroup.path` or one of its ancestors


def _limit_file(path: Path, version: int) -> Optional[int]:
    name = "memory.max" if version == 2 else "memory.limit_in_bytes"
    try:
        raw = (path / name).read_text().strip()
    except OSError:
        return None
    if not raw.isdigit():   # v2 "max"
        return None
    value = int(raw)
    return value if version == 2 or value < _V1_UNLIMITED else None


def memory_limit_of(pid: int) -> Optional[MemoryLimit]:
    """The memory limit process `pid` runs under, or None when no cgroup above it sets one (then an
    allocation can only end in the machine's own OOM, which a drill must never cause).

    v1 where a memory hierarchy is mounted (limits are hierarchical there, as in v2), else v2."""
    groups = _own_cgroups(pid)
    v1 = next((m for m, t, o in mounts() if t == "cgroup" and "memory" in o.split(",")), None)
    v2 = next((m for m, t, _ in mounts() if t == "cgroup2"), None)
    for root, key, version in ((v1, "memory", 1), (v2, "", 2)):
        if root is None or key not in groups:
            continue
        own = Path(root) / groups[key].lstrip("/")
        if not own.is_dir():   # a path from another cgroup namespace's view: nothing to read here
            continue
        for path in (own, *own.parents):
            if not path.is_relative_to(root):
                break
            limit = _limit_file(path, version)
            if limit is not None:
                return MemoryLimit(MemoryCgroup(own, version), limit, path)
    return None


_KMSG_KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\)")


class KernelLog:
    """A reader of /dev/kmsg positioned at the attempt's start, so only new records are seen.

    Positioning by the reader's own offset (not timestamps) keeps the evidence right across
    clock jumps and VM snapshot restores; an old kill of a reused pid is never read.
    """

    def __init__(self) -> None:
        try:
            self._fd: Optional[int] = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self._fd, 0, os.SEEK_END)
        except OSError:
            self._fd = None

    def oom_kills(self, pids: Iterable[int]) -> list[str]:
        """New kernel log lines saying the OOM killer killed one of `pids`."""
        wanted = set(pids)
        found: list[str] = []
        if self._fd is None:
            return found
        while True:
            try:
                rec = os.read(self._fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # a record was overwritten while we lagged: go on
                    continue
                break
            msg = rec.partition(";")[2].strip()
            m = _KMSG_KILLED.search(msg)
            if m and int(m.group(1)) in wanted:
                rss = re.search(r"anon-rss:\d+\w+", msg)
                found.append(f"kernel log: Killed process {m.group(1)} ({m.group(2)})" + (f" {rss.group(0)}" if rss else ""))
        return found

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
