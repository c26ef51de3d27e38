"""One attempt: what the supervisor tracks while it runs, and how its end is assessed.

`assess` gathers the facts of an ended attempt (exit status, OOM evidence, the shim's error
files, torchrun's per-rank summary, the step marks) into an `AttemptResult` with exactly one
`Kind`; the supervisor's loop only decides what to do next.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path
from typing import Callable, Optional

import psutil

from trainer_shim.rundir import (
    ENV_ATTEMPT, ENV_LAST_FAILURE, ENV_NODE, ENV_RESUME_FROM, ENV_RUN_DIR, RESUME_NONE, ContractError, ErrorRecord,
    HeartbeatRecord, Phase, RunDir, checkpoint_roots, iso_at, newest_valid, parse_checkpoint_name, reached_step,
    read_heartbeat_record, read_json, tracker_environ,
)

from . import procs
from ..messages import say
from .cgroup import KernelLog, MemoryCgroup
from ..decisions.classify import AttemptFacts, Kind, classify, is_cuda_oom
from .below import death_below
from .heartbeat import HeartbeatMonitor
from .launch import ProcessFailure, parse_rendezvous_failure, parse_torchrun_failure

__all__ = ["Attempt", "AttemptResult", "RankError", "assess", "attempt_error", "attempt_environ",
           "clear_stale_heartbeats", "next_log_number"]


@dataclasses.dataclass
class Attempt:
    """A running attempt, as the supervisor tracks it."""

    number: int
    child: procs.Child
    chosen: Optional[str]               # the checkpoint the supervisor told it to resume from
    started: float                      # monotonic
    monitor: HeartbeatMonitor
    kernel_log: KernelLog
    oom_base: int                       # the cgroup's OOM-kill counter at start
    seen: dict[int, psutil.Process]     # every process of its tree seen so far (OOM evidence, orphan kill)
    last_scan: float = 0.0
    killed_for: Optional[Kind] = None   # Kind.HANG / Kind.STARTUP_TIMEOUT when we killed it
    stale_detail: str = ""
    resumed_from: Optional[str] = None
    resumed_known: bool = False         # a heartbeat past `starting` said what it really loaded
    peak_rss: int = 0                   # the largest summed RSS of the process tree seen so far
    rank_crashed_at: Optional[float] = None   # monotonic: when a rank's error file was first seen
    peers_ended: bool = False           # the ranks that outlived a crashed one were ended (once)
    failed_at: Optional[float] = None   # wall clock: best estimate of when the failure happened
    detected_at: Optional[float] = None  # wall clock: when the supervisor saw it and began to stop it
    snapshot_at_start: Optional[int] = None  # step of the newest memory snapshot when it started

    @classmethod
    def begin(cls, n: int, child: procs.Child, chosen: Optional[str], monitor: HeartbeatMonitor,
              kernel_log: KernelLog, oom_base: int) -> "Attempt":
        return cls(number=n, child=child, chosen=chosen, started=monitor.spawned_at, monitor=monitor,
                   kernel_log=kernel_log, oom_base=oom_base, seen={p.pid: p for p in procs.tree(child.pid)},
                   last_scan=monitor.spawned_at, resumed_from=chosen)

    def downloaded(self, restored: Optional[Path], choose: Callable[[], Optional[str]]) -> Optional[str]:
        """It started while the supervisor downloaded its checkpoint (rundir.pending), which is over:
        the dir it was told to resume from when that was not committed (None when it was); `choose`
        then names what its trainer falls back to (the same rule)."""
        # Nothing watched it during the download, and its trainer could not get past `starting`
        # before the download ended: its start-up allowance counts from now.
        self.monitor.restart_clock(time.monotonic())
        if restored is not None and str(restored) == self.chosen:
            return None
        failed, self.chosen = self.chosen, choose()
        self.resumed_from = self.chosen
        return failed

    def kill(self, grace: float, tick: Callable[[], None]) -> None:
        """SIGTERM the whole tree (and every process ever seen in it), SIGKILL what is left after `grace`."""
        for p in procs.tree(self.child.pid):
            self.seen.setdefault(p.pid, p)
        procs.kill_tree(self.child.pid, grace=grace, known=list(self.seen.values()), tick=tick, reap=self.child.poll)

    def dump_stacks(self, rd: RunDir, pids: set[int], wait: float, tick: Callable[[], None]) -> None:
        """SIGUSR1 (the shim writes every thread's stack into rd.stacks_file(pid)) to `pids`, then up
        to `wait` seconds, until every dump has landed or the launcher exits. faulthandler writes a
        whole dump from its signal handler and the shim's relay copies it at once: a file that grew
        and then kept its size over two polls is complete. A rank whose relay cannot run (its main
        thread holds the GIL in C) takes the whole `wait`, as every dump did before."""
        def sizes() -> dict[int, int]:
            return {pid: _file_size(rd.stacks_file(pid)) for pid in pids}

        before = sizes()
        for pid in pids:
            procs.signal_pid(pid, signal.SIGUSR1)
        deadline = time.monotonic() + wait
        last = before
        while time.monotonic() < deadline and self.child.poll() is None:
            tick()
            time.sleep(0.05)
            now = sizes()
            if now == last and all(now[p] > before[p] for p in pids):
                return
            last = now

    def scan_tree(self) -> None:
        """Record every process of the tree (evidence and the orphan kill need them after exit) and the peak RSS."""
        rss = 0
        for p in procs.tree(self.child.pid):
            self.seen.setdefault(p.pid, p)
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                pass
        self.peak_rss = max(self.peak_rss, rss)

    def learn_resumed(self, hb: Optional[HeartbeatRecord]) -> bool:
        """True the first time a beat says what the trainer really loaded. The shim's first beat
        (phase starting) goes out before it restores anything, so only a later one knows."""
        if hb is None or self.resumed_known or hb.phase == Phase.STARTING.value:
            return False
        self.resumed_known = True
        loaded = hb.resumed_from
        self.resumed_from = str(loaded) if loaded and loaded != RESUME_NONE else None
        return True

    def rank_pids(self) -> set[int]:
        """Every rank whose heartbeat pid is in our process tree (not a reused pid). Not the
        launcher: SIGUSR1's default action would kill torchrun, and with it (PDEATHSIG) every
        rank before its stack dump is written."""
        return set(self.rank_procs().values())

    def rank_procs(self) -> dict[int, int]:
        """rank -> pid of every rank still alive in our process tree (see rank_pids)."""
        ours = {p.pid for p in procs.tree(self.child.pid)}
        return {rank: t.record.pid for rank, t in self.monitor.tracks.items() if t.record.pid in ours}

    def ask_to_save(self, launcher_forwards: bool) -> list[int]:
        """A requested stop: SIGTERM each rank's main process (its DataLoader workers must keep
        serving the final save); the pids signalled. torchrun forwards SIGTERM to its ranks and
        waits for them, so it is signalled itself; any other launcher (`swift`, `accelerate
        launch`, `sh -c`) would die at once, its trainer left to the teardown's SIGKILL."""
        ranks = [] if launcher_forwards else sorted(set(self.rank_procs().values()) - {self.child.pid})
        targets = ranks or [self.child.pid]  # no heartbeat yet: nothing to save, the launcher as before
        for pid in targets:
            procs.signal_pid(pid, signal.SIGTERM)
        return targets

    def outlive_a_crash(self, rd: RunDir, now: float, wait: float) -> dict[int, int]:
        """rank -> pid of the ranks still alive `wait` seconds after another rank crashed (wrote
        its error file); {} before that. They cannot finish a collective without it, and the
        launcher gives them 30 s between its SIGTERM and SIGKILL: a restart waited that long. A rank
        that wrote an error file is not among them: it is ending of its own exception, and its
        death must read as the crash it recorded, not as our SIGKILL."""
        if self.rank_crashed_at is None:
            if not rd.rank_error_files(self.number):
                return {}
            self.rank_crashed_at = now
        if now - self.rank_crashed_at < wait:
            return {}
        crashed = {rank for rank, _ in rd.rank_error_files(self.number)}
        return {rank: pid for rank, pid in self.rank_procs().items() if rank not in crashed}

    def end_peers_of_a_crash(self, rd: RunDir, now: float, wait: float, dump_wait: float,
                             tick: Callable[[], None]) -> list[tuple[int, int]]:
        """Once: the ranks that outlived a crashed one get SIGUSR1 (their stacks: why were they not
        done?) and SIGKILL; the launcher then ends the attempt as it would have 25 s later."""
        left = self.outlive_a_crash(rd, now, wait)
        if not left:
            return []
        self.peers_ended = True  # once: what outlives even the SIGKILL is the launcher's to report
        self.dump_stacks(rd, set(left.values()), dump_wait, tick)
        for pid in left.values():
            procs.signal_pid(pid, signal.SIGKILL)
        return sorted(left.items())

    def tearing_down(self, rd: RunDir, now: float, grace: float) -> bool:
        """Whether a silent rank is excused: another rank crashed (it wrote its error file) and the
        launcher is still ending the others, for up to `grace` seconds. A survivor blocked in a
        collective with the dead rank looks hung, but the crash is what happened; torch and gloo
        teardown took over 5 s on a loaded box. Checked only once a rank is silent (a listdir)."""
        if self.rank_crashed_at is None:
            if not rd.rank_error_files(self.number):
                return False
            self.rank_crashed_at = now
        return now - self.rank_crashed_at < grace

    def mark_failure(self, failed_at: Optional[float] = None) -> None:
        """Record detection now (first call wins); `failed_at` defaults to now: an exit is seen at once."""
        if self.detected_at is None:
            self.detected_at = time.time()
            self.failed_at = failed_at if failed_at is not None else self.detected_at


