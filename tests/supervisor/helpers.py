"""Helpers for supervisor tests: run the real CLI as a subprocess and read the run dir it leaves."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Optional

import psutil

from supervisor.process.warmable import WARM_MODULE
from tests.conftest import JOBS
from tests.support import (  # noqa: F401 - re-exported
    CLI, ended_kinds, events, heartbeat, kill_group, run_cli, start_cli, sup_env, supervisor_state, wait_until,
)
from trainer_shim.rundir import Event, RunDir, read_warm_ready, standby_title

FAKE_JOB = str(JOBS / "fake_job.py")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def attempt_pids(run_dir: Path) -> list[int]:
    return [e["pid"] for e in events(run_dir, "attempt_started")]


def no_standby_left(marker: str) -> None:
    """No idle warm interpreter of this test is left running: one whose command line holds `marker` (a
    test's own path), or one whose process title names a run dir beside it (the standby retitles itself)."""
    titled = standby_title(Path(marker).parent).head
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        assert not (WARM_MODULE in cmd and any(marker in c for c in cmd)), cmd
        assert not " ".join(cmd).startswith(titled), cmd


def warm_run(rd: Path, command: list[str], env: dict, cwd: Optional[Path] = None, imported: tuple[str, ...] = (),
             kill_trainer: bool = False) -> None:
    """`resilient-run -- command`, its attempt 1 SIGKILLed once attempt 2's warm interpreter has imported
    torch and `imported` (its ready file, polled) and attempt 1 is past step 5 (a checkpoint): the job
    must succeed with attempt 2 run warm by a ready interpreter. `kill_trainer`: the process that
    heartbeats is killed (a launcher's child), not the attempt's own process."""
    p = start_cli("--run-dir", str(rd), "--backoff", "0", "--", *command, env=env, cwd=cwd)
    try:
        def ready() -> bool:
            mods = read_warm_ready(RunDir(rd).warm_ready(2))
            return (p.poll() is None and mods is not None and set(imported) <= set(mods)
                    and ((heartbeat(rd) or {}).get("step") or 0) > 5)

        wait_until(ready, timeout=90, what=f"attempt 2's warm interpreter with {imported or 'torch'} imported")
        victim = heartbeat(rd)["pid"] if kill_trainer else events(rd, Event.ATTEMPT_STARTED)[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        _, err = p.communicate(timeout=180)
    finally:
        kill_group(p)
    assert p.returncode == 0, err[-3000:]
    assert ended_kinds(rd) == ["signal", "success"]
    started = events(rd, Event.ATTEMPT_STARTED)
    assert [(e["warm"], e["warm_ready"]) for e in started] == [(False, False), (True, True)], started
