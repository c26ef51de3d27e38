"""`resilient-run drill`: rehearse a failure on a live supervised run and show how it was handled.

A real fault hits the trainer of one rank (named by its heartbeat, checked to be a process of the
live supervisor's attempt); then the records are polled until the next attempt takes its first
step, and what the supervisor recorded is read back: the kind and evidence of the ended attempt,
the checkpoint the next one resumed, and the recovery split exactly as `report` computes it.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from pathlib import Path
from typing import Optional

from trainer_shim.rundir import (EXIT_NOT_RECOVERED, EXIT_OK, EXIT_USAGE, Event, HeartbeatRecord, Kind, Phase, RunDir,
                                 RunState, SupervisorState, lock_pid, read_events, read_heartbeat_record)

from ..agent import STACK_DUMP_WAIT
from ..errors import SupervisorError
from ..messages import say
from ..process import faults, procs
from ..process.cgroup import memory_limit_of
from ..process.heartbeat import allowance
from .report import AttemptCost, build_report
from .status import open_run_dir, recorded_config, supervised_parts, supervisor_state

__all__ = ["FAULTS", "DrillRefused", "DrillResult", "run_drill", "render_text"]

# Each fault and the kind the supervisor is expected to record for it.
FAULTS = {"kill": Kind.SIGNAL, "hang": Kind.HANG, "oom": Kind.OOM}
POLL_S = 0.1
# What ends a run: seen after the fault, the next attempt will never come.
_RUN_ENDS = (Event.GAVE_UP, Event.FINISHED, Event.STOPPED)


class DrillRefused(SupervisorError):
    """The run cannot be drilled (not live, not supervised, no memory limit for `oom`); nothing was done."""

    exit_code = EXIT_USAGE


@dataclasses.dataclass
class DrillResult:
    """What a drill did and what the supervisor recorded about it."""

    fault: str
    rank: int
    pid: int                                   # the trainer the fault hit
    attempt: int                               # the attempt it belonged to
    expected_kind: str
    outcome: str                               # "recovered", or why no next attempt took a step
    kind: Optional[str] = None                 # what the supervisor recorded for `attempt`
    evidence: Optional[str] = None
    next_attempt: Optional[int] = None
    resumed_from: Optional[str] = None         # the checkpoint the next attempt was started from
    first_step: Optional[int] = None           # the step the next attempt's first step reached
    recovery: Optional[AttemptCost] = None     # `report`'s row of the next attempt (recover_* fields)

    @property
    def recovered(self) -> bool:
        return self.outcome == "recovered"

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.recovered else EXIT_NOT_RECOVERED

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "recovered": self.recovered}


@dataclasses.dataclass(frozen=True)
class _Live:
    rd: RunDir                # the supervisor's part of the run dir (a node's, in a multi-node run)
    state: SupervisorState
    heartbeat: HeartbeatRecord
    target: faults.Target


def _refuse(why: str) -> DrillRefused:
    return DrillRefused(why.replace("\n", " "))


def _live_trainer(rd: RunDir, rank: int) -> _Live:
    """The trainer of `rank` in the live supervisor's current attempt, or DrillRefused saying why not."""
    hb = read_heartbeat_record(rd.heartbeat(rank))
    part = next((p for p in supervised_parts(rd) if hb is None or p.owns_heartbeat(hb)), rd)
    holder = lock_pid(part)
    if holder is None:
        if hb is not None and hb.phase != Phase.FINISHED.value and faults.Target.of(hb.pid) is not None:
            raise _refuse(f"{rd.root} is not supervised: rank {rank}'s trainer (pid {hb.pid}) runs without "
                          "`resilient-run run`, so nothing would recover it")
        raise _refuse(f"{rd.root} is not live: no supervisor holds it (a drill needs a job running under `resilient-run run`)")
    state = supervisor_state(part)
    if state is None or state.supervisor_pid != holder or procs.matches(holder, state.supervisor_create_time) is None:
        raise _refuse(f"cannot prove pid {holder}, which holds {part.lock}, is the supervisor supervisor.json names")
    if state.host and state.host != socket.gethostname():
        raise _refuse(f"the supervisor of {rd.root} runs on host {state.host}; run the drill there")
    if state.state != RunState.RUNNING.value:
        raise _refuse(f"{rd.root} has no running attempt (supervisor state: {state.state}); try again once it trains")
    if hb is None or hb.attempt != state.attempt or hb.phase in (Phase.FINISHED.value, Phase.STOPPING.value):
        raise _refuse(f"rank {rank} of attempt {state.attempt} has no live heartbeat in {rd.root}")
    target = faults.Target.of(hb.pid)
    # The heartbeat's pid must be a process of the attempt the supervisor runs: never a stranger
    # that reused the pid of a trainer that has just died.
    child = procs.matches(state.child_pid, state.child_create_time)
    if target is None or child is None or hb.pid not in {p.pid for p in procs.tree(child.pid)}:
        raise _refuse(f"rank {rank}'s trainer (pid {hb.pid}) is not a running process of attempt {state.attempt}")
    return _Live(part, state, hb, target)


def _deadline_s(fault: str, live: _Live) -> float:
    """The longest the supervisor may take from the fault to the next attempt's first step: detect (a
    hang: the heartbeat allowance of the phase it stopped in, then the stack dumps), stop, the
    longest backoff, and a start-up that may itself go quiet for its whole allowance."""
    cfg = recorded_config(live.state)
    # A stopped trainer cannot change its phase: the one it beat last is the one it is judged in.
    detect = allowance(live.heartbeat.phase, cfg) + STACK_DUMP_WAIT if fault == "hang" else 0.0
    return detect + cfg.grace_period + cfg.backoff_max + allowance(Phase.STARTING.value, cfg) + cfg.heartbeat_timeout


