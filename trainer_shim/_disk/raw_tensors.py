"""The raw tensor layout of a split checkpoint member (memory snapshots).

`<member>.tensors` holds the bytes of the member's tensors back to back (each contiguous, 64-byte
aligned); `<member>.table` (JSON, written before MANIFEST.json) gives for entry i (the skeleton's
TENSOR_REF i) dtype, shape, stride, offset, nbytes and the xxh3_64 digest of those bytes.

Why not torch.save'd tensors: restoring then means unpickling and allocating every tensor. Here a
restore reads each tensor's bytes once straight to where they belong and verifies them there
(raw_read). The writer maps the region MAP_SHARED once and updates it in place with copy_ (the
preallocated buffers *are* the slot).
"""

from __future__ import annotations

import dataclasses
import json
import math
import mmap
import os
import stat
from pathlib import Path
from typing import Any, Optional

import torch
import xxhash

from .. import rundir
from ..errors import CheckpointError

ALIGN = 64
FORMAT = "resilient-run raw tensors"
VERSION = 1
_CHUNK = 1 << 20  # hashed in pieces that stay in cache for the file digest's second look


@dataclasses.dataclass(frozen=True)
class Entry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    nbytes: int
    digest: str = ""

    def to_json(self) -> dict:
        return {"dtype": str(self.dtype).removeprefix("torch."), "shape": list(self.shape),
                "stride": list(self.stride), "offset": self.offset, "nbytes": self.nbytes, "xxh3_64": self.digest}

    @classmethod
    def from_json(cls, d: Any) -> "Entry":
        dtype = getattr(torch, str(d["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {d['dtype']!r}")
        shape, stride = tuple(int(x) for x in d["shape"]), tuple(int(x) for x in d["stride"])
        nbytes, off = int(d["nbytes"]), int(d["offset"])
        if len(stride) != len(shape) or off < 0 or nbytes != math.prod(shape) * dtype.itemsize:
            raise ValueError("shape, stride and nbytes disagree")
        return cls(dtype, shape, stride, off, nbytes, str(d["xxh3_64"]))


def _dense_stride(t: torch.Tensor) -> tuple[int, ...]:
    """t's stride when its elements fill their span exactly once (e.g. channels_last), else contiguous."""
    want = 1
    for d in sorted(range(t.dim()), key=lambda i: (t.stride(i), t.shape[i])):
        if t.shape[d] != 1 and t.stride(d) != want:
            return tuple(torch.empty(t.shape, device="meta").stride())
        want *= t.shape[d]
    return tuple(t.stride())


def plan(tensors: list) -> Optional[list[Entry]]:
    """Where each tensor goes; None if one cannot be stored raw (sparse, quantized, nested ...)."""
    out, off = [], 0
    for t in tensors:
        if t.layout != torch.strided or t.is_quantized or t.is_nested or t.dtype.itemsize == 0:
            return None
        n = t.numel() * t.element_size()
        out.append(Entry(t.dtype, tuple(t.shape), _dense_stride(t), off, n))
        off += -(-n // ALIGN) * ALIGN
    return out


def size_of(entries: list[Entry]) -> int:
    return max((e.offset + e.nbytes for e in entries), default=0)


def view(buf: Any, e: Entry) -> torch.Tensor:
    """Entry e of a mapped region as a contiguous tensor sharing the mapping (no copy)."""
    if e.nbytes == 0:
        return torch.empty(e.shape, dtype=e.dtype)
    return torch.frombuffer(buf, dtype=torch.uint8, count=e.nbytes, offset=e.offset).view(e.dtype).view(e.shape)


def create(path: Path, entries: list[Entry]) -> mmap.mmap:
    """A fresh owner-only region file of the right size, its pages reserved, mapped MAP_SHARED
    read-write. OSError (ENOSPC, ENOMEM ...) when the pages cannot be had; no file is left then.

    Reserved, not just sized: a write through the mapping to a page a full tmpfs cannot back is a
    SIGBUS that kills the process; posix_fallocate makes that an error here instead."""
    tmp = path.with_name(path.name + ".new")
    n = max(size_of(entries), 1)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, n)
        mm = mmap.mmap(fd, n, flags=mmap.MAP_SHARED)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return mm


def open_own(path: Path, flags: int) -> Optional[tuple[int, os.stat_result]]:
    """(fd, its stat) of `path` opened with `flags` when it is a regular file of ours (not followed
    through a symlink), else None: a slot region anyone else could have put there is not mapped."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd, st


def reuse(path: Path, entries: list[Entry]) -> Optional[mmap.mmap]:
    """The existing region file at `path` mapped MAP_SHARED read-write and populated, when it is our
    own regular file of exactly the size `entries` need; else None (create() then makes a new one).

    A restarted process's first snapshots go to the slots its predecessor left: their pages already
    exist in /dev/shm, so writing in place skips allocating and zeroing them (0.016 s vs 0.057 s for
    128 MiB here), which a fresh file costs on the first steps after a restart."""
    opened = open_own(path, os.O_RDWR)
    if opened is None:
        return None
    fd, st = opened
    try:
        n = max(size_of(entries), 1)
        if st.st_size != n:
            return None
        if st.st_blocks * 512 < n:  # holes (a file no create() of ours reserved): back them now or never map it
            os.posix_fallocate(fd, 0, n)
        return mmap.mmap(fd, n, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    except OSError:
        return None
    finally:
        os.close(fd)


def digests(mm: mmap.mmap, entries: list[Entry]) -> tuple[list[Entry], str]:
    """Every entry's digest and the whole file's (the manifest's), in one pass over the region."""
    whole = rundir.new_hasher()
    mv = memoryview(mm)
    out, pos = [], 0
    try:
        for e in entries:
            whole.update(mv[pos:e.offset])  # alignment padding
            h = xxhash.xxh3_64()
            for start in range(e.offset, e.offset + e.nbytes, _CHUNK):
                piece = mv[start:min(start + _CHUNK, e.offset + e.nbytes)]
                h.update(piece)
                whole.update(piece)
            out.append(dataclasses.replace(e, digest=h.hexdigest()))
            pos = e.offset + e.nbytes
        whole.update(mv[pos:])
    finally:
        mv.release()
    return out, whole.hexdigest()


def table_bytes(entries: list[Entry]) -> bytes:
    return json.dumps({"format": FORMAT, "version": VERSION, "tensors": [e.to_json() for e in entries]}).encode()


def read_table(path: Path) -> list[Entry]:
    try:
        d = json.loads(path.read_bytes())
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise ValueError(f"unsupported table {d.get('format')!r} v{d.get('version')!r}")
        return [Entry.from_json(x) for x in d["tensors"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path.name}: unreadable tensor table: {e}") from e


def match(skel: Any, live: Any, out: dict[int, Any]) -> bool:
    """Pair skeleton markers with the tensors at the same place in `live` (into `out`); True when
    both have exactly the same shape of containers and keys, so filling `live` in place is a
    complete restore (no load_state_dict needed)."""
    if isinstance(skel, str) and skel.startswith(rundir.TENSOR_REF):
        out[int(skel[len(rundir.TENSOR_REF):])] = live
        return isinstance(live, torch.Tensor)
    if isinstance(skel, dict):
        same = isinstance(live, dict) and skel.keys() == live.keys()
        for k, v in skel.items():
            same = match(v, live.get(k) if isinstance(live, dict) else None, out) and same
        return same
    if isinstance(skel, (list, tuple)):
        seq = live if isinstance(live, (list, tuple)) and len(live) == len(skel) else [None] * len(skel)
        same = seq is live
        for v, lv in zip(skel, seq):
            same = match(v, lv, out) and same
        return same
    return isinstance(live, type(skel)) and skel == live
