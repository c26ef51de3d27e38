"""Which commands restart warm, and the standby prestarted for them (argv only: no torch here).

    command                                             standby for the next attempt
    python SCRIPT.py ARGS                               warm interpreter: runpy.run_path(SCRIPT.py)
    python -m MODULE ARGS                               warm interpreter: runpy.run_module(MODULE)
    NAME ARGS, NAME a console script of our Python      warm interpreter: runpy.run_path(NAME's file)
    python -m torch.distributed.run ARGS, torchrun ARGS prestarted torchrun (trainer_shim._launch.standby)
    anything else (another Python, `sh -c`, a binary)   none: restarts start cold

"Our Python" is the supervisor's interpreter in the supervisor's environment: the same executable
file once symlinks are followed AND the same venv (the dir holding the pyvenv.cfg that CPython finds
beside the interpreter's path as invoked, or one dir up; none for both). So `python` found on PATH
in the activated venv, `.venv/bin/python3.11` and the shebang `#!/venv/bin/python` of that venv's
console scripts are ours; another venv's python (a symlink to the same binary, other packages) is
not, since the standby would have imported the wrong packages. Only `python` directly followed by
SCRIPT.py or `-m` counts: interpreter options (`python -u -m ...`) are not parsed, such a command
starts cold. A bare command name is looked up on the job's PATH, as the attempt's spawn will.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from typing import Optional, Sequence

__all__ = ["Route", "standby_route", "ours", "TORCHRUN_MODULE", "WARM_MODULE", "STANDBY_MODULE"]

TORCHRUN_MODULE = "torch.distributed.run"
STANDBY_MODULE = "trainer_shim._launch.standby"
WARM_MODULE = "trainer_shim._launch.warm"
_SHEBANG_MAX = 512   # the kernel reads at most 256 bytes of `#!` line; more is not a shebang it runs


@dataclasses.dataclass(frozen=True)
class Route:
    """The standby for a command: `python -m launcher [OPTIONS] target...`."""

    python: str                # the interpreter a cold attempt runs in (sys.executable stays the same)
    launcher: str              # WARM_MODULE or STANDBY_MODULE
    target: tuple[str, ...]    # after the launcher's options: SCRIPT ARGS, -m MODULE ARGS, or torchrun's args

    @property
    def warm(self) -> bool:
        """A warm interpreter (one process: the memory rule applies), not a prestarted torchrun."""
        return self.launcher == WARM_MODULE

    def argv(self, *options: str) -> tuple[str, ...]:
        return (self.python, "-m", self.launcher, *options, *self.target)


def standby_route(command: Sequence[str], *, path: Optional[str], cwd: Optional[str]) -> Optional[Route]:
    """The standby for `command` (see the table above); None when it restarts cold. `path` is the job's
    PATH, `cwd` the directory it runs in (for relative command names)."""
    if not command:
        return None
    exe = locate(command[0], path, cwd)
    if exe is None:
        return None
    if ours(exe):
        return _python_route(command)
    interpreter = _shebang_interpreter(exe, path, cwd)
    if interpreter is None or not ours(interpreter):
        return None
    # A console script: the kernel runs `INTERPRETER FILE ARGS`, FILE as found on PATH (argv[0]).
    script = exe if os.sep not in command[0] else command[0]
    if os.path.basename(exe) == "torchrun":  # torch's own entry point: torchrun's standby, not a warm interpreter
        return Route(interpreter, STANDBY_MODULE, tuple(command[1:]))
    if script.startswith("-"):
        return None
    return Route(interpreter, WARM_MODULE, (script, *command[1:]))


def _python_route(command: Sequence[str]) -> Optional[Route]:
    """`python SCRIPT.py ...`, `python -m MODULE ...` under our Python."""
    rest = tuple(command[1:])
    if len(rest) >= 2 and rest[0] == "-m":
        if rest[1] == TORCHRUN_MODULE:
            return Route(command[0], STANDBY_MODULE, rest[2:])
        return Route(command[0], WARM_MODULE, rest) if not rest[1].startswith("-") else None
    if rest and rest[0].endswith(".py") and not rest[0].startswith("-"):
        return Route(command[0], WARM_MODULE, rest)
    return None


def locate(name: str, path: Optional[str], cwd: Optional[str]) -> Optional[str]:
    """The file exec runs for argv[0] `name`: looked up on `path` when it has no slash, else relative
    to `cwd`; None when there is no such executable file."""
    if os.sep not in name:
        return shutil.which(name, path=path if path is not None else os.defpath)
    full = os.path.join(cwd or os.getcwd(), name)
    return full if os.path.isfile(full) and os.access(full, os.X_OK) else None


def ours(exe: str) -> bool:
    """Whether the interpreter at `exe` is the supervisor's own Python (the rule above)."""
    try:
        if not os.path.samefile(exe, sys.executable):   # follows symlinks on both sides
            return False
    except OSError:
        return False
    return _venv(exe) == _venv(sys.executable)


def _venv(exe: str) -> Optional[str]:
    """The venv an interpreter at `exe` starts in: where CPython finds pyvenv.cfg (beside the path as
    invoked, before symlinks, or one dir up)."""
    here = os.path.dirname(os.path.abspath(exe))
    for d in (here, os.path.dirname(here)):
        if os.path.isfile(os.path.join(d, "pyvenv.cfg")):
            return os.path.realpath(d)
    return None


def _shebang_interpreter(exe: str, path: Optional[str], cwd: Optional[str]) -> Optional[str]:
    """The interpreter of a `#!/abs/python` or `#!/usr/bin/env NAME` script; None for anything else
    (a binary, interpreter options, pip's `#!/bin/sh` trampoline for over-long paths)."""
    try:
        with open(exe, "rb") as f:
            head = f.read(_SHEBANG_MAX)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    try:
        words = head[2:].split(b"\n", 1)[0].decode().split()
    except UnicodeDecodeError:
        return None
    if len(words) == 2 and os.path.basename(words[0]) == "env":
        return locate(words[1], path, cwd)
    return words[0] if len(words) == 1 and os.path.isabs(words[0]) else None