def _inject(fault: str, live: _Live, seconds: float):
    """Hit the trainer; the OOM allocator's process (to be ended by the caller) or None."""
    t = live.target
    if fault == "oom":
        limit = memory_limit_of(t.pid)
        if limit is None:
            raise _refuse(f"rank {live.heartbeat.rank}'s trainer (pid {t.pid}) has no memory limit, so an OOM drill "
                          "would fill the machine; rerun the job with --memory-limit")
        try:
            hog = faults.start_oom(t, limit, seconds)
        except OSError as e:
            raise _refuse(f"cannot drill an OOM in {limit.cgroup.path}: {e}") from None
        if hog is None:
            raise _refuse(f"rank {live.heartbeat.rank}'s trainer (pid {t.pid}) ended before the drill")
        return hog
    hit = faults.kill(t) if fault == "kill" else faults.stop(t)
    if not hit:
        raise _refuse(f"rank {live.heartbeat.rank}'s trainer (pid {t.pid}) ended before the drill")
    return None


def _wait(rd: RunDir, attempt: int, deadline: float) -> tuple[str, Optional[dict]]:
    """Poll the records until an attempt after `attempt` takes its first step: ("recovered", its
    first_step event), or why it will not (the run ended, the supervisor exited, the deadline)."""
    while True:
        # Asked before the events are read: a supervisor that exits after writing the first step
        # is then never taken for one that exited without it.
        gone, late = lock_pid(rd) is None, time.monotonic() > deadline
        events = read_events(rd)
        first = next((e for e in events if e.get("event") == Event.FIRST_STEP
                      and isinstance(e.get("attempt"), int) and e["attempt"] > attempt), None)
        if first is not None:
            return "recovered", first
        end = next((e for e in events if e.get("event") in _RUN_ENDS and isinstance(e.get("attempt"), int)
                    and e["attempt"] >= attempt), None)
        if end is not None:
            return f"the run ended ({end['event']}) before another attempt took a step", None
        if gone:
            return "the supervisor exited before another attempt took a step", None
        if late:
            return "no attempt took a step before the supervisor's own allowances ran out", None
        time.sleep(POLL_S)


def run_drill(run_dir: "str | Path", fault: str, rank: int = 0) -> DrillResult:
    """Inject `fault` (kill, hang, oom) into rank `rank`'s trainer of the live run at `run_dir`, wait
    for the next attempt's first step and return what was recorded. DrillRefused before any fault."""
    if fault not in FAULTS:
        raise _refuse(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
    live = _live_trainer(open_run_dir(run_dir), rank)
    seconds = _deadline_s(fault, live)
    hog = _inject(fault, live, seconds)
    # The wait may be long (a hang is seen only after the heartbeat timeout): say what is awaited.
    say(f"{fault} injected into pid {live.target.pid} (attempt {live.state.attempt}); waiting up to "
        f"{seconds:.0f}s for the next attempt's first step")
    try:
        outcome, first = _wait(live.rd, live.state.attempt or 0, time.monotonic() + seconds)
    finally:
        if hog is not None:   # it exits by itself once the trainer is gone; never left behind
            hog.kill()
            hog.wait()
    return _result(live, fault, outcome, first)


def _result(live: _Live, fault: str, outcome: str, first: Optional[dict]) -> DrillResult:
    """What the supervisor recorded: its attempt_ended and attempt_started events and `report`'s row."""
    n = live.state.attempt or 0
    res = DrillResult(fault=fault, rank=live.heartbeat.rank, pid=live.target.pid, attempt=n,
                      expected_kind=FAULTS[fault].value, outcome=outcome)
    events = read_events(live.rd)
    ended = next((e for e in events if e.get("event") == Event.ATTEMPT_ENDED and e.get("attempt") == n), None)
    if ended is not None:
        res.kind, res.evidence = ended.get("kind"), ended.get("evidence")
    if first is None:
        return res
    res.next_attempt, res.first_step = first["attempt"], first.get("step")
    started = next((e for e in events if e.get("event") == Event.ATTEMPT_STARTED and e.get("attempt") == first["attempt"]), None)
    res.resumed_from = started.get("resume_from") if started else None
    res.recovery = next((c for c in build_report(live.rd).attempts if c.attempt == first["attempt"]), None)
    return res


_HOW = {"kill": "SIGKILL", "hang": "SIGSTOP (a hang)", "oom": "an allocation to its memory limit"}


def render_text(res: DrillResult) -> str:
    """A few lines for a human: the fault, what was recorded, the resume, the recovery split."""
    def s(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.2f}s"

    lines = [f"drill {res.fault}: {_HOW[res.fault]} to rank {res.rank}'s trainer, pid {res.pid} (attempt {res.attempt})"]
    if res.kind is not None:
        unexpected = "" if res.kind == res.expected_kind else f" (expected {res.expected_kind})"
        lines.append(f"recorded: {res.kind}{unexpected}: {res.evidence or ''}")
    if not res.recovered:
        lines.append(f"not recovered: {res.outcome}")
        return "\n".join(lines)
    lines.append(f"resumed:  attempt {res.next_attempt} from {res.resumed_from or 'a fresh start'} "
                 f"(first step {res.first_step})")
    c = res.recovery
    if c is not None:
        lines.append(f"recovery: {s(c.recover_total)} = detect {s(c.recover_detect)} / stop {s(c.recover_stop)} / "
                     f"start {s(c.recover_start)} / restore {s(c.recover_restore)} / first step {s(c.recover_first_step)}")
    return "\n".join(lines)
