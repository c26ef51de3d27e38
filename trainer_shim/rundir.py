"""The run-directory contract shared by the supervisor and the trainer shim.

Everything the two sides exchange lives here: paths and file names, environment variables,
the JSON shapes of heartbeats, manifests, the checkpoint index and events, atomic writes, and
the "newest valid checkpoint" logic. This module must never import torch: the supervisor
imports it on machines without torch.

Run-dir layout::

    RUN_DIR/
      supervisor.json            supervisor state (supervisor writes)
      supervisor.lock            flock held by the live supervisor
      events.jsonl               one JSON object per line (both sides append)
      checkpoint_metadata.json   index of committed checkpoints (shim writes)
      metrics.prom               Prometheus textfile (supervisor writes)
      heartbeats/rank-<R>.json   liveness, one per rank (shim writes)
      checkpoints/step-XXXXXXXX/ committed checkpoints, MANIFEST.json written last
      checkpoints/.tmp-*         in-flight or abandoned writes, never chosen
      checkpoints/latest         symlink to the newest committed checkpoint
      logs/attempt-NNNN.log      child output per attempt (supervisor writes)
      logs/stacks-<pid>.txt      faulthandler dumps on SIGUSR1 (shim writes)
      errors/attempt-N.json      uncaught exception of attempt N (shim writes; rank 0)
      errors/attempt-N-rank-R.json  the same for rank R > 0 of a distributed attempt
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import errno
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

import xxhash

__all__ = [
    "ENV_RUN_DIR", "ENV_ATTEMPT", "ENV_RESUME_FROM", "ENV_LAST_FAILURE", "ENV_ALLOW_RESHARD", "ENV_NODE", "RESUME_NONE",
    "EXIT_PREEMPTED", "FORMAT_VERSION", "MANIFEST_NAME", "RunDir", "Phase", "CheckpointKind",
    "Manifest", "CheckpointInfo", "InvalidCheckpoint", "ContractError", "atomic_write_bytes",
    "atomic_write_json", "read_json", "append_event", "read_events", "new_hasher",
    "checkpoint_name", "parse_checkpoint_name", "inspect_checkpoint", "iter_checkpoint_dirs",
    "newest_valid", "now_iso", "read_heartbeat", "next_attempt_number", "ensure_run_dir",
]

# --- environment -------------------------------------------------------------------------------

ENV_RUN_DIR = "RESILIENT_RUN_DIR"
ENV_ATTEMPT = "RESILIENT_ATTEMPT"          # 1-based attempt number
ENV_RESUME_FROM = "RESILIENT_RESUME_FROM"  # checkpoint dir chosen by the supervisor, or RESUME_NONE
ENV_LAST_FAILURE = "RESILIENT_LAST_FAILURE"  # kind of the previous attempt's failure, if any
# "1": a sharded (DCP) checkpoint may be resumed at another world size (model and optimizer
# reshard exactly; data order and per-rank RNG cannot continue the old world bitwise).
ENV_ALLOW_RESHARD = "RESILIENT_ALLOW_RESHARD"
# Node rank of the supervisor that launched this process; set only for a multi-node job, whose
# supervisors share the run dir and keep their own files in nodes/node-<N>/.
ENV_NODE = "RESILIENT_NODE"
RESUME_NONE = "none"                       # the supervisor found nothing valid: start fresh

# The shim exits with this after saving a preempt checkpoint (EX_TEMPFAIL: "try again later").
EXIT_PREEMPTED = 75

# --- names -------------------------------------------------------------------------------------

FORMAT_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
CHECKPOINTS = "checkpoints"
NODES = "nodes"
_NODE_RE = re.compile(r"^node-(\d+)$")
LATEST = "latest"
TMP_PREFIX = ".tmp-"
CKPT_PREFIX = "step-"
_CKPT_RE = re.compile(r"^step-(\d{8,})$")
RUN_DIR_MODE = 0o700


class Phase(str, enum.Enum):
    """Heartbeat phase: starting -> training <-> saving -> stopping | finished."""

    STARTING = "starting"
    TRAINING = "training"
    SAVING = "saving"
    STOPPING = "stopping"
    FINISHED = "finished"


class CheckpointKind(str, enum.Enum):
    """Why a checkpoint was taken; step/preempt/emergency share one rotation pool, epoch/final another."""

    STEP = "step"
    EPOCH = "epoch"
    FINAL = "final"
    EMERGENCY = "emergency"
    PREEMPT = "preempt"

    @property
    def pool(self) -> str:
        return "epoch" if self in (CheckpointKind.EPOCH, CheckpointKind.FINAL) else "step"

    @property
    def rank(self) -> int:
        """Strength for index upgrades: a save at an existing step may raise, never lower, the kind."""
        return {"emergency": 0, "step": 1, "preempt": 1, "epoch": 2, "final": 3}[self.value]


class ContractError(Exception):
    """A run-dir file is missing, unreadable or not of the documented shape."""


class InvalidCheckpoint(ContractError):
    """A checkpoint directory failed validation; `reason` says why in one line."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


