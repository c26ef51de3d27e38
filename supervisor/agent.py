"""The supervisor: one loop that runs attempts, watches them, classifies each end and restarts."""

from __future__ import annotations

import dataclasses
import enum
import fcntl
import json
import os
import select
import signal
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import psutil

from trainer_shim import rundir as rd_mod
from trainer_shim.rundir import (
    ENV_ATTEMPT, ENV_LAST_FAILURE, ENV_NODE, ENV_RESUME_FROM, ENV_RUN_DIR, RESUME_NONE, ContractError, RunDir,
    append_event, atomic_write_json, checkpoint_roots, newest_valid, now_iso, read_events, read_json,
)

from . import procs, snapshots
from .cgroup import KernelLog, MemoryCgroup
from .classify import AttemptFacts, Kind, classify
from .launch import is_python_script, parse_rendezvous_failure, parse_torchrun_failure, standby_command
from .config import Config
from .errors import EXIT_GAVE_UP, EXIT_OK, EXIT_STOPPED, LockedError, RunDirError
from .heartbeat import HeartbeatEvents, HeartbeatMonitor, allowance
from .metrics import MetricsSnapshot, disk_free_bytes, write_textfile
from .progress import CostCache
from .notify import Notifier, child_environ
from .policy import Action, RestartPolicy
from .learned_timeout import TimeoutLearner
from .smart_restarts import SmartRestarts, newer_checkpoints

__all__ = ["State", "AttemptResult", "Supervisor", "say"]

POISONED = "poisoned"              # prefix of the checkpoint_rejected reason for crash loops
STACK_DUMP_WAIT = 2.0              # SIGUSR1 to SIGTERM on a hang: time for faulthandler to write
TREE_SCAN_EVERY = 5.0              # how often descendants are recorded (OOM evidence, orphan kill)
# A warm interpreter for a single-process job (trainer_shim.warm) is prestarted only while
# MemAvailable >= WARM_MEMORY_FACTOR x the running attempt's peak RSS (its process tree, sampled every
# TREE_SCAN_EVERY), and at least WARM_MEMORY_FLOOR: the idle standby costs torch's ~250 MB and the
# restarted attempt will need its predecessor's peak again.
WARM_MEMORY_FACTOR = 2.0
WARM_MEMORY_FLOOR = 512 << 20
METRICS_EVERY = 10.0
RETRY_WRITES_EVERY = 5.0
CHILD_EXIT_GRACE = 5.0             # after the main process exits, its leftovers get this long


