"""MANIFEST.json, the commit record of one checkpoint, and the validation of a checkpoint dir."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Optional

import xxhash

from .clock import now_iso
from .errors import InvalidCheckpoint
from .layout import inside

__all__ = [
    "commit_age",
    "FORMAT_VERSION", "MANIFEST_NAME", "MODEL_FILE", "OPTIMIZER_FILE", "TRAINER_FILE", "CheckpointKind", "FileEntry", "Manifest", "CheckpointInfo",
    "new_hasher", "digest_file", "safe_member", "inspect_checkpoint", "verify_members",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
# The engine's members of a non-sharded checkpoint (a warm standby sizes its landing memory by the second).
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
TRAINER_FILE = "trainer.pt"


class CheckpointKind(str, enum.Enum):
    """Why a checkpoint was taken, with what each kind implies, stated once per kind.

    `pool`: step/preempt/emergency checkpoints rotate in one pool, epoch/final in another.
    `rank`: strength for index upgrades; a save at an existing step may raise, never lower, the kind.
    """

    pool: str
    rank: int

    def __new__(cls, value: str, pool: str, rank: int) -> "CheckpointKind":
        member = str.__new__(cls, value)
        member._value_ = value
        member.pool, member.rank = pool, rank
        return member

    STEP = ("step", "step", 1)
    EPOCH = ("epoch", "epoch", 2)
    FINAL = ("final", "epoch", 3)
    EMERGENCY = ("emergency", "step", 0)
    PREEMPT = ("preempt", "step", 1)


def new_hasher() -> "xxhash.xxh3_128":
    return xxhash.xxh3_128()


@dataclasses.dataclass(frozen=True)
class FileEntry:
    size: int
    xxh3_128: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """MANIFEST.json of one checkpoint (written last; its presence commits the checkpoint)."""

    global_step: int
    epoch: int
    batch_in_epoch: int
    kind: CheckpointKind
    loss: Optional[float]
    created_at: str
    files: dict[str, FileEntry]
    exact: bool = True
    torch_version: Optional[str] = None
    python_version: Optional[str] = None
    git_commit: Optional[str] = None
    git_dirty: Optional[bool] = None
    world_size: int = 1
    # Model and optimizer live in a torch.distributed.checkpoint (DCP) set inside the dir
    # (`.metadata` + `__<rank>_<n>.distcp`) instead of model.pt/optimizer.pt; reshardable.
    sharded: bool = False
    args_hash: Optional[str] = None   # trainer_shim._policies.provenance.args_hash of the writing process
    # The step `loss` was logged at, when not this checkpoint's own (a framework logs every N steps).
    loss_step: Optional[int] = None
    format: int = FORMAT_VERSION

    @classmethod
    def create(cls, files: dict[str, FileEntry], *, step: int, epoch: int, batch_in_epoch: int,
               kind: CheckpointKind, loss: Optional[float], meta: Optional[dict[str, Any]] = None,
               **fields: Any) -> "Manifest":
        """The manifest of a checkpoint committed now by this process: the versions of the running
        Python and (when loaded) torch, and the writer's provenance `meta` (git_commit, git_dirty,
        args_hash). torch is looked up, never imported: this module stays torch-free."""
        meta = meta or {}
        torch = sys.modules.get("torch")
        return cls(global_step=step, epoch=epoch, batch_in_epoch=batch_in_epoch, kind=kind, loss=loss,
                   created_at=now_iso(), files=files, torch_version=getattr(torch, "__version__", None),
                   python_version=sys.version.split()[0], git_commit=meta.get("git_commit"),
                   git_dirty=meta.get("git_dirty"), args_hash=meta.get("args_hash"), **fields)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["kind"] = self.kind.value
        return d

    def to_bytes(self) -> bytes:
        """MANIFEST.json's bytes: the one serialisation every writer commits."""
        return (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, d: Any) -> "Manifest":
        if not isinstance(d, dict):
            raise ValueError("manifest is not a JSON object")
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"unsupported manifest format {d.get('format')!r}")
        try:
            files = {rel: _file_entry(rel, ent) for rel, ent in d["files"].items()}
            for key in ("global_step", "epoch", "batch_in_epoch"):
                if not isinstance(d[key], int) or d[key] < 0:
                    raise ValueError(f"bad {key} {d[key]!r}")
            return cls(
                global_step=d["global_step"], epoch=d["epoch"], batch_in_epoch=d["batch_in_epoch"],
                kind=CheckpointKind(d["kind"]), loss=d.get("loss"), created_at=str(d.get("created_at", "")),
                files=files, exact=bool(d.get("exact", True)), torch_version=d.get("torch_version"),
                python_version=d.get("python_version"), git_commit=d.get("git_commit"),
                git_dirty=d.get("git_dirty"), world_size=int(d.get("world_size", 1)),
                sharded=bool(d.get("sharded", False)), args_hash=d.get("args_hash"),
                loss_step=d.get("loss_step") if isinstance(d.get("loss_step"), int) else None,
            )
        except KeyError as e:
            raise ValueError(f"manifest lacks {e.args[0]!r}") from e


