"""A Python interpreter that has already imported torch, waiting to run the next attempt of a Python job.

The supervisor (torch-free) starts `python -m trainer_shim._launch.warm [OPTIONS] TARGET` while an
attempt of a single-process job trains, TARGET being `SCRIPT ARGS...` (for `python SCRIPT.py` and for
a console script, whose file is the SCRIPT) or `-m MODULE ARGS...` (for `python -m MODULE`). It
imports torch (and the --preload modules), then blocks on one line from stdin: the contract's
StandbyMessage with the next attempt's environment. While it waits it also imports the frameworks
the running attempt recorded (rundir.warm), and keeps the memory a restore from the run's memory
snapshot slots (--slots) will land in faulted in (_restore.landing). It then runs TARGET as `__main__` in this same process
(same pid, process group, output pipes, PDEATHSIG and oom_score_adj as the supervisor spawned it),
so a restart skips the interpreter start and torch's ~1.5 s of imports. A launcher's trainer child
(`swift sft` runs `python FILE.py ARGS` and waits) runs in this process as well (`inline`), so it
starts warm too. EOF on stdin: not needed, exit 0 silently.

The script or module itself is read fresh from disk at that moment: only the preloaded modules are
shared with the interpreter's start, never the job's own code. Exceptions, `sys.exit` codes and
signals leave this process exactly as they leave `python SCRIPT.py` (the interpreter's own exit
path: the traceback is printed by sys.excepthook and the exit code is 1).

Usage (by the supervisor only):
  python -m trainer_shim._launch.warm [--preload=M1,M2] [--ready=FILE] [--frameworks=RECORD] [--slots=S0,S1]
                                      [--run-dir=RUN_DIR [--node=N]] TARGET
FILE is written once the imports are done (rundir.write_warm_ready); RECORD is the run dir's frameworks
record; S0,S1 are the attempt's memory snapshot slots (rundir.snapshot_slot_paths); RUN_DIR (and N)
name the run in the process title (rundir.titles): `standby RUN_DIR (waiting)`, then the trainer's.
"""

from __future__ import annotations

import importlib
import os
import runpy
import select
import sys
from pathlib import Path
from typing import Optional

from . import inline, threads
from .._restore import landing
from ..rundir import (
    ENV_ATTEMPT, ENV_NODE, ENV_RUN_DIR, EXIT_OK, StandbyMessage, frameworks_of_child, set_title, standby_title,
    trainer_title, write_warm_ready,
)

# How often a waiting interpreter looks at the frameworks record and the slots: a few stats and a small
# read, while the next import would come seconds later anyway (the attempt writes the record at its
# first step).
FRAMEWORKS_POLL_S = 0.5
_OPTIONS = ("--preload", "--ready", "--frameworks", "--slots", "--run-dir", "--node")


def main() -> None:
    opts, target = _parse(sys.argv[1:])
    if not target or (target[0] == "-m" and len(target) < 2):
        sys.exit("usage: python -m trainer_shim._launch.warm [--preload=M1,M2] [--ready=FILE] "
                 "[--frameworks=RECORD] (SCRIPT | -m MODULE) ARGS...")
    if opts.get("--run-dir"):   # before the imports: an importing standby is as idle as a waiting one
        set_title(standby_title(opts["--run-dir"], _node(opts.get("--node"))))
    import torch  # noqa: F401  - the point: pay for the imports before the restart

    import torch._dynamo  # noqa: F401  - every torch.optim.Optimizer() imports it lazily: ~0.7 s at the first step
    import trainer_shim._loop.run  # noqa: F401  - the shim's training path, imported lazily by trainer_shim.init
    # What a resumed attempt loads after init() (a cold start pays for it at its first restore and save).
    import trainer_shim._disk.save  # noqa: F401
    import trainer_shim._restore.apply  # noqa: F401

    preloaded = [m for m in opts.get("--preload", "").split(",") if m]
    for name in preloaded:
        importlib.import_module(name)
    ready, record = opts.get("--ready"), opts.get("--frameworks")
    slots = [Path(p) for p in opts.get("--slots", "").split(",") if p]
    msg = _wait(Path(ready) if ready else None, Path(record) if record else None, preloaded, slots)
    if msg is None:
        sys.exit(EXIT_OK)
    os.environ.clear()
    os.environ.update(msg.env)
    _title_as_trainer(target)
    threads.follow()  # the script's own OMP_NUM_THREADS counts, as in a cold start
    # The attempt must not inherit the supervisor's pipe as its stdin (a cold attempt gets /dev/null).
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    _run(target)


def _parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    while argv and argv[0].startswith(tuple(f"{o}=" for o in _OPTIONS)):
        opt, _, val = argv[0].partition("=")
        opts[opt] = val
        argv = argv[1:]
    return opts, argv


def _node(value: Optional[str]) -> Optional[int]:
    return int(value) if value and value.isdigit() else None


def _title_as_trainer(target: list[str]) -> None:
    """From here on this process is the attempt: it must not read `standby (waiting)` while the
    script imports and loads, before its init() titles it with its rank (0: one process)."""
    run_dir, attempt = os.environ.get(ENV_RUN_DIR), os.environ.get(ENV_ATTEMPT, "")
    if run_dir and attempt.isdigit():
        command = [os.path.basename(sys.executable), *target]
        set_title(trainer_title(run_dir, rank=0, attempt=int(attempt), command=command,
                                node=_node(os.environ.get(ENV_NODE))))


def _wait(ready: Optional[Path], record: Optional[Path], preloaded: list[str],
          slots: list[Path]) -> Optional[StandbyMessage]:
    """Block until the supervisor's message; meanwhile import the frameworks the running attempt
    recorded, and keep a restore's landing memory faulted in. The ready file names what is imported,
    and is absent while an import is under way (a message read then waits for it: the attempt would
    import the framework itself, later)."""
    if ready:
        write_warm_ready(ready, preloaded)
    stdin = sys.stdin.buffer
    while (record or slots) and not select.select([stdin], [], [], FRAMEWORKS_POLL_S)[0]:
        if slots:
            landing.keep_ready(slots)
        if record is None:
            continue
        new = [m for m in frameworks_of_child(record, os.getppid()) if m not in preloaded]
        if not new:
            continue
        if ready:
            ready.unlink(missing_ok=True)
        for name in new:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the attempt imports it itself and meets the error there
                pass
            preloaded.append(name)  # tried once: never again, whatever came of it
        if ready:
            write_warm_ready(ready, [m for m in preloaded if m in sys.modules])
    return StandbyMessage.from_line(stdin.readline())


def _run(target: list[str]) -> None:
    """Run TARGET as `python SCRIPT ARGS` or `python -m MODULE ARGS` would: the same sys.argv and sys.path[0].
    A launcher's `python FILE.py` child runs in this process too (`inline`)."""
    inline.install()
    if target[0] == "-m":
        # `python -m` puts the working directory first on sys.path: so did ours (started as `-m` in the
        # same cwd). sys.argv[0] is the module's file: run_module's alter_sys sets it, as `-m` does.
        sys.argv = ["-m", *target[2:]]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        return
    script = target[0]
    sys.argv = list(target)
    # What `python SCRIPT.py` puts first on sys.path: the script's directory, not ours.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
