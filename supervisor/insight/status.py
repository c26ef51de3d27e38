"""What a run dir says about its job: status report and checkpoint listing (read-only, no torch)."""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import psutil

from trainer_shim.rundir import (
    MANIFEST_NAME, ContractError, Event, HeartbeatRecord, InvalidCheckpoint, Phase, RunDir, RunState, SupervisorState,
    checkpoint_roots, commit_age, inspect_checkpoint, iter_checkpoint_dirs, newest_valid, parse_checkpoint_name,
    reached_step, read_events, read_heartbeat_record, read_index, run_slots, stale_reason,
)

from ..process import procs
from ..decisions.classify import Kind
from ..config import DEFAULTS, Config
from ..errors import RunDirError, SupervisorError
from ..process.heartbeat import allowance
from ..messages import say
from .progress import Progress, progress_of

__all__ = ["StatusReport", "read_status", "supervisor_state", "CheckpointRow", "list_checkpoints", "open_run_dir",
           "supervised_parts"]

FINAL_STATES = tuple(s.value for s in RunState if s.final)


def open_run_dir(path: str | Path) -> RunDir:
    """The RunDir at `path`, or RunDirError (exit 2) naming the problem."""
    rd = RunDir(Path(path))
    if not rd.root.exists():
        raise RunDirError(f"{rd.root} does not exist; pass the run dir of a job (e.g. runs/train)")
    if not rd.root.is_dir():
        raise RunDirError(f"{rd.root} is not a directory; pass the run dir of a job (e.g. runs/train)")
    if not rd.is_run_dir():
        raise RunDirError(f"{rd.root} is not a run dir (no supervisor.json, events.jsonl or checkpoints/)")
    return rd


def supervised_parts(rd: RunDir) -> list[RunDir]:
    """One RunDir per supervisor of the run: the run dir itself, or each node's of a multi-node job."""
    nodes = rd.node_numbers() if rd.node is None and not rd.supervisor_state.exists() else []
    return [rd.for_node(n) for n in nodes] or [rd]