def _file_entry(rel: str, ent: Any) -> FileEntry:
    if not isinstance(ent, dict) or not isinstance(ent.get("size"), int) or not isinstance(ent.get("xxh3_128"), str):
        raise ValueError(f"bad file entry for {rel!r}")
    return FileEntry(ent["size"], ent["xxh3_128"])


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint whose manifest parsed and whose files passed the chosen check."""

    path: Path
    manifest: Manifest

    @property
    def step(self) -> int:
        return self.manifest.global_step

    @property
    def name(self) -> str:
        return self.path.name


def safe_member(ckpt_dir: Path, rel: str) -> Path:
    """The path of a manifest-listed file, refusing anything that escapes the checkpoint dir."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or rel in ("", "."):
        raise InvalidCheckpoint(ckpt_dir, f"manifest lists unsafe path {rel!r}")
    full = ckpt_dir / p
    if full.is_symlink() or not inside(full.resolve(), ckpt_dir.resolve()):
        raise InvalidCheckpoint(ckpt_dir, f"{rel} points outside the checkpoint")
    return full


def read_pieces(f: BinaryIO, size: int) -> Iterator[memoryview]:
    """The rest of `f` in pieces of up to `size` bytes, read into one reused buffer (each piece is
    valid until the next is read)."""
    buf = bytearray(size)
    view = memoryview(buf)
    while True:
        n = f.readinto(buf)
        if not n:
            return
        yield view[:n]


def digest_file(path: Path, chunk: int = 8 << 20) -> str:
    h = new_hasher()
    with open(path, "rb", buffering=0) as f:
        # No larger than the file: a small member (a skeleton, a table) must not fault in 8 MiB of
        # fresh buffer (~2 ms each, on a restore's critical path).
        for piece in read_pieces(f, max(1, min(chunk, os.fstat(f.fileno()).st_size))):
            h.update(piece)
    return h.hexdigest()


def _read_manifest(path: Path) -> Manifest:
    try:
        raw = (path / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        raise InvalidCheckpoint(path, "no MANIFEST.json (incomplete or damaged)") from None
    except OSError as e:
        raise InvalidCheckpoint(path, f"cannot read MANIFEST.json: {e.strerror or e}") from e
    try:
        manifest = Manifest.from_json(json.loads(raw))
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidCheckpoint(path, f"MANIFEST.json is malformed: {e}") from e
    if not manifest.files:
        raise InvalidCheckpoint(path, "MANIFEST.json lists no files")
    return manifest


def _check_member(path: Path, rel: str, ent: FileEntry, *, digest: bool) -> None:
    fp = safe_member(path, rel)
    try:
        size = fp.stat().st_size
    except FileNotFoundError:
        raise InvalidCheckpoint(path, f"{rel} is missing") from None
    except OSError as e:
        raise InvalidCheckpoint(path, f"{rel}: {e.strerror or e}") from e
    if size != ent.size:
        raise InvalidCheckpoint(path, f"{rel} has {size} bytes, manifest says {ent.size} (truncated?)")
    if digest:
        try:
            got = digest_file(fp)
        except OSError as e:
            raise InvalidCheckpoint(path, f"{rel}: {e.strerror or e}") from e
        if got != ent.xxh3_128:
            raise InvalidCheckpoint(path, f"{rel} digest mismatch (corrupted)")


def inspect_checkpoint(path: Path, *, full: bool = False, root: Optional[Path] = None,
                       digest_only: Optional[Callable[[dict[str, FileEntry]], Iterable[str]]] = None,
                       ) -> CheckpointInfo:
    """Validate one checkpoint dir: manifest parses and every listed file has its size.

    With `full`, also recompute each file's xxh3_128 (only of the files `digest_only` picks from
    the manifest's entries, when given: ranks split the hashing of a multi-rank checkpoint). `root` (the
    checkpoints dir it was found in) refuses a dir that resolves outside it. Raises
    InvalidCheckpoint naming the reason.
    """
    path = Path(path)
    if root is not None and not inside(path.resolve(), Path(root).resolve()):
        raise InvalidCheckpoint(path, f"resolves outside {root}")
    manifest = _read_manifest(path)
    hashed = set(manifest.files if digest_only is None else digest_only(manifest.files))
    for rel, ent in manifest.files.items():
        _check_member(path, rel, ent, digest=full and rel in hashed)
    return CheckpointInfo(path, manifest)


def verify_members(info: CheckpointInfo, names: Iterable[str]) -> None:
    """Recompute the digests of `names` (those the manifest lists) of a checkpoint already
    inspected: InvalidCheckpoint naming the first that differs (a restore splits this work)."""
    for rel in names:
        ent = info.manifest.files.get(rel)
        if ent is not None:
            _check_member(info.path, rel, ent, digest=True)


def commit_age(path: Path) -> Optional[float]:
    """Seconds since the checkpoint at `path` was committed (its MANIFEST.json was written), or None."""
    try:
        return max(0.0, time.time() - (Path(path) / MANIFEST_NAME).stat().st_mtime)
    except OSError:
        return None
