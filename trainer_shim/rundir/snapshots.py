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

Torch-free, so both sides use them: finding the complete slots (`newest_complete`), persisting one
to disk (`persist_slot`, `persist_newest`: a byte copy hashed against the slot's own manifest, committed
by the one commit protocol) and freeing them (`free_slots`). The supervisor persists the newest slot after
an attempt dies and frees the slots when it stops; a trainer started without a supervisor persists
a slot it restored from.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Optional

import xxhash

from .commit import Draft, copy_verified
from .env import DEFAULT_SHM_DIR, ENV_SHM_DIR, shm_dir
from .errors import EnvError, InvalidCheckpoint
from .index import add_to_index, checkpoint_roots
from .layout import RunDir, checkpoint_name
from .manifest import MANIFEST_NAME, CheckpointInfo, FileEntry, Manifest, inspect_checkpoint, safe_member
from .mount_table import fs_type
from .selection import newest_valid

# Read once at import: the supervisor and its trainers inherit the same environment.
SHM_DIR = shm_dir(os.environ)
_MEMORY_FS = frozenset({"tmpfs", "ramfs"})   # what keeps a slot in RAM (hugetlbfs cannot be written)
SNAPSHOT_PREFIX = "resilient-run-"
SNAPSHOT_SLOTS = 2                 # at most two snapshot slots per run dir (node)
TENSORS_SUFFIX = ".tensors"        # the member holding the raw tensor bytes of `<member>`
TABLE_SUFFIX = ".table"            # the member describing them (trainer_shim._disk.raw_tensors)
TENSOR_REF = "\x00rr-tensor:"      # skeleton leaf standing for tensors[i] (NUL: never user text)
OWNER_NAME = "owner.json"          # `<prefix>[r<R>-]owner.json`: the rank process holding those slots (slot_memory)


def check_shm_dir(environ: Mapping[str, str]) -> None:
    """EnvError (one line, names the fix) when RESILIENT_SHM_DIR names no writable directory in RAM:
    a slot on a disk filesystem would be written back to the disk every step. Unset: /dev/shm, unchecked."""
    path = shm_dir(environ)
    if path == Path(DEFAULT_SHM_DIR):
        return
    value = str(path)
    fix = ("a writable directory on a tmpfs (e.g. mount -t tmpfs -o huge=within_size tmpfs DIR), "
           "or unset it for /dev/shm")
    if not path.is_absolute() or not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise EnvError(ENV_SHM_DIR, value, fix)
    fs = fs_type(path)
    if fs is not None and fs not in _MEMORY_FS:
        raise EnvError(ENV_SHM_DIR, value, f"{fix} (it is on {fs}, so every memory snapshot would go to the disk)")


def slot_prefix(run_root: Path, node: Optional[int]) -> str:
    """`resilient-run-<16 hex>-`: every name of this run dir's (node's) slots starts with it."""
    key = f"{os.path.realpath(run_root)}\0{'' if node is None else node}"
    return f"{SNAPSHOT_PREFIX}{xxhash.xxh3_64_hexdigest(key.encode())}-"


def snapshot_slot_paths(run_root: Path, node: Optional[int] = None, rank: int = 0) -> list[Path]:
    """`/dev/shm/resilient-run-<16 hex>-<i>` (rank 0 or a single process) and
    `/dev/shm/resilient-run-<16 hex>-r<R>-<i>` (rank R > 0 of a multi-rank job): names per run dir
    (and node) and rank, stable across processes. Each rank's slots hold its own share of the
    checkpoint (the members that rank writes to disk), with a manifest listing just those."""
    tag = f"r{rank}-" if rank else ""
    return [SHM_DIR / f"{slot_prefix(run_root, node)}{tag}{i}" for i in range(SNAPSHOT_SLOTS)]


def snapshot_slot_ranks(run_root: Path, node: Optional[int] = None) -> list[int]:
    """The ranks that have any slot of this run dir (and node) in SHM_DIR, ascending."""
    prefix = slot_prefix(run_root, node)
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


Reject = Callable[[Path, str], None]


def complete_slots(run_root: Path, node: Optional[int] = None, on_reject: Optional[Reject] = None,
                   rank: int = 0) -> list[CheckpointInfo]:
    """Trusted slots of `rank` whose manifest is written and whose members have their sizes,
    newest step first.

    A slot being rewritten has no MANIFEST.json (it is unlinked before the first byte changes),
    so a half-written slot is never listed.
    """
    found = []
    for path in snapshot_slot_paths(run_root, node, rank):
        if not os.path.lexists(path):
            continue
        why = untrusted_slot_reason(path)
        if why is not None:
            if on_reject:
                on_reject(path, f"memory snapshot not trusted: {why}")
            continue
        if not (path / MANIFEST_NAME).exists():
            continue  # being written, or abandoned mid-write: never used
        try:
            found.append(inspect_checkpoint(path))
        except InvalidCheckpoint as e:
            if on_reject:
                on_reject(path, f"memory snapshot: {e.reason}")
    found.sort(key=lambda i: i.step, reverse=True)
    return found


