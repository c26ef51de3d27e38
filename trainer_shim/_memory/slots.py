"""Write a checkpoint into a shared-memory slot with the training stall of a memory copy.

A slot (`/dev/shm/resilient-run-<hash>-<slot>/`, 0700, files 0600) holds the members of a
normal checkpoint. model.pt and optimizer.pt are split (trainer_shim._disk.raw_tensors):
`<member>.tensors` holds the state's tensor bytes, mapped MAP_SHARED once and then updated in
place with `copy_` (the preallocated buffers *are* the slot), `<member>.table` says where each
tensor is and its digest, and `<member>` is the small skeleton with TENSOR_REF markers, rewritten
each time (it holds lr, step counts ...). A structure change (new optimizer state, another shape)
recreates the tensor file once.

Order of a snapshot: unlink MANIFEST.json (the slot stops being complete), copy, then
`finalize()` hashes the tensors (table) and the members and writes MANIFEST.json last; a kill
in between leaves a slot nobody uses. `fill()` (one copy into the mapped buffers) is all training
waits for; `finalize()` runs on a background thread (async_save.FastSaver).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import mmap
import os
from pathlib import Path
from typing import Any, Optional

import torch

from .._disk import raw_tensors as raw
from .. import rundir
from ..errors import ShimError
from .._session.messages import describe, say
from ..rundir import FileEntry, Manifest
from .._disk import members
from .._restore import read
from .._state import capture

SPLIT = (rundir.MODEL_FILE, rundir.OPTIMIZER_FILE)


class SlotError(ShimError):
    """A slot cannot be created or is not ours (owner/mode); memory snapshots are off."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


class NoRoom(SlotError):
    """A slot file found no room (ENOSPC, ENOMEM, EDQUOT): its region's pages could not be reserved or
    a small member not written, although the fit check let the slots in (something else took the
    room meanwhile). The slots go off for the attempt (saver), never a retry at every snapshot."""

    ERRNOS = (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT)

    def __init__(self, path: Path, nbytes: int, error: str) -> None:
        super().__init__(path, f"no room for {nbytes} bytes: {error}")
        self.nbytes, self.error = nbytes, error