def say(msg: str) -> None:
    """A supervisor message: stderr, one line, prefixed so it stands out of the child's output."""
    try:
        sys.stderr.write(f"resilient-run: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class State(str, enum.Enum):
    """Supervisor state, as written to supervisor.json.

    STARTING -> RUNNING (an attempt's child is up) -> RESTARTING (it ended; backoff) -> RUNNING ...
    and from any of them to a final state: SUCCEEDED (exit 0), FAILED (gave up, exit 1) or
    STOPPED (stop requested and the child saved, exit 75).
    """

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    """How one attempt ended."""

    attempt: int
    kind: Kind
    exit_code: Optional[int]
    signal: Optional[int]
    step: Optional[int]
    evidence: str
    log_tail: list[str]
    resumed_from: Optional[str]     # what the trainer actually loaded (first heartbeat), else our choice
    progressed: bool
    duration_s: float
    rank_exit_code: Optional[int] = None  # torchrun: the exit code of the rank that failed first


@dataclasses.dataclass
class _Attempt:
    number: int
    child: procs.Child
    chosen: Optional[str]
    started: float
    monitor: HeartbeatMonitor
    kernel_log: KernelLog
    oom_base: int
    seen: dict[int, psutil.Process]
    last_scan: float = 0.0
    killed_for: Optional[str] = None
    stale_detail: str = ""
    resumed_from: Optional[str] = None
    resumed_known: bool = False
    peak_rss: int = 0    # the largest summed RSS of the attempt's process tree seen so far


@dataclasses.dataclass
class _Standby:
    """A launcher started ahead of need (trainer_shim.standby): attempt `number`'s process and log."""

    number: int
    child: procs.Child
    warm: bool = False   # a warm interpreter (trainer_shim.warm) rather than a prestarted torchrun


class Supervisor:
    """Runs `config.command` until it succeeds, the policy gives up, or a stop is requested."""

    def __init__(self, config: Config, run_dir: Path) -> None:
        self.config = config
        self.rd = RunDir(run_dir, config.node)
        self._costs = CostCache(self.rd)  # goodput, lost steps, recovery times for the metrics file
        self.state = State.STARTING
        self.policy = RestartPolicy(
            max_restarts=config.max_restarts, backoff=config.backoff, backoff_max=config.backoff_max,
            no_restart_exit_codes=config.no_restart_exit_codes, crash_loop_attempts=config.crash_loop_attempts,
            # A peer node may take its longest silence allowance, the stack dump and the grace period
            # to end a hung attempt and let go of the rendezvous this node would rejoin.
            rendezvous_window=max(allowance(p.value, config) for p in rd_mod.Phase) + STACK_DUMP_WAIT + config.grace_period,
        )
        self.notifier = Notifier.from_env()
        self.smart = SmartRestarts(config)   # divergence fallback, per-kind budgets, policy actions
        self.learner = TimeoutLearner(self.rd, config.heartbeat_timeout_floor) if config.heartbeat_timeout_auto else None
        self.attempt: Optional[_Attempt] = None
        self._standby: Optional[_Standby] = None
        self.attempt_no = 0
        self.restart_at: Optional[float] = None
        self.next_resume: Optional[str] = None
        self.last_failure: Optional[str] = None
        self.poisoned: set[str] = set()
        self.failures: Counter[str] = Counter()
        self.attempts_total = 0
        self.stop_requested = False
        self.stop_deadline: Optional[float] = None
        self.exit_code: Optional[int] = None
        self._signals: list[int] = []
        self._wake_r, self._wake_w = -1, -1
        self._lock_fd: Optional[int] = None
        self._cgroup: Optional[MemoryCgroup] = None
        self._events: Optional[HeartbeatEvents] = None
        self._pending_events: list[tuple[str, dict]] = []
        self._state_dirty = False
        self._write_warned: set[str] = set()
        self._rejected: set[tuple[str, str]] = set()
        self._last_metrics = 0.0
        self._last_retry = 0.0
        self._started_at = now_iso()

    # --- public ------------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until done; returns the exit code. Cleanup always runs."""
        self._prepare_run_dir()
        self._acquire_lock()
        old_handlers: dict[int, Any] = {}
        try:
            self._wake_r, self._wake_w = os.pipe()
            for fd in (self._wake_r, self._wake_w):
                os.set_blocking(fd, False)
            signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                old_handlers[sig] = signal.signal(sig, self._queue_signal)
            procs.protect_from_oom()
            self._recover_history()
            self._kill_leftover_trainer()
            self._persist_snapshot()
            if self.config.memory_limit:
                self._cgroup = MemoryCgroup.create(f"resilient-run-{os.getpid()}", self.config.memory_limit)
            self._events = HeartbeatEvents(self.rd.heartbeats, self._wake)
            self._start_attempt()
            self.notifier.ready(self._status_line())
            self._loop()
            return self.exit_code if self.exit_code is not None else EXIT_GAVE_UP
        finally:
            self._cleanup()
            for sig, h in old_handlers.items():
                signal.signal(sig, h)
            if self._wake_w >= 0:
                signal.set_wakeup_fd(-1)
                os.close(self._wake_r)
                os.close(self._wake_w)

    # --- setup ---------------------------------------------------------------------------------

    def _prepare_run_dir(self) -> None:
        try:
            rd_mod.ensure_run_dir(self.rd.root, self.rd.node)
        except ContractError as e:
            raise RunDirError(f"{e}; choose another --run-dir") from None

    def _acquire_lock(self) -> None:
        try:
            fd = os.open(self.rd.lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise RunDirError(f"cannot open {self.rd.lock}: {e.strerror}; check the run dir's permissions") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raw = os.read(fd, 64).decode(errors="replace").strip()
            os.close(fd)
            which = "" if self.rd.node is None else f" (node {self.rd.node})"
            raise LockedError(
                f"run dir {self.rd.root}{which} is in use by supervisor pid {raw or '?'}; "
                f"stop it with `resilient-run stop {self.rd.root}` or pick another --run-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _recover_history(self) -> None:
        """Attempt numbers, failure counts and poisoned checkpoints carry over from earlier supervisors."""
        try:
            events = read_events(self.rd)
        except ContractError:
            events = []
        self.attempt_no = rd_mod.next_attempt_number(events) - 1
        for ev in events:
            if ev.get("event") == "attempt_ended" and ev.get("kind") not in (None, "success"):
                self.failures[str(ev["kind"])] += 1
            if ev.get("event") == "attempt_started":
                self.attempts_total += 1
            if ev.get("event") == "checkpoint_rejected" and str(ev.get("reason", "")).startswith(POISONED):
                self.poisoned.add(str(ev.get("path")))

    def _kill_leftover_trainer(self) -> None:
        """A trainer whose supervisor died must go before a new one starts on the same run dir."""
        try:
            prev = read_json(self.rd.supervisor_state)
        except ContractError:
            return
        if not isinstance(prev, dict) or not prev.get("child_pid"):
            return
        pid = prev.get("child_pid")
        proc = procs.matches(pid, prev.get("child_create_time"))
        if proc is None:
            if psutil.pid_exists(int(pid)):
                say(f"pid {pid} recorded in supervisor.json is no longer our trainer (start time differs); leaving it alone")
            return
        try:
            cmd = proc.cmdline()
        except psutil.Error:
            cmd = None
        if prev.get("child_cmdline") and cmd != prev.get("child_cmdline"):
            say(f"pid {pid} recorded in supervisor.json runs another command ({' '.join(cmd or [])[:80]}); leaving it alone")
            return
        say(f"stopping trainer pid {pid} left over from a supervisor that died")
        procs.kill_tree(int(pid), grace=self.config.grace_period, tick=self._tick)

    # --- signals and waking --------------------------------------------------------------------

    def _queue_signal(self, signum: int, frame: Any) -> None:
        # Only record: everything else happens in the loop (handlers may run at any bytecode).
        self._signals.append(signum)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"w")
        except OSError:
            pass  # pipe full: the loop is awake anyway

    def _sleep(self, timeout: float) -> None:
        if self._signals:
            return
        try:
            r, _, _ = select.select([self._wake_r], [], [], max(0.0, timeout))
        except InterruptedError:
            return
        if r:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass

    def _handle_signals(self) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            handler = getattr(self, f"handle_{signal.Signals(sig).name.lower()}", None)
            if handler:
                handler()

    def handle_sigterm(self) -> None:
        if self.stop_requested:
            return
        self.stop_requested = True
        self.notifier.stopping("stopping: waiting for the trainer's preempt checkpoint")
        if self.attempt is None:
            self._finish(State.STOPPED, EXIT_STOPPED)
            self._emit("stopped", saved=False)
            return
        say(f"stop requested: asking trainer pid {self.attempt.child.pid} to save (up to {self.config.grace_period:g}s)")
        # The main process only: its DataLoader workers must keep serving the final save.
        procs.signal_pid(self.attempt.child.pid, signal.SIGTERM)
        self.stop_deadline = time.monotonic() + self.config.grace_period

    def handle_sigint(self) -> None:
        if self.stop_requested and self.attempt is not None:
            say("second interrupt: killing the trainer now")
            self._kill_attempt(grace=0)
            return
        self.handle_sigterm()

    def handle_sighup(self) -> None:
        self.handle_sigterm()

    def handle_sigchld(self) -> None:
        pass  # it only wakes the loop; exits are collected by poll()

    # --- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while self.exit_code is None:
            now = time.monotonic()
            self._sleep(self._next_wakeup(now) - now)
            self._handle_signals()
            if self.exit_code is not None:
                break
            now = time.monotonic()
            if self.attempt is not None:
                rc = self.attempt.child.poll()
                if rc is None:
                    self._watch(now)
                else:
                    self._after_attempt(rc)
            elif self.restart_at is not None and now >= self.restart_at:
                self._start_attempt()
            self._tick()

    def _next_wakeup(self, now: float) -> float:
        t = now + 2.0  # timer fallback: heartbeat files on NFS raise no inotify events
        if self.attempt is not None:
            t = min(t, self.attempt.monitor.next_deadline(now) + 0.01)
            if self.stop_deadline is not None:
                t = min(t, self.stop_deadline)
        if self.restart_at is not None:
            t = min(t, self.restart_at)
        if self.notifier.watchdog_interval:
            t = min(t, now + self.notifier.watchdog_interval / 2)
        return max(t, now + 0.01)

    def _tick(self) -> None:
        """Periodic duties; also called while we block on a kill, so the watchdog stays fed."""
        now = time.monotonic()
        if self.notifier.watchdog_due(now):
            self.notifier.watchdog()
        if now - self._last_retry >= RETRY_WRITES_EVERY and (self._pending_events or self._state_dirty):
            self._last_retry = now
            self._flush_writes()
        if now - self._last_metrics >= METRICS_EVERY:
            self._write_metrics()
        if self.learner is not None:
            self.learner.save(now, force=self.attempt is None)

    def _watch(self, now: float) -> None:
        a = self.attempt
        assert a is not None
        if now - a.last_scan >= TREE_SCAN_EVERY:
            a.last_scan = now
            rss = 0
            for p in procs.tree(a.child.pid):
                a.seen.setdefault(p.pid, p)
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            a.peak_rss = max(a.peak_rss, rss)
        before = a.monitor.first
        a.monitor.observe(now)
        hb = a.monitor.first
        # The shim's first beat (phase starting) goes out before it restores anything, so its
        # resumed_from is always null; only a later beat says what was actually loaded.
        if hb is not None and not a.resumed_known and hb.get("phase") != rd_mod.Phase.STARTING.value:
            a.resumed_known = True
            self._prestart()  # the job is past its own start-up: the next launcher's imports may run now
            loaded = hb.get("resumed_from")
            a.resumed_from = str(loaded) if loaded and loaded != RESUME_NONE else None
        if hb is not None and (before is None or before.get("step") != hb.get("step") or before.get("phase") != hb.get("phase")):
            self.notifier.status(self._status_line(hb))
        if self.stop_requested:
            if self.stop_deadline is not None and now >= self.stop_deadline:
                say(f"trainer did not save within --grace-period {self.config.grace_period:g}s; killing it")
                self._kill_attempt(grace=0)
            return
        stale = a.monitor.verdict(now)
        if stale is not None:
            self._kill_stale(stale.kind, stale.detail)

    def _kill_stale(self, kind: str, detail: str) -> None:
        a = self.attempt
        assert a is not None
        a.killed_for, a.stale_detail = kind, detail
        say(f"attempt {a.number}: {kind.replace('_', ' ')}: {detail}")
        if kind == "hang":
            # Stack dumps first (the shim's SIGUSR1 handler), from every rank whose pid is ours.
            ours = {p.pid for p in procs.tree(a.child.pid)}
            targets = {a.child.pid} | {t.record.get("pid") for t in a.monitor.tracks.values() if t.record.get("pid") in ours}
            for pid in targets:
                procs.signal_pid(int(pid), signal.SIGUSR1)
            self._wait_exit(STACK_DUMP_WAIT)
        self._kill_attempt(grace=self.config.grace_period)

    def _wait_exit(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.attempt is not None and self.attempt.child.poll() is None:
            self._tick()
            time.sleep(0.05)

    def _kill_attempt(self, grace: float) -> None:
        a = self.attempt
        assert a is not None
        for p in procs.tree(a.child.pid):
            a.seen.setdefault(p.pid, p)
        procs.kill_tree(a.child.pid, grace=grace, known=list(a.seen.values()), tick=self._tick, reap=a.child.poll)

    # --- attempts ------------------------------------------------------------------------------

    def _reject(self, path: Path, reason: str) -> None:
        key = (str(path), reason)
        if key not in self._rejected:
            self._rejected.add(key)
            say(f"checkpoint rejected: {path}: {reason}")
            self._emit("checkpoint_rejected", path=str(path), reason=reason)

    def _choose_checkpoint(self) -> Optional[str]:
        info = newest_valid(checkpoint_roots(self.rd), exclude=self.poisoned, on_reject=self._reject)
        return str(info.path) if info else None

    def _persist_snapshot(self) -> None:
        snapshots.persist_newest(self.rd, self._emit, say, self._reject)

    def _base_env(self) -> dict[str, str]:
        env = child_environ(os.environ)
        env.update(self.smart.attempt_env(self.config.env_dict))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _attempt_env(self, n: int, chosen: Optional[str]) -> dict[str, str]:
        env = self._base_env()
        env[ENV_RUN_DIR] = str(self.rd.root.resolve())
        env[ENV_ATTEMPT] = str(n)
        env[ENV_RESUME_FROM] = chosen or RESUME_NONE
        if self.last_failure:
            env[ENV_LAST_FAILURE] = self.last_failure
        else:
            env.pop(ENV_LAST_FAILURE, None)
        if self.rd.node is not None:
            env[ENV_NODE] = str(self.rd.node)
        else:
            env.pop(ENV_NODE, None)
        return env

    def _next_log_number(self) -> int:
        n = self.attempt_no + 1
        while self.rd.attempt_log(n).exists():  # never overwrite a log, even one an event did not record
            n += 1
        return n

    def _start_attempt(self) -> None:
        self.restart_at = None
        chosen = self.next_resume if self.next_resume is not None else self._choose_checkpoint()
        self.next_resume = None
        # Heartbeats of an earlier process (a standalone run also calls itself attempt 1) must not
        # pass for this attempt's: nothing of ours is alive now, so they are all stale (another
        # node's ranks are that node's business).
        for stale in self.rd.heartbeats.glob("rank-*.json"):
            hb = rd_mod.read_heartbeat(stale)
            if hb is not None and not self.rd.owns_heartbeat(hb):
                continue
            try:
                stale.unlink()
            except OSError:
                pass
        kernel_log = KernelLog()
        oom_base = self._cgroup.oom_kills() if self._cgroup else 0
        sb = self._activate_standby(chosen)
        if sb is not None:
            n, child = sb.number, sb.child
        else:
            n = self._next_log_number()
            log_path = self.rd.attempt_log(n)
            child = procs.spawn(self.smart.command, env=self._attempt_env(n, chosen), cwd=self.config.working_dir,
                                log_path=log_path, cgroup_procs=self._cgroup.procs_file if self._cgroup else None)
            if child.log_file is None:
                say(f"cannot write {log_path}; the child's output goes to the terminal only")
        self.attempt_no = n
        self.attempts_total += 1
        now = time.monotonic()
        self.attempt = _Attempt(
            number=n, child=child, chosen=chosen, started=now,
            monitor=HeartbeatMonitor(self.rd, n, self.config, now, self.learner), kernel_log=kernel_log, oom_base=oom_base,
            seen={p.pid: p for p in procs.tree(child.pid)}, last_scan=now, resumed_from=chosen,
        )
        self.state = State.RUNNING
        self._emit("attempt_started", pid=child.pid, resume_from=chosen, command=list(self.smart.command),
                   prestarted=sb is not None, warm=sb is not None and sb.warm)
        self._write_state()
        say(f"attempt {n} started (pid {child.pid}), " + (f"resuming from {chosen}" if chosen else "starting fresh"))
        self.notifier.status(self._status_line())

    # --- the prestarted launcher ---------------------------------------------------------------

    def _prestart(self) -> None:
        """Start the next attempt's torchrun now, so that a restart does not wait for its imports."""
        argv = standby_command(self.smart.command, self.config.preload) if self.config.prestart else None
        if argv is None or self._standby is not None or self.stop_requested or self.exit_code is not None:
            return
        warm = is_python_script(self.smart.command)
        if warm and not self._memory_for_warm():
            return
        n = self._next_log_number()
        if warm:  # an interpreter still importing torch would make the restart slower than a cold one
            argv = (*argv[:3], f"--ready={self._warm_ready_file(n)}", *argv[3:])
        log_path = self.rd.standby_log(n)
        log_path.unlink(missing_ok=True)  # an idle standby's log left by a killed supervisor: never an attempt's
        try:  # the attempt's own variables come over the pipe when it is needed
            child = procs.spawn(argv, env=self._base_env(), cwd=self.config.working_dir, log_path=log_path,
                                stdin_pipe=True)
        except OSError as e:
            say(f"cannot prestart the next attempt's launcher ({e.strerror or e}); restarts start it cold")
            return
        self._standby = _Standby(n, child, warm=warm)

    def _warm_ready_file(self, n: int) -> Path:
        log = self.rd.attempt_log(n)
        return log.with_name(log.name + ".warm-ready")

    def _memory_for_warm(self) -> bool:
        """The rule of WARM_MEMORY_FACTOR: is there room for an idle warm interpreter?"""
        peak = self.attempt.peak_rss if self.attempt is not None else 0
        need = max(WARM_MEMORY_FLOOR, int(WARM_MEMORY_FACTOR * peak))
        try:
            avail = psutil.virtual_memory().available
        except (OSError, psutil.Error):
            return False
        if avail < need:
            say(f"not prestarting a warm interpreter: {avail >> 20} MiB available < {need >> 20} MiB "
                f"({WARM_MEMORY_FACTOR:g} x the attempt's peak RSS); a restart starts cold")
            return False
        return True

    def _activate_standby(self, chosen: Optional[str]) -> Optional[_Standby]:
        """Hand the prestarted launcher its attempt's environment; None when there is none usable."""
        sb = self._standby
        if sb is None:
            return None
        if sb.number <= self.attempt_no or sb.child.poll() is not None or sb.child.popen.stdin is None \
                or (sb.warm and not self._warm_ready_file(sb.number).exists()):
            self._discard_standby()
            return None
        try:
            if self._cgroup is not None:  # joined only now: idle, it must not eat the job's memory budget
                with open(self._cgroup.procs_file, "w") as f:
                    f.write(str(sb.child.pid))
            line = json.dumps({"env": self._attempt_env(sb.number, chosen)}) + "\n"
            sb.child.popen.stdin.write(line.encode())
            sb.child.popen.stdin.close()
        except OSError as e:
            say(f"prestarted launcher unusable ({e.strerror or e}); starting the attempt cold")
            self._discard_standby()
            return None
        self._standby = None
        if sb.warm:
            self._warm_ready_file(sb.number).unlink(missing_ok=True)
        try:  # from now on it is attempt N: its log takes the attempt's name (the open fd follows the rename)
            os.replace(sb.child.log_path, self.rd.attempt_log(sb.number))
            sb.child.log_path = self.rd.attempt_log(sb.number)
        except OSError:
            pass
        return sb

    def _discard_standby(self) -> None:
        sb, self._standby = self._standby, None
        if sb is None:
            return
        if sb.warm:
            self._warm_ready_file(sb.number).unlink(missing_ok=True)
        procs.kill_tree(sb.child.pid, grace=0, tick=self._tick, reap=sb.child.poll)
        sb.child.close()
        try:
            sb.child.log_path.unlink()  # the log of an attempt that never ran
        except OSError:
            pass

    def _after_attempt(self, rc: int) -> None:
        a = self.attempt
        assert a is not None
        # Whatever the main process left behind (workers, ranks) goes now: no survivor of the old tree.
        procs.kill_tree(a.child.pid, grace=min(CHILD_EXIT_GRACE, self.config.grace_period),
                        known=list(a.seen.values()), tick=self._tick, reap=a.child.poll)
        a.child.close()
        self._persist_snapshot()  # before the next choice: a snapshot newer than the disk is not lost
        a.monitor.observe(time.monotonic())
        result = self._result(a, rc)
        a.kernel_log.close()
        self.attempt = None
        self.stop_deadline = None if not self.stop_requested else self.stop_deadline
        if result.kind is not Kind.SUCCESS:
            self.failures[result.kind.value] += 1
            self.last_failure = result.kind.value
        self._emit("attempt_ended", kind=result.kind.value, exit_code=result.exit_code, signal=result.signal,
                   step=result.step, evidence=result.evidence, log_tail=result.log_tail,
                   resumed_from=result.resumed_from, progressed=result.progressed)
        say(f"attempt {result.attempt} ended: {result.kind.value} ({result.evidence})")
        # Under torchrun the rank's own exit code (e.g. 2: a configuration error) decides, not torchrun's 1.
        code = result.rank_exit_code if result.rank_exit_code is not None else result.exit_code
        if result.kind is not Kind.SUCCESS and not self.stop_requested and self._judge_smart(result):
            return
        decision = self.policy.decide(result.kind, code, progressed=result.progressed,
                                      resumed_from=result.resumed_from, stop_requested=self.stop_requested,
                                      now=time.monotonic())
        if decision.action is Action.DONE:
            self._emit("finished")
            self._finish(State.SUCCEEDED, EXIT_OK)
            say(f"job succeeded after {result.attempt} attempt(s)")
        elif decision.action is Action.STOP:
            saved = result.kind in (Kind.PREEMPTED, Kind.SUCCESS)
            self._emit("stopped", saved=saved, step=result.step)
            if result.kind is Kind.SUCCESS:
                self._finish(State.SUCCEEDED, EXIT_OK)
            else:
                self._finish(State.STOPPED, EXIT_STOPPED)
                say("stopped; rerun the same command to resume" + ("" if saved else " (the trainer did not save)"))
        elif decision.action is Action.GIVE_UP:
            self._emit("gave_up", reason=decision.reason)
            self._finish(State.FAILED, EXIT_GAVE_UP)
            say(f"giving up: {decision.reason}")
        else:
            self._apply_policy(result.kind)
            if decision.poison:
                self.poisoned.add(decision.poison)
                reason = (f"{POISONED}: {self.config.crash_loop_attempts} attempts in a row resumed from it "
                          "and made no progress")
                say(f"checkpoint rejected: {decision.poison}: {reason}")
                self._emit("checkpoint_rejected", path=decision.poison, reason=reason)
            resume = self._choose_checkpoint()
            if decision.poison and resume is None:
                self._emit("gave_up", reason="crash loop and no older checkpoint is left")
                self._finish(State.FAILED, EXIT_GAVE_UP)
                say("giving up: crash loop and no older checkpoint is left")
                return
            self.next_resume = resume
            self._prestart()  # if the attempt died before it could be started: imports during the backoff
            self.restart_at = time.monotonic() + decision.delay_s
            self.state = State.RESTARTING
            self._emit("restarting", delay_s=decision.delay_s, resume_from=resume)
            self._write_state()
            say(f"restarting in {decision.delay_s:g}s from " + (resume or "scratch"))
            self.notifier.status(self._status_line())

    def _judge_smart(self, result: AttemptResult) -> bool:
        """Divergence fallback and per-kind budgets (issue 16); True when the supervisor gave up."""
        err = self._attempt_error(result.attempt, ())
        resumed_step = rd_mod.parse_checkpoint_name(Path(result.resumed_from).name) if result.resumed_from else None
        j = self.smart.judge(
            result.kind, failures_of_kind=self.failures[result.kind.value],
            diverged_step=err.get("step") if err and isinstance(err.get("step"), int) else result.step,
            resumed_from=result.resumed_from, resumed_step=resumed_step,
            newer=newer_checkpoints(rd_mod.iter_checkpoint_dirs(checkpoint_roots(self.rd)), resumed_step,
                                    since=time.time() - result.duration_s - 1.0)
            if result.kind is Kind.DIVERGED else (), error_type=err.get("type") if err else None)
        for path in j.poison:
            if path not in self.poisoned:
                self.poisoned.add(path)
                say(f"checkpoint rejected: {path}: {POISONED}: {j.poison_reason}")
                self._emit("checkpoint_rejected", path=path, reason=f"{POISONED}: {j.poison_reason}", poisoned=True)
        if j.poison:
            self.policy.no_progress = 0   # the fallback is this failure's answer; no second crash-loop poisoning
        if j.give_up is None:
            return False
        self._emit("gave_up", reason=j.give_up, **({"detail": j.detail} if j.detail else {}))
        self._finish(State.FAILED, EXIT_GAVE_UP)
        say(f"giving up: {j.give_up}" + (f" ({j.detail})" if j.detail else ""))
        return True

    def _apply_policy(self, kind: Kind) -> None:
        fields = self.smart.apply(kind)
        if fields is None:
            return
        self._discard_standby()   # it was started with the old argv
        self._emit(rd_mod.Event.POLICY_APPLIED.value, **fields)
        say(f"policy for {kind.value}: next attempt with " + " ".join(
            [f"{k}={v}" for k, v in fields["env"].items()] + fields["args"]))

    def _result(self, a: _Attempt, rc: int) -> AttemptResult:
        evidence: list[str] = []
        if self._cgroup is not None:
            kills = self._cgroup.oom_kills()
            if kills > a.oom_base:
                evidence.append(f"cgroup {self._cgroup.counter_name} rose {a.oom_base}->{kills}")
        evidence += a.kernel_log.oom_kills(a.seen.keys())
        tail = _tail(a.child.log_path)
        rank_failures = tuple(parse_torchrun_failure(tail)) if rc not in (0, None) else ()
        kind, detail = classify(AttemptFacts(
            returncode=rc, killed_for=a.killed_for, stale_detail=a.stale_detail, oom_evidence=tuple(evidence),
            error=self._attempt_error(a.number, rank_failures), stop_requested=self.stop_requested,
            rank_failures=rank_failures, ranks_stopped=_ranks_stopped(a.monitor, multi_node=self.rd.node is not None),
            # Only when no rank of this attempt ever beat: a torchrun that loses the store mid-run is no rendezvous retry.
            rendezvous_error=parse_rendezvous_failure(tail) if rc not in (0, None) and not a.monitor.tracks else None,
        ))
        hb = a.monitor.first
        resumed = a.resumed_from if a.resumed_known else a.chosen
        resumed_step = rd_mod.parse_checkpoint_name(Path(resumed).name) if resumed else None
        newest = newest_valid(checkpoint_roots(self.rd), exclude=self.poisoned)
        progressed = newest is not None and (resumed_step is None or newest.step > resumed_step)
        facts = AttemptFacts(returncode=rc)
        return AttemptResult(
            attempt=a.number, kind=kind, exit_code=facts.exit_code, signal=facts.signal,
            step=hb.get("step") if hb else None, evidence=detail, log_tail=tail,
            resumed_from=resumed, progressed=progressed, duration_s=round(time.monotonic() - a.started, 3),
            rank_exit_code=_rank_exit_code(rank_failures),
        )

    def _attempt_error(self, n: int, rank_failures: tuple[str, ...]) -> Optional[dict]:
        """The error file that best explains attempt n: a CUDA OOM, else the first rank torchrun
        reports failed, else the lowest rank (rank 0 writes attempt-N.json, others -rank-R)."""
        errors: list[dict] = []
        for rank, path in self.rd.rank_error_files(n):
            try:
                err = read_json(path)
            except ContractError:
                continue
            if isinstance(err, dict):
                errors.append({**err, "rank": rank})
        if not errors:
            return None
        for err in errors:
            if "OutOfMemoryError" in str(err.get("type", "")):
                return err
        failed = [int(p.split()[1]) for p in rank_failures if p.split()[1].isdigit()]
        for r in failed:
            for err in errors:
                if err["rank"] == r:
                    return err
        return errors[0]

    def _finish(self, state: State, code: int) -> None:
        self._discard_standby()
        self.state = state
        self.exit_code = code
        self._write_state()

    # --- files ---------------------------------------------------------------------------------

    def _emit(self, event: str, **fields: Any) -> None:
        n = self.attempt.number if self.attempt is not None else (self.attempt_no or None)
        self._pending_events.append((event, {"attempt": n, **fields}))
        self._flush_writes()

    def _state_json(self) -> dict:
        a = self.attempt
        me = procs.identity_of(os.getpid())
        return {
            "state": self.state.value, "supervisor_pid": os.getpid(), "node": self.rd.node, "host": socket.gethostname(),
            "supervisor_create_time": me.create_time if me else None,
            "child_pid": a.child.pid if a else None,
            "child_create_time": a.child.identity.create_time if a else None,
            "child_cmdline": list(a.child.popen.args) if a else None,
            "attempt": self.attempt_no or None, "restarts": self.policy.restarts,
            "started_at": self._started_at, "updated_at": now_iso(),
            "config": _json_config(self.config),
        }

    def _write_state(self) -> None:
        self._state_dirty = True
        self._flush_writes()

    def _flush_writes(self) -> None:
        """Write pending events and state; on failure (disk full) keep them and retry later."""
        while self._pending_events:
            event, fields = self._pending_events[0]
            attempt = fields.pop("attempt", None)
            try:
                append_event(self.rd, event, attempt, **fields)
            except OSError as e:
                fields["attempt"] = attempt
                self._warn_write(str(self.rd.events), e)
                break
            self._pending_events.pop(0)
            self._write_warned.discard(str(self.rd.events))
        if self._state_dirty:
            try:
                atomic_write_json(self.rd.supervisor_state, self._state_json())
                self._state_dirty = False
                self._write_warned.discard(str(self.rd.supervisor_state))
            except OSError as e:
                self._warn_write(str(self.rd.supervisor_state), e)

    def _warn_write(self, path: str, e: OSError) -> None:
        if path not in self._write_warned:
            self._write_warned.add(path)
            say(f"cannot write {path} ({e.strerror or e}); still supervising, will retry")

    def _write_metrics(self) -> None:
        self._last_metrics = time.monotonic()
        a = self.attempt
        hb = a.monitor.first if a else None
        hb_age = None
        if a is not None and a.monitor.tracks:
            hb_age = round(time.monotonic() - min(t.changed_at for t in a.monitor.tracks.values()), 3)
        latest = newest_valid(checkpoint_roots(self.rd), exclude=self.poisoned)
        ckpt_age = None
        if latest is not None:
            try:
                ckpt_age = max(0.0, time.time() - (latest.path / rd_mod.MANIFEST_NAME).stat().st_mtime)
            except OSError:
                pass
        free = disk_free_bytes(self.rd.root)
        snap = MetricsSnapshot(
            run=self.rd.root.resolve().name, up=a is not None, attempts_total=self.attempts_total,
            failures_by_kind=dict(self.failures), heartbeat_age_s=hb_age,
            global_step=hb.get("step") if hb else None, last_checkpoint_step=latest.step if latest else None,
            last_checkpoint_age_s=ckpt_age, disk_free_bytes=free, **self._costs.get(),
            save_interval_s=hb.get("save_interval_s") if hb else None,
        )
        try:
            write_textfile(self.rd, snap, self.config.metrics_textfile_dir)
        except OSError as e:
            self._warn_write(str(self.rd.metrics), e)

    def _status_line(self, hb: Optional[dict] = None) -> str:
        step = f", step {hb.get('step')}" if hb and hb.get("step") is not None else ""
        return f"attempt {self.attempt_no}{step}, {self.state.value}"

    # --- cleanup -------------------------------------------------------------------------------

    def _cleanup(self) -> None:
        self._discard_standby()
        if self.attempt is not None:
            # We are leaving (error or forced exit): no trainer may outlive its supervisor.
            self._kill_attempt(grace=min(self.config.grace_period, CHILD_EXIT_GRACE))
            self.attempt.child.close()
            self.attempt.kernel_log.close()
            self.attempt = None
            if self.exit_code is None:
                self.state = State.FAILED
                self._state_dirty = True
        if self._events is not None:
            self._events.stop()
        if self._lock_fd is not None:
            self._persist_snapshot()
            snapshots.free(self.rd)
            self._flush_writes()
            self._write_metrics()
        if self._cgroup is not None:
            self._cgroup.remove()
        self.notifier.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


def _rank_exit_code(rank_failures: tuple[str, ...]) -> Optional[int]:
    """The exit code of torchrun's root-cause rank, when it exited (rather than being signalled)."""
    if not rank_failures or " exit code " not in rank_failures[0]:
        return None
    try:
        return int(rank_failures[0].rsplit(" exit code ", 1)[1])
    except ValueError:
        return None


def _ranks_stopped(monitor: HeartbeatMonitor, multi_node: bool = False) -> Optional[str]:
    """For a multi-rank attempt whose every (local) rank's last beat is `stopping` after a preempt save: the detail."""
    recs = [t.record for _, t in sorted(monitor.tracks.items())]
    if len(recs) < (1 if multi_node else 2) or any(r.get("phase") != rd_mod.Phase.STOPPING.value for r in recs):
        return None
    steps = sorted({r.get("checkpoint_step") for r in recs}, key=str)
    return f"all {len(recs)} ranks saved a preempt checkpoint at step {', '.join(map(str, steps))} and stopped"


def _tail(path: Path, lines: int = 20, max_bytes: int = 16384) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    return [ln[:500] for ln in data.decode("utf-8", "replace").splitlines()[-lines:]]


def _json_config(c: Config) -> dict:
    d = dataclasses.asdict(c)
    d["env"] = {k: "***" for k, _ in c.env}  # names only: values may be secrets
    return d
