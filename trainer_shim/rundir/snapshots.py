"""Memory snapshot slots: names and the trust rule, shared by the shim and the supervisor.

A memory snapshot is a checkpoint directory on tmpfs (`/dev/shm/resilient-run-<hash>-<slot>/`),
0700 with 0600 files, in the disk member format, its MANIFEST.json (digests) written last; so
the supervisor persists one by copying bytes. Big tensors live in `<member>.tensors` (their raw
bytes back to back, updated in place by the shim) described by `<member>.table` (JSON: dtype,
shape, stride, offset, nbytes and xxh3_64 digest per tensor, written before MANIFEST.json);
`<member>` then holds the small skeleton whose tensor leaves are TENSOR_REF markers (index i is
table entry i). Events: Event.CHECKPOINT_PERSISTED_BY_SUPERVISOR {path,
step}, Event.SAVE_SKIPPED {step, target, reason}; async writer failures are CHECKPOINT_FAILED
with `background: true`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

import xxhash

SHM_DIR = Path("/dev/shm")
SNAPSHOT_PREFIX = "resilient-run-"
SNAPSHOT_SLOTS = 2                 # at most two snapshot slots per run dir (node)
TENSORS_SUFFIX = ".tensors"        # the member holding the raw tensor bytes of `<member>`
TABLE_SUFFIX = ".table"            # the member describing them (trainer_shim.raw_tensors)
TENSOR_REF = "\x00rr-tensor:"      # skeleton leaf standing for tensors[i] (NUL: never user text)


def _slot_prefix(run_root: Path, node: Optional[int]) -> str:
    key = f"{os.path.realpath(run_root)}\0{'' if node is None else node}"
    return f"{SNAPSHOT_PREFIX}{xxhash.xxh3_64_hexdigest(key.encode())}-"


def snapshot_slot_paths(run_root: Path, node: Optional[int] = None, rank: int = 0) -> list[Path]:
    """`/dev/shm/resilient-run-<16 hex>-<i>` (rank 0 or a single process) and
    `/dev/shm/resilient-run-<16 hex>-r<R>-<i>` (rank R > 0 of a multi-rank job): names per run dir
    (and node) and rank, stable across processes. Each rank's slots hold its own share of the
    checkpoint (the members that rank writes to disk), with a manifest listing just those."""
    tag = f"r{rank}-" if rank else ""
    return [SHM_DIR / f"{_slot_prefix(run_root, node)}{tag}{i}" for i in range(SNAPSHOT_SLOTS)]


def snapshot_slot_ranks(run_root: Path, node: Optional[int] = None) -> list[int]:
    """The ranks that have any slot of this run dir (and node) in SHM_DIR, ascending."""
    prefix = _slot_prefix(run_root, node)
    ranks = set()
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    for name in names:
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        if rest.isdigit():
            ranks.add(0)
        elif rest.startswith("r") and "-" in rest and rest[1:rest.index("-")].isdigit():
            ranks.add(int(rest[1:rest.index("-")]))
    return sorted(ranks)


def untrusted_slot_reason(path: Path) -> Optional[str]:
    """Why a slot must not be trusted (owner or mode differ, or it is no plain dir); None if fine."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot stat: {e.strerror or e}"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not {os.geteuid()}"
    if st.st_mode & 0o077:
        return f"mode {stat.S_IMODE(st.st_mode):o} is readable by others (want 700)"
    try:
        for ent in os.scandir(path):
            fst = ent.stat(follow_symlinks=False)
            if not stat.S_ISREG(fst.st_mode) or fst.st_uid != os.geteuid() or fst.st_mode & 0o077:
                return f"{ent.name}: not an owner-only regular file"
    except OSError as e:
        return f"cannot list: {e.strerror or e}"
    return None
