"""The one helper module every test area shares: running the CLI (as a process, or in-process for bad
input), polling, killing, reading the run dir's events and records, comparing weights.

Area helpers (tests/supervisor/helpers.py, tests/shim/helpers.py, tests/faults/common.py,
tests/distributed/common.py) build on these; none restates them. torch is imported only by the
weight helpers, so supervisor-only tests stay light.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

import typer
from typer.testing import CliRunner

from supervisor import cli
from tests.conftest import JOBS, PYTHON, REPO, SHM_ENV, child_env
from trainer_shim.rundir import (
    MANIFEST_NAME, ContractError, Event, Phase, RunDir, parse_checkpoint_name, read_events, read_heartbeat, read_json,
)

T = TypeVar("T")

__all__ = ["writer_threads", "sup_env", "run_cli", "invoke_cli", "start_cli", "faulted_run", "wait_until", "kill_group", "events",
           "ended_kinds", "resumed_from", "resumed_steps", "first_steps", "rejected", "written_in", "heartbeat", "finished_step", "supervisor_state",
           "weights", "assert_equal_state", "assert_same_weights"]

CLI = [PYTHON, "-m", "supervisor"]
TOY = str(JOBS / "toy_train.py")
# Fast supervisor settings for the failure campaign: restart at once, short timeouts.
FAST = ("--backoff", "0", "--heartbeat-timeout", "3", "--grace-period", "2")


def writer_threads() -> list[str]:
    """The background writer threads of ours still alive in this process: none once a front end has
    closed its saver (a daemon writer still unwinding at interpreter exit aborts the process)."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("trainer_shim-") and t.name.endswith(("-save", "-hash"))]


def sup_env(**extra: str) -> dict[str, str]:
    env = child_env(**extra)
    env["PYTHONPATH"] = str(REPO)
    return env


def run_cli(*args: str, env: Optional[dict] = None, timeout: float = 120,
            cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=env or sup_env(), capture_output=True, text=True, timeout=timeout, cwd=cwd)


def invoke_cli(*args: str, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """The CLI's entry point in this process, through typer's CliRunner: for input it refuses before
    any process starts (no signals, restarts or daemons), at a fraction of a subprocess's cost.

    Same shape as run_cli's result; an uncaught exception is appended to stderr as its traceback, as
    the real process would print it."""
    unset = {k: None for k in os.environ if k.startswith("RESILIENT_") and k != SHM_ENV}  # as sup_env
    # main() is the entry point (it turns errors into one line and an exit code), so a one-command
    # app calls it: CliRunner then captures stdout, stderr and the SystemExit as the process would.
    command = typer.Typer(add_completion=False)
    command.command()(lambda: cli.main(list(args)))
    with contextlib.chdir(cwd) if cwd else contextlib.nullcontext():
        r = CliRunner(env=unset).invoke(command, [], catch_exceptions=True)
    err = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        err += "".join(traceback.format_exception(r.exception))
    return subprocess.CompletedProcess(list(args), r.exit_code, r.stdout, err)


def start_cli(*args: str, env: Optional[dict] = None, cwd: Optional[Path] = None) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *args], env=env or sup_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd, start_new_session=True)


def faulted_run(run_dir: Path, out: Path, job: tuple[str, ...], faults: str, kinds: list[str],
                timeout: float = 240) -> subprocess.CompletedProcess:
    """toy_train.py with TOY_FAULTS under the supervisor CLI (FAST settings): it must exit 0 after
    attempts ending as `kinds`, in order."""
    r = run_cli("--run-dir", str(run_dir), *FAST, TOY, *job, "--out", str(out), env=sup_env(TOY_FAULTS=faults),
                timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == kinds, r.stderr[-3000:]
    return r


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


def resumed_from(run_dir: Path, node: Optional[int] = None) -> list[Optional[str]]:
    """Each attempt's checkpoint path as the supervisor chose and passed it on (None: a fresh start)."""
    return [e.get("resume_from") for e in events(run_dir, Event.ATTEMPT_STARTED, node)]


def resumed_steps(run_dir: Path, node: Optional[int] = None) -> list[Optional[int]]:
    """The step of each attempt's chosen checkpoint (None: a fresh start): the record, not the log line."""
    return [parse_checkpoint_name(Path(p).name) if p else None for p in resumed_from(run_dir, node)]


def first_steps(run_dir: Path, node: Optional[int] = None) -> dict[int, int]:
    """Attempt -> the step its first counted step reached (the shim's first_step event, written with or
    without a supervisor): N + 1 after resuming from step N, 1 after a fresh start."""
    return {e["attempt"]: e["step"] for e in events(run_dir, Event.FIRST_STEP, node)}


def rejected(run_dir: Path, node: Optional[int] = None) -> list[dict]:
    """checkpoint_rejected events (either side: a damaged, untrusted or poisoned checkpoint)."""
    return events(run_dir, Event.CHECKPOINT_REJECTED, node)


def written_in(run_dir: Path, checkpoint: Path, attempt: int, node: Optional[int] = None) -> bool:
    """Whether `checkpoint` was committed by `attempt` or later (its manifest's created_at is not before
    that attempt's first_step event): a damaged checkpoint at that step was replaced, not kept."""
    import datetime

    [first] = [e for e in events(run_dir, Event.FIRST_STEP, node) if e["attempt"] == attempt]
    created = read_json(Path(checkpoint) / MANIFEST_NAME)["created_at"]
    return datetime.datetime.fromisoformat(created) >= datetime.datetime.fromisoformat(first["time"])


def heartbeat(run_dir: Path, rank: int = 0) -> Optional[dict]:
    return read_heartbeat(RunDir(run_dir).heartbeat(rank))


def finished_step(run_dir: Path, rank: int = 0) -> Optional[int]:
    """The step a trainer finished at, from its last heartbeat (None unless it says `finished`)."""
    hb = heartbeat(run_dir, rank) or {}
    return hb.get("step") if hb.get("phase") == Phase.FINISHED else None


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
    """Bitwise-equal weights: two weight files, or two out dirs of a distributed job (every rank's
    final-rank-N.pt, e.g. an interrupted run against the uninterrupted one)."""
    if not Path(b).is_dir():
        assert_equal_state(weights(a), weights(b), f"{a} vs {b}")
        return
    ranks = sorted(p.name for p in Path(b).glob("final-rank-*.pt"))
    assert ranks, f"{b}: no final-rank-*.pt"
    assert sorted(p.name for p in Path(a).glob("final-rank-*.pt")) == ranks, f"{a} vs {b}: ranks differ"
    for name in ranks:
        assert_equal_state(weights(Path(a) / name), weights(Path(b) / name), f"{name} vs the uninterrupted run")
