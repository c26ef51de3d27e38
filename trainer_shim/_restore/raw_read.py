"""Reading split checkpoint members back (the raw tensor layout of raw_tensors): each tensor's
bytes read once (preadv; or copied out of the warm standby's populated mapping of the slot while
that is still the same file: slot_maps) straight to where they belong — into the live
tensor it replaces when that is contiguous with the same dtype and shape, else into one fresh
anonymous region per member (a fresh restart's optimizer state) — and hashed there in cache-sized
chunks.

Every member of a restore is read in ONE pass: `prepare` each (its table, its destinations), then
`read` them together. The tensors are handed out biggest first to the reader threads as each one
finishes its last, so no thread idles while another has a queue, and the caller's own Python work
(`meanwhile`: unpickling the small members) runs on the calling thread while the others read.

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

import ctypes
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import torch
import xxhash

from . import landing, slot_maps
from .. import rundir
from ..errors import CheckpointError, LiveStateChanged
from .._disk.raw_tensors import ALIGN, Entry, read_table, size_of

# Read, then hashed while still in cache: 1 MiB stays in this box's L2 beside the reader's other
# data (4 MiB pieces did not, and the hash went back to RAM: 66-74 ms vs 60-68 ms for 384 MiB).
_READ_CHUNK = 1 << 20
_THREADS = 2  # readers; the box (and most trainers' spare) has few cores
_MIN_THREAD_BYTES = 8 << 20  # below this per thread, starting one costs more than it saves


def _fits(t: Any, e: Entry) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype == e.dtype and tuple(t.shape) == e.shape
            and t.device.type == "cpu" and t.layout == torch.strided and not t.requires_grad)


def _bytes_of(t: torch.Tensor) -> memoryview:
    """A writable view of a contiguous CPU tensor's bytes (valid while t lives)."""
    n = t.numel() * t.element_size()
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B") if n else memoryview(b"")


class _Dest:
    """Where entry i's bytes are read to (`buf`, at address `addr`), and what becomes of them once verified."""

    def __init__(self, e: Entry, over: torch.Tensor, result: torch.Tensor, live: bool,
                 staged: Optional[torch.Tensor] = None) -> None:
        # over: the contiguous tensor whose bytes are read into; staged: the one copied into
        # `result` after verification
        self.e, self.buf, self.addr = e, _bytes_of(over), over.data_ptr()
        self.result, self.live, self.staged = result, live, staged


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
            out.append(_Dest(e, t, t, live=True))
            continue
        tmp = _carve(mm, offs[i], e) if i in offs else torch.empty(e.shape, dtype=e.dtype)  # type: ignore[arg-type]
        if _fits(t, e):
            out.append(_Dest(e, tmp, t, live=False, staged=tmp))
        elif _same_order(tmp, e):
            out.append(_Dest(e, tmp, tmp.as_strided(e.shape, e.stride), live=False))
        else:  # e.g. channels_last optimizer state: materialised with the stride it was saved with
            out.append(_Dest(e, tmp, torch.empty_strided(e.shape, e.stride, dtype=e.dtype), False, tmp))
    return out


class Member:
    """One split member ready to be read: its open region file (and the warm standby's populated
    mapping of it when one is held: slot_maps) and where each tensor goes."""

    def __init__(self, name: str, fd: int, dests: list[_Dest]) -> None:
        self.name, self.fd, self.dests = name, fd, dests
        self.src = slot_maps.source(fd)
        self.bad: dict[int, str] = {}       # tensor index -> why it failed
        self.touched = False                # live bytes were written

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def prepare(tensors_path: Path, targets: Optional[dict[int, Any]] = None) -> Member:
    """Open a member's region and plan its destinations (see `load` for `targets`)."""
    name = tensors_path.name
    entries = read_table(tensors_path.with_name(name[:-len(rundir.TENSORS_SUFFIX)] + rundir.TABLE_SUFFIX))
    try:
        fd = os.open(tensors_path, os.O_RDONLY)
    except OSError as e:
        raise CheckpointError(f"{name}: {e.strerror or e}") from e
    try:
        if os.fstat(fd).st_size < size_of(entries):
            raise CheckpointError(f"{name}: shorter than its table says ({size_of(entries)} bytes)")
        return Member(name, fd, _destinations(entries, targets or {}))
    except BaseException:
        os.close(fd)
        raise