def checkpoint_name(step: int) -> str:
    return f"{CKPT_PREFIX}{step:08d}"


def parse_checkpoint_name(name: str) -> Optional[int]:
    m = _CKPT_RE.match(name)
    return int(m.group(1)) if m else None


@dataclasses.dataclass(frozen=True)
class RunDir:
    """Every path inside one run directory.

    Checkpoints, their index and heartbeats (named by global rank) are shared by every node of
    a job. What belongs to one supervisor (its lock, state, events, attempt logs, error files,
    metrics) lives in the run dir itself, or in nodes/node-<N>/ when `node` is set: the
    supervisors of a multi-node job share one run dir and count their attempts separately.
    """

    root: Path
    node: Optional[int] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def own(self) -> Path:
        """The directory of this supervisor's own files."""
        return self.root if self.node is None else self.root / NODES / f"node-{self.node}"

    def for_node(self, node: Optional[int]) -> "RunDir":
        return RunDir(self.root, node)

    def node_numbers(self) -> list[int]:
        """The nodes that have written to a multi-node run dir, in order (empty for a single node)."""
        try:
            names = os.listdir(self.root / NODES)
        except OSError:
            return []
        return sorted(int(m.group(1)) for m in map(_NODE_RE.match, names) if m)

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def latest(self) -> Path:
        return self.checkpoints / LATEST

    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeats"

    @property
    def logs(self) -> Path:
        return self.own / "logs"

    @property
    def errors(self) -> Path:
        return self.own / "errors"

    @property
    def events(self) -> Path:
        return self.own / "events.jsonl"

    @property
    def supervisor_state(self) -> Path:
        return self.own / "supervisor.json"

    @property
    def lock(self) -> Path:
        return self.own / "supervisor.lock"

    @property
    def index(self) -> Path:
        return self.root / "checkpoint_metadata.json"

    @property
    def metrics(self) -> Path:
        return self.own / "metrics.prom"

    def heartbeat(self, rank: int = 0) -> Path:
        return self.heartbeats / f"rank-{rank}.json"

    def owns_heartbeat(self, hb: dict) -> bool:
        """Whether this (node's) supervisor judges the rank that wrote `hb`: on a single node, every rank."""
        return self.node is None or hb.get("node") == self.node

    def attempt_log(self, attempt: int) -> Path:
        return self.logs / f"attempt-{attempt:04d}.log"

    def error_file(self, attempt: int, rank: int = 0) -> Path:
        """Rank 0 (and a single process) writes attempt-N.json; rank R > 0 attempt-N-rank-R.json."""
        return self.errors / (f"attempt-{attempt}.json" if rank == 0 else f"attempt-{attempt}-rank-{rank}.json")

    def rank_error_files(self, attempt: int) -> list[tuple[int, Path]]:
        """(rank, path) of every error file of attempt N, rank 0 first, then by rank."""
        out = [(0, self.error_file(attempt))] if self.error_file(attempt).exists() else []
        prefix = f"attempt-{attempt}-rank-"
        try:
            names = os.listdir(self.errors)
        except OSError:
            names = []
        for n in names:
            if n.startswith(prefix) and n.endswith(".json") and n[len(prefix):-5].isdigit():
                out.append((int(n[len(prefix):-5]), self.errors / n))
        return sorted(out)

    def stacks_file(self, pid: int) -> Path:
        return self.logs / f"stacks-{pid}.txt"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / checkpoint_name(step)

    def tmp_checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"{TMP_PREFIX}{checkpoint_name(step)}"

    def is_run_dir(self) -> bool:
        """True when the path looks like a run dir that either side has written to."""
        return self.root.is_dir() and any(
            p.exists() for p in (self.supervisor_state, self.events, self.heartbeats, self.checkpoints, self.index,
                                 self.root / NODES)
        )


