"""The raw tensor layout of a split checkpoint member (memory snapshots).

`<member>.tensors` holds the bytes of the member's tensors back to back (each contiguous, 64-byte
aligned); `<member>.table` (JSON, written before MANIFEST.json) gives for entry i (the skeleton's
TENSOR_REF i) dtype, shape, stride, offset, nbytes and the xxh3_64 digest of those bytes.

Why not torch.save'd tensors: restoring then means unpickling and allocating every tensor. Here a
restore reads each tensor's bytes once (preadv, no mapping of the slot) straight to where they
belong — into the live tensor it replaces when that is contiguous with the same dtype and shape,
else into one fresh anonymous region per member (a fresh restart's optimizer
state) — and hashes them there in cache-sized chunks, on up to two threads. The writer maps the
region MAP_SHARED once and updates it in place with copy_ (the preallocated buffers *are* the slot).

The safety rule: bytes may reach a live tensor before its digest is checked (verifying first would
mean reading everything twice). What a user relies on still holds — a corrupt slot never becomes
training state: a bad digest raises (LiveStateChanged when live bytes were written); the caller
rejects the checkpoint (a memory slot loses its manifest, so nobody picks it again) and falls back
to an older one, whose load_state_dict / in-place fill overwrites every tensor the failed load
touched. When no fallback is left, the live model is partly overwritten and cannot be rebuilt here:
restoring.restore() ends the attempt with a one-line error (exit 1: a crash, restarted), and the
next attempt starts from its own fresh model. Tensors needing a strided live home are staged in
the fresh region and copied only after they verify. Nothing restored aliases the slot: a later
rewrite of the slot cannot change training state.
"""

from __future__ import annotations

import dataclasses
import json
import ctypes
import math
import mmap
import os
import stat
import threading
from pathlib import Path
from typing import Any, Optional

import torch
import xxhash

from . import landing
from .. import rundir
from ..errors import CheckpointError

ALIGN = 64
FORMAT = "resilient-run raw tensors"
VERSION = 1
_CHUNK = 1 << 20  # hashed in pieces that stay in cache for the file digest's second look
_READ_CHUNK = 4 << 20  # read, then hashed while still in cache (fits in L2/L3: the hash does not go to RAM)
_THREADS = 2  # readers; the box (and most trainers' spare) has few cores
_MIN_THREAD_BYTES = 8 << 20  # below this per thread, starting one costs more than it saves