@dataclasses.dataclass(frozen=True)
class RankError:
    """The shim's error record of one rank."""

    rank: int
    record: ErrorRecord


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    """How one attempt ended."""

    attempt: int
    kind: Kind
    exit_code: Optional[int]
    signal: Optional[int]
    step: Optional[int]             # the last step really reached (step marks), else the last heartbeat's
    evidence: str
    log_tail: list[str]
    resumed_from: Optional[str]     # what the trainer actually loaded (first heartbeat), else our choice
    progressed: bool
    duration_s: float
    failures: tuple[ProcessFailure, ...] = ()   # torchrun's failed ranks, root cause first
    error: Optional[RankError] = None
    failure_time: Optional[str] = None
    detected_time: Optional[str] = None
    dead_pid: Optional[int] = None  # the trainer a signal killed below a launcher

    @property
    def rank_exit_code(self) -> Optional[int]:
        """The exit code of torchrun's root-cause rank, when it exited (rather than being signalled)."""
        return self.failures[0].exitcode if self.failures else None

    def event_fields(self) -> dict:
        """The fields of this attempt's `attempt_ended` event."""
        return dict(kind=self.kind.value, exit_code=self.exit_code, signal=self.signal, step=self.step,
                    evidence=self.evidence, log_tail=self.log_tail, resumed_from=self.resumed_from,
                    progressed=self.progressed, failure_time=self.failure_time, detected_time=self.detected_time,
                    **({"dead_pid": self.dead_pid} if self.dead_pid is not None else {}))


