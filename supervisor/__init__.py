"""resilient-run supervisor: a torch-free daemon that keeps a training job alive.

It talks to the job only through the run directory, whose contract (paths, records, event names,
env names, exit codes) is `trainer_shim.rundir`. One module per idea:

the loop        agent        Supervisor: one loop, signal handlers that only queue, handle_<sig>
                wakeup       self-pipe + signal queue the loop sleeps on
                heartbeat    per-rank liveness from file events and a timer, on our own clock
an attempt      procs        spawn in its own group (die-with-parent), tee the log, kill whole trees
                attempts     Attempt (what runs) and AttemptResult (how it ended, assessed once)
                launch       the torchrun argv; torchrun's per-rank ProcessFailure records
                classify     exactly one Kind per ended attempt, with its evidence
                cgroup       --memory-limit cgroups and the kernel's OOM-kill evidence
after it        decide       one Verdict: smart_restarts (divergence, per-kind budgets) + policy (backoff,
                             crash loops); failure_policy (per-kind argv/env changes), divergence
                choice       the newest valid, never-poisoned checkpoint to resume from
                snapshots    persist a memory snapshot newer than the disk before any choice
                prestart     the next attempt's launcher (prestarted torchrun or warm interpreter)
                learned_timeout  --heartbeat-timeout auto
records         journal      the lock, events.jsonl and supervisor.json (retried when the disk is full),
                             history left by earlier supervisors, a leftover trainer
                metrics      the Prometheus textfile; progress: goodput/lost steps/ETA for it
                notify       systemd sd_notify (READY, WATCHDOG, STATUS)
the CLI         cli, cli_insight   typer: parse only; config (flags + YAML, one schema)
                jobspec      what `run`'s job tokens and run dir mean, checked before anything starts
                render       reports to text and rich tables (status, checkpoints, watch, doctor)
                status, stopping, report, doctor, export   the logic the commands call (plain functions)
                messages     `say`: the one-line stderr messages; errors: exceptions with exit codes
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
    "Kind": ".classify",
    # what the commands compute
    "StatusReport": ".status", "read_status": ".status", "open_run_dir": ".status",
    "RunReport": ".report", "build_report": ".report", "stop_run": ".stopping",
    # errors (one root) and exit codes
    "SupervisorError": ".errors", "ConfigError": ".errors", "RunDirError": ".errors", "LockedError": ".errors",
    "CgroupError": ".cgroup",
    "EXIT_OK": ".errors", "EXIT_GAVE_UP": ".errors", "EXIT_USAGE": ".errors", "EXIT_LOCKED": ".errors",
    "EXIT_STOPPED": ".errors",
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
