"""Process titles: what `ps` and `pgrep -af` show for each process of a run.

The supervisor, an idle warm standby and the trainer would otherwise all read `python ...` with the
same script in their command lines, so "kill the trainer" by name could hit the supervisor. Each
retitles itself instead (`setproctitle`), naming what it is and for which run dir:

    resilient-run supervisor RUN_DIR
    resilient-run standby RUN_DIR (waiting)
    resilient-run trainer rank R attempt N RUN_DIR (python train.py ...)

Only the trainer's title names the job's command, so `pgrep -af train.py` finds the trainer alone.

The title overwrites the process's argv memory, and `setproctitle` borrows the environment block
behind it when the title is longer; /proc/PID/environ then reads empty, and tools (ours included:
tests find a job's processes by their RESILIENT_RUN_DIR) lose it. So the environment is kept
whenever the title's head (what and which run dir) fits in the original command line, the
command part shortened to fit (`...`); only a command line too short for the head gives up the
environment block, since a title without its run dir would be no title.

A title is a courtesy: `setproctitle` is optional for the trainer (the shim runs without it) and
no failure here ever reaches the caller.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Optional, Sequence, Union

__all__ = ["Title", "supervisor_title", "standby_title", "trainer_title", "set_title"]

PROGRAM = "resilient-run"
_ELLIPSIS = "..."
# setproctitle reads this at its first call: set, it never writes into the environment block.
_NO_ENV = "SPT_NOENV"
# /proc/PID/comm, what `top` and the kernel's OOM-kill line show: 15 bytes, so a short name per role.
_COMM_MAX = 15

# Fixed at this process's first title: the characters a title may have (None: as many as it needs).
_room: Optional[int] = None
_titled = False


@dataclasses.dataclass(frozen=True)
class Title:
    """`head (detail)`: the head names the process and its run dir and is always shown whole; the
    detail (a command, a state) is shortened when the command line has no room for it."""

    head: str
    detail: str = ""
    comm: str = PROGRAM

    def text(self, room: Optional[int] = None) -> str:
        full = f"{self.head} ({self.detail})" if self.detail else self.head
        if room is None or len(full) <= room:
            return full
        keep = room - len(self.head) - len(" (" + _ELLIPSIS + ")")
        if keep <= 0:
            return self.head
        return f"{self.head} ({self.detail[:keep]}{_ELLIPSIS})"


def _where(run_dir: Union[str, Path], node: Optional[int]) -> str:
    return os.path.abspath(run_dir) + ("" if node is None else f" node {node}")


def supervisor_title(run_dir: Union[str, Path], node: Optional[int] = None) -> Title:
    return Title(f"{PROGRAM} supervisor {_where(run_dir, node)}", comm="rr-supervisor")


def standby_title(run_dir: Union[str, Path], node: Optional[int] = None) -> Title:
    """An idle warm interpreter: the next attempt, not yet running anything."""
    return Title(f"{PROGRAM} standby {_where(run_dir, node)}", "waiting", comm="rr-standby")


def trainer_title(run_dir: Union[str, Path], *, rank: int, attempt: int, command: Sequence[str],
                  node: Optional[int] = None) -> Title:
    return Title(f"{PROGRAM} trainer rank {rank} attempt {attempt} {_where(run_dir, node)}", " ".join(command),
                 comm=f"rr-trainer-{rank}"[:_COMM_MAX])


def set_title(title: Title) -> None:
    """Retitle this process (a no-op without `setproctitle`); never raises."""
    global _titled
    try:
        import setproctitle
    except ImportError:
        return
    try:
        if not _titled:
            _titled = True
            _first_title(setproctitle, title)
        else:
            setproctitle.setproctitle(title.text(_room))
        if threading.current_thread() is threading.main_thread():  # the main thread's name is the process's
            setproctitle.setthreadtitle(title.comm[:_COMM_MAX])
    except Exception:  # noqa: BLE001 - a title is never worth a failed run
        pass


def _argv_room() -> int:
    """How many characters a title can have without touching the environment block: the original
    command line's bytes (its NULs included) less two (setproctitle keeps the last one for its own NUL)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return max(0, len(f.read()) - 2)
    except OSError:
        return 0


def _first_title(setproctitle, title: Title) -> None:  # noqa: ANN001 - the module
    """The first call fixes how much memory setproctitle may use (it reads _NO_ENV then, and only then)."""
    global _room
    room = _argv_room()
    if len(title.head.encode()) > room:   # argv and the environment block: room for any title we write
        setproctitle.setproctitle(title.text())
        return
    _room = room
    had = os.environ.get(_NO_ENV)
    os.environ[_NO_ENV] = "1"
    try:
        setproctitle.setproctitle(title.text(_room))
    finally:
        if had is None:   # the job's children must not inherit our choice
            os.environ.pop(_NO_ENV, None)
