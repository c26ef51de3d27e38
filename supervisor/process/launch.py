"""The child command of a distributed job: `torchrun` (as `python -m torch.distributed.run`) around SCRIPT.py.

The supervisor never imports torch; it only builds the argv. torchrun runs with
`--max-restarts 0`: restarting is the supervisor's job (from the newest valid checkpoint), and
with no restarts of its own torchrun exits non-zero as soon as any rank dies, which ends the
attempt; the supervisor then kills the whole tree.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal as signal_mod
import sys
from typing import Optional, Sequence

from trainer_shim.rundir import ATTACH_DIR, ENV_CALLBACK

from ..errors import ConfigError
from .warmable import TORCHRUN_MODULE

__all__ = ["torchrun_command", "ProcessFailure", "parse_torchrun_failure", "RendezvousFailure", "parse_rendezvous_failure",
           "TorchrunOptions", "torchrun_options", "attach_environ"]


@dataclasses.dataclass(frozen=True)
class TorchrunOptions:
    """What the supervisor must know of a user's own `-- torchrun ...` command."""

    nnodes: int          # the largest node count of `--nnodes N` or `MIN:MAX`
    node_rank: Optional[int]
    max_restarts: int


def torchrun_options(command: Sequence[str]) -> Optional[TorchrunOptions]:
    """The launcher options of `torchrun ...` or `python -m torch.distributed.run ...`; None for any other command."""
    argv = list(command)
    if argv and os.path.basename(argv[0]) == "torchrun":
        rest = argv[1:]
    elif len(argv) >= 3 and argv[1] == "-m" and argv[2] in (TORCHRUN_MODULE, "torch.distributed.launch"):
        rest = argv[3:]
    else:
        return None
    opts: dict[str, str] = {}
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--"):
            break  # the training script: what follows are its own arguments
        name, eq, val = tok[2:].partition("=")
        name = name.replace("_", "-")
        if name in ("standalone", "no-python", "run-path", "module", "redirects-all", "tee-all") and not eq:
            i += 1
            continue
        if not eq and i + 1 < len(rest):
            val, i = rest[i + 1], i + 1
        opts[name] = val
        i += 1

    def whole(name: str, value: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"command: torchrun --{name} {value!r} is not a whole number") from None

    nnodes = max(whole("nnodes", p) for p in opts.get("nnodes", "1").split(":"))
    return TorchrunOptions(nnodes=nnodes,
                           node_rank=whole("node-rank", opts["node-rank"]) if "node-rank" in opts else None,
                           max_restarts=whole("max-restarts", opts.get("max-restarts", "0")))


def torchrun_command(
    script: str,
    args: Sequence[str],
    *,
    nproc_per_node: int,
    nnodes: Optional[int] = None,
    node_rank: Optional[int] = None,
    rdzv_endpoint: Optional[str] = None,
    rdzv_id: str = "resilient-run",
    python: str = sys.executable,
) -> tuple[str, ...]:
    """argv running `script args` on nproc_per_node local ranks (and nnodes nodes when > 1)."""
    cmd = [python, "-m", TORCHRUN_MODULE, "--max-restarts", "0", "--nproc-per-node", str(nproc_per_node)]
    if (nnodes or 1) <= 1:
        if rdzv_endpoint or (node_rank or 0) != 0:
            raise ConfigError("rdzv_endpoint/node_rank need nnodes > 1; a single node uses --standalone")
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise ConfigError(f"nnodes {nnodes} needs rdzv_endpoint HOST:PORT (the same on every node)")
        if node_rank is None:
            raise ConfigError(f"nnodes {nnodes} needs node_rank (0..{nnodes - 1}, unique per node)")
        if node_rank >= nnodes:
            raise ConfigError(f"node_rank {node_rank} must be below nnodes {nnodes}")
        if not re.match(r"^\[?[A-Za-z0-9_.:-]+\]?:\d+$", rdzv_endpoint):
            raise ConfigError(f"rdzv_endpoint: {rdzv_endpoint!r} is not HOST:PORT")
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]
    return (*cmd, script, *args)


