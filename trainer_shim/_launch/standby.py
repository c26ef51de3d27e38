"""A torchrun that has already imported torch, waiting for the supervisor to say "go".

The supervisor (torch-free) starts `python -m trainer_shim._launch.standby` while an attempt runs. It
imports torch.distributed.run, then blocks on one line from stdin: the JSON environment of the
next attempt. It then becomes `python -m torch.distributed.run ARGV` in place (same pid, same
process group, same output pipes), so a restart skips the launcher's ~1 s of imports. EOF on
stdin means the standby is not needed: it exits 0 without output.

Usage (by the supervisor only): python -m trainer_shim._launch.standby TORCHRUN_ARGS...
"""

from __future__ import annotations

import json
import os
import runpy
import sys

from ..rundir import EXIT_OK

MODULE = "torch.distributed.run"


def main() -> None:
    import torch.distributed.run  # noqa: F401  - the point: pay for the imports before the restart

    line = sys.stdin.readline()
    if not line.strip():
        sys.exit(EXIT_OK)  # the supervisor closed our stdin: not needed after all
    env = json.loads(line)["env"]
    os.environ.clear()
    os.environ.update(env)
    # Ranks must not inherit the supervisor's pipe as their stdin.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.argv = [MODULE, *sys.argv[1:]]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
