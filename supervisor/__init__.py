"""resilient-run supervisor: a torch-free daemon that keeps a training job alive.

It talks to the job only through the run directory, whose contract (paths, records, event names,
env names, exit codes) is `trainer_shim.rundir`.

Where things live (one room per idea; each room's __init__ maps its modules):

    process/      process control: spawn, watch and stop the job's processes
                    attempts, below, cgroup, faults, first_attempt, heartbeat, launch, leftover, lock,
                    prestart, procs, snapshots, stopping, wakeup, warmable
    decisions/    what an ended attempt means and what to do next
                    choice, classify, decide, divergence, failure_policy, learned_timeout, policy,
                    smart_restarts
    insight/      what the run tells the world: records, status, reports, metrics
                    doctor, drill, export, journal, metrics, notify, periodic, progress, render,
                    report, status, timeline
    mirror/       checkpoints on S3-compatible object storage (--mirror; boto3 only when used)
                    mirror, remote, uploader, url, _client
    agent         Supervisor: one loop, signal handlers that only queue, handle_<sig>
    cli           typer: parse and render only
    cli_insight   the `doctor`, `report` and `drill` commands
    cli_options   `run`'s flags, derived from their one declaration in config (Config fields with a CliOption)
    cli_slots     the `slots` command: memory snapshot slots in /dev/shm, freeing them
    config        flags + YAML, one schema with every default; each `run` flag declared on its field
    errors        exceptions, each carrying its exit code
    jobspec       what `run`'s job tokens and run dir mean, checked before anything starts
    messages      `say`: the one-line stderr messages
"""

from __future__ import annotations

import importlib
from typing import Any

# What a user of the supervisor may rely on, and the module that defines it. Imported on first
# use, so that `import supervisor` stays cheap: the CLI pulls in typer and rich, the loop psutil
# and watchdog. Everything else is internal and may move.
_PUBLIC = {
    # the command line and the loop behind it
    "main": ".cli", "Supervisor": ".agent",
    # configuration
    "Config": ".config", "DEFAULTS": ".config", "build_config": ".config", "load_config_file": ".config",
    # how an attempt ended
    "Kind": ".decisions.classify",
    # what the commands compute
    "StatusReport": ".insight.status", "read_status": ".insight.status", "open_run_dir": ".insight.status",
    "RunReport": ".insight.report", "build_report": ".insight.report", "stop_run": ".process.stopping",
    # errors (one root) and exit codes
    "SupervisorError": ".errors", "ConfigError": ".errors", "RunDirError": ".errors", "LockedError": ".errors",
    "CgroupError": ".process.cgroup",
    "EXIT_OK": ".errors", "EXIT_GAVE_UP": ".errors", "EXIT_USAGE": ".errors", "EXIT_LOCKED": ".errors",
    "EXIT_STOPPED": ".errors", "EXIT_UNHEALTHY": ".errors", "EXIT_INVALID_CHECKPOINT": ".errors",
    "EXIT_NOT_STOPPED": ".errors", "EXIT_INTERRUPTED": ".errors",
}

__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value   # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
