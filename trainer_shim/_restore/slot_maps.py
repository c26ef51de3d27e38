"""The slots' tensor regions mapped and populated by the warm standby while it waits.

A restore from a memory slot copies every byte of the slot's `.tensors` regions. Read with preadv,
/dev/shm hands them over one 4 KiB page at a time (a page lookup each): 384 MiB took 62-67 ms on
two threads here. Copied out of a mapping whose page tables already exist it took 50-57 ms, but
populating that mapping costs 30 ms of its own — nothing gained inside the restore. The warm
standby (landing.keep_ready) has nothing else to do while it waits, so it maps each slot's regions
read-only (MAP_SHARED: the very pages of /dev/shm, no memory of their own beyond page tables) with
MAP_POPULATE, and the restore copies from the mapping instead of calling preadv.

Why it stays correct:
- a slot is rewritten in place (same file, same pages): the mapping shows what the file holds;
- a slot file replaced (a new inode) or resized is a different key (device, inode, size): the
  restore only uses a mapping whose key is its open file's, else it reads with preadv as before;
- a slot file removed is unmapped at the standby's next poll (FRAMEWORKS_POLL_S), so its memory is
  not kept alive by the standby for longer than that; every mapping is dropped when the restore
  ends (landing.release: on a thread, within milliseconds), so a running trainer holds none.
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from .._disk import raw_tensors
from .. import rundir

_MAP_POPULATE: Optional[int] = getattr(mmap, "MAP_POPULATE", None)   # Linux (as are the slots)
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_DONTFORK = getattr(mmap, "MADV_DONTFORK", 10)
_PIECE = 16 << 20
_MEMBERS = (rundir.MODEL_FILE, rundir.OPTIMIZER_FILE)   # the split members (memory_snapshot)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


_LIBC = _libc()


@dataclasses.dataclass(frozen=True)
class _Map:
    key: tuple[int, int, int]   # st_dev, st_ino, st_size of the file mapped
    addr: int


_maps: dict[Path, _Map] = {}
_read_through = 0   # bytes this process's restore copied out of a mapping (said at resume)


def _key(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_dev, st.st_ino, st.st_size


def _map(path: Path) -> Optional[_Map]:
    opened = raw_tensors.open_own(path, os.O_RDONLY)
    if opened is None:
        return None
    fd, st = opened
    try:
        if st.st_size == 0:
            return None
        addr = _LIBC.mmap(None, st.st_size, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_POPULATE, fd, 0)
        if addr in (None, _MAP_FAILED):
            return None
        # Never inherited: a DataLoader worker forked while it is being unmapped would keep it.
        _LIBC.madvise(addr, st.st_size, _MADV_DONTFORK)
        return _Map(_key(st), addr)
    finally:
        os.close(fd)


def _unmap(m: _Map) -> None:
    """In 16 MiB pieces: one munmap of a whole slot region holds the address space's lock for as
    long as its page tables take to tear down (5-6 ms for 384 MiB), stalling the process's thread
    starts and mmaps meanwhile."""
    size = m.key[2]
    for off in range(0, size, _PIECE):
        _LIBC.munmap(m.addr + off, min(_PIECE, size - off))


def follow(slots: Sequence[Path]) -> int:
    """Hold a populated mapping of every split member region of `slots` (the standby, at each poll):
    new or replaced files mapped, removed ones unmapped. Bytes mapped now."""
    if _MAP_POPULATE is None:
        return 0
    want: dict[Path, tuple[int, int, int]] = {}
    for slot in slots:
        for member in _MEMBERS:
            path = slot / (member + rundir.TENSORS_SUFFIX)
            try:
                want[path] = _key(os.stat(path, follow_symlinks=False))
            except OSError:
                continue
    for path in [p for p, m in _maps.items() if want.get(p) != m.key]:
        _unmap(_maps.pop(path))
    for path in want.keys() - _maps.keys():
        m = _map(path)
        if m is not None and m.key == want[path]:
            _maps[path] = m
        elif m is not None:   # replaced between the stat and the open: the next poll maps it
            _unmap(m)
    return sum(m.key[2] for m in _maps.values())


def source(fd: int) -> Optional[int]:
    """The address of a held mapping of the file open at `fd` (same device, inode and size), or None."""
    try:
        key = _key(os.fstat(fd))
    except OSError:
        return None
    return next((m.addr for m in _maps.values() if m.key == key), None)


def count_read(n: int) -> None:
    global _read_through
    _read_through += n


def read_through() -> int:
    """Bytes this process's restore copied out of the standby's mappings."""
    return _read_through


def release() -> None:
    """Unmap everything: the restore is over (so a running trainer holds no mapping that would keep
    a removed slot's memory alive). On a thread: the 5-6 ms per slot need not be init()'s."""
    maps = list(_maps.values())
    _maps.clear()
    if maps:
        threading.Thread(target=lambda: [_unmap(m) for m in maps], name="trainer_shim-unmap", daemon=True).start()