def next_log_number(rd: RunDir, after: int) -> int:
    """The next attempt number after `after` whose log does not exist: never overwrite a log, even
    one an event did not record."""
    n = after + 1
    while rd.attempt_log(n).exists():
        n += 1
    return n


def attempt_environ(base: dict[str, str], rd: RunDir, n: int, chosen: Optional[str],
                    last_failure: Optional[str], trackers: bool = False) -> dict[str, str]:
    """Attempt n's environment: `base` plus the contract's variables (unset ones removed); with
    `trackers`, one W&B / MLflow run for all attempts (rundir.trackers)."""
    env = dict(base)
    env[ENV_RUN_DIR] = str(rd.root.resolve())
    env[ENV_ATTEMPT] = str(n)
    env[ENV_RESUME_FROM] = chosen or RESUME_NONE
    for name, value in ((ENV_LAST_FAILURE, last_failure), (ENV_NODE, rd.node)):
        if value is not None:
            env[name] = str(value)
        else:
            env.pop(name, None)
    try:
        if trackers:
            tracker_environ(env, rd)
    except OSError as e:  # a run dir that cannot take the id costs the trackers' continuity, not the run
        say(f"warning: trackers: cannot record their run ids in {rd.root}: {e}")
    return env


def clear_stale_heartbeats(rd: RunDir) -> None:
    """Before an attempt starts: heartbeats of an earlier process (a standalone run also calls
    itself attempt 1) must not pass for this attempt's. Nothing of ours is alive now, so they are
    all stale; another node's ranks are that node's business."""
    for _, path in rd.heartbeat_files():
        hb = read_heartbeat_record(path)
        if hb is not None and not rd.owns_heartbeat(hb):
            continue
        path.unlink(missing_ok=True)


def attempt_error(rd: RunDir, n: int, failures: tuple[ProcessFailure, ...] = ()) -> Optional[RankError]:
    """The error file that best explains attempt n: a CUDA OOM, else the first rank torchrun
    reports failed, else the lowest rank (rank 0 writes attempt-N.json, others -rank-R)."""
    errors: list[RankError] = []
    for rank, path in rd.rank_error_files(n):
        try:
            rec = ErrorRecord.from_json(read_json(path))
        except ContractError:
            continue
        if rec is not None:
            errors.append(RankError(rank, rec))
    if not errors:
        return None
    for err in errors:
        if is_cuda_oom(err.record):
            return err
    for pf in failures:
        for err in errors:
            if err.rank == pf.rank:
                return err
    return errors[0]


def _oom_evidence(a: Attempt, cgroup: Optional[MemoryCgroup]) -> tuple[str, ...]:
    evidence: list[str] = []
    if cgroup is not None:
        kills = cgroup.oom_kills()
        if kills > a.oom_base:
            evidence.append(f"cgroup {cgroup.counter_name} rose {a.oom_base}->{kills}")
    # The trainers' pids from their beats too: one below a launcher may have lived between two scans.
    return (*evidence, *a.kernel_log.oom_kills({*a.seen.keys(), *_trainer_pids(a)}))


