"""Lightning integration: ``ResilientCallback`` (a Lightning ``Callback``, for ``lightning`` and ``pytorch_lightning``).

    from trainer_shim.integrations.lightning import ResilientCallback
    cb = ResilientCallback(save_every_steps=5)   # run dir: $RESILIENT_RUN_DIR, else trainer.default_root_dir
    trainer = pl.Trainer(callbacks=[cb], ...)
    trainer.fit(model, train_dataloaders=dl, ckpt_path=cb.resume_from())

Checkpoints are Lightning's own (``trainer.save_checkpoint``) written into
``checkpoints/.tmp-step-N/``, fsynced, hashed into MANIFEST.json and renamed to ``step-N/``:
the native shim's atomic, verified layout. ``async_save=True`` (one process): a step save copies
Lightning's checkpoint dict into reusable buffers and a writer thread writes and commits it
(``_lightning_async``). The train loader is wrapped so Lightning sees it as
resumable (``_resumable.ResumableLoader``): a mid-epoch resume continues with the same next batch
and the same RNG state, which Lightning alone does not give for a plain shuffled DataLoader.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import time
from pathlib import Path
from typing import Any, Optional

from .. import rundir
from .._disk.members import write_member
from ..rundir import LIGHTNING_CKPT, CheckpointKind, FileEntry, Manifest, Phase
from ._background import BackgroundSaves
from ._lightning_async import copy_checkpoint
from ._resumable import ResumableLoader
from ._doctor import FrameworkDoctor
from ._options import DEFAULT_KEEP_LAST, CallbackOptions
from ._session import FrameworkSession, say

_BASES: list[type] = []
try:
    import lightning.pytorch as _lpt

    _BASES.append(_lpt.Callback)
except ImportError:  # pragma: no cover - either package is enough
    pass
try:
    import pytorch_lightning as _ptl

    if _ptl.Callback not in _BASES:
        _BASES.append(_ptl.Callback)
except ImportError:  # pragma: no cover
    pass
if not _BASES:  # pragma: no cover
    raise ImportError("trainer_shim.integrations.lightning needs `lightning` or `pytorch_lightning` "
                      "(pip install 'resilient-run[lightning]')")

__all__ = ["ResilientCallback"]


@dataclasses.dataclass(frozen=True)
class _Position:
    """Where training stood when a save began: what its manifest records (a background commit runs
    steps later), and when (`t0`: the start of the training thread's stall)."""

    step: int
    epoch: int
    batch: int
    loss: Optional[float]
    t0: float


@dataclasses.dataclass(frozen=True)
class _Job:
    """A background save: the copy of Lightning's checkpoint dict and where it goes."""

    state: Any
    final: Path
    pos: _Position


class ResilientCallback(CallbackOptions, *_BASES):  # type: ignore[misc]
    """Supervision for a Lightning Trainer (both `lightning` and `pytorch_lightning`: its bases are the
    Callback class of each one installed); see the module docstring. Options: CallbackOptions."""

    def _setup(self) -> None:
        self._background: Optional[BackgroundSaves] = None
        self.session: Optional[FrameworkSession] = None
        self._loader: Optional[ResumableLoader] = None
        self._saved_step: Optional[int] = None
        self._doctor: Optional[FrameworkDoctor] = None

    # --- setup and resume ----------------------------------------------------------------------

    def _start(self, default_root: os.PathLike | str) -> FrameworkSession:
        if self.session is None:
            self.session = FrameworkSession.open(self.run_dir, default_root, heartbeat_interval=self.heartbeat_interval,
                                        keep_last=self.keep_last or DEFAULT_KEEP_LAST)
            self._start_schedule(self.session)
            self._doctor = FrameworkDoctor.from_env(self.session.env)
        return self.session

    def resume_from(self, directory: Optional[os.PathLike | str] = None) -> Optional[str]:
        """The ``ckpt_path`` for ``trainer.fit``: the supervisor's choice when it verifies, else the
        newest valid checkpoint of the run dir (rejections become ``checkpoint_rejected`` events);
        None on a fresh start. Without $RESILIENT_RUN_DIR or ``run_dir=``, the run dir is `directory`
        (the Trainer's default_root_dir), else the current directory (Lightning's default)."""
        s = self._start(directory if directory is not None else os.getcwd())
        info = s.resume(rundir.checkpoint_roots(s.rd), s.rd.checkpoints)
        if info is not None:
            from .._trackers import point   # Lightning logs a step before counting it: N first

            point.set_resumed(info.step, info.step)
        return str(info.path / LIGHTNING_CKPT) if info else None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        self._start(trainer.default_root_dir)
        self._start_background(trainer)
        source = trainer.fit_loop._data_source
        request = source.dataloader

        def wrapped() -> Any:
            loader = request()
            if isinstance(loader, ResumableLoader):
                return loader
            if isinstance(loader, (list, tuple, dict)) or loader is None:
                say("warning: several train loaders: mid-epoch resume is not exact for them")
                return loader
            if trainer.world_size > 1:
                loader = _with_distributed_sampler(trainer, loader)
            self._loader = ResumableLoader(loader)
            return self._loader

        source.dataloader = wrapped  # instance attribute: Lightning asks the source for the loader

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        s = self.session
        if s is None:
            return
        # After Lightning's own SIGTERM handler (it would raise SystemExit(1) at the next batch,
        # before our save): SIGTERM now means "save at this step's end and exit 75".
        s.install_stop()
        s.group  # every rank here together (torch.distributed is up): the barrier group is made collectively
        s.check_resumed(trainer.global_step)  # restored from ckpt_path before this hook
        s.check_provenance()   # the script's arguments and config files, its git state
        s.set_total_steps(trainer.estimated_stepping_batches)
        s.beat(trainer.global_step, trainer.current_epoch, Phase.STARTING.value)  # `training` from the first step on

    # --- per step ------------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        _finish_skipped_epoch_start(trainer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        s = self.session
        if s is None:
            return
        step = trainer.global_step
        s.beat(step, trainer.current_epoch, Phase.TRAINING.value, _loss(outputs) if s.beat_due() else None)
        if s.stop_agreed():
            self._save(trainer, CheckpointKind.PREEMPT)
            s.sync("preempt checkpoint committed")  # no rank exits (and makes torchrun end the rest) before it
            s.exit_preempted()
        if step != self._saved_step and self._step_save_due(s, step):
            t0 = time.monotonic()
            self._save(trainer, CheckpointKind.STEP)
            self._saved(s, time.monotonic() - t0)   # what the save cost training (a background one: its copy)
        if self._doctor is not None and self._doctor.on_step(
                step, pl_module, {"optimizer": trainer.optimizers[0] if trainer.optimizers else None,
                                  "scheduler": trainer.lr_scheduler_configs[0].scheduler
                                  if trainer.lr_scheduler_configs else None},
                loss=_loss(outputs), epoch=trainer.current_epoch, batch=batch, rank=trainer.global_rank):
            trainer.should_stop = True

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.session is not None:
            self.session.evaluating(True)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.session is not None:
            self.session.evaluating(False)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.session is None:
            return
        if self.save_on_train_end and trainer.global_step != self._saved_step:
            self._save(trainer, CheckpointKind.FINAL)
        self._stop_background()  # the step save in flight, when no final save drained it
        self.session.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop_background()  # the save in flight still commits before the process ends

    # --- save ----------------------------------------------------------------------------------

    def _start_background(self, trainer: Any) -> None:
        if not self.async_save or self._background is not None:
            return
        if trainer.world_size > 1:  # Lightning's save is collective: every rank's part of it would need a writer
            if trainer.is_global_zero:
                say(f"warning: async_save is single-process only for Lightning; this job ({trainer.world_size} "
                    "ranks) saves synchronously")
            return
        self._background = BackgroundSaves(self._write_background, "lightning")

    def _stop_background(self) -> None:
        if self._background is not None:
            self._background.close()
            self._background = None

    def _save(self, trainer: Any, kind: CheckpointKind) -> Optional[Path]:
        """Collective (every rank calls it at the same step): Lightning's save, a barrier, then global
        zero alone commits. The checkpoint path on rank 0 (None elsewhere, when the save failed or
        when it was handed to the background writer)."""
        s = self.session
        assert s is not None
        if self._background is not None and kind is CheckpointKind.STEP:
            self._background.wait()  # one save in flight at most: a due step save waits for it
        elif self._background is not None:
            self._background.drain()  # the process may end after a preempt/final save: bounded
        step = trainer.global_step
        final = s.rd.checkpoint(step)
        if final.exists():  # every rank sees the same: rank 0 renames only after the barrier below
            self._saved_step = step
            return final
        pos = _Position(step, trainer.current_epoch, self._loader.batches if self._loader is not None else 0,
                        s.hb.value("loss"), time.monotonic())
        if self._background is not None and kind is CheckpointKind.STEP:
            return self._save_background(trainer, final, pos)
        s.hb.begin_save()
        ok = self._write(trainer, final)
        s.sync("every rank's checkpoint files written")
        if not trainer.is_global_zero:  # rank 0 commits after the barrier
            self._saved_step = step
            s.hb.end_save(**({"checkpoint_step": step} if ok else {}))
            return None
        path = self._commit(final, pos, kind) if ok else None
        if path is not None:
            self._saved_step = step
        s.hb.end_save(**({"checkpoint_step": step} if path is not None else {}))  # a failed save claims nothing
        return path

    def _write(self, trainer: Any, final: Path) -> bool:
        """Lightning's own checkpoint (collective: global zero writes the file) into the temp dir."""
        s = self.session
        assert s is not None
        draft = rundir.commit.Draft(s.rd.checkpoints, final.name)
        try:
            if trainer.is_global_zero:  # one rank prepares the dir; another would remove it under the writer
                draft = rundir.commit.Draft.open(s.rd.checkpoints, final.name)
            trainer.save_checkpoint(draft.path / LIGHTNING_CKPT, weights_only=False)  # full state: optimizer, loops, loader
            return True
        except OSError as e:
            draft.discard()
            s.save_failed(final, trainer.global_step, e)
            return False

    def _save_background(self, trainer: Any, final: Path, pos: _Position) -> Optional[Path]:
        """Training thread, one process: Lightning's checkpoint dict copied into the staging buffers and
        handed to the writer thread (`_write_background`). The training stall is this copy alone."""
        s = self.session
        assert s is not None and self._background is not None
        draft = rundir.commit.Draft.open(s.rd.checkpoints, final.name)
        try:
            state = copy_checkpoint(self._background, trainer, draft.path / LIGHTNING_CKPT)
        except OSError as e:  # only a synchronous fallback writes here (see copy_checkpoint)
            draft.discard()
            s.save_failed(final, pos.step, e)
            return None
        self._saved_step = pos.step
        if state is None:  # written synchronously after all: commit it here
            return self._commit(final, pos, CheckpointKind.STEP)
        # Reported now, as native async saves are: when the save returns control to training.
        s.saves.add(time.monotonic() - pos.t0, CheckpointKind.STEP, pos.step, s.checkpoint_step)
        self._background.submit(_Job(state, final, pos))
        return None

    def _write_background(self, job: _Job) -> None:
        """Writer thread: the copy as Lightning's `.ckpt` into the temp dir (hashed as it is written,
        fsynced), then the synchronous save's commit; the heartbeat's checkpoint_step only after it."""
        s = self.session
        assert s is not None
        draft = rundir.commit.Draft(s.rd.checkpoints, job.final.name)
        try:
            size, digest = write_member(draft.path, LIGHTNING_CKPT, job.state)
        except BaseException as e:  # a failed save, whatever the reason: training continues
            draft.discard()
            s.save_failed(job.final, job.pos.step, e, background=True)
            self._saved_step = None  # not saved after all: a final save at this step is still due
            return
        if self._commit(job.final, job.pos, CheckpointKind.STEP, {LIGHTNING_CKPT: FileEntry(size, digest)}) is None:
            self._saved_step = None

    def _commit(self, final: Path, pos: _Position, kind: CheckpointKind,
                files: Optional[dict[str, FileEntry]] = None) -> Optional[Path]:
        """Global zero: manifest, rename into place, `latest`, index and rotation. `files`: the members'
        entries when the writer hashed them as it wrote (a background save, whose stall was reported
        when it returned to training); else the temp dir is hashed here and the whole save timed."""
        s = self.session
        assert s is not None
        draft = rundir.commit.Draft(s.rd.checkpoints, final.name)
        try:
            manifest = Manifest.create(files if files is not None else rundir.commit.hash_tree(draft.path),
                                       step=pos.step, epoch=pos.epoch, batch_in_epoch=pos.batch, kind=kind,
                                       loss=pos.loss, meta=s.manifest_meta())
            draft.commit(manifest.to_bytes(), repoint=True)
        except OSError as e:
            draft.discard()
            s.save_failed(final, pos.step, e, background=files is not None)
            return None
        s.committed(final, manifest, rundir.checkpoint_roots(s.rd),
                    seconds=None if files is not None else time.monotonic() - pos.t0)
        return final


def _with_distributed_sampler(trainer: Any, loader: Any) -> Any:
    """The loader with the DistributedSampler Lightning would inject itself: it does so only into a plain
    DataLoader, which our ResumableLoader wrapper is not, and every rank would then train on every sample."""
    try:
        stages = importlib.import_module(type(trainer).__module__.rsplit(".", 1)[0] + ".states")
        return trainer._data_connector._prepare_dataloader(loader, shuffle=True, mode=stages.RunningStage.TRAINING)
    except (ImportError, AttributeError) as e:  # another Lightning version: say so, train on
        say(f"warning: cannot add Lightning's distributed sampler to the train loader ({e}); every rank sees every sample")
        return loader


def _finish_skipped_epoch_start(trainer: Any) -> None:
    """Do the epoch-start bookkeeping Lightning skipped after resuming from an epoch's last batch.

    A checkpoint written at the end of an epoch's last batch resumes as "restarted mid-epoch": Lightning
    closes that epoch at once and goes on to the next, but (2.x) still skips the next epoch's start: its
    `epoch_progress` is never marked ready/started and `on_train_epoch_start` is not called. Every
    checkpoint the resumed attempt then writes in that epoch says "epoch not started", so an attempt
    resuming from one of them replays the epoch from its first batch on top of the restored weights.
    While a batch trains, an uninterrupted run always has started == processed + 1: restore that.
    """
    progress = getattr(getattr(trainer, "fit_loop", None), "epoch_progress", None)
    if progress is None or progress.current.started != progress.current.processed:
        return
    progress.increment_ready()
    # The hooks the uninterrupted run called here, through the trainer's own package's dispatch (so
    # every callback sees them): `lightning` and `pytorch_lightning` may both be installed.
    if type(trainer).__module__.startswith("pytorch_lightning"):
        from pytorch_lightning.trainer import call
    else:
        from lightning.pytorch.trainer import call  # type: ignore[no-redef]
    call._call_callback_hooks(trainer, "on_train_epoch_start")
    call._call_lightning_module_hook(trainer, "on_train_epoch_start")
    progress.increment_started()


def _loss(outputs: Any) -> Optional[float]:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    try:
        return float(loss.detach()) if hasattr(loss, "detach") else None
    except (TypeError, ValueError, RuntimeError):
        return None

