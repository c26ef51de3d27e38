"""`init(resume="auto"|"ask"|"never"|PATH)`: what a standalone run does with the checkpoints it finds.

- "auto" (default): resume from the newest valid checkpoint.
- "ask": on a terminal (stdin and stderr are TTYs), in a single-process standalone run, ask
  `Found checkpoint step-N (epoch E, loss L, 2h ago). Resume? [Y/n]`; Enter or y resumes, n starts
  fresh as "never" does. Anywhere else (supervised, piped, multi-rank) it never blocks: "auto".
- "never": start fresh in a new run dir name (RUN_DIR-2, -3, ... the first without checkpoints);
  nothing is ever deleted.
- PATH: resume from that checkpoint dir (refused with a one-line ConfigError if it is not valid).

Under `resilient-run` (RESILIENT_RESUME_FROM is set) the supervisor's choice always wins: restarts
must resume, and nobody is there to answer.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, TextIO

from .. import rundir
from ..errors import ConfigError

__all__ = ["MODES", "resolve", "fresh_root", "describe", "should_prompt"]

MODES = ("auto", "ask", "never")


def should_prompt(stdin: TextIO, stderr: TextIO, supervised: bool, world_size: int) -> bool:
    try:
        return not supervised and world_size == 1 and stdin.isatty() and stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _ago(created_at: str) -> str:
    try:
        s = (datetime.now(timezone.utc) - datetime.fromisoformat(created_at)).total_seconds()
    except ValueError:
        return "at an unknown time"
    if s < 120:
        return f"{s:.0f}s ago"
    if s < 7200:
        return f"{s / 60:.0f}m ago"
    if s < 172800:
        return f"{s / 3600:.0f}h ago"
    return f"{s / 86400:.0f}d ago"


def describe(info: rundir.CheckpointInfo) -> str:
    m = info.manifest
    loss = f"{m.loss:.4g}" if isinstance(m.loss, (int, float)) else "n/a"
    return f"Found checkpoint {info.path.name} (epoch {m.epoch}, loss {loss}, {_ago(m.created_at)}). Resume? [Y/n] "


def fresh_root(root: Path) -> Path:
    """The first of ROOT-2, ROOT-3, ... that has no checkpoint (it may exist, e.g. empty)."""
    n = 2
    while True:
        cand = root.with_name(f"{root.name}-{n}")
        if not any(rundir.iter_checkpoint_dirs([cand / rundir.CHECKPOINTS])):
            return cand
        n += 1


def _ask(question: str, stdin: TextIO, stderr: TextIO) -> bool:
    stderr.write(question)
    stderr.flush()
    answer = stdin.readline()
    return answer.strip().lower() not in ("n", "no")


def resolve(resume: str, root: Path, env: rundir.RunEnv, *, stdin: TextIO = sys.stdin, stderr: TextIO = sys.stderr,
            say: Callable[[str], None] = print) -> tuple[Path, rundir.RunEnv]:
    """(the run dir to use, the env with an explicit PATH as its resume_from). Standalone runs only."""
    supervised = env.resume_from is not None
    world_size = rundir.LauncherEnv.from_environ(os.environ).world_size
    if supervised or resume == "auto":
        return root, env
    if resume not in MODES:
        path = Path(resume).absolute()
        try:
            rundir.inspect_checkpoint(path)
        except rundir.InvalidCheckpoint as e:
            raise ConfigError(f"resume={resume!r}: {e.reason}; give a checkpoint dir such as RUN_DIR/checkpoints/step-N") from None
        return root, dataclasses.replace(env, resume_from=str(path))
    found: Optional[rundir.CheckpointInfo] = rundir.newest_valid([root / rundir.CHECKPOINTS])
    if found is None:
        return root, env
    if resume == "ask":
        if not should_prompt(stdin, stderr, supervised, world_size) or _ask(describe(found), stdin, stderr):
            return root, env
    new = fresh_root(root)
    say(f"starting fresh in {new} (resume={resume!r}); {root} keeps its checkpoints")
    return new, env
