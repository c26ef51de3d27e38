"""Where everything lives in a run dir: names, patterns and the `RunDir` paths object.

Each file-name pattern is stated once here, with a builder and a parser, so no other module
restates `rank-<R>.json` or `step-XXXXXXXX`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from .errors import ContractError
from .frameworks import number_in, parse_hf_checkpoint_name
from .records import HeartbeatRecord

__all__ = [
    "CHECKPOINTS", "NODES", "LATEST", "TMP_PREFIX", "CKPT_PREFIX", "RUN_DIR_MODE",
    "RunDir", "ensure_run_dir", "checkpoint_name", "parse_checkpoint_name", "heartbeat_name",
    "parse_heartbeat_name", "step_mark_name", "tmp_dirs", "discard_abandoned", "inside",
]

CHECKPOINTS = "checkpoints"
NODES = "nodes"
LATEST = "latest"
TMP_PREFIX = ".tmp-"
CKPT_PREFIX = "step-"
RUN_DIR_MODE = 0o700
_CKPT_RE = re.compile(r"^step-(\d{8,})$")
_NODE_RE = re.compile(r"^node-(\d+)$")
_HEARTBEAT_RE = re.compile(r"^rank-(\d+)\.json$")
_RANK_ERROR_RE = re.compile(r"^attempt-(\d+)-rank-(\d+)\.json$")


def checkpoint_name(step: int) -> str:
    return f"{CKPT_PREFIX}{step:08d}"


def parse_checkpoint_name(name: str) -> Optional[int]:
    """Step of a checkpoint dir name: ours (step-XXXXXXXX) or a HF Trainer's (checkpoint-N)."""
    step = number_in(_CKPT_RE, name)
    return step if step is not None else parse_hf_checkpoint_name(name)


def heartbeat_name(rank: int) -> str:
    return f"rank-{rank}.json"


def parse_heartbeat_name(name: str) -> Optional[int]:
    """The rank of a heartbeat file name, None for anything else (temp files, step marks)."""
    return number_in(_HEARTBEAT_RE, name)


def step_mark_name(rank: int) -> str:
    return f"rank-{rank}.step"


def inside(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def tmp_dirs(ckpt_root: Path) -> Iterator[Path]:
    """In-flight or abandoned checkpoint writes (never chosen by selection)."""
    try:
        for ent in os.scandir(ckpt_root):
            if ent.name.startswith(TMP_PREFIX) and ent.is_dir(follow_symlinks=False):
                yield Path(ent.path)
    except FileNotFoundError:
        return


def discard_abandoned(ckpt_root: Path) -> None:
    """Remove what killed writers left in `ckpt_root` (temporary dirs, half-deleted trash); never a checkpoint."""
    for t in tmp_dirs(ckpt_root):
        shutil.rmtree(t, ignore_errors=True)


class _Under:
    """A read-only RunDir path: `name` under another of its paths (`root`, `own`, ...)."""

    def __init__(self, base: str, name: str) -> None:
        self.base, self.name = base, name

    def __get__(self, rd: Optional["RunDir"], owner: type) -> Any:
        return self if rd is None else getattr(rd, self.base) / self.name


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

    # The layout as a table: each path is a name under the shared root or this supervisor's own dir.
    checkpoints = _Under("root", CHECKPOINTS)
    latest = _Under("checkpoints", LATEST)
    heartbeats = _Under("root", "heartbeats")
    index = _Under("root", "checkpoint_metadata.json")
    logs = _Under("own", "logs")
    errors = _Under("own", "errors")
    events = _Under("own", "events.jsonl")
    supervisor_state = _Under("own", "supervisor.json")
    lock = _Under("own", "supervisor.lock")
    metrics = _Under("own", "metrics.prom")
    # `--heartbeat-timeout auto`: per-phase heartbeat intervals the supervisor learned (inherited by restarts).
    learned_timeouts = _Under("root", "heartbeat_timeouts.json")
    # The frameworks the last trainer imported, for the warm interpreter of the next attempt (see warm.py).
    frameworks = _Under("own", "imported_frameworks.json")

    def heartbeat(self, rank: int = 0) -> Path:
        return self.heartbeats / heartbeat_name(rank)

    def heartbeat_files(self) -> list[tuple[int, Path]]:
        """(rank, path) of every heartbeat file present, by rank; never fails (empty when unreadable)."""
        try:
            names = os.listdir(self.heartbeats)
        except OSError:
            return []
        found = ((parse_heartbeat_name(n), n) for n in names)
        return sorted((rank, self.heartbeats / n) for rank, n in found if rank is not None)

    def step_mark(self, rank: int = 0) -> Path:
        """heartbeats/rank-<R>.step: the last step rank R reached (see stepmark.py)."""
        return self.heartbeats / step_mark_name(rank)

    def owns_heartbeat(self, hb: HeartbeatRecord) -> bool:
        """Whether this (node's) supervisor judges the rank that wrote `hb`: on a single node, every rank."""
        return self.node is None or hb.node == self.node

    def attempt_log(self, attempt: int) -> Path:
        return self.logs / f"attempt-{attempt:04d}.log"

    def standby_log(self, attempt: int) -> Path:
        """A prestarted launcher's log until it becomes attempt N (renamed to attempt_log(N)): an idle
        standby left by a killed supervisor must not take an attempt number."""
        return self.logs / f"standby-{attempt:04d}.log"

    def warm_ready(self, attempt: int) -> Path:
        """Written by the warm interpreter for attempt N once its imports are done (see warm.py)."""
        return self.logs / f"standby-{attempt:04d}.ready"

    def error_file(self, attempt: int, rank: int = 0) -> Path:
        """Rank 0 (and a single process) writes attempt-N.json; rank R > 0 attempt-N-rank-R.json."""
        return self.errors / (f"attempt-{attempt}.json" if rank == 0 else f"attempt-{attempt}-rank-{rank}.json")

    def rank_error_files(self, attempt: int) -> list[tuple[int, Path]]:
        """(rank, path) of every error file of attempt N, rank 0 first, then by rank."""
        out = [(0, self.error_file(attempt))] if self.error_file(attempt).exists() else []
        try:
            names = os.listdir(self.errors)
        except OSError:
            names = []
        for m in filter(None, map(_RANK_ERROR_RE.match, names)):
            if int(m.group(1)) == attempt:
                out.append((int(m.group(2)), self.errors / m.group(0)))
        return sorted(out)

    def stacks_file(self, pid: int) -> Path:
        return self.logs / f"stacks-{pid}.txt"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / checkpoint_name(step)

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