def region_bytes(files: dict[str, Any]) -> int:
    """What one slot's region files take for `files` (a checkpoint's members): whole pages, as a
    tmpfs allocates them. The small members (skeletons, RNG state) are the fit check's margin."""
    total = 0
    for name in SPLIT:
        if name in files:
            tensors: list = []
            split(files[name], tensors)
            entries = raw.plan(tensors)
            if entries is not None:
                total += -(-max(raw.size_of(entries), 1) // mmap.PAGESIZE) * mmap.PAGESIZE
    return total


def split(obj: Any, out: list) -> Any:
    """The skeleton of `obj` with every tensor moved to `out` and replaced by its marker."""
    def leaf(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            out.append(v)
            return f"{rundir.TENSOR_REF}{len(out) - 1}"
        return v
    return capture.map_leaves(obj, leaf)


def _layout(tensors: list) -> list:
    return [(t.dtype, tuple(t.shape), t.device.type) for t in tensors]


def _write_new(path: Path, obj: Any) -> None:
    """torch.save into a fresh owner-only file (replacing any old one); NoRoom when the tmpfs is full,
    with nothing left behind. Serialized in memory first (skeletons and trainer state are small):
    torch.save straight into a full tmpfs fails with an opaque RuntimeError and leaves its file."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    tmp = path.with_name(path.name + ".new")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=False) as f, buf.getbuffer() as data:
                f.write(data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if e.errno in NoRoom.ERRNOS:
            raise NoRoom(path, buf.getbuffer().nbytes, describe(e)) from e
        raise


class Staging:
    """Reusable private CPU buffers for the async paths: run.step() (or the Lightning callback's
    background save) pays one copy into them (the floor); the writer thread moves them into a slot
    (or torch.saves them). One set: one save in flight at a time."""

    def __init__(self) -> None:
        self.bufs: dict[str, list] = {}
        self.layouts: dict[str, list] = {}

    def put(self, name: str, tensors: list) -> None:
        lay = _layout(tensors)
        if self.layouts.get(name) != lay:
            self.bufs[name] = [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
            self.layouts[name] = lay
        with torch.no_grad():
            for dst, src in zip(self.bufs[name], tensors):
                dst.copy_(src)

    def copy_of(self, name: str, obj: Any) -> Any:
        """`obj` whole (any nesting of dicts, lists and tuples: a framework's checkpoint dict) with every
        tensor replaced by its copy in these buffers and every other leaf deep-copied, so the caller's
        state may change right after while a writer thread saves the copy. The copy is valid until the
        next `put`/`copy_of` of `name`."""
        tensors: list = []
        skeleton = copy.deepcopy(split(obj, tensors))  # only markers and small values: the tensors are split out
        self.put(name, tensors)
        return read.fill_refs(skeleton, self.bufs[name])


class Slot:
    """One slot directory and the mapped tensor lists of its split members."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.views: dict[str, list] = {}     # member -> tensors mapped MAP_SHARED from <member>.tensors
        self.layouts: dict[str, list] = {}
        self.regions: dict[str, tuple[mmap.mmap, list]] = {}  # member -> (its mapping, table entries)
        self.pending: list[str] = []         # split members whose tensors wait in the staging buffers
        self.late: list[tuple[str, list, list[int]]] = []  # (member, its tensors, indices the hasher copies)
        self.created = False                 # the last fill (re)created a tensor file: not a steady cost

    def prepare(self) -> Optional[str]:
        """Create the slot (0700) or check ours. A loose one of ours (wrong mode) is never trusted:
        it is emptied and recreated (the reason is returned); a foreign one raises SlotError."""
        why = rundir.untrusted_slot_reason(self.path) if os.path.lexists(self.path) else None
        if why is not None:
            if os.lstat(self.path).st_uid != os.geteuid():
                raise SlotError(self.path, why)
            rundir.remove_slot(self.path)
        if not os.path.lexists(self.path):
            try:
                os.mkdir(self.path, 0o700)
            except FileExistsError:
                pass
            except OSError as e:
                raise SlotError(self.path, f"cannot create: {e.strerror or e}") from e
        now = rundir.untrusted_slot_reason(self.path)
        if now is not None:
            raise SlotError(self.path, now)
        return why

    def invalidate(self) -> None:
        try:
            os.unlink(self.path / rundir.MANIFEST_NAME)
        except FileNotFoundError:
            pass

    def fill(self, files: dict[str, Any], staging: Optional[Staging] = None,
             protected: Optional[set[int]] = None) -> None:
        """Copy `files` (member -> state) into the slot, or its big tensors into `staging` (then
        flush() completes the slot); the caller's tensors may change right after either way.
        `protected`: storage addresses of tensors left for copy_late() (late_copy: the optimizer's,
        unchanged until its next step); the caller must not change those before copy_late() ends."""
        self.invalidate()
        self.pending = []
        self.late = []
        self.created = False
        present = set()
        for name, obj in files.items():
            present.add(name)
            tensors: list = []
            skel = split(obj, tensors) if name in SPLIT else obj
            if name not in SPLIT or raw.plan(tensors) is None:  # e.g. a sparse tensor: stored whole
                self._forget(name)
                _write_new(self.path / name, obj)
                continue
            present.update((name + rundir.TENSORS_SUFFIX, name + rundir.TABLE_SUFFIX))
            if staging is not None:
                staging.put(name, tensors)
                self.pending.append(name)
            elif protected is not None and self._in_place(name, tensors):
                self._store_early(name, tensors, protected)
            else:
                self._store(name, tensors)
            _write_new(self.path / name, skel)
        for ent in os.scandir(self.path):  # members of an older layout (e.g. an optimizer since dropped)
            if ent.name not in present:
                os.unlink(ent.path)
        for name in list(self.views):
            if name + rundir.TENSORS_SUFFIX not in present:
                self._forget(name)

    def _forget(self, name: str) -> None:
        self.views.pop(name, None)
        self.layouts.pop(name, None)
        self.regions.pop(name, None)

    def flush(self, staging: Staging) -> None:
        """Writer thread: move the staged tensors into the slot's mapped files."""
        for name in self.pending:
            self._store(name, staging.bufs[name])
        self.pending = []

    def _store(self, name: str, tensors: list) -> None:
        if self._in_place(name, tensors):
            with torch.no_grad():
                for dst, src in zip(self.views[name], tensors):
                    dst.copy_(src)
        else:
            self._remap(name, self.path / (name + rundir.TENSORS_SUFFIX), tensors)

    def _in_place(self, name: str, tensors: list) -> bool:
        return name in self.views and self.layouts.get(name) == _layout(tensors) and \
            (self.path / (name + rundir.TENSORS_SUFFIX)).exists()

    def _store_early(self, name: str, tensors: list, protected: set[int]) -> None:
        """Copy the tensors not in `protected` now; the rest wait for copy_late()."""
        late = []
        with torch.no_grad():
            for i, (dst, src) in enumerate(zip(self.views[name], tensors)):
                if src.data_ptr() in protected:
                    late.append(i)
                else:
                    dst.copy_(src)
        if late:
            self.late.append((name, tensors, late))

    def late_tensors(self) -> list:
        return [tensors[i] for _, tensors, idx in self.late for i in idx]

    def copy_late(self) -> None:
        """Hasher thread: copy the tensors fill() left (see late_copy)."""
        with torch.no_grad():
            for name, tensors, idx in self.late:
                views = self.views[name]
                for i in idx:
                    views[i].copy_(tensors[i])

    def _remap(self, name: str, tpath: Path, tensors: list) -> None:
        """Map the raw region shared (the one left here when it has the right size, else a new one),
        so later copies go in place."""
        self._forget(name)
        self.created = True
        entries = raw.plan(tensors)
        assert entries is not None  # fill() stores members that cannot be raw whole
        try:
            mm = raw.reuse(tpath, entries) or raw.create(tpath, entries)
        except OSError as e:
            if e.errno in NoRoom.ERRNOS:
                raise NoRoom(tpath, raw.size_of(entries), describe(e)) from e
            raise
        views = [raw.view(mm, e) for e in entries]
        with torch.no_grad():
            for dst, src in zip(views, tensors):
                dst.copy_(src)
        self.views[name], self.layouts[name], self.regions[name] = views, _layout(tensors), (mm, entries)

    def finalize(self, cap: capture.Capture, meta: dict[str, Any], world_size: int = 1) -> Manifest:
        """Hash the tensors (their table) and the members, write MANIFEST.json last: from now on
        the slot is a complete snapshot (of one rank's share when `world_size` > 1)."""
        return self.commit(cap, meta, world_size, self.hash_tensors())

    def hash_tensors(self) -> dict[str, str]:
        """Each split member's table written; tensor file name -> its whole digest."""
        known = {}
        for name, (mm, table) in self.regions.items():
            table, whole = raw.digests(mm, table)
            rundir.atomic_write_bytes(self.path / (name + rundir.TABLE_SUFFIX), raw.table_bytes(table), durable=False)
            known[name + rundir.TENSORS_SUFFIX] = whole
        return known

    def commit(self, cap: capture.Capture, meta: dict[str, Any], world_size: int, known: dict[str, str]) -> Manifest:
        """The other members hashed, MANIFEST.json written last."""
        entries = {}
        for ent in sorted(os.scandir(self.path), key=lambda e: e.name):
            if ent.name == rundir.MANIFEST_NAME or ent.name.endswith(".new"):
                continue
            dig = known.get(ent.name) or rundir.digest_file(Path(ent.path))
            entries[ent.name] = FileEntry(os.path.getsize(ent.path), dig)
        manifest = members.manifest_of(cap, entries, meta, world_size)
        rundir.atomic_write_bytes(self.path / rundir.MANIFEST_NAME, manifest.to_bytes(),
                                  durable=False)
        return manifest

    def close(self) -> None:
        self.views.clear()
        self.layouts.clear()
        self.regions.clear()


class Slots:
    """The two slots of one run dir (and rank): which is newest-complete, which the writer holds."""

    def __init__(self, rd: rundir.RunDir, rank: int = 0) -> None:
        self.rd = rd
        self.slots = [Slot(p) for p in rundir.snapshot_slot_paths(rd.root, rd.node, rank)]
        self.staging = Staging()
        self.newest: Optional[int] = None  # index of the newest complete slot this process wrote/restored
        self.complete: set[int] = set()    # slots this process knows complete (wrote or restored)

    def need(self, files: dict[str, Any]) -> int:
        """What this rank's slots take in all when they hold `files`."""
        return len(self.slots) * region_bytes(files)

    def held(self) -> int:
        """What this rank's slots hold now: a predecessor's regions, which its snapshots rewrite in place."""
        mine = {str(s.path) for s in self.slots}
        return sum(u.bytes for u in rundir.run_slots(self.rd.root, self.rd.node).slots if u.path in mine)

    def prepare(self) -> list[tuple[Path, str]]:
        """Every slot ready; (path, reason) of loose ones that were replaced."""
        out = []
        for s in self.slots:
            why = s.prepare()
            if why is not None:
                out.append((s.path, why))
        return out

    def target(self, busy: set[int]) -> Optional[int]:
        """The slot the next snapshot may overwrite: never a busy one (held by the writer, or being
        hashed), never the only complete one; the older slot first. None when no slot may be taken."""
        order = [0, 1] if self.newest is None else [1 - self.newest, self.newest]
        for i in order:
            if i not in busy and (not self.complete or self.complete - {i}):
                return i
        return None

    def filling(self, idx: int) -> None:
        """Slot idx is being rewritten: no longer complete."""
        self.complete.discard(idx)

    def done(self, idx: int) -> None:
        """Slot idx has its manifest: complete, and the newest (snapshots complete in step order)."""
        self.complete.add(idx)
        self.newest = idx

    def free(self) -> None:
        """This rank's slots (the supervisor frees every rank's when the run ends)."""
        for s in self.slots:
            s.close()
            rundir.remove_slot(s.path)

    def adopt(self, path: Path) -> None:
        """A slot this process restored from is the newest complete one (not overwritten first)."""
        for i, s in enumerate(self.slots):
            if s.path == path:
                self.done(i)


def own_slots(rd: rundir.RunDir, rank: int) -> None:
    """Record this process as its slots' owner (so a kill leaves them visible and reclaimable), and
    take back the memory of other runs' stale slots (the rule: trainer_shim.rundir.slot_memory)."""
    try:
        rundir.record_owner(rd.root, rd.node, rank)
        if rank == 0:
            for g, why in rundir.free_stale(keep=rundir.slot_prefix(rd.root, rd.node)):
                say(f"freed {g.bytes / 2**20:.0f} MiB of stale memory snapshots in {rundir.SHM_DIR} "
                    f"({g.run_dir or g.prefix + '*'}: {why})")
    except OSError as e:
        say(f"warning: cannot record the memory snapshot owner in {rundir.SHM_DIR}: {e.strerror or e}")


def disown_slots(rd: rundir.RunDir, rank: int) -> None:
    """The slots are freed: the owner record goes with them."""
    rundir.remove_slot(rundir.owner_path(rd.root, rd.node, rank))