def recorded_config(state: Optional[SupervisorState]) -> Config:
    """The configuration the live supervisor recorded (its numbers only), else the defaults."""
    cfg = state.config if state is not None else {}
    known = {f.name for f in dataclasses.fields(Config)}
    values = {k: v for k, v in cfg.items() if k in known and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return dataclasses.replace(DEFAULTS, **values)


@dataclasses.dataclass(frozen=True)
class StatusReport:
    """`status --json`; `healthy` decides the exit code (0 running with a fresh heartbeat, or succeeded)."""

    state: str
    supervisor_pid: Optional[int]
    child_pid: Optional[int]
    attempt: Optional[int]
    restarts: Optional[int]
    heartbeat_age_s: Optional[float]
    step: Optional[int]
    epoch: Optional[int]
    loss: Optional[float]
    last_failure: Optional[dict]
    latest_checkpoint: Optional[dict]
    phase: Optional[str] = None
    heartbeat_fresh: bool = False
    checkpoint_age_s: Optional[float] = None
    disk_free_bytes: Optional[int] = None
    save_interval_s: Optional[float] = None   # the shim's current save_every_seconds="auto" interval
    progress: Optional[Progress] = None
    supervisor_alive: bool = False
    stop: Optional[dict] = None   # a requested stop that ended the run: {"attempt", "saved", "step"}
    mirrored: Optional[dict] = None   # --mirror: the newest checkpoint on object storage {"url", "step", "at"}
    # memory snapshot slots in /dev/shm: {"bytes", "live_owner_pid", "owners", "slots", "stale"}; None if none
    memory_slots: Optional[dict] = None
    # rank 0's pid from its heartbeat (this attempt's): child_pid is a launcher's (swift, sh -c) when they differ
    trainer_pid: Optional[int] = None
    # every rank's pid from its heartbeat (this attempt's), by rank: the processes to signal by hand
    trainer_pids: Optional[dict[int, int]] = None
    # the heartbeat's step, which lags `step` (the step mark, written every step) by up to its interval
    heartbeat_step: Optional[int] = None
    loss_step: Optional[int] = None   # the step `loss` was logged at, when a framework logs every N steps
    # why the trainer's memory snapshots are off for its attempt (the slots did not fit), from its heartbeat
    memory_snapshots_off_reason: Optional[str] = None

    @property
    def healthy(self) -> bool:
        return self.state == RunState.SUCCEEDED or (self.state == RunState.RUNNING and self.heartbeat_fresh)

    def to_json(self) -> dict:
        keys = ("trainer_pids", "state", "supervisor_pid", "child_pid", "trainer_pid", "attempt", "restarts",
                "heartbeat_age_s", "step", "heartbeat_step", "epoch", "loss", "loss_step", "last_failure",
                "latest_checkpoint", "save_interval_s", "stop", "mirrored", "memory_slots", "memory_snapshots_off_reason")
        out = {k: getattr(self, k) for k in keys}
        if self.progress is not None:
            out.update(total_steps=self.progress.total_steps, steps_per_s=self.progress.steps_per_s,
                       eta_s=self.progress.eta_s, goodput=self.progress.goodput)
        return out


def _newest_heartbeat(rd: RunDir) -> tuple[Optional[HeartbeatRecord], Optional[float]]:
    """Rank 0's heartbeat (else the stalest rank's) and its age by the file's mtime; of a node's ranks only, for a node."""
    best: tuple[Optional[HeartbeatRecord], Optional[float]] = (None, None)
    for rank, p in rd.heartbeat_files():
        hb = read_heartbeat_record(p)
        if hb is None or not rd.owns_heartbeat(hb):
            continue
        try:
            age = max(0.0, time.time() - p.stat().st_mtime)
        except OSError:
            continue
        if rank == 0 or best[0] is None or (best[1] is not None and age > best[1]):
            best = (hb, age)
            if rank == 0:
                break
    return best


def _trainer_pids(rd: RunDir, attempt: int) -> dict[int, int]:
    """rank -> pid of every rank whose heartbeat is of `attempt` (of this node's ranks, for a node)."""
    pids = {}
    for rank, p in rd.heartbeat_files():
        hb = read_heartbeat_record(p)
        if hb is not None and hb.attempt == attempt and rd.owns_heartbeat(hb):
            pids[rank] = hb.pid
    return pids


def supervisor_state(rd: RunDir) -> Optional[SupervisorState]:
    """supervisor.json as its record (None while absent, being replaced or not a supervisor state)."""
    try:
        return SupervisorState.read(rd.supervisor_state)
    except ContractError:
        return None


def read_status(rd: RunDir) -> StatusReport:
    state = supervisor_state(rd)
    recorded = (state.state if state else "") or "not_running"
    sup_alive = state is not None and procs.matches(state.supervisor_pid, state.supervisor_create_time) is not None
    if recorded not in FINAL_STATES and not sup_alive:
        recorded = "not_running"
    cfg = recorded_config(state)
    hb, age = _newest_heartbeat(rd)
    fresh = False
    current = hb is not None and state is not None and hb.attempt == state.attempt
    if current and age is not None:
        fresh = age <= allowance(hb.phase, cfg)
    # The step mark (every step) where there is one of this heartbeat's attempt; the beat lags it.
    step = reached_step(rd, hb.rank, hb.attempt) if hb is not None else None
    if step is None and hb is not None:
        step = hb.step
    events = read_events(rd)
    last_failure = _last_failure(events)
    latest = newest_valid(checkpoint_roots(rd))
    ckpt_age = commit_age(latest.path) if latest is not None else None
    try:
        free = shutil.disk_usage(rd.root).free
    except OSError:
        free = None
    return StatusReport(
        state=recorded, supervisor_pid=state.supervisor_pid if state else None,
        child_pid=state.child_pid if state else None, attempt=state.attempt if state else None,
        restarts=state.restarts if state else None,
        heartbeat_age_s=round(age, 3) if age is not None else None,
        step=step, heartbeat_step=hb.step if hb else None, epoch=hb.epoch if hb else None,
        loss=hb.loss if hb else None, loss_step=hb.loss_step if hb else None, last_failure=last_failure,
        latest_checkpoint={"path": str(latest.path), "step": latest.step} if latest else None,
        phase=hb.phase if hb else None, heartbeat_fresh=fresh,
        checkpoint_age_s=round(ckpt_age, 3) if ckpt_age is not None else None, disk_free_bytes=free,
        save_interval_s=hb.save_interval_s if hb else None,
        progress=progress_of(rd, hb, events, failed=last_failure is not None, step=step),
        supervisor_alive=sup_alive,
        stop=_stop(events) if recorded == RunState.STOPPED else None, mirrored=_mirrored(events),
        memory_slots=_memory_slots(rd), trainer_pid=hb.pid if current and hb is not None else None,
        trainer_pids=_trainer_pids(rd, hb.attempt) if current and hb is not None else None,
        memory_snapshots_off_reason=hb.memory_snapshots_off_reason if hb else None,
    )


def _mirrored(events: list[dict]) -> Optional[dict]:
    """The newest checkpoint the supervisor put on (or brought back from) object storage; no network."""
    for ev in reversed(events):
        if ev.get("event") in (Event.CHECKPOINT_MIRRORED, Event.CHECKPOINT_RESTORED_FROM_MIRROR):
            return {"url": ev.get("url"), "step": ev.get("step"), "at": ev.get("time")}
    return None


def _memory_slots(rd: RunDir) -> Optional[dict]:
    """What the run's slots hold in /dev/shm (RAM, until freed): a killed standalone run leaves them."""
    g = run_slots(rd.root, rd.node)
    return {**g.to_json(), "stale": stale_reason(g)} if g.slots else None


# What the supervisor writes after an attempt_ended: the first of these says how that attempt's end was taken.
_OUTCOMES = (Event.ATTEMPT_STARTED, Event.RESTARTING, Event.STOPPED, Event.FINISHED, Event.GAVE_UP)


def _ended_by_stop(events: list[dict], i: int) -> bool:
    """Whether the attempt_ended at events[i] was the requested stop (its next outcome is `stopped`)."""
    nxt = next((e.get("event") for e in events[i + 1:] if e.get("event") in _OUTCOMES), None)
    return nxt == Event.STOPPED


def _last_failure(events: list[dict]) -> Optional[dict]:
    """The newest attempt that failed; an attempt ended by a requested stop did not fail, whatever
    its exit looked like (75 after its preempt save)."""
    for i in range(len(events) - 1, -1, -1):
        ev = events[i]
        if ev.get("event") == Event.ATTEMPT_ENDED and ev.get("kind") not in (Kind.SUCCESS.value, None) \
                and not _ended_by_stop(events, i):
            return {"kind": ev.get("kind"), "exit_code": ev.get("exit_code"), "signal": ev.get("signal"),
                    "at": ev.get("time"), "attempt": ev.get("attempt")}
    return None


def _stop(events: list[dict]) -> Optional[dict]:
    """The requested stop that ended the run: its attempt, whether the trainer saved, at which step."""
    ev = next((e for e in reversed(events) if e.get("event") == Event.STOPPED), None)
    if ev is None:
        return None
    return {"attempt": ev.get("attempt"), "saved": ev.get("saved"), "step": ev.get("step")}


@dataclasses.dataclass(frozen=True)
class CheckpointRow:
    """One listed checkpoint; `problem` is None when it passed the chosen check."""

    name: str
    path: str
    step: int
    epoch: Optional[int]
    batch_in_epoch: Optional[int]
    kind: Optional[str]
    loss: Optional[float]
    created_at: Optional[str]
    size_bytes: Optional[int]
    exact: Optional[bool]
    is_best: bool
    is_latest: bool
    problem: Optional[str]
    remote: bool = False   # on object storage (--mirror), listed by its URL
    loss_step: Optional[int] = None   # the step `loss` was logged at, when not the checkpoint's own
    writing: bool = False   # the newest, no manifest yet, its writer alive: a save in progress, not damage

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["valid"] = self.problem is None and not self.writing
        return d


def list_checkpoints(rd: RunDir, *, verify: bool = False) -> list[CheckpointRow]:
    """Every committed checkpoint, newest first, checked by size (or full digests with `verify`)."""
    index = read_index(rd)
    try:
        latest_target = (rd.latest).resolve() if rd.latest.is_symlink() else None
    except OSError:
        latest_target = None
    rows = []
    for step, path, root in iter_checkpoint_dirs(checkpoint_roots(rd)):
        entry = index.get(path.name) if isinstance(index.get(path.name), dict) else {}
        problem = None
        manifest = None
        try:
            info = inspect_checkpoint(path, full=verify, root=root)
            manifest = info.manifest
        except InvalidCheckpoint as e:
            problem = e.reason
        size = sum(f.size for f in manifest.files.values()) if manifest else None
        rows.append(CheckpointRow(
            name=path.name, path=str(path), step=step,
            epoch=manifest.epoch if manifest else entry.get("epoch"),
            batch_in_epoch=manifest.batch_in_epoch if manifest else None,
            kind=entry.get("kind") or (manifest.kind.value if manifest else None),
            loss=manifest.loss if manifest else entry.get("loss"), loss_step=manifest.loss_step if manifest else None,
            created_at=manifest.created_at if manifest else entry.get("timestamp"),
            size_bytes=size, exact=manifest.exact if manifest else None,
            is_best=bool(entry.get("is_best")), is_latest=latest_target is not None and path.resolve() == latest_target,
            problem=problem,
        ))
    _mark_writing(rd, rows)
    return sorted(rows + _remote_rows(rd), key=lambda r: r.step, reverse=True)


def _remote_rows(rd: RunDir) -> list[CheckpointRow]:
    """The checkpoints on the run's mirror (the URL its supervisor recorded), committed or not."""
    state = supervisor_state(rd)
    url = state.config.get("mirror") if state is not None and isinstance(state.config, dict) else None
    if not url:
        return []
    from ..mirror.remote import survey   # boto3 (the s3 extra) only for a mirrored run

    try:
        found, skipped = survey(str(url))
    except SupervisorError as e:   # the store unreachable, or the s3 extra not installed here
        say(f"mirror {url}: cannot list it: {e}")
        return []
    rows = [CheckpointRow(name=rc.name, path=str(url).rstrip("/") + "/" + rc.name, step=rc.step, epoch=rc.manifest.epoch,
                          batch_in_epoch=rc.manifest.batch_in_epoch, kind=rc.manifest.kind.value, loss=rc.manifest.loss,
                          created_at=rc.manifest.created_at, size_bytes=sum(f.size for f in rc.manifest.files.values()),
                          exact=rc.manifest.exact, is_best=False, is_latest=False, problem=None, remote=True)
            for rc in found]
    for u, why in skipped:
        name = u.rstrip("/").rpartition("/")[2]
        rows.append(CheckpointRow(name=name, path=u, step=parse_checkpoint_name(name) or 0, epoch=None, batch_in_epoch=None,
                                  kind=None, loss=None, created_at=None, size_bytes=None, exact=None, is_best=False,
                                  is_latest=False, problem=why, remote=True))
    return rows


def _mark_writing(rd: RunDir, rows: list[CheckpointRow]) -> None:  # rows: in place
    """The newest checkpoint without a manifest, while the job that writes it runs, is a save in
    progress (a framework names its checkpoint dir before its files are in; our manifest comes last)."""
    if not rows:
        return
    i = max(range(len(rows)), key=lambda j: rows[j].step)
    newest = rows[i]
    if newest.problem is None or (Path(newest.path) / MANIFEST_NAME).exists() or not _writer_alive(rd):
        return
    rows[i] = dataclasses.replace(newest, problem=None, writing=True)


def _writer_alive(rd: RunDir) -> bool:
    state = supervisor_state(rd)
    if state is not None and procs.matches(state.child_pid, state.child_create_time) is not None:
        return True
    hb, _ = _newest_heartbeat(rd)  # a job run without the supervisor (or its child not yet recorded)
    return hb is not None and hb.phase != Phase.FINISHED.value and psutil.pid_exists(hb.pid)