def attach_environ(env: dict[str, str], on: bool, callback: Sequence[tuple[str, object]] = ()) -> dict[str, str]:
    """`env` for auto-attach: the shim's bootstrap dir first on PYTHONPATH (every Python process of
    the job, launchers' children included, then gives its Trainers the callback), the callback's
    options. Off: the bootstrap dir is taken out (a job under a supervisor under a supervisor)."""
    boot = str(ATTACH_DIR)
    current = env.get("PYTHONPATH")
    # An empty entry means the working directory: kept, only our own entry is moved or removed.
    paths = [p for p in current.split(os.pathsep) if p != boot] if current else []
    if on:
        paths.insert(0, boot)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    if on and callback:
        env[ENV_CALLBACK] = json.dumps(dict(callback))
    else:
        env.pop(ENV_CALLBACK, None)
    return env


# torchrun's failure summary (torch.distributed.elastic ChildFailedError), e.g.
#   [0]:
#     time      : 2026-12-02_17:40:01
#     host      : box
#     rank      : 1 (local_rank: 1)
#     exitcode  : -9 (pid: 12345)
_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")


# The last line of torchrun's traceback when its agent could not join the rendezvous, e.g.
#   torch.distributed.elastic.rendezvous.api.RendezvousClosedError
#   torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: The node 'x' has failed ...
_RDZV_RE = re.compile(r"^torch\.distributed\.elastic\.rendezvous\.api\.(Rendezvous\w*Error)\b:?\s*(.*)$")


@dataclasses.dataclass(frozen=True)
class RendezvousFailure:
    """torchrun's agent could not join its peers: the rendezvous error's class name and message."""

    error: str          # e.g. "RendezvousClosedError"
    message: str = ""

    @property
    def closed(self) -> bool:
        """The rendezvous was closed: on several nodes, another node's previous attempt had not ended yet."""
        return self.error == "RendezvousClosedError"

    def describe(self) -> str:
        """For humans (evidence lines); code reads the fields, never this phrase."""
        return f"{self.error}: {self.message}" if self.message else self.error


def parse_rendezvous_failure(lines: Sequence[str]) -> Optional[RendezvousFailure]:
    """The rendezvous error torchrun died of while joining its peers (its last such line), else None."""
    for ln in reversed(lines):
        m = _RDZV_RE.match(ln.strip())
        if m:
            return RendezvousFailure(m.group(1), m.group(2)[:200])
    return None


@dataclasses.dataclass(frozen=True)
class ProcessFailure:
    """One failed rank of torchrun's failure summary: its exit code or the signal that killed it."""

    rank: Optional[int]
    pid: Optional[int]
    exitcode: Optional[int] = None   # set when the rank exited
    signal: Optional[int] = None     # set when a signal killed it

    def describe(self) -> str:
        """For humans (evidence lines); code reads the fields, never this phrase."""
        if self.signal is not None:
            try:
                how = f"killed by {signal_mod.Signals(self.signal).name}"
            except ValueError:
                how = f"killed by signal {self.signal}"
        else:
            how = f"exit code {self.exitcode}"
        return f"rank {'?' if self.rank is None else self.rank} (pid {'?' if self.pid is None else self.pid}) {how}"


def parse_torchrun_failure(lines: Sequence[str]) -> list[ProcessFailure]:
    """The failed ranks of torchrun's summary, its "Root Cause (first observed failure)" first."""
    out: list[ProcessFailure] = []
    root: list[ProcessFailure] = []
    in_root = False
    rank: Optional[int] = None
    for ln in lines:
        if ln.startswith("Root Cause"):
            in_root = True
            continue
        m = _RANK_RE.match(ln)
        if m:
            rank = int(m.group(1))
            continue
        m = _EXIT_RE.match(ln)
        if m:
            code, pid = int(m.group(1)), int(m.group(2))
            pf = ProcessFailure(rank, pid, signal=-code) if code < 0 else ProcessFailure(rank, pid, exitcode=code)
            (root if in_root else out).append(pf)
    seen: list[ProcessFailure] = []
    for pf in root + out:
        if pf not in seen:
            seen.append(pf)
    return seen
