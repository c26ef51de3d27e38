"""A launcher's Python child run inside the warm interpreter, so that its restart is warm too.

`swift sft` (and launchers like it) start the trainer as `subprocess.run([sys.executable, FILE.py,
*ARGS])` and exit with its status. Started cold, that child pays the interpreter start and every
import (torch, transformers: seconds) at each restart however warm the launcher was. In a warm
attempt (trainer_shim._launch.warm) the first such call is run in this process instead: `FILE.py` as
`__main__` with that argv and sys.path[0], as `python FILE.py ARGS` would, in the interpreter that has
torch and the job's frameworks imported already. Its exit status comes back as the child's would:
0, a `sys.exit` code, 1 after an uncaught exception (traceback printed), and a signal kills the one
process, which is then the attempt's own (the supervisor sees the trainer die directly).

Only that exact call is inlined: our own interpreter, a `.py` file that exists, and no other argument
(no env, pipes, cwd or check: a launcher that waits for its child and inherits everything). Any
other call, and every call after the first, runs as before.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import traceback
from typing import Any, Sequence

__all__ = ["install", "inlinable"]


def inlinable(args: Any, extra: Sequence[Any], kwargs: dict) -> bool:
    """Whether `subprocess.run(args, *extra, **kwargs)` is a plain `python FILE.py ARGS` child of ours."""
    if extra or set(kwargs) - {"args"} or not isinstance(args, (list, tuple)) or len(args) < 2:
        return False
    if not all(isinstance(a, str) for a in args) or not args[1].endswith(".py") or not os.path.isfile(args[1]):
        return False
    try:
        return os.path.samefile(args[0], sys.executable)
    except OSError:
        return False


def install() -> None:
    """Wrap `subprocess.run` so that the first inlinable call runs in this process."""
    original = subprocess.run

    def run_inline(*popenargs: Any, **kwargs: Any) -> Any:
        args = popenargs[0] if popenargs else kwargs.get("args")
        if not inlinable(args, popenargs[1:], kwargs):
            return original(*popenargs, **kwargs)
        subprocess.run = original  # one child: the trainer
        return subprocess.CompletedProcess(list(args), _run_child(list(args[1:])))

    run_inline.__wrapped__ = original  # type: ignore[attr-defined]
    subprocess.run = run_inline


def _run_child(argv: list[str]) -> int:
    """`python argv[0] argv[1:]` in this process; its exit status."""
    saved_argv, saved_path0 = sys.argv, sys.path[0]
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    try:
        runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as e:
        return _exit_status(e.code)
    except BaseException:  # noqa: BLE001 - as the interpreter would: traceback, status 1
        traceback.print_exc()
        return 1
    finally:
        sys.argv, sys.path[0] = saved_argv, saved_path0
        sys.stdout.flush()
        sys.stderr.flush()


def _exit_status(code: Any) -> int:
    """The status `sys.exit(code)` gives a process (None: 0; an int: itself; anything else: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF  # as the kernel reports it: sys.exit(-9) is 247
    print(code, file=sys.stderr)
    return 1