def _trainer_pids(a: Attempt) -> list[int]:
    """The pids of the ranks' last beats that were not ending by themselves (finished, stopping)."""
    ending = (Phase.FINISHED.value, Phase.STOPPING.value)
    return [t.record.pid for _, t in sorted(a.monitor.tracks.items()) if t.record.phase not in ending]


def last_step(rd: RunDir, a: Attempt) -> Optional[int]:
    """The last step the attempt really reached: the lowest tracked rank's step mark (beats lag)."""
    for rank in sorted(a.monitor.tracks):
        step = reached_step(rd, rank, a.number)
        if step is not None:
            return step
    hb = a.monitor.first
    return hb.step if hb else None


def assess(rd: RunDir, a: Attempt, rc: int, *, cgroup: Optional[MemoryCgroup], stop_requested: bool,
           poisoned: set[str]) -> AttemptResult:
    """The result of attempt `a`, whose main process exited with `rc` (Popen convention)."""
    tail = tail_lines(a.child.log_path)
    failures = tuple(parse_torchrun_failure(tail)) if rc not in (0, None) else ()
    err = attempt_error(rd, a.number, failures)
    below = death_below(rc, a.child.pid, _trainer_pids(a), a.seen) if not failures else None
    kind, detail = classify(AttemptFacts(
        returncode=rc, killed_for=a.killed_for, stale_detail=a.stale_detail, oom_evidence=_oom_evidence(a, cgroup),
        error=err.record if err else None, error_rank=err.rank if err else None, stop_requested=stop_requested,
        rank_failures=failures,
        ranks_stopped=ranks_stopped(a.monitor, multi_node=rd.node is not None, stop_requested=stop_requested),
        # Only when no rank of this attempt ever beat: a torchrun that loses the store mid-run is no rendezvous retry.
        rendezvous_error=parse_rendezvous_failure(tail) if rc not in (0, None) and not a.monitor.tracks else None,
        below=below,
    ))
    resumed = a.resumed_from if a.resumed_known else a.chosen
    resumed_step = parse_checkpoint_name(Path(resumed).name) if resumed else None
    newest = newest_valid(checkpoint_roots(rd), exclude=poisoned)
    facts = AttemptFacts(returncode=rc, below=below)
    failed = kind not in (Kind.SUCCESS, Kind.PREEMPTED)
    step = last_step(rd, a)
    # Progress (no evidence against the checkpoint resumed from): a newer checkpoint committed, or
    # a step trained past it. Killed mid-save three times in a row at step 50 is no crash loop of 40.
    progressed = (newest is not None and (resumed_step is None or newest.step > resumed_step)) or (
        resumed_step is not None and step is not None and step > resumed_step)
    return AttemptResult(
        attempt=a.number, kind=kind, exit_code=facts.exit_code, signal=facts.signal, step=step,
        evidence=detail, log_tail=tail, resumed_from=resumed, progressed=progressed,
        duration_s=round(time.monotonic() - a.started, 3), failures=failures, error=err,
        failure_time=iso_at(a.failed_at) if failed and a.failed_at is not None else None,
        detected_time=iso_at(a.detected_at) if failed and a.detected_at is not None else None,
        dead_pid=below.pid if below is not None else None,
    )


def ranks_stopped(monitor: HeartbeatMonitor, multi_node: bool = False, stop_requested: bool = False) -> Optional[str]:
    """When every (local) rank's last beat is `stopping` after a preempt save: the detail.

    torchrun exits 1 (SignalException) after its ranks saved and exited 75, so a launcher's exit
    code cannot say it; the beats can. One rank is enough when a stop was requested (torchrun
    --nproc-per-node 1) or on several nodes; otherwise it takes two, so that a lone process's
    `stopping` beat never excuses its own non-75 exit.
    """
    recs = [t.record for _, t in sorted(monitor.tracks.items())]
    enough = 1 if (multi_node or stop_requested) else 2
    if len(recs) < enough or any(r.phase != Phase.STOPPING.value for r in recs):
        return None
    steps = sorted({r.checkpoint_step for r in recs}, key=str)
    who = f"all {len(recs)} ranks" if len(recs) > 1 else "its rank"
    return f"{who} saved a preempt checkpoint at step {', '.join(map(str, steps))} and stopped"


def tail_lines(path: Path, lines: int = 20, max_bytes: int = 16384) -> list[str]:
    """The last `lines` lines of a log (each cut to 500 characters); [] when unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    return [ln[:500] for ln in data.decode("utf-8", "replace").splitlines()[-lines:]]


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