def _read_verify(m: Member, d: _Dest, stop: threading.Event) -> Optional[str]:
    """Read entry d's bytes into d.buf in chunks (copied out of the standby's mapping when there is
    one: ctypes.memmove releases the GIL, as preadv does), hashing each chunk while it is in cache;
    the error text or None. `stop`: another worker found a bad tensor, no need to go on."""
    h, e = xxhash.xxh3_64(), d.e
    for start in range(0, e.nbytes, _READ_CHUNK):
        if stop.is_set():
            return None
        piece = d.buf[start:min(start + _READ_CHUNK, e.nbytes)]
        if m.src is not None:   # prepare() checked the file (so the mapping) holds the whole table
            ctypes.memmove(d.addr + start, m.src + e.offset + start, len(piece))
        got = len(piece) if m.src is not None else 0
        while got < len(piece):
            n = os.preadv(m.fd, [piece[got:]], e.offset + start + got)
            if n <= 0:
                return "shorter than its table says"
            got += n
        h.update(piece)
    return None if h.hexdigest() == e.digest else "digest mismatch (changed or corrupt)"


def _readers(total: int) -> int:
    return max(1, min(_THREADS, os.cpu_count() or 1, total // _MIN_THREAD_BYTES))


def _read_all(members: Sequence[Member], meanwhile: Callable[[], Any]) -> Any:
    """Every member's tensors read and verified on the reader threads, biggest first, each taken by
    the first free reader; the calling thread runs `meanwhile` first, then reads too. Its result."""
    jobs = sorted(((m, i) for m in members for i, d in enumerate(m.dests) if d.e.nbytes),
                  key=lambda j: -j[0].dests[j[1]].e.nbytes)
    todo, lock, stop = iter(jobs), threading.Lock(), threading.Event()

    def work() -> None:
        while not stop.is_set():
            with lock:
                m, i = next(todo, (None, 0))
            if m is None:
                return
            d = m.dests[i]
            m.touched |= d.live
            try:
                why = _read_verify(m, d, stop)
            except Exception as e:  # noqa: BLE001 - a reader never ends without a verdict: an unread
                why = f"unreadable: {type(e).__name__}: {e}"  # tensor would otherwise pass as read
            if why:
                m.bad[i] = why
                stop.set()

    threads = [threading.Thread(target=work, name="trainer_shim-read", daemon=True)
               for _ in range(_readers(sum(m.dests[i].e.nbytes for m, i in jobs)) - 1)]
    for t in threads:
        t.start()
    try:
        out = meanwhile()
        work()
    except BaseException:
        stop.set()
        raise
    finally:
        for t in threads:
            t.join()
    return out


def read(members: Sequence[Member], meanwhile: Callable[[], Any] = lambda: None) -> tuple[list[list[torch.Tensor]], Any]:
    """Read `members` (from `prepare`) in one pass; (each member's tensors, `meanwhile()`'s result).
    The members' files are closed either way. The first member with a bad tensor raises
    CheckpointError naming it — LiveStateChanged when any member's live bytes had changed."""
    try:
        out = _read_all(members, meanwhile)
    finally:
        for m in members:
            m.close()
    bad = next((m for m in members if m.bad), None)
    if bad is not None:
        i = min(bad.bad)
        touched = any(m.touched for m in members)
        raise (LiveStateChanged if touched else CheckpointError)(f"{bad.name}: tensor {i} {bad.bad[i]}")
    slot_maps.count_read(sum(d.e.nbytes for m in members if m.src is not None for d in m.dests))
    with torch.no_grad():
        for m in members:
            for d in m.dests:
                if d.staged is not None:  # verified: now it may reach its strided home
                    d.result.copy_(d.staged)
    return [[d.result for d in m.dests] for m in members], out


def load(tensors_path: Path, targets: Optional[dict[int, Any]] = None) -> list[torch.Tensor]:
    """One member's tensors, each read once straight to where it lives and verified there.

    targets[i] (a live CPU tensor of the same dtype and shape) receives entry i and is returned
    as it; other entries are materialised on fresh memory. Nothing returned aliases the file: a
    slot rewritten later cannot change what was loaded. A bad tensor raises CheckpointError naming
    it — LiveStateChanged when bytes had already reached a live target (see the module docstring).
    """
    return read([prepare(tensors_path, targets)])[0][0]