def ensure_run_dir(root: Path | str, node: Optional[int] = None) -> RunDir:
    """Create the run dir (owner-only) and its subdirs; raise ContractError with a one-line reason."""
    rd = RunDir(Path(root), node)
    if rd.root.exists() and not rd.root.is_dir():
        raise ContractError(f"run dir {rd.root} exists and is not a directory")
    try:
        rd.root.mkdir(mode=RUN_DIR_MODE, parents=True, exist_ok=True)
        own = [] if node is None else [rd.root / NODES, rd.own]
        for sub in (rd.checkpoints, rd.heartbeats, *own, rd.logs, rd.errors):
            sub.mkdir(mode=RUN_DIR_MODE, exist_ok=True)
    except OSError as e:
        raise ContractError(f"cannot create run dir {rd.root}: {e.strerror or e}") from e
    if not os.access(rd.root, os.W_OK | os.X_OK):
        raise ContractError(f"run dir {rd.root} is not writable")
    return rd


# --- time --------------------------------------------------------------------------------------


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


# --- atomic files ------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write via a temp file in the same dir and rename, so readers never see a torn file.

    `durable` fsyncs the file and its directory; heartbeats skip it (they are rewritten every
    second and a lost one after a power cut is harmless).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode(), durable=durable)


def read_json(path: Path) -> Any:
    """Parse a JSON file; ContractError (one line) if missing, unreadable or malformed."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError as e:
        raise ContractError(f"{path}: missing") from e
    except OSError as e:
        raise ContractError(f"{path}: {e.strerror or e}") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise ContractError(f"{path}: not valid JSON ({e})") from e


def read_heartbeat(path: Path) -> Optional[dict]:
    """The heartbeat as a dict, or None when absent or torn (a reader never fails on it)."""
    try:
        hb = read_json(path)
    except ContractError:
        return None
    return hb if isinstance(hb, dict) else None


# --- events ------------------------------------------------------------------------------------


def append_event(run_dir: RunDir, event: str, attempt: Optional[int], **fields: Any) -> dict:
    """Append one event line; O_APPEND with a single write keeps concurrent writers' lines whole."""
    rec = {"time": now_iso(), "event": event, "attempt": attempt, **fields}
    line = (json.dumps(rec, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(run_dir.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return rec


def read_events(run_dir: RunDir) -> list[dict]:
    """All parseable events; a torn last line (writer killed mid-write) is skipped."""
    try:
        raw = run_dir.events.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ContractError(f"{run_dir.events}: {e.strerror or e}") from e
    out = []
    for line in raw.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def next_attempt_number(events: Iterable[dict]) -> int:
    """Attempt numbers continue across supervisor restarts on the same run dir."""
    last = 0
    for ev in events:
        a = ev.get("attempt")
        if isinstance(a, int) and ev.get("event") == "attempt_started":
            last = max(last, a)
    return last + 1


# --- manifests and validation ------------------------------------------------------------------


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
    format: int = FORMAT_VERSION

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["kind"] = self.kind.value
        return d

    @classmethod
    def from_json(cls, d: Any) -> "Manifest":
        if not isinstance(d, dict):
            raise ValueError("manifest is not a JSON object")
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"unsupported manifest format {d.get('format')!r}")
        try:
            files = {}
            for rel, ent in d["files"].items():
                if not isinstance(ent, dict) or not isinstance(ent.get("size"), int) or not isinstance(ent.get("xxh3_128"), str):
                    raise ValueError(f"bad file entry for {rel!r}")
                files[rel] = FileEntry(ent["size"], ent["xxh3_128"])
            for key in ("global_step", "epoch", "batch_in_epoch"):
                if not isinstance(d[key], int) or d[key] < 0:
                    raise ValueError(f"bad {key} {d[key]!r}")
            return cls(
                global_step=d["global_step"], epoch=d["epoch"], batch_in_epoch=d["batch_in_epoch"],
                kind=CheckpointKind(d["kind"]), loss=d.get("loss"), created_at=str(d.get("created_at", "")),
                files=files, exact=bool(d.get("exact", True)), torch_version=d.get("torch_version"),
                python_version=d.get("python_version"), git_commit=d.get("git_commit"),
                git_dirty=d.get("git_dirty"), world_size=int(d.get("world_size", 1)),
                sharded=bool(d.get("sharded", False)),
            )
        except KeyError as e:
            raise ValueError(f"manifest lacks {e.args[0]!r}") from e


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


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def safe_member(ckpt_dir: Path, rel: str) -> Path:
    """The path of a manifest-listed file, refusing anything that escapes the checkpoint dir."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or rel in ("", "."):
        raise InvalidCheckpoint(ckpt_dir, f"manifest lists unsafe path {rel!r}")
    full = ckpt_dir / p
    if full.is_symlink() or not _inside(full.resolve(), ckpt_dir.resolve()):
        raise InvalidCheckpoint(ckpt_dir, f"{rel} points outside the checkpoint")
    return full


def digest_file(path: Path, chunk: int = 8 << 20) -> str:
    h = new_hasher()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


def inspect_checkpoint(path: Path, *, full: bool = False, root: Optional[Path] = None,
                       digest_only: Optional[Callable[[dict[str, "FileEntry"]], Iterable[str]]] = None,
                       ) -> CheckpointInfo:
    """Validate one checkpoint dir: manifest parses and every listed file has its size.

    With `full`, also recompute each file's xxh3_128 (only of the files `digest_only` picks from
    the manifest's entries, when given: ranks split the hashing of a multi-rank checkpoint). `root` (the
    checkpoints dir it was found in) refuses a dir that resolves outside it. Raises
    InvalidCheckpoint naming the reason.
    """
    path = Path(path)
    if root is not None and not _inside(path.resolve(), Path(root).resolve()):
        raise InvalidCheckpoint(path, f"resolves outside {root}")
    mpath = path / MANIFEST_NAME
    try:
        raw = mpath.read_bytes()
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
    hashed = set(manifest.files if digest_only is None else digest_only(manifest.files))
    for rel, ent in manifest.files.items():
        fp = safe_member(path, rel)
        try:
            size = fp.stat().st_size
        except FileNotFoundError:
            raise InvalidCheckpoint(path, f"{rel} is missing") from None
        except OSError as e:
            raise InvalidCheckpoint(path, f"{rel}: {e.strerror or e}") from e
        if size != ent.size:
            raise InvalidCheckpoint(path, f"{rel} has {size} bytes, manifest says {ent.size} (truncated?)")
        if full and rel in hashed:
            try:
                got = digest_file(fp)
            except OSError as e:
                raise InvalidCheckpoint(path, f"{rel}: {e.strerror or e}") from e
            if got != ent.xxh3_128:
                raise InvalidCheckpoint(path, f"{rel} digest mismatch (corrupted)")
    return CheckpointInfo(path, manifest)


def iter_checkpoint_dirs(dirs: Iterable[Path]) -> list[tuple[int, Path, Path]]:
    """(step, checkpoint dir, the checkpoints dir it is in), newest first; tmp dirs never appear."""
    found = []
    for order, d in enumerate(dirs):
        try:
            entries = list(os.scandir(d))
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.EACCES):
                continue
            raise
        for ent in entries:
            step = parse_checkpoint_name(ent.name)
            if step is not None:
                found.append((step, -order, Path(ent.path), Path(d)))
    # Newest step first; on a tie the primary dir (listed first) wins.
    found.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [(s, p, d) for s, _, p, d in found]


def newest_valid(
    dirs: Iterable[Path],
    *,
    exclude: Iterable[str] = (),
    full: bool = False,
    allow_inexact: bool = False,
    below_step: Optional[int] = None,
    on_reject: Optional[Callable[[Path, str], None]] = None,
) -> Optional[CheckpointInfo]:
    """The newest checkpoint that validates, searching `dirs` (primary first, then fallbacks).

    Stops at the first valid one, so the cost does not grow with the number kept. `exclude`
    holds resolved paths (as str) to skip, e.g. checkpoints the supervisor marked poisoned;
    inexact (emergency) checkpoints are skipped unless `allow_inexact`.
    """
    dirs = [Path(d) for d in dirs]
    excluded = {str(Path(e)) for e in exclude}
    for d in dirs:
        _check_latest_link(d, on_reject)
    for step, path, root in iter_checkpoint_dirs(dirs):
        if below_step is not None and step >= below_step:
            continue
        if str(path) in excluded or str(path.resolve()) in excluded:
            continue
        try:
            info = inspect_checkpoint(path, full=full, root=root)
        except InvalidCheckpoint as e:
            if on_reject:
                on_reject(path, e.reason)
            continue
        if info.manifest.global_step != step:
            if on_reject:
                on_reject(path, f"manifest says step {info.manifest.global_step}, dir name says {step}")
            continue
        if not info.manifest.exact and not allow_inexact:
            continue
        return info
    return None


def _check_latest_link(ckpt_root: Path, on_reject: Optional[Callable[[Path, str], None]]) -> None:
    """Report a `latest` link that dangles or leaves the checkpoints dir; selection never follows it."""
    link = ckpt_root / LATEST
    if not link.is_symlink() or on_reject is None:
        return
    target = link.resolve()
    if not _inside(target, ckpt_root.resolve()):
        on_reject(link, f"latest points outside {ckpt_root} ({os.readlink(link)})")
    elif not target.exists():
        on_reject(link, f"latest points to missing {os.readlink(link)}")


def repoint_latest(ckpt_root: Path, name: str) -> None:
    """Atomically swap `latest` to `name` (relative target, so the run dir can be moved)."""
    tmp = ckpt_root / f"{TMP_PREFIX}latest-{os.getpid()}"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(name, tmp)
    os.replace(tmp, ckpt_root / LATEST)
    fsync_dir(ckpt_root)


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll `predicate` until it returns a truthy value or `timeout` passes; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def tmp_dirs(ckpt_root: Path) -> Iterator[Path]:
    try:
        for ent in os.scandir(ckpt_root):
            if ent.name.startswith(TMP_PREFIX) and ent.is_dir(follow_symlinks=False):
                yield Path(ent.path)
    except FileNotFoundError:
        return


# --- heartbeat and index shapes ----------------------------------------------------------------

# heartbeats/rank-<R>.json, rewritten atomically by the shim:
#   {"pid", "rank", "attempt", "step", "epoch", "loss", "phase", "time" (wall clock, informative
#    only), "checkpoint_step" (newest committed, or null), "seq" (increments on every write),
#    "resumed_from" (dir actually loaded, after any fallback; null when fresh),
#    "save_bytes" (bytes written so far while phase is "saving")}
# The supervisor judges liveness by *changes* it observes (seq), timed on its own monotonic clock.
HEARTBEAT_FIELDS = ("pid", "rank", "attempt", "step", "epoch", "loss", "phase", "time",
                    "checkpoint_step", "seq", "resumed_from", "save_bytes")

# checkpoint_metadata.json: {"<checkpoint dir name>": {"epoch", "global_step", "loss",
#   "timestamp" (ISO 8601), "is_best", "kind", "dir" (absolute dir, differs for fallback saves)}}


def index_entry(manifest: Manifest, *, is_best: bool, directory: Path) -> dict:
    return {
        "epoch": manifest.epoch, "global_step": manifest.global_step, "loss": manifest.loss,
        "timestamp": manifest.created_at, "is_best": is_best, "kind": manifest.kind.value,
        "dir": str(directory),
    }


def read_index(run_dir: RunDir) -> dict:
    try:
        idx = read_json(run_dir.index)
    except ContractError:
        return {}
    return idx if isinstance(idx, dict) else {}


def checkpoint_roots(run_dir: RunDir, extra: Iterable[Path] = ()) -> list[Path]:
    """Checkpoints dirs to search: the run dir's own first, then fallback dirs the index names."""
    roots = [run_dir.checkpoints]
    for p in extra:
        if Path(p) not in roots:
            roots.append(Path(p))
    for entry in read_index(run_dir).values():
        d = entry.get("dir") if isinstance(entry, dict) else None
        if isinstance(d, str) and d:
            parent = Path(d).parent
            if parent not in roots:
                roots.append(parent)
    return roots
