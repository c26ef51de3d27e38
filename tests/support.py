"""The one helper module every test area shares: polling, killing, reading the run dir, comparing weights.

Area helpers (tests/supervisor/helpers.py, tests/shim/helpers.py, tests/faults/common.py,
tests/distributed/common.py) build on these; none restates them. torch is imported only by the
weight helpers, so supervisor-only tests stay light.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

from trainer_shim.rundir import ContractError, Event, RunDir, read_events, read_heartbeat, read_json

T = TypeVar("T")

__all__ = ["wait_until", "kill_group", "events", "ended_kinds", "heartbeat", "supervisor_state", "weights",
           "assert_equal_state", "assert_same_weights"]


def wait_until(pred: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = "condition") -> T:
    """Poll `pred` until it returns something truthy and return that; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def kill_group(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGKILL a process started with start_new_session=True and its whole group (orphaned workers too)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait(timeout)


def events(run_dir: Path, name: "Event | str | None" = None, node: Optional[int] = None) -> list[dict]:
    """The run dir's events (of one supervisor `node` in a multi-node run dir), only `name` when given."""
    return [e for e in read_events(RunDir(run_dir, node)) if name is None or e.get("event") == name]


def ended_kinds(run_dir: Path, node: Optional[int] = None) -> list[str]:
    return [e["kind"] for e in events(run_dir, Event.ATTEMPT_ENDED, node)]


def heartbeat(run_dir: Path, rank: int = 0) -> Optional[dict]:
    return read_heartbeat(RunDir(run_dir).heartbeat(rank))


def supervisor_state(run_dir: Path, node: Optional[int] = None) -> dict:
    """supervisor.json as a dict ({} while absent or being replaced)."""
    try:
        st = read_json(RunDir(run_dir, node).supervisor_state)
    except ContractError:
        return {}
    return st if isinstance(st, dict) else {}


def weights(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def assert_equal_state(got: dict, want: dict, what: str = "weights") -> None:
    """Bitwise equality of two state dicts, naming the tensors that differ."""
    import torch

    assert got.keys() == want.keys(), f"{what}: keys differ"
    diff = [k for k in want if not torch.equal(got[k], want[k])]
    assert not diff, f"{what}: tensors differ: {diff}"


def assert_same_weights(a: Path, b: Path) -> None:
    assert_equal_state(weights(a), weights(b), f"{a} vs {b}")
