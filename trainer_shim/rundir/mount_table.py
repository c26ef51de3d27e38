"""What is mounted where: /proc/self/mounts read one way for both sides (the supervisor finds its
memory cgroup hierarchy there; the slot directory check asks whether a path is in RAM)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

__all__ = ["mounts", "fs_type"]


def mounts() -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, options) of every mount this process sees, in mount order;
    [] when /proc cannot be read."""
    out = []
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4:
                    out.append((parts[1].replace("\\040", " "), parts[2], parts[3]))
    except OSError:
        pass
    return out


def fs_type(path: Path) -> Optional[str]:
    """The filesystem type of the mount holding `path` (the last-mounted of the longest mount
    points above it), or None when nothing is known."""
    real, best = str(Path(path).resolve()), ("", None)
    for mnt, fstype, _ in mounts():
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best[0]):
            best = (mnt, fstype)
    return best[1]
