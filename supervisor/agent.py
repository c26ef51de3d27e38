"""The supervisor: one loop that runs attempts, watches them, classifies each end and restarts.

Shape (after gunicorn's arbiter): signal handlers only queue; the loop sleeps on one self-pipe
(wakeup.py), dispatches queued signals to `handle_<sig>` methods, polls the attempt, watches its
heartbeats and restarts it when the policy says so. What is not the loop lives beside it:
attempts.py (an attempt and how its end is assessed), lock.py and leftover.py (one supervisor per
run dir; a trainer its dead supervisor left), journal.py (events, supervisor.json, history),
prestart.py (the next attempt's launcher), first_attempt.py (on a new node it starts during the
mirror download), periodic.py (the duties of every turn: watchdog, journal retries,
metrics, learned timeouts, mirror uploads), snapshots.py, smart_restarts.py.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, Optional

from trainer_shim.rundir import (
    ContractError, Event, HeartbeatRecord, Phase, RunDir, RunState, SupervisorState, ensure_run_dir, now_iso, set_title,
    supervisor_title,
)

from .process import procs, snapshots
from .process.attempts import Attempt, AttemptResult, assess, attempt_environ, clear_stale_heartbeats, next_log_number
from .process.cgroup import KernelLog, MemoryCgroup
from .decisions.choice import CheckpointChoice
from .decisions.classify import Kind
from .config import Config
from .decisions.decide import decide
from .errors import EXIT_GAVE_UP, EXIT_OK, EXIT_STOPPED, RunDirError
from .messages import say
from .process.heartbeat import HeartbeatEvents, HeartbeatMonitor, allowance
from .insight.journal import History, Journal, recover_history, state_record
from .decisions.learned_timeout import TimeoutLearner
from .insight.notify import Notifier
from .insight.periodic import PeriodicDuties
from .decisions.policy import Action, RestartPolicy
from .process.launch import torchrun_options
from .process.leftover import kill_leftover_trainer
from .process.lock import acquire_lock
from .process.first_attempt import start_first_attempt
from .process.prestart import Prestarter, standby_fields
from .decisions.smart_restarts import SmartRestarts
from .process.wakeup import Wakeup
from .mirror.mirror import Mirror

__all__ = ["State", "AttemptResult", "Supervisor", "say"]

STACK_DUMP_WAIT = 2.0              # SIGUSR1 to SIGTERM on a hang: at most this for the stack dumps
TREE_SCAN_EVERY = 5.0              # how often descendants are recorded (OOM evidence, orphan kill)
PEER_CRASH_WAIT = 5.0              # ranks alive this long after another crashed are ended (torchrun: 30 s)
CHILD_EXIT_GRACE = 5.0             # after the main process exits, its leftovers get this long


State = RunState  # supervisor.json's state (the contract's enum); the old name stays importable


class Supervisor:
    """Runs `config.command` until it succeeds, the policy gives up, or a stop is requested."""

    def __init__(self, config: Config, run_dir: Path) -> None:
        self.config = config
        self.rd = RunDir(run_dir, config.node)
        self.state = State.STARTING
        # A peer node may take its longest silence allowance, the stack dump and the grace period
        # to end a hung attempt and let go of the rendezvous this node would rejoin.
        self.policy = RestartPolicy.for_config(
            config, max(allowance(p.value, config) for p in Phase) + STACK_DUMP_WAIT + config.grace_period)
        self.notifier = Notifier.from_env()
        self.smart = SmartRestarts(config)   # divergence fallback, per-kind budgets, policy actions
        self.learner = TimeoutLearner(self.rd, config.heartbeat_timeout_floor) if config.heartbeat_timeout_auto else None
        self.journal = Journal(self.rd, self._state_record)
        self.prestarter = Prestarter(self.rd, config.preload, config.working_dir, self._tick,
                                     landing=not config.memory_limit)
        self.wakeup = Wakeup((signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD))
        self.attempt: Optional[Attempt] = None
        self.history = History()   # attempt numbers, failure counts, poisoned checkpoints: read by run()
        self.choice = CheckpointChoice(self.rd, self.history.poisoned, self._emit)
        self.mirror = Mirror(config.mirror, self.rd, self._emit, self.history.poisoned)
        self.duties = PeriodicDuties(self.rd, self.notifier, self.journal, self.learner, self.mirror,
                                     config.metrics_textfile_dir)
        self.restart_at: Optional[float] = None
        self.next_resume: Optional[str] = None
        self.last_failure: Optional[str] = None
        self.stop_requested = False
        self.stop_deadline: Optional[float] = None
        self.exit_code: Optional[int] = None
        self._lock_fd: Optional[int] = None
        self._cgroup: Optional[MemoryCgroup] = None
        self._events: Optional[HeartbeatEvents] = None
        self._started_at = now_iso()

    def run(self) -> int:
        """Supervise until done; returns the exit code. Cleanup always runs."""
        self.mirror.check()   # bad credentials or bucket: one line, exit 2, before anything starts
        try:
            ensure_run_dir(self.rd.root, self.rd.node)
        except ContractError as e:
            raise RunDirError(f"{e}; choose another --run-dir") from None
        self._lock_fd = acquire_lock(self.rd)
        # Only now is this the run dir's supervisor; its command line (`... -- python train.py`) would
        # match a search for the trainer's script, its title does not.
        set_title(supervisor_title(self.rd.root.resolve(), self.rd.node))
        try:
            self.history = recover_history(self.rd)   # under the lock: no other supervisor appends now
            self.choice.poisoned = self.mirror.poisoned = self.history.poisoned
            self.wakeup.open()
            procs.protect_from_oom()
            kill_leftover_trainer(self.rd, self.config.grace_period, self._tick)
            self.choice.persist_snapshot()
            if self.config.memory_limit:
                self._cgroup = MemoryCgroup.create(f"resilient-run-{os.getpid()}", self.config.memory_limit)
            self._events = HeartbeatEvents(self.rd.heartbeats, self.wakeup.wake)
            # A new node: the first attempt starts as the mirror's download does (first_attempt.py).
            start_first_attempt(self.mirror, self._start_attempt, self._prestart, self.choice.choose)
            self.notifier.ready(self._status_line())
            self._loop()
            return self.exit_code if self.exit_code is not None else EXIT_GAVE_UP
        finally:
            self._cleanup()
            self.wakeup.close()

    # --- signals -------------------------------------------------------------------------------

    def _handle_signals(self) -> None:
        for sig in self.wakeup.pop():
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
            self._emit(Event.STOPPED, saved=False)
            return
        pids = self.attempt.ask_to_save(torchrun_options(self.smart.command) is not None)
        say(f"stop requested: asking trainer pid {', '.join(map(str, pids))} to save (up to {self.config.grace_period:g}s)")
        self.stop_deadline = time.monotonic() + self.config.grace_period

    def handle_sigint(self) -> None:
        if self.stop_requested and self.attempt is not None:
            say("second interrupt: killing the trainer now")
            self.attempt.kill(0, self._tick)
            return
        self.handle_sigterm()

    handle_sighup = handle_sigterm  # a lost terminal stops the run like SIGTERM

    def handle_sigchld(self) -> None:
        pass  # it only wakes the loop; exits are collected by poll()

    # --- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while self.exit_code is None:
            now = time.monotonic()
            self.wakeup.sleep(self._next_wakeup(now) - now)
            self._handle_signals()
            if self.exit_code is not None:
                break
            now = time.monotonic()
            if self.attempt is not None:
                rc = self.attempt.child.poll()
                if rc is None:
                    self._watch(now)
                else:
                    self.attempt.mark_failure()
                    self._after_attempt(rc)
            elif self.restart_at is not None and now >= self.restart_at:
                self._start_attempt(self.next_resume)
            self._tick()

    def _next_wakeup(self, now: float) -> float:
        t = now + 2.0  # timer fallback: heartbeat files on NFS raise no inotify events
        a = self.attempt
        if a is not None:   # while a crashed rank's launcher tears down, silence is not judged
            crashed = a.rank_crashed_at
            t = min(t, crashed + self.config.grace_period if crashed else a.monitor.next_deadline(now) + 0.01,
                    self.stop_deadline or t)
        if self.restart_at is not None:
            t = min(t, self.restart_at)
        if self.notifier.watchdog_interval:
            t = min(t, now + self.notifier.watchdog_interval / 2)
        return max(t, now + 0.01)

    def _tick(self) -> None:
        """Periodic duties (periodic.py); also called while we block on a kill, so the watchdog stays fed."""
        self.duties.tick(self.attempt, self.history)

    def _watch(self, now: float) -> None:
        a = self.attempt
        assert a is not None
        if now - a.last_scan >= TREE_SCAN_EVERY:
            a.last_scan = now
            a.scan_tree()
        before = a.monitor.first
        a.monitor.observe(now)
        hb = a.monitor.first
        a.learn_resumed(hb)
        if hb is not None and (before is None or (before.step, before.phase) != (hb.step, hb.phase)):
            self.notifier.status(self._status_line(hb))
        if self.stop_requested:
            if self.stop_deadline is not None and now >= self.stop_deadline:
                say(f"trainer did not save within --grace-period {self.config.grace_period:g}s; killing it")
                self.attempt.kill(0, self._tick)
            return
        if len(a.monitor.tracks) > 1 and a.killed_for is None and not a.peers_ended:  # also `-- torchrun ...`
            for rank, pid in a.end_peers_of_a_crash(self.rd, now, PEER_CRASH_WAIT, STACK_DUMP_WAIT, self._tick):
                say(f"attempt {a.number}: ended rank {rank} (pid {pid}), alive {PEER_CRASH_WAIT:g}s after another rank "
                    f"crashed; its stack: {self.rd.stacks_file(pid)}")
        stale = a.monitor.verdict(now) if a.killed_for is None else None   # judged once: its first evidence stands
        if stale is not None and not a.tearing_down(self.rd, now, self.config.grace_period):
            # A hang happened when the rank's heartbeat last changed; a start-up timeout at the start.
            since = a.monitor.tracks[stale.rank].changed_at if stale.rank in a.monitor.tracks else a.started
            a.mark_failure(failed_at=time.time() - (now - since))
            crashed = a.rank_crashed_at is not None   # its exception is recorded: a crash slow to exit, not a hang
            self._kill_stale(Kind.CRASH if crashed else stale.kind, stale.detail + (
                f"; still running {self.config.grace_period:g}s after its uncaught exception" if crashed else ""))

    def _kill_stale(self, kind: Kind, detail: str) -> None:
        a = self.attempt
        assert a is not None
        a.killed_for, a.stale_detail = kind, detail
        say(f"attempt {a.number}: {kind.value.replace('_', ' ')}: {detail}")
        if kind is Kind.HANG:  # stack dumps first (the shim's SIGUSR1 handler) from every rank that is ours
            a.dump_stacks(self.rd, a.rank_pids(), STACK_DUMP_WAIT, self._tick)
        a.kill(self.config.grace_period, self._tick)

    # --- starting an attempt -------------------------------------------------------------------

    def _attempt_env(self, n: int, chosen: Optional[str]) -> dict[str, str]:
        # --no-auto-attach leaves the trackers' settings alone too
        return attempt_environ(self.smart.base_env(), self.rd, n, chosen, self.last_failure,
                               trackers=self.config.auto_attach)

    def _start_attempt(self, resume: Optional[str] = None, prestart_next: bool = True) -> Attempt:
        """Start the next attempt, resuming from `resume` (None: the newest valid checkpoint)."""
        self.restart_at = None
        chosen = resume if resume is not None else self.choice.choose()
        self.next_resume = None
        clear_stale_heartbeats(self.rd)
        kernel_log, oom_base = KernelLog(), self._cgroup.oom_kills() if self._cgroup else 0
        cgroup_procs = self._cgroup.procs_file if self._cgroup else None
        n, child, sb = self.prestarter.launch(self.smart.command, self.history.attempt_no,
                                              lambda n: self._attempt_env(n, chosen), cgroup_procs)
        self.history.attempt_no = n
        self.history.attempts_total += 1
        monitor = HeartbeatMonitor(self.rd, n, self.config, time.monotonic(), self.learner)
        self.attempt = a = Attempt.begin(n, child, chosen, monitor, kernel_log, oom_base)
        a.snapshot_at_start = snapshots.newest_step(self.rd)
        child.note(f"attempt {n} started at {now_iso()} (pid {child.pid}"
                   + (", prestarted" if sb else "") + f"), resuming from {chosen or 'scratch'}")
        self.state = State.RUNNING
        self._emit(Event.ATTEMPT_STARTED, pid=child.pid, resume_from=chosen, command=list(self.smart.command),
                   **standby_fields(sb))
        self.journal.write_state()
        say(f"attempt {n} started (pid {child.pid}), " + (f"resuming from {chosen}" if chosen else "starting fresh"))
        self.notifier.status(self._status_line())
        if prestart_next:
            self._prestart()  # warm at any moment: a crash before the first step restarts warm too
        return a

    def _prestart(self) -> None:
        """Start the next attempt's launcher now, so that a restart does not wait for its imports."""
        if not self.config.prestart or self.stop_requested or self.exit_code is not None:
            return
        peak = self.attempt.peak_rss if self.attempt is not None else 0
        self.prestarter.start(self.smart.command, next_log_number(self.rd, self.history.attempt_no), self.smart.base_env(), peak)

    # --- after an attempt ----------------------------------------------------------------------

    def _after_attempt(self, rc: int) -> None:
        a = self.attempt
        assert a is not None
        # Whatever the main process left behind (workers, ranks) goes now: no survivor of the old tree.
        a.kill(min(CHILD_EXIT_GRACE, self.config.grace_period), self._tick)
        a.child.drain()
        deferred = snapshots.restart_persists(self.rd, a.snapshot_at_start)
        if not deferred:
            self.choice.persist_snapshot()  # before the next choice: a snapshot newer than the disk is not lost
        a.monitor.observe(time.monotonic())
        result = assess(self.rd, a, rc, cgroup=self._cgroup, stop_requested=self.stop_requested,
                        poisoned=self.history.poisoned)
        a.child.close(footer=f"attempt {a.number} ended: {result.kind.value} ({result.evidence})")
        a.kernel_log.close()
        self.attempt = None
        if result.kind is not Kind.SUCCESS:
            self.history.failures[result.kind.value] += 1
            self.last_failure = result.kind.value
        self._emit(Event.ATTEMPT_ENDED, **result.event_fields())
        say(f"attempt {result.attempt} ended: {result.kind.value} ({result.evidence})")
        v = decide(result, policy=self.policy, smart=self.smart, rd=self.rd,
                   failures_of_kind=self.history.failures[result.kind.value], poisoned=self.history.poisoned,
                   stop_requested=self.stop_requested)
        for path, why in v.poison:
            self.choice.poison(path, why)
        if v.action is Action.DONE:
            self._emit(Event.FINISHED)
            self._finish(State.SUCCEEDED, EXIT_OK)
            say(f"job succeeded after {result.attempt} attempt(s)")
        elif v.action is Action.STOP:
            saved = result.kind in (Kind.PREEMPTED, Kind.SUCCESS)
            self._emit(Event.STOPPED, saved=saved, step=result.step)
            if result.kind is Kind.SUCCESS:
                self._finish(State.SUCCEEDED, EXIT_OK)
            else:
                self._finish(State.STOPPED, EXIT_STOPPED)
                say("stopped; rerun the same command to resume" + ("" if saved else " (the trainer did not save)"))
        elif v.action is Action.GIVE_UP:
            self._give_up(v.reason, v.detail)
        else:
            self._apply_policy(result.kind)
            self._schedule_restart(v.delay_s, crash_loop=v.crash_loop)

    def _schedule_restart(self, delay_s: float, crash_loop: bool) -> None:
        resume = self.choice.choose()
        if crash_loop and resume is None:
            self._give_up("crash loop and no older checkpoint is left")
            return
        self.next_resume = resume
        self._prestart()  # if the attempt died before it could be started: imports during the backoff
        self.restart_at = time.monotonic() + delay_s
        self.state = State.RESTARTING
        self._emit(Event.RESTARTING, delay_s=delay_s, resume_from=resume)
        self.journal.write_state()
        say(f"restarting in {delay_s:g}s from " + (resume or "scratch"))
        self.notifier.status(self._status_line())

    def _give_up(self, reason: str, detail: Optional[str] = None) -> None:
        self._emit(Event.GAVE_UP, reason=reason, **({"detail": detail} if detail else {}))
        self._finish(State.FAILED, EXIT_GAVE_UP)
        say(f"giving up: {reason}" + (f" ({detail})" if detail else ""))

    def _apply_policy(self, kind: Kind) -> None:
        fields = self.smart.apply(kind)
        if fields is None:
            return
        self.prestarter.discard()   # it was started with the old argv
        self._emit(Event.POLICY_APPLIED, **fields)
        say(f"policy for {kind.value}: next attempt with " + " ".join(
            [f"{k}={v}" for k, v in fields["env"].items()] + fields["args"]))

    def _finish(self, state: State, code: int) -> None:
        self.prestarter.discard()
        self.state = state
        self.exit_code = code
        self.journal.write_state()

    # --- records -------------------------------------------------------------------------------

    def _emit(self, event: Event, **fields: Any) -> None:
        n = self.attempt.number if self.attempt is not None else (self.history.attempt_no or None)
        self.journal.emit(Event(event), n, **fields)

    def _state_record(self) -> SupervisorState:
        a = self.attempt
        return state_record(self.state.value, self.rd, a.child if a else None, attempt=self.history.attempt_no,
                            restarts=self.policy.restarts, started_at=self._started_at, config=self.config)

    def _status_line(self, hb: Optional[HeartbeatRecord] = None) -> str:
        step = f", step {hb.step}" if hb else ""
        return f"attempt {self.history.attempt_no}{step}, {self.state.value}"

    # --- cleanup -------------------------------------------------------------------------------

    def _cleanup(self) -> None:
        self.prestarter.discard()
        if self.attempt is not None:
            # We are leaving (error or forced exit): no trainer may outlive its supervisor.
            self.attempt.kill(min(self.config.grace_period, CHILD_EXIT_GRACE), self._tick)
            self.attempt.child.close(footer=f"attempt {self.attempt.number} killed: the supervisor is exiting")
            self.attempt.kernel_log.close()
            self.attempt = None
            if self.exit_code is None:
                self.state = State.FAILED
                self.journal.write_state()
        if self._events is not None:
            self._events.stop()
        if self._lock_fd is not None:
            self.choice.persist_snapshot()
            self.mirror.close(self.config.grace_period)   # the final checkpoint's upload may finish
            snapshots.free(self.rd)
            self.journal.flush()
            self.duties.write_metrics(self.attempt, self.history)
        if self._cgroup is not None:
            self._cgroup.remove()
        self.notifier.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
