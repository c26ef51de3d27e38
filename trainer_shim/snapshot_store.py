"""Memory snapshot slots as seen without torch: find the complete ones, persist one to disk, free them.

Both sides use this: the supervisor persists the newest slot after an attempt dies (event
checkpoint_persisted_by_supervisor) and frees the slots when it stops; a trainer started without
a supervisor persists a slot it restored from in the background. Persisting is a byte copy of
the slot's members, hashed on the way and compared with the digests the slot's manifest already
holds, committed by the one commit protocol (manifest last, rename, fsync dir, `latest`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from . import rundir
from .rundir import CheckpointInfo, InvalidCheckpoint, Manifest
from .rundir.commit import copy_member, copy_verified

__all__ = ["complete_slots", "newest_complete", "merged_manifest", "persist", "add_to_index", "persist_newest",
           "remove", "free", "copy_member"]


def complete_slots(run_root: Path, node: Optional[int] = None,
                   on_reject: Optional[Callable[[Path, str], None]] = None, rank: int = 0) -> list[CheckpointInfo]:
    """Trusted slots of `rank` whose manifest is written and whose members have their sizes,
    newest step first.

    A slot being rewritten has no MANIFEST.json (it is unlinked before the first byte changes),
    so a half-written slot is never listed.
    """
    found = []
    for path in rundir.snapshot_slot_paths(run_root, node, rank):
        if not os.path.lexists(path):
            continue
        why = rundir.untrusted_slot_reason(path)
        if why is not None:
            if on_reject:
                on_reject(path, f"memory snapshot not trusted: {why}")
            continue
        if not (path / rundir.MANIFEST_NAME).exists():
            continue  # being written, or abandoned mid-write: never used
        try:
            found.append(rundir.inspect_checkpoint(path))
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
                    on_reject: Optional[Callable[[Path, str], None]] = None) -> Optional[list[CheckpointInfo]]:
    """The newest snapshot every rank holds complete: one slot per rank, in rank order (one slot
    for a single process). Rank R's slot holds only rank R's share of the checkpoint (the members
    it writes to disk) and a manifest listing those, with the job's world_size."""
    by_rank = {r: complete_slots(run_root, node, on_reject, r) for r in rundir.snapshot_slot_ranks(run_root, node)}
    for first in by_rank.get(0, []):
        picks = [first]
        for r in range(1, first.manifest.world_size):
            picks += [i for i in by_rank.get(r, []) if _same_save(i.manifest, first.manifest)][:1]
        if len(picks) == first.manifest.world_size:
            return picks
    return None


def merged_manifest(infos: list[CheckpointInfo]) -> Manifest:
    """One checkpoint's manifest from the manifests of its ranks' slots (their files are disjoint)."""
    files: dict[str, rundir.FileEntry] = {}
    for info in infos:
        clash = files.keys() & info.manifest.files.keys()
        if clash:
            raise InvalidCheckpoint(info.path, f"{sorted(clash)[0]} is in two ranks' snapshots")
        files.update(info.manifest.files)
    return dataclasses.replace(infos[0].manifest, files=files)


def persist(info: CheckpointInfo | list[CheckpointInfo], ckpt_root: Path,
            progress: Callable[[int], None] = lambda n: None) -> Optional[Path]:
    """Copy a complete slot (or every rank's slot of one save) into ckpt_root as step-N, hashing
    every byte against the slots' manifests (slots someone else wrote); None if step-N already
    exists there. (The trainer's own writer copies through saving.save_snapshot instead.)

    OSError (disk) and InvalidCheckpoint (the slot changed or lied) propagate; the tmp dir is
    removed on any failure and a committed dir is never overwritten.
    """
    infos = info if isinstance(info, list) else [info]
    manifest = merged_manifest(infos)
    name = rundir.checkpoint_name(manifest.global_step)
    final = Path(ckpt_root) / name
    if final.exists():
        return None
    tmp = rundir.commit.tmp_dir(ckpt_root, name)
    try:
        rundir.commit.fresh_tmp_dir(ckpt_root, name)
        written = 0
        for one in infos:
            for rel, ent in sorted(one.manifest.files.items()):
                src = rundir.safe_member(one.path, rel)
                written += copy_verified(src, tmp / rel, ent.xxh3_128, progress, written)
        raw = (infos[0].path / rundir.MANIFEST_NAME).read_bytes() if len(infos) == 1 else manifest.to_bytes()
        rundir.commit.commit_dir(tmp, final, raw, repoint=manifest.exact)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def add_to_index(rd: rundir.RunDir, path: Path, manifest: Manifest) -> None:
    """Record a checkpoint the trainer did not write itself (rotation is the next save's business)."""
    idx = rundir.read_index(rd)
    idx[path.name] = rundir.index_entry(manifest, is_best=False, directory=path)
    rundir.atomic_write_json(rd.index, idx)


def persist_newest(rd: rundir.RunDir, on_reject: Optional[Callable[[Path, str], None]] = None,
                   ) -> Optional[tuple[Path, Manifest]]:
    """Persist the newest snapshot every rank holds complete if it is newer than every valid disk checkpoint."""
    slots = newest_complete(rd.root, rd.node, on_reject)
    if not slots:
        return None
    disk = rundir.newest_valid(rundir.checkpoint_roots(rd))
    manifest = merged_manifest(slots)
    if disk is not None and disk.step >= manifest.global_step:
        return None
    final = persist(slots, rd.checkpoints)
    if final is None:
        return None
    try:
        add_to_index(rd, final, manifest)
    except OSError:
        pass  # the index is bookkeeping; the committed dir is what counts
    return final, manifest


def remove(path: Path) -> None:
    """Remove one slot (dir, or whatever else sits at its name) without following links."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def free(run_root: Path, node: Optional[int] = None) -> None:
    """Remove this run's slots, every rank's (only ones this user owns; a foreign one is not ours to touch)."""
    ranks = set(rundir.snapshot_slot_ranks(run_root, node)) | {0}
    for path in (p for r in sorted(ranks) for p in rundir.snapshot_slot_paths(run_root, node, r)):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid == os.geteuid():
            remove(path)
