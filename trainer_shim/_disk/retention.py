"""Retention upkeep: the checkpoint index, rotation by the policy in `rotation`, background deletion.

`rotation` decides *what* to keep (a pure policy over entries); this module applies it to the
checkpoint roots: it keeps the index in step with what was committed, renames doomed checkpoints
out of sight and deletes them (rundir.commit.discard) in the background, or at once when the
space is needed now or the process may end right after a save (the framework callbacks, whose
rotation this is too). Every failure here is reported and ignored: bookkeeping must never stop training.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..rundir import rotation
from .. import rundir
from ..rundir import CheckpointKind
from .._session.messages import say

__all__ = ["Retention", "free_bytes"]


def free_bytes(root: Path) -> Optional[int]:
    p = root
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


class Retention:
    """Index and rotation of one run's checkpoint roots (`search_dirs()`: the run dir's, then the fallback's)."""

    def __init__(self, rd: rundir.RunDir, search_dirs: Callable[[], list[Path]], *, keep_last: int,
                 keep_epochs: int, keep_best: int, background: bool = True) -> None:
        self.rd = rd
        self.background = background  # delete rotated checkpoints in a thread (else before returning)
        self.search_dirs = search_dirs
        self.keep_last, self.keep_epochs, self.keep_best = keep_last, keep_epochs, keep_best
        self.resumed_step: Optional[int] = None    # the checkpoint this process resumed from
        self.committed_step: Optional[int] = None  # newest checkpoint this process committed
        self.deleters: list[threading.Thread] = []  # background rmtree of rotated checkpoints

    def join(self) -> None:
        """Wait for background deletions (a finished run leaves no trash behind)."""
        for t in self.deleters:
            t.join()

    def write_index(self, idx: dict) -> None:
        try:
            rundir.write_index(self.rd, idx, self.keep_best)
        except (OSError, TypeError, ValueError) as e:
            # The index is bookkeeping: losing an update must never stop training.
            say(f"warning: cannot write {self.rd.index}: {e}")

    def add(self, path: Path, manifest: rundir.Manifest) -> None:
        idx = rundir.read_index(self.rd)
        idx[path.name] = rundir.index_entry(manifest, is_best=False, directory=path)
        self.write_index(idx)

    def upgrade_kind(self, path: Path, kind: CheckpointKind) -> None:
        idx = rundir.read_index(self.rd)
        ent = idx.get(path.name)
        if not isinstance(ent, dict):
            try:
                info = rundir.inspect_checkpoint(path)
            except rundir.InvalidCheckpoint:
                return
            ent = idx[path.name] = rundir.index_entry(info.manifest, is_best=False, directory=path)
        try:
            old = CheckpointKind(ent.get("kind", "step"))
        except ValueError:
            old = CheckpointKind.STEP
        if kind.rank > old.rank:
            ent["kind"] = kind.value
            self.write_index(idx)

    def rotate(self, placeholder: Optional[rotation.Entry] = None, protect: Iterable[str] = ()) -> None:
        """Delete what the retention policy drops, never a checkpoint named in `protect` (e.g. a
        framework's best one); a failure here is reported and ignored."""
        try:
            idx = rundir.read_index(self.rd)
            found: dict[str, tuple[Path, rotation.Entry]] = {}
            for step, path, _root in rundir.iter_checkpoint_dirs(self.search_dirs()):
                if path.name in found:
                    continue
                try:
                    info = rundir.inspect_checkpoint(path)
                except rundir.InvalidCheckpoint:
                    continue  # not ours to judge: a damaged dir stays for inspection
                kind = info.manifest.kind
                try:
                    kind = CheckpointKind(idx.get(path.name, {}).get("kind", kind.value))
                except ValueError:
                    pass
                found[path.name] = (path, rotation.Entry(path.name, step, kind, info.manifest.loss,
                                                         info.manifest.exact))
            entries = [e for _, e in found.values()]
            protected = set(protect)
            if placeholder is not None:
                entries.append(placeholder)
                protected.add(placeholder.name)
            for d in self.search_dirs():
                try:
                    protected.add(os.path.basename(os.readlink(d / rundir.LATEST)))
                except OSError:
                    pass
            if self.resumed_step is not None and (self.committed_step is None
                                                   or self.committed_step <= self.resumed_step):
                # By step: a framework's dirs are named checkpoint-N, the native ones step-N.
                protected |= {n for n, (_p, e) in found.items() if e.step == self.resumed_step}
            doomed = rotation.to_delete(entries, keep_last=self.keep_last, keep_epochs=self.keep_epochs,
                                        keep_best=self.keep_best, protected=protected)
            for name in doomed:
                if name not in found:
                    continue
                # Making room (placeholder): the space must be free now.
                t = rundir.commit.discard(found[name][0], background=self.background and placeholder is None)
                if t is not None:
                    self.deleters.append(t)
                idx.pop(name, None)
            if doomed:
                for n in [n for n, e in idx.items() if not Path(e.get("dir", "")).is_dir()]:
                    idx.pop(n)
                self.write_index(idx)
        except OSError as e:
            say(f"warning: checkpoint rotation failed: {e}")
