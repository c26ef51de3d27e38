"""The supervisor's own records in the run dir: events.jsonl, supervisor.json, and the history an
earlier supervisor of the same run dir left behind. (Taking the lock and ending a trainer that
outlived its supervisor are process control: supervisor.process.lock and .leftover.)

Writes never stop supervision: a failed write (disk full) is kept, warned about once, and retried
by the loop's tick until it lands, in order.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections import Counter
from typing import Any, Callable, Optional

from trainer_shim.rundir import (
    ContractError, Event, RunDir, SupervisorState, append_event, atomic_write_json, next_attempt_number,
    now_iso, poisoned_checkpoints, read_events,
)

from ..process import procs
from ..decisions.classify import Kind
from ..config import Config
from ..messages import say

__all__ = ["Journal", "History", "recover_history", "state_record"]


@dataclasses.dataclass
class History:
    """What carries over from earlier supervisors of this run dir."""

    attempt_no: int = 0                      # the last attempt number used
    attempts_total: int = 0
    failures: Counter = dataclasses.field(default_factory=Counter)   # kind -> count
    poisoned: set = dataclasses.field(default_factory=set)           # checkpoint paths never to resume from


def recover_history(rd: RunDir) -> History:
    """Attempt numbers, failure counts and poisoned checkpoints from events.jsonl (empty when unreadable)."""
    try:
        events = read_events(rd)
    except ContractError:
        events = []
    h = History(attempt_no=next_attempt_number(events) - 1, poisoned=poisoned_checkpoints(events))
    for ev in events:
        if ev.get("event") == Event.ATTEMPT_ENDED and ev.get("kind") not in (None, Kind.SUCCESS.value):
            h.failures[str(ev["kind"])] += 1
        if ev.get("event") == Event.ATTEMPT_STARTED:
            h.attempts_total += 1
    return h


def state_record(state: str, rd: RunDir, child: Optional[procs.Child], *, attempt: int, restarts: int,
                 started_at: str, config: Config) -> SupervisorState:
    """supervisor.json now. The child's pid comes with its create time and command line, so a later
    supervisor can tell a leftover trainer from a process that reused the pid."""
    me = procs.identity_of(os.getpid())
    cfg = dataclasses.asdict(config)
    cfg["env"] = {k: "***" for k, _ in config.env}  # names only: values may be secrets
    return SupervisorState(
        state=state, supervisor_pid=os.getpid(), node=rd.node, host=socket.gethostname(),
        supervisor_create_time=me.create_time if me else None,
        child_pid=child.pid if child else None,
        child_create_time=child.identity.create_time if child else None,
        child_cmdline=list(child.popen.args) if child else None,
        attempt=attempt or None, restarts=restarts, started_at=started_at, updated_at=now_iso(), config=cfg,
    )


class Journal:
    """events.jsonl and supervisor.json, written in order with retry."""

    def __init__(self, rd: RunDir, state: Callable[[], SupervisorState]) -> None:
        self.rd = rd
        self._state = state              # builds today's supervisor.json on each write
        self._pending: list[tuple[str, Optional[int], dict]] = []
        self._state_dirty = False
        self._warned: set[str] = set()

    @property
    def behind(self) -> bool:
        """Something failed to land and waits for `flush()`."""
        return bool(self._pending) or self._state_dirty

    def emit(self, event: Event, attempt: Optional[int], **fields: Any) -> None:
        self._pending.append((event.value, attempt, fields))
        self.flush()

    def write_state(self) -> None:
        self._state_dirty = True
        self.flush()

    def flush(self) -> None:
        """Write pending events, then the state; on failure keep them for the next try."""
        while self._pending:
            event, attempt, fields = self._pending[0]
            try:
                append_event(self.rd, event, attempt, **fields)
            except OSError as e:
                self.warn(str(self.rd.events), e)
                break
            self._pending.pop(0)
            self._warned.discard(str(self.rd.events))
        if self._state_dirty:
            try:
                atomic_write_json(self.rd.supervisor_state, self._state().to_json())
                self._state_dirty = False
                self._warned.discard(str(self.rd.supervisor_state))
            except OSError as e:
                self.warn(str(self.rd.supervisor_state), e)

    def warn(self, path: str, e: OSError) -> None:
        """Say once per path that a write failed; supervision goes on."""
        if path not in self._warned:
            self._warned.add(path)
            say(f"cannot write {path} ({e.strerror or e}); still supervising, will retry")