def _same_save(a: Manifest, b: Manifest) -> bool:
    """Two ranks' slot manifests belong to one save (the same step of the same world)."""
    return ((a.global_step, a.epoch, a.batch_in_epoch, a.kind, a.exact, a.world_size)
            == (b.global_step, b.epoch, b.batch_in_epoch, b.kind, b.exact, b.world_size))


def newest_complete(run_root: Path, node: Optional[int] = None,
                    on_reject: Optional[Reject] = None) -> Optional[list[CheckpointInfo]]:
    """The newest snapshot every rank holds complete: one slot per rank, in rank order (one slot
    for a single process). Rank R's slot holds only rank R's share of the checkpoint (the members
    it writes to disk) and a manifest listing those, with the job's world_size."""
    by_rank = {r: complete_slots(run_root, node, on_reject, r) for r in snapshot_slot_ranks(run_root, node)}
    for first in by_rank.get(0, []):
        picks = [first]
        for r in range(1, first.manifest.world_size):
            picks += [i for i in by_rank.get(r, []) if _same_save(i.manifest, first.manifest)][:1]
        if len(picks) == first.manifest.world_size:
            return picks
    return None


def merged_manifest(infos: list[CheckpointInfo]) -> Manifest:
    """One checkpoint's manifest from the manifests of its ranks' slots (their files are disjoint)."""
    files: dict[str, FileEntry] = {}
    for info in infos:
        clash = files.keys() & info.manifest.files.keys()
        if clash:
            raise InvalidCheckpoint(info.path, f"{sorted(clash)[0]} is in two ranks' snapshots")
        files.update(info.manifest.files)
    return dataclasses.replace(infos[0].manifest, files=files)


def persist_slot(info: CheckpointInfo | list[CheckpointInfo], ckpt_root: Path,
            progress: Callable[[int], None] = lambda n: None) -> Optional[Path]:
    """Copy a complete slot (or every rank's slot of one save) into ckpt_root as step-N, hashing
    every byte against the slots' manifests (slots someone else wrote); None if step-N already
    exists there. (The trainer's own writer copies through its saving path instead.)

    OSError (disk) and InvalidCheckpoint (the slot changed or lied) propagate; the tmp dir is
    removed on any failure and a committed dir is never overwritten.
    """
    infos = info if isinstance(info, list) else [info]
    manifest = merged_manifest(infos)
    name = checkpoint_name(manifest.global_step)
    final = Path(ckpt_root) / name
    if final.exists():
        return None
    with Draft.open(ckpt_root, name) as draft:
        written = 0
        for one in infos:
            for rel, ent in sorted(one.manifest.files.items()):
                written += copy_verified(safe_member(one.path, rel), draft.path / rel, ent.xxh3_128, progress, written)
        # One slot: its own manifest bytes, unchanged; several: the merged manifest.
        raw = (infos[0].path / MANIFEST_NAME).read_bytes() if len(infos) == 1 else manifest.to_bytes()
        draft.commit(raw, repoint=manifest.exact)
    return final


def persist_newest(rd: RunDir, on_reject: Optional[Reject] = None) -> Optional[tuple[Path, Manifest]]:
    """Persist the newest snapshot every rank holds complete if it is newer than every valid disk checkpoint."""
    slots = newest_complete(rd.root, rd.node, on_reject)
    if not slots:
        return None
    disk = newest_valid(checkpoint_roots(rd))
    manifest = merged_manifest(slots)
    if disk is not None and disk.step >= manifest.global_step:
        return None
    final = persist_slot(slots, rd.checkpoints)
    if final is None:
        return None
    try:
        add_to_index(rd, final, manifest)
    except OSError:
        pass  # the index is bookkeeping; the committed dir is what counts
    return final, manifest


def remove_slot(path: Path) -> None:
    """Remove one slot (dir, or whatever else sits at its name) without following links."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def free_slots(run_root: Path, node: Optional[int] = None) -> None:
    """Remove this run's slots, every rank's (only ones this user owns; a foreign one is not ours to touch)."""
    ranks = set(snapshot_slot_ranks(run_root, node)) | {0}
    owners = [SHM_DIR / f"{slot_prefix(run_root, node)}{f'r{r}-' if r else ''}{OWNER_NAME}" for r in sorted(ranks)]
    for path in [p for r in sorted(ranks) for p in snapshot_slot_paths(run_root, node, r)] + owners:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid == os.geteuid():
            remove_slot(path)