class LiveStateChanged(CheckpointError):
    """A tensor failed its digest after bytes of this member had already reached live tensors."""


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
    """A fresh owner-only region file of the right size, mapped MAP_SHARED read-write."""
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, max(size_of(entries), 1))
        mm = mmap.mmap(fd, max(size_of(entries), 1), flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return mm


def reuse(path: Path, entries: list[Entry]) -> Optional[mmap.mmap]:
    """The existing region file at `path` mapped MAP_SHARED read-write and populated, when it is our
    own regular file of exactly the size `entries` need; else None (create() then makes a new one).

    A restarted process's first snapshots go to the slots its predecessor left: their pages already
    exist in /dev/shm, so writing in place skips allocating and zeroing them (0.016 s vs 0.057 s for
    128 MiB here), which a fresh file costs on the first steps after a restart."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        n = max(size_of(entries), 1)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size != n:
            return None
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


def _fits(t: Any, e: Entry) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype == e.dtype and tuple(t.shape) == e.shape
            and t.device.type == "cpu" and t.layout == torch.strided and not t.requires_grad)


def _bytes_of(t: torch.Tensor) -> memoryview:
    """A writable view of a contiguous CPU tensor's bytes (valid while t lives)."""
    n = t.numel() * t.element_size()
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B") if n else memoryview(b"")


class _Dest:
    """Where entry i's bytes are read to (`buf`), and what becomes of them once verified."""

    def __init__(self, e: Entry, buf: memoryview, result: torch.Tensor, live: bool,
                 staged: Optional[torch.Tensor] = None) -> None:
        # staged: the tensor over `buf` that is copied into `result` after verification
        self.e, self.buf, self.result, self.live, self.staged = e, buf, result, live, staged


def _fresh_region(n: int) -> Optional[mmap.mmap]:
    """One anonymous region for the tensors that have no live home (filled by the reader threads
    in parallel). No MADV_HUGEPAGE: in a fresh process the kernel's compaction for the first huge
    pages stalled a restore for up to 1.7 s here (0.30 s median vs 0.08 s with 4 KiB pages). A warm
    standby's region, faulted in while it waited, is taken when it fits (landing)."""
    if n == 0:
        return None
    return landing.take(n) or mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _carve(mm: mmap.mmap, off: int, e: Entry) -> torch.Tensor:
    # frombuffer keeps `mm` alive for as long as any tensor over it exists.
    return torch.frombuffer(mm, dtype=torch.uint8, count=e.nbytes, offset=off).view(e.dtype).view(e.shape)


def _same_order(t: torch.Tensor, e: Entry) -> bool:
    """t (contiguous) already has entry e's saved stride, up to the meaningless strides of size-1 dims."""
    return all(n == 1 or a == b for n, a, b in zip(e.shape, t.stride(), e.stride))


def _destinations(entries: list[Entry], targets: dict[int, Any]) -> list[_Dest]:
    """A contiguous live target of the right dtype/shape receives its bytes directly; every other
    entry is read into one fresh region (then copied into a strided live target, or kept there,
    or moved to a tensor with its saved stride), so nothing of the restore aliases the slot."""
    direct = {i for i, e in enumerate(entries) if _fits(targets.get(i), e) and targets[i].is_contiguous()}
    offs, total = {}, 0
    for i, e in enumerate(entries):
        if i not in direct and e.nbytes:
            offs[i], total = total, total + -(-e.nbytes // ALIGN) * ALIGN
    mm = _fresh_region(total)
    out = []
    for i, e in enumerate(entries):
        t = targets.get(i)
        if i in direct:
            out.append(_Dest(e, _bytes_of(t), t, live=True))
            continue
        tmp = _carve(mm, offs[i], e) if i in offs else torch.empty(e.shape, dtype=e.dtype)  # type: ignore[arg-type]
        if _fits(t, e):
            out.append(_Dest(e, _bytes_of(tmp), t, live=False, staged=tmp))
        elif _same_order(tmp, e):
            out.append(_Dest(e, _bytes_of(tmp), tmp.as_strided(e.shape, e.stride), live=False))
        else:  # e.g. channels_last optimizer state: materialised with the stride it was saved with
            out.append(_Dest(e, _bytes_of(tmp), torch.empty_strided(e.shape, e.stride, dtype=e.dtype), False, tmp))
    return out


def _read_verify(fd: int, d: _Dest, stop: threading.Event) -> Optional[str]:
    """Read entry d's bytes into d.buf in chunks, hashing each chunk while it is in cache; the
    error text or None. `stop`: another worker found a bad tensor, no need to go on."""
    h, e = xxhash.xxh3_64(), d.e
    for start in range(0, e.nbytes, _READ_CHUNK):
        if stop.is_set():
            return None
        piece = d.buf[start:min(start + _READ_CHUNK, e.nbytes)]
        got = 0
        while got < len(piece):
            n = os.preadv(fd, [piece[got:]], e.offset + start + got)
            if n <= 0:
                return "shorter than its table says"
            got += n
        h.update(piece)
    return None if h.hexdigest() == e.digest else "digest mismatch (changed or corrupt)"


def _workers(dests: list[_Dest]) -> list[list[int]]:
    """Entries split over up to _THREADS workers by bytes (preadv and xxh3 release the GIL)."""
    k = max(1, min(_THREADS, os.cpu_count() or 1, sum(d.e.nbytes for d in dests) // _MIN_THREAD_BYTES))
    shares: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for i in sorted(range(len(dests)), key=lambda i: -dests[i].e.nbytes):
        w = load.index(min(load))
        shares[w].append(i)
        load[w] += dests[i].e.nbytes
    return shares


def _read_all(fd: int, dests: list[_Dest]) -> tuple[Optional[str], bool]:
    """(first error as "tensor i: why" or None, whether any live tensor's bytes were written)."""
    stop, errors, touched = threading.Event(), {}, [False]

    def work(share: list[int]) -> None:
        for i in share:
            if stop.is_set():
                return
            touched[0] |= dests[i].live and dests[i].e.nbytes > 0
            why = _read_verify(fd, dests[i], stop)
            if why:
                errors[i] = why
                stop.set()

    shares = _workers(dests)
    threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in shares[1:]]
    for t in threads:
        t.start()
    try:
        work(shares[0])
    finally:
        for t in threads:
            t.join()
    first = min(errors, default=None)
    return (None if first is None else f"tensor {first} {errors[first]}"), touched[0]


def load(tensors_path: Path, targets: Optional[dict[int, Any]] = None) -> list[torch.Tensor]:
    """The member's tensors, each read once straight to where it lives and verified there.

    targets[i] (a live CPU tensor of the same dtype and shape) receives entry i and is returned
    as it; other entries are materialised on fresh memory. Nothing returned aliases the file: a
    slot rewritten later cannot change what was loaded. A bad tensor raises CheckpointError naming
    it — LiveStateChanged when bytes had already reached a live target (see the module docstring).
    """
    name = tensors_path.name
    entries = read_table(tensors_path.with_name(name[:-len(rundir.TENSORS_SUFFIX)] + rundir.TABLE_SUFFIX))
    try:
        fd = os.open(tensors_path, os.O_RDONLY)
    except OSError as e:
        raise CheckpointError(f"{name}: {e.strerror or e}") from e
    try:
        if os.fstat(fd).st_size < size_of(entries):
            raise CheckpointError(f"{name}: shorter than its table says ({size_of(entries)} bytes)")
        dests = _destinations(entries, targets or {})
        err, touched = _read_all(fd, dests)
    finally:
        os.close(fd)
    if err is not None:
        raise (LiveStateChanged if touched else CheckpointError)(f"{name}: {err}")
    with torch.no_grad():
        for d in dests:
            if d.staged is not None:  # verified: now it may reach its strided home
                d.result.copy_(d.staged)
    return [d.result for d in dests]


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
