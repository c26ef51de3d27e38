"""What both framework callbacks share: one process's run-dir session.

Heartbeats, the process hooks (SIGTERM stop flag, SIGUSR1 stack dumps, the error record of an
uncaught exception), events, the index, `latest`, rotation and the choice of the checkpoint to
resume from. All of it is the engine's own code (rundir and its commit protocol, heartbeat,
hooks, retention): the callbacks only translate framework calls; nothing here imports a framework.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable, Optional

from .. import rundir
from ..errors import ConfigError
from .._session.core import Session
from .._session.engine import Group, Solo, exit_at_once
from .._policies import provenance
from .._disk.retention import Retention
from ..rundir import Event, Manifest, Phase, RunEnv
from .._session.messages import describe, say


def product_env() -> RunEnv:
    """This process's RESILIENT_* environment; a bad value is a one-line ConfigError."""
    try:
        return RunEnv.from_environ(os.environ)
    except rundir.EnvError as e:
        raise ConfigError(str(e)) from e


# How long a rank waits at a checkpoint barrier for the others (the raw loop's default): a rank that
# died or hangs ends the wait with CollectiveTimeout (non-zero exit) rather than holding the job.
COLLECTIVE_TIMEOUT_S = 300.0


class FrameworkSession(Session):
    """The session core (trainer_shim._session.core) plus what a framework callback adds: rank R of a
    job of `world_size` ranks (as torchrun, accelerate or any launcher setting RANK/WORLD_SIZE started
    it; a lone process is rank 0 of 1), the framework's checkpoint roots, the resume choice and the
    commit bookkeeping. Every rank has its own heartbeat, step mark and error record; rank 0 alone
    commits manifests, rotates and cleans up, after the barrier (`sync`) that says every rank's files
    are written.
    """

    def __init__(self, run_dir: Path, *, heartbeat_interval: float = 1.0, keep_last: int = 3,
                 env: Optional[RunEnv] = None) -> None:
        self.init_time = rundir.now_iso()   # the report's start -> restore boundary (the first_step event)
        env = env if env is not None else product_env()
        launcher = rundir.LauncherEnv.from_environ(os.environ)
        super().__init__(rundir.ensure_run_dir(run_dir, env.node), env, rank=launcher.rank,
                         world_size=launcher.world_size, heartbeat_interval=heartbeat_interval)
        self.hb.start()
        self._group: Optional[Group] = None   # distributed.Dist once torch.distributed is up (see `group`)
        self._rotation_roots: list[Path] = []
        # Deleted before returning: a framework's process may end (or be killed) right after a save.
        self.retention = Retention(self.rd, lambda: self._rotation_roots, keep_last=keep_last,
                                   keep_epochs=keep_last, keep_best=0, background=False)
        self.resumed_from: Optional[Path] = None
        self.checkpoint_step: Optional[int] = None
        # What every manifest records of the code and arguments, as the raw loop's (git in the background).
        self.provenance = provenance.Provenance.for_run(provenance.script_path(), False, env)
        self._chosen = False              # choose() ran: its answer, not the supervisor's, is the resume point
        self._resume_checked = False
        # Installed together, removed together at finish (or by the next Run/Session of this
        # process); SIGTERM waits for install_stop(), after the framework's own handler.
        self.install_hooks(self._on_exception, stop_now=False)
        self._before_eval = Phase.STARTING.value
        self._restored_time: Optional[str] = None   # the framework's train start: its state is loaded
        self._first_step_seen = False

    # --- heartbeats ----------------------------------------------------------------------------

    @classmethod
    def open(cls, run_dir: Optional[os.PathLike | str], default_root: os.PathLike | str, **kwargs: Any) -> "FrameworkSession":
        """This process's session: the supervisor's run dir ($RESILIENT_RUN_DIR) first, then the
        callback's `run_dir=`, then where the framework writes by default."""
        env = product_env()
        return cls(Path(env.run_dir or run_dir or default_root), env=env, **kwargs)

    def beat(self, step: int, epoch: int, phase: str = Phase.TRAINING.value, loss: Any = None) -> None:  # type: ignore[override]
        """Every step: the step mark, the report's marks, and the paced heartbeat of the core."""
        self.mark.set(step)
        self._mark_timings(step, phase)
        super().beat(step, epoch, loss, Phase(phase))

    def _mark_timings(self, step: int, phase: str) -> None:
        """The report's marks, as a native run leaves them: the train start (the framework has loaded
        its checkpoint by then) and the attempt's first step, in the `first_step` event."""
        if phase == Phase.STARTING.value and self._restored_time is None:
            self._restored_time = rundir.now_iso()
        elif phase == Phase.TRAINING.value and not self._first_step_seen:
            self._first_step_seen = True
            if self.is_zero:  # one mark per attempt, as native runs write it
                self.event(Event.FIRST_STEP, step=step, restored_time=self._restored_time, pid=os.getpid(),
                           **rundir.start_marks(self.init_time))
                # For the next attempt's warm interpreter: the frameworks this one imported (rundir.warm).
                rundir.record_frameworks(self.rd.frameworks, sys.modules, os.getpid(), os.getppid())

    def set_total_steps(self, total: Any) -> None:
        """The run's length in optimizer steps (heartbeat `total_steps`): `status` shows progress and ETA
        from it, as for a native run. Unknown lengths (None, 0, an infinite estimate) are left out."""
        try:
            n = int(total)
        except (TypeError, ValueError, OverflowError):
            return
        if n > 0:
            self.hb.set_total_steps(n)

    def evaluating(self, on: bool) -> None:
        """Phase `evaluating` around an evaluation, then back to the phase before it (a sanity
        check before the first step returns to `starting`)."""
        if on:
            self._before_eval = self.hb.value("phase")
            self.hb.write_now(phase=Phase.EVALUATING.value)
        else:
            self.hb.write_now(phase=self._before_eval)

    # --- events, errors ------------------------------------------------------------------------

    def _on_exception(self, tp: type, value: BaseException, tb: Optional[TracebackType]) -> None:
        if not issubclass(tp, (SystemExit, KeyboardInterrupt)):
            self.record_exception(tp, value, tb, self.hb.value("step"))

    # --- ranks ---------------------------------------------------------------------------------

    @property
    def is_zero(self) -> bool:
        """Whether this process commits, rotates and cleans up (rank 0, or a single process)."""
        return self.rank == 0

    @property
    def group(self) -> Group:
        """The shim's collectives among the job's ranks (the raw loop's: a gloo group of its own with a
        timeout); a world of one, or a job that never initialised torch.distributed, needs none.
        Created on first use, which every rank must reach at the same point (new_group is collective)."""
        if self._group is None:
            self._group = Solo()
            if self.world_size > 1:
                from .._session import distributed   # a multi-rank job only

                if distributed.active_world_size() == self.world_size:
                    self._group = distributed.Dist(COLLECTIVE_TIMEOUT_S)
        return self._group

    def sync(self, what: str) -> None:
        """Barrier of every rank (nothing in a world of one)."""
        self.group.barrier(what)

    def stop_agreed(self) -> bool:
        """Whether any rank was asked to stop: every rank must save and exit at the same step (a save
        is collective), though SIGTERM reaches each at its own moment. One all-reduce per step."""
        return self.group.agree(self.stop.requested, False)[0]

    # --- resume --------------------------------------------------------------------------------

    def choose(self, roots: Iterable[Path]) -> Optional[rundir.CheckpointInfo]:
        """The supervisor's choice (RESILIENT_RESUME_FROM) if it verifies, else the newest valid one:
        the chooser of native runs, over the framework's roots, every file's digest checked."""
        # Every rank reads the same files and the supervisor's same choice, so all choose alike;
        # rank 0 alone reports the rejections.
        info = rundir.choose([Path(r) for r in roots], self.env.resume_from, full=True,
                             on_reject=self.reject if self.is_zero else None)
        self._chosen = True
        self.resumed_from = info.path if info else None
        self.retention.resumed_step = info.step if info else None
        return info

    def resume(self, roots: Iterable[Path], writes_into: Path) -> Optional[rundir.CheckpointInfo]:
        """Choose the checkpoint to resume from (see choose), remove the torn dirs newer than it in
        `writes_into` (where the framework saves next) and record it in the heartbeat; None: fresh."""
        info = self.choose(roots)
        if self.is_zero:  # one rank removes; the others would race it for the same dirs
            self.discard_newer([writes_into], info.step if info else -1)
        if info is None:
            return None
        self.checkpoint_step = info.step
        self.hb.set_checkpoint(info.step, resumed_from=str(info.path))
        if self.is_zero:
            say(f"resuming from {info.path} (step {info.step})")
        return info

    def check_resumed(self, start_step: int) -> None:
        """Once, as the framework begins training at `start_step` (its restored global step): a
        resume point that was not passed to the framework (it starts at 0 again, rewriting every
        checkpoint) must not go unnoticed. One line on stderr and a `resume_step_mismatch` event
        (doctor fails on it); training goes on, as the script asked."""
        if self._resume_checked:
            return
        self._resume_checked = True
        if self._chosen:
            path, expected = self.resumed_from, self.checkpoint_step
        else:  # the script never asked us: the supervisor's choice is what it should have loaded
            chosen = self.env.resume_from
            path = Path(chosen) if chosen and not self.env.fresh_start_requested else None
            expected = rundir.parse_checkpoint_name(path.name) if path is not None else None
        if expected is None or start_step == expected:
            return
        say(f"error: resume not applied: training starts after step {start_step}, but the checkpoint to resume "
            f"from is {path} (step {expected}); pass it to the Trainer (resume_from_checkpoint= / ckpt_path=, "
            "e.g. cb.resume_from()) or leave it to auto-attach")
        self.event(Event.RESUME_STEP_MISMATCH, path=str(path), expected_step=expected, actual_step=start_step)

    def check_provenance(self, config: Optional[dict] = None) -> None:
        """Once the framework's arguments are known (`config`: counted in the args hash), and before
        training: a resumed checkpoint of other code or arguments is a warning, or under strict resume
        (--strict-resume) a refusal, exit 2, as for the raw loop."""
        if config is not None:
            self.provenance.include(config)
        if self.resumed_from is not None:
            try:
                manifest = rundir.inspect_checkpoint(self.resumed_from).manifest
            except rundir.InvalidCheckpoint:
                return   # chosen verified a moment ago; gone since: the framework's load reports it
            provenance.check_resume(self.provenance, self.resumed_from, manifest, self,
                                    lambda code: exit_at_once(self.hb, code))

    def manifest_meta(self) -> dict[str, Any]:
        """The provenance a manifest written now records (git commit and dirty state, args hash)."""
        self.provenance.settle()
        return self.provenance.meta

    def discard_newer(self, roots: Iterable[Path], step: int) -> None:
        """Remove checkpoint dirs newer than the resume point that did not validate: the framework
        would write into them again and mix its new files with the torn ones."""
        for s, path, _root in rundir.iter_checkpoint_dirs([Path(r) for r in roots]):
            if s <= step:
                break
            try:
                rundir.inspect_checkpoint(path)
            except rundir.InvalidCheckpoint:
                rundir.commit.discard(path, "rejected")

    # --- commit --------------------------------------------------------------------------------

    def set_keep_last(self, n: int) -> None:
        """How many checkpoints rotation keeps (per pool, as for native runs)."""
        self.retention.keep_last = self.retention.keep_epochs = n

    def committed(self, path: Path, manifest: Manifest, roots: Iterable[Path], protect: Iterable[Path] = (),
                  seconds: Optional[float] = None) -> None:
        """After a checkpoint dir got its manifest (and `latest`, from the commit driver): index, rotation (never the one just
        written, the one resumed from, nor one in `protect`), heartbeat field, and the `seconds`
        the save stalled training (reported as native runs report theirs)."""
        self.checkpoint_step = manifest.global_step
        self.hb.set_checkpoint(manifest.global_step)
        self._rotation_roots = [Path(r) for r in roots]
        self.retention.add(path, manifest)
        self.retention.rotate(protect={path.name, *(Path(p).name for p in protect)})
        if seconds is not None:
            self.saves.add(seconds, manifest.kind, manifest.global_step, manifest.global_step)

    def save_failed(self, path: Path, step: Optional[int], e: BaseException, background: bool = False) -> None:
        """A checkpoint that did not commit (a storage error; in a background write anything): event
        and warning, in the words of every front end (Reporter.checkpoint_failed); training continues."""
        self.reporter.checkpoint_failed(path, step, describe(e), background=background)

    # --- stop ----------------------------------------------------------------------------------

    def exit_preempted(self) -> None:  # type: ignore[override]
        """After the preempt checkpoint committed: heartbeat `stopping`, exit 75."""
        where = f"checkpoint at step {self.checkpoint_step}" if self.is_zero else "rank 0 committed the checkpoint"
        super().exit_preempted(where)
