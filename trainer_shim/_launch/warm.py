"""A Python interpreter that has already imported torch, waiting to run the next attempt of SCRIPT.py.

The supervisor (torch-free) starts `python -m trainer_shim._launch.warm [--preload M1,M2] SCRIPT.py ARGS...`
while an attempt of a single-process job trains. It imports torch (and the --preload modules), then
blocks on one line from stdin: the contract's StandbyMessage with the next attempt's environment.
It then runs SCRIPT.py as `__main__` with `runpy.run_path` in this same process (same pid, process
group, output pipes, PDEATHSIG and oom_score_adj as the supervisor spawned it), so a restart skips
the interpreter start and torch's ~1.5 s of imports. EOF on stdin: not needed, exit 0 silently.

The script itself is read fresh from disk at that moment: only the preloaded modules are shared
with the interpreter's start, never the script's own code. Exceptions, `sys.exit` codes and
signals leave this process exactly as they leave `python SCRIPT.py` (the interpreter's own exit
path: the traceback is printed by sys.excepthook and the exit code is 1).

Usage (by the supervisor only): python -m trainer_shim._launch.warm [--preload=M1,M2] [--ready=FILE] SCRIPT.py ARGS...
(FILE is created once the imports are done.)
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys

from ..rundir import EXIT_OK, StandbyMessage


def main() -> None:
    argv = sys.argv[1:]
    preload: list[str] = []
    ready = None
    while argv and argv[0].startswith(("--preload=", "--ready=")):
        opt, _, val = argv[0].partition("=")
        if opt == "--preload":
            preload = [m for m in val.split(",") if m]
        else:
            ready = val
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m trainer_shim._launch.warm [--preload M1,M2] SCRIPT.py ARGS...")
    import torch  # noqa: F401  - the point: pay for the imports before the restart

    import torch._dynamo  # noqa: F401  - every torch.optim.Optimizer() imports it lazily: ~0.7 s at the first step
    import trainer_shim._loop.run  # noqa: F401  - the shim's training path, imported lazily by trainer_shim.init

    for name in preload:
        importlib.import_module(name)
    if ready:  # the supervisor uses this interpreter only once its imports are done (else it starts cold)
        open(ready, "w").close()
    msg = StandbyMessage.from_line(sys.stdin.buffer.readline())
    if msg is None:
        sys.exit(EXIT_OK)
    os.environ.clear()
    os.environ.update(msg.env)
    # The attempt must not inherit the supervisor's pipe as its stdin (a cold attempt gets /dev/null).
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    script = argv[0]
    sys.argv = list(argv)
    # What `python SCRIPT.py` puts first on sys.path: the script's directory, not ours.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
