"""The public API: `init()` returns a Run that counts steps, beats, checkpoints and resumes bit-exactly."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Optional


from . import options
from .._policies import provenance
from .._restore import loop as restoring
from .. import rundir
from .._session.core import Session
from .._session.engine import Engine, Group, Solo
from .._session.messages import say
from ..errors import CollectiveTimeout, ConfigError
from .._session.watch import StepWatch
from .._policies.provenance import script_path
from ..rundir import CheckpointKind

__all__ = ["Run", "init"]

class Run:
    """One training process's view of its run dir. Create it with `trainer_shim.init()`."""

    def __init__(self, **kwargs: Any) -> None:
        self.init_time = rundir.now_iso()   # the report's start -> restore boundary (the first_step event)
        o = self.options = options.Options.parse(kwargs)
        self.launcher = rundir.LauncherEnv.from_environ(os.environ)
        o.check_world(self.launcher.world_size)
        self.on_nonfinite = o.on_nonfinite
        script = script_path()
        try:  # the product env, parsed once; a bad value is a one-line configuration error
            env = rundir.RunEnv.from_environ(os.environ)
            if rundir.ENV_SHM_DIR in os.environ:  # where memory snapshot slots live: refused early if unusable
                rundir.check_shm_dir(os.environ)
            root = o.run_dir or env.run_dir or Path("runs") / (script.stem if script else "interactive")
            root, self.env = Path(root).absolute(), env
            if str(o.resume) != "auto":   # the default resumes the newest valid checkpoint: nothing to ask
                from . import resume_prompt

                root, self.env = resume_prompt.resolve(str(o.resume), root, env, say=say)
            self.rd = rundir.ensure_run_dir(Path(root).absolute(), env.node)
        except rundir.ContractError as e:
            raise ConfigError(str(e)) from e
        group = self._join_world(o.collective_timeout)
        self.attempt = self.env.attempt
        # The session core (heartbeat and step mark, hooks, events, the end): the same for every front end.
        self.session = s = Session(self.rd, self.env, rank=self.rank, world_size=self.world_size,
                                   heartbeat_interval=o.heartbeat_interval,
                                   position=lambda: (self.global_step, self.checkpoint_step))
        self.engine = eng = Engine(s.reporter, group, hb=s.hb, saves=s.saves)
        self.sharded = options.decide_sharded(o.sharded, o.model)
        self.allow_reshard = bool(self.env.allow_reshard if o.allow_reshard is None else o.allow_reshard)
        self.model, self.optimizer, self.scheduler, self.scaler = o.model, o.optimizer, o.scheduler, o.scaler
        self.extra: dict[str, Any] = dict(o.extra or {})
        self.save_every_seconds: Optional[float] = None
        if o.seconds_interval is not None:   # a time interval, "auto" (Young/Daly) included
            from .._policies import save_interval

            self.save_every_seconds, eng.auto = save_interval.from_option(o.seconds_interval, self.rd,
                                                                          o.mtbf_hours, eng.hb)
        self.skipped_steps = 0            # on_nonfinite="skip": steps not counted
        self.fallback_dir = Path(o.fallback_dir).absolute() if o.fallback_dir else None
        self._reset_position()
        s.install_hooks(self._on_exception, o.optimizer, self._on_optimizer_step)
        eng.provenance = provenance.Provenance.for_run(script, o.strict_resume, self.env)
        if o.async_save or o.memory_every_steps:  # the memory room is loaded only when switched on
            from .._memory import saver

            self._disk_save()   # its writer thread commits (and rotates) from the first snapshot on
            eng.fast = saver.make(self, self._save, o.async_save, o.memory_every_steps)
        self._resume()

    def _resume(self) -> None:
        if self.engine.group.world_size == 1 or self.rank == 0:
            for d in self.search_dirs:
                rundir.discard_abandoned(d)  # the writes a killed attempt left behind
        self.engine.group.barrier("startup barrier")  # rank 0 has cleaned up before anyone saves
        restored = restoring.restore(self, self.engine.fast.before_restore() if self.engine.fast is not None else None)
        if restored is not None:
            self.global_step, self.epoch, self.batch_in_epoch = (restored.global_step, restored.epoch,
                                                                 restored.batch_in_epoch)
            self.loss, self.resumed_from = restored.loss, restored.resumed_from
            self.state.clear()
            self.state.update(restored.state)
            self._checkpoint_step = restored.checkpoint_step
            self._disk_save()   # a resumed run keeps the checkpoint it stands on until it has saved one
            self.engine.retention.resumed_step = restored.global_step
            from .._trackers import point   # a SummaryWriter opened from now on purges the dead attempt's steps

            point.set_resumed(restored.global_step, restored.global_step + 1)   # run.step() counts, then logs
        elif self.env.resume_from and not self.env.fresh_start_requested:
            from .._trackers import point   # the supervisor's choice did not restore: not its step, from 0

            point.set_fresh()
        self.engine.provenance.settle()   # every later manifest records it (a fresh start had no resume check)
        self.session.mark.set(self.global_step)
        # Second "starting" beat: the supervisor learns what was actually restored (after any fallback).
        self.engine.hb.write_now(step=self.global_step, epoch=self.epoch, loss=self.loss,
                           resumed_from=self.resumed_from, checkpoint_step=self.checkpoint_step)
        self.engine.hb.start()
        self._probe = self._watch()  # step-boundary checks; digests and faults in doctor mode

    def _watch(self) -> StepWatch:
        if self.env.doctor_log is None:
            return StepWatch(self)
        from .._insight.probe import DoctorLog, Probe   # doctor mode only

        return Probe(self, DoctorLog.from_env(self.env))

    def _reset_position(self) -> None:
        """Where training stands (step 0 until a checkpoint is restored) and the data cursor."""
        self.global_step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.loss: Optional[float] = None
        self.resumed_from: Optional[str] = None
        self.state: dict[str, Any] = {}
        self._checkpoint_step: Optional[int] = None   # of the newest checkpoint this process saved or restored

        self._yielded = 0                 # batches handed out by the current training stream
        self._stream_epoch: Optional[int] = None  # epoch whose training stream has started
        self._stream_done = False
        self.engine.reset()

    def _join_world(self, collective_timeout: float) -> Group:
        """This process's rank and group: a world of one is a group of size one (no torch.distributed)."""
        self.rank, self.world_size = self.launcher.rank, self.launcher.world_size
        if self.world_size == 1:
            return Solo()
        from .._session import distributed   # a multi-rank job only
        if distributed.active_world_size() != self.world_size:
            raise ConfigError(f"WORLD_SIZE={self.world_size} but torch.distributed is not initialised with that "
                              "world size; call torch.distributed.init_process_group() before trainer_shim.init()")
        return distributed.Dist(collective_timeout)

    @property
    def checkpoint_step(self) -> Optional[int]:
        """The step of the newest checkpoint committed (or restored) by this process, a background
        writer's included."""
        fast = self.engine.fast
        steps = [s for s in (self._checkpoint_step, fast.committed_step if fast is not None else None) if s is not None]
        return max(steps) if steps else None

    @property
    def strict_resume(self) -> bool:
        """Whether a checkpoint of other code or arguments is refused (else: a warning)."""
        return self.engine.provenance.strict

    # --- paths ----------------------------------------------------------------------------------

    @property
    def search_dirs(self) -> list[Path]:
        """Checkpoint roots in restore order: the run dir's, then the fallback's."""
        dirs = [self.rd.checkpoints]
        if self.fallback_dir is not None:
            dirs.append(self.fallback_dir / rundir.CHECKPOINTS)
        return dirs

    # --- the training loop API ------------------------------------------------------------------

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Yield epoch numbers from the restored one on; the epoch-end checkpoint follows each body."""
        self.engine.stream.in_epochs = True
        self._probe.num_epochs = num_epochs
        try:
            e = self.epoch
            while e < num_epochs:
                self.epoch = e
                yield e
                self._end_epoch()
                e += 1
        finally:
            self.engine.stream.in_epochs = False

    def batches(self, loader: Iterable) -> Iterator[Any]:
        """Yield the epoch's batches in the interrupted run's order, skipping consumed ones unloaded.

        The first run.batches() of an epoch is its training stream; later calls in the same epoch
        (e.g. validation) pass through untouched. Without run.epochs(), a new call after the
        previous stream was exhausted starts the next epoch.
        """
        if self._stream_epoch == self.epoch:
            if not (self._stream_done and not self.engine.stream.in_epochs):
                yield from loader
                return
            self._advance_epoch_counters()
        self._stream_epoch = self.epoch
        self._stream_done = False
        self.engine.stream.loader = loader
        self._probe.on_stream(loader)
        from .._state import data, rng   # the data position: loaded with the first training stream

        resume = self.engine.stream.resume
        self.engine.stream.resume = None
        if resume is not None and resume["epoch"] == self.epoch and (
                resume["batch_in_epoch"] > 0 or (resume.get("loader_state") is not None and data.is_stateful(loader))):
            from . import cursor   # a resumed epoch only

            it, self.engine.stream.epoch_rng = cursor.resumed_iter(loader, resume)
            self._yielded = resume["batch_in_epoch"]
        else:
            self.engine.stream.epoch_rng = rng.capture(data.loader_generator(loader))
            it = iter(loader)
            self._yielded = 0
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except Exception:
                if self.session.stop.requested:
                    # A SIGTERM sent to the whole process group also reaches DataLoader workers,
                    # whose torch-installed handler kills them, so fetching the next batch fails.
                    # Nothing has changed since the last run.step(): stop gracefully instead.
                    say("the data loader failed after a stop signal (its workers got it too); stopping")
                    self._preempt()
                raise
            self._yielded += 1
            self._probe.on_batch(batch)
            yield batch
        self._stream_done = True

    def step(self, loss: Any = None) -> None:
        """Count one optimizer step: heartbeat when due, checkpoint when due, graceful stop if asked."""
        if loss is not None:
            value = loss if type(loss) is float else float(loss)
            if value - value != 0.0 and self.on_nonfinite != "ignore":  # NaN or +-inf: x - x is NaN for both
                from .._policies import divergence   # only a non-finite loss needs it

                if divergence.nonfinite(self, value):   # "raise" never returns
                    self.skipped_steps += 1
                    divergence.note_skip(self, value)
                    return   # on_nonfinite="skip": the step is not counted
            self.loss = value
        self.global_step += 1
        self.session.mark.set(self.global_step)
        self.batch_in_epoch = self._yielded if self._stream_epoch == self.epoch else self.batch_in_epoch + 1
        self.engine.dirty = False
        now = time.monotonic()
        self.session.beat(self.global_step, self.epoch, self.loss)
        every = self.options.step_interval
        timed = self.save_every_seconds is not None and now - self.engine.last_save_t >= self.save_every_seconds
        stop = self.session.stop.requested
        # Every rank must save, and stop, at the same step: one MAX all-reduce of both flags.
        stop, timed = self.engine.group.agree(stop, timed)
        if self.engine.fast is not None:
            self.engine.fast.on_step(bool((every and self.global_step % every == 0) or timed))
        elif (every and self.global_step % every == 0) or timed:
            self._save(CheckpointKind.STEP)
            self._tune_interval(time.monotonic() - now)
        self._probe.on_step()
        if stop:
            self._preempt()

    def heartbeat(self) -> None:
        """An explicit liveness beat for long non-step work (validation); rate-limited like step()."""
        self.session.beat(self.global_step, self.epoch, self.loss)
        if self.session.stop.requested and self.engine.group.world_size == 1:  # multi-rank: the stop is agreed at run.step()
            self._preempt()

    def save(self) -> Optional[Path]:
        """Checkpoint now (kind step); returns the checkpoint dir, or None if the save failed."""
        t0 = time.monotonic()
        path = self._save(CheckpointKind.STEP)
        self._tune_interval(time.monotonic() - t0)
        return path

    def _tune_interval(self, stall_s: float) -> None:
        if self.engine.auto is not None:   # save_every_seconds="auto": the stall re-tunes the interval
            from .._policies import save_interval   # loaded with the tuner

            self.save_every_seconds = save_interval.tune(self.engine.auto, self.engine.hb, stall_s)

    def finish(self) -> None:
        """Final checkpoint and the `finished` heartbeat; the run dir is left ready for inspection."""
        if self.engine.finished:
            return
        final = self._save(CheckpointKind.FINAL)
        self.engine.finished = True
        if self.engine.fast is not None:  # the newest state is on disk now: the memory slots can go
            self.engine.fast.close(free=final is not None)
        if self.engine.retention is not None:
            self.engine.retention.join()  # a finished run leaves no trash behind
        # The hooks stay: an exception after finish() is still recorded (and gets no emergency save).
        self.session.finish(uninstall=False, step=self.global_step, epoch=self.epoch, loss=self.loss,
                            checkpoint_step=self.checkpoint_step)

    # --- epochs -------------------------------------------------------------------------------

    def _advance_epoch_counters(self) -> None:
        self.epoch += 1
        self.batch_in_epoch = 0
        self._yielded = 0
        self._stream_epoch = None
        self.engine.stream.epoch_rng = None

    def _end_epoch(self) -> None:
        self._advance_epoch_counters()
        self.engine.hb.set_epoch(self.epoch)
        if self.options.save_on_epoch_end:
            self._save(CheckpointKind.EPOCH)
        self._probe.on_epoch_end()
        stop = self.session.stop.requested
        stop, _ = self.engine.group.agree(stop, False)
        if stop:
            self._preempt()

    # --- saving -------------------------------------------------------------------------------

    def _on_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        self.engine.dirty = True

    def _disk_save(self) -> Any:
        """The save path (`_disk.save`: capture, member files, the commit, retention), loaded at the
        first save or restore: a fresh start's init() writes and reads no checkpoint."""
        from .._disk import retention, save

        if self.engine.retention is None:
            o = self.options
            self.engine.retention = retention.Retention(self.rd, lambda: self.search_dirs, keep_last=o.keep_last,
                                                        keep_epochs=o.keep_epochs, keep_best=o.keep_best)
        return save

    def _save(self, kind: CheckpointKind, exact: bool = True) -> Optional[Path]:
        """Save at the current step (one protocol for 1..N ranks, see `saving`) unless the step
        already has a checkpoint; storage failures never raise. Every rank calls it at the same step."""
        if self.engine.fast is not None:
            self.engine.fast.drain()  # a synchronous save comes after the background one in flight
        self.engine.last_save_t = time.monotonic()
        self.engine.hb.progress(self.global_step, self.epoch, self.loss, phase=None)
        self.engine.hb.begin_save()
        try:
            with self.engine.saves.stall(kind):
                try:
                    outcome = self._disk_save().save(self, kind, exact)
                except CollectiveTimeout as e:
                    if self.rank == 0:
                        self.engine.reporter.checkpoint_failed(self.rd.checkpoint(self.global_step), self.global_step,
                                                               str(e))
                    say(f"error: {e}; exiting (the supervisor resumes from the newest complete checkpoint)")
                    raise
                if outcome.committed:  # not when an existing checkpoint stands for the step
                    self.engine.last_size = outcome.nbytes
                    self._checkpoint_step = self.engine.retention.committed_step = self.global_step
            return outcome.path if outcome.error is None else None
        finally:
            self.engine.last_save_t = time.monotonic()
            self.engine.hb.end_save(checkpoint_step=self.checkpoint_step)

    # --- stopping and crashing ----------------------------------------------------------------

    def _preempt(self) -> None:
        path = self._save(CheckpointKind.PREEMPT)
        if self.engine.fast is not None:  # without a supervisor nobody else would free the slots
            self.engine.fast.close(free=path is not None and self.env.run_dir is None)
        self.session.exit_preempted(f"checkpoint at step {self.global_step}", self.engine.group.destroy,
                                    step=self.global_step, epoch=self.epoch, loss=self.loss,
                                    checkpoint_step=self.checkpoint_step)

    def _on_exception(self, tp: type, value: BaseException, tb: Optional[TracebackType]) -> None:
        self.session.record_exception(tp, value, tb, self.global_step)
        if self.engine.finished:
            return
        if self.engine.fast is not None:
            self.engine.fast.drain()  # the in-flight save commits before anything else is decided
        why_not = self._disk_save().no_emergency_reason(self)
        if why_not is not None:
            say(f"no emergency checkpoint: {why_not}")
            return
        path = self._save(CheckpointKind.EMERGENCY, exact=False)
        if path is not None:
            say(f"emergency checkpoint (inexact, not auto-resumed) at {path}")


def init(**options: Any) -> Run:
    return Run(**options)


# One declaration of the options (trainer_shim._loop.options.Options): the signature and the
# docstring shown by help(), inspect and IDEs are derived from it, never retyped.
init.__signature__ = options.signature(Run)  # type: ignore[attr-defined]
init.__doc__ = options.docstring("""Create the Run: first heartbeat, then restore the requested or newest valid checkpoint.

An unknown keyword is a TypeError (trainer_shim.ConfigError) naming the closest option.""")
