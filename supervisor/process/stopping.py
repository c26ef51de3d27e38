"""`resilient-run stop`: ask a run's live supervisor to stop (SIGTERM) and wait until it has exited."""

from __future__ import annotations

import signal
import socket
import time
from typing import Optional

from trainer_shim.rundir import RunDir, SupervisorState, lock_pid

from . import procs
from ..errors import EXIT_NOT_STOPPED, EXIT_OK
from ..messages import say
from ..insight.render import stop_summary
from ..insight.status import read_status, recorded_config, supervisor_state

__all__ = ["stop_run", "stop_one"]

POLL_S = 0.1


def stop_run(parts: list[RunDir], timeout: Optional[float], wait: bool) -> int:
    """Stop every supervisor in `parts` (a multi-node run dir's nodes on this host); the worst exit code."""
    return max((stop_one(rd, timeout, wait) for rd in parts), default=EXIT_OK)


def _where(rd: RunDir) -> str:
    return f"{rd.root}" + ("" if rd.node is None else f" (node {rd.node})")


def _live_supervisor(rd: RunDir, state: Optional[SupervisorState]) -> Optional[int]:
    """The pid to signal, or None (after saying why) when no provable live supervisor of `rd` runs here."""
    where = _where(rd)
    holder = lock_pid(rd)
    if holder is None:
        say(f"no supervisor is running on {where}")
        return None
    host = state.host if state else None
    if host and host != socket.gethostname():
        say(f"the supervisor of {where} runs on host {host}; run `resilient-run stop` there")
        return None
    pid = state.supervisor_pid if state else None
    if state is None or procs.matches(pid, state.supervisor_create_time) is None or pid != holder:
        # Never signal a pid we cannot prove is this run's supervisor (stale or forged record).
        say(f"supervisor.json names pid {pid}, which is not the live supervisor of {where} "
            f"(lock held by pid {holder}); not signalling")
        return None
    return int(pid)


def stop_one(rd: RunDir, timeout: Optional[float], wait: bool) -> int:
    """SIGTERM `rd`'s supervisor and (with `wait`) wait up to `timeout` s (default grace + 30) for it to exit."""
    state = supervisor_state(rd)
    pid = _live_supervisor(rd, state)
    if pid is None:
        return EXIT_NOT_STOPPED
    procs.signal_pid(pid, signal.SIGTERM)
    if not wait:
        say(f"sent SIGTERM to supervisor pid {pid}")
        return EXIT_OK
    limit = timeout if timeout is not None else recorded_config(state).grace_period + 30
    deadline = time.monotonic() + limit
    while lock_pid(rd) is not None and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if lock_pid(rd) is not None:
        say(f"supervisor pid {pid} is still running after {limit:g}s")
        return EXIT_NOT_STOPPED
    say(stop_summary(_where(rd), read_status(rd)))
    return EXIT_OK
