"""Hugging Face Trainer integration: ``ResilientCallback`` (a ``transformers.TrainerCallback``).

    from trainer_shim.integrations.hf import ResilientCallback
    cb = ResilientCallback()          # run dir: $RESILIENT_RUN_DIR, else args.output_dir
    trainer = Trainer(model=..., args=args, train_dataset=..., callbacks=[cb])
    trainer.train(resume_from_checkpoint=cb.resume_from(args.output_dir))

The Trainer keeps doing its own saving and (bit-exact) resuming; the callback makes each
``checkpoint-N/`` verifiable (MANIFEST.json with sizes and xxh3 digests, written last, fsynced),
picks the newest *valid* one to resume from, beats the heartbeat, turns SIGTERM into a save at
the next step end plus exit 75, and takes over ``save_total_limit`` rotation: the Trainer rotates
*inside* its save, before ``on_save`` runs, so a kill between its rotation and our manifest could
leave no valid checkpoint at all. We rotate after the manifest is committed instead, and never
delete the checkpoint the run resumed from (nor the Trainer's best one).

``ResilientCallback(async_save=True)`` (config ``callback: {async_save: true}``): a due step save costs
training one copy of the state into reusable buffers; the Trainer's files are written and committed
by a background thread (see ``_hf_async``). What lands on disk is the Trainer's own ``checkpoint-N/``.

ms-swift builds the callbacks it names in ``--callbacks`` as ``cls(args, trainer)`` before its
Trainer; so built, the callback sets ``args.resume_from_checkpoint`` itself (ms-swift passes it to
``train()``). A plugin file (``--external_plugins FILE --callbacks resilient``) needs two lines:

    from swift.callbacks import callbacks_map
    callbacks_map["resilient"] = ResilientCallback
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Optional

from transformers import TrainerCallback

from .. import rundir
from ..rundir import CheckpointKind, Manifest, Phase, hf_checkpoint_name, read_extra_roots, record_extra_root
from ._background import BackgroundSaves
from ._doctor import FrameworkDoctor
from ._hf_async import SaveWindow, StagedFiles
from ._options import CallbackOptions
from ._session import FrameworkSession, say
from ..errors import ConfigError

__all__ = ["ResilientCallback"]

_UNLIMITED = 1 << 30


@dataclasses.dataclass
class _Job:
    """A background save: the Trainer's staged files of `path`, and what its manifest records."""
    path: Path
    staged: StagedFiles
    epoch: int
    loss: Optional[float]
    loss_step: Optional[int]
    best: Optional[str]


def _remove_if_just_made(path: Path, since: float) -> None:
    """Doctor mode: the Trainer made the user's output_dir in its __init__, before any callback
    could redirect it; doctor's runs leave no trace there. Only an empty dir made since `since`."""
    try:
        if path.stat().st_ctime >= since and not any(path.iterdir()):
            path.rmdir()
    except OSError:
        pass


class ResilientCallback(CallbackOptions, TrainerCallback):
    """Supervision for a ``transformers.Trainer``; see the module docstring. Options: CallbackOptions."""

    def _setup(self) -> None:
        self._background: Optional[BackgroundSaves] = None
        self._window: Optional[SaveWindow] = None
        self.session: Optional[FrameworkSession] = None
        self.output_dir: Optional[Path] = None
        self._limit: Any = None
        self._stopping = False
        self._loss: Optional[float] = None
        self._loss_step: Optional[int] = None   # the step the Trainer logged `_loss` at
        self._doctor: Optional[FrameworkDoctor] = None
        self._save_t0: Optional[float] = None   # the step end before the Trainer's save (its stall starts)
        self._at_epoch_end: Optional[tuple] = None  # a save at an epoch's last step, committed at the next epoch
        self._step_losses: list[float] = []  # doctor mode: this step's training forward losses
        self._loss_hook: Any = None
        self._born = time.time()  # before the Trainer (built after its callbacks) creates output_dir
        self._epoch_len: Optional[tuple[int, int]] = None   # (batches per epoch, gradient accumulation)

    def _framework_args(self, args: Any) -> None:
        """ms-swift's ``cls(args, trainer)``: its arguments get the resume point, unless they name one."""
        if not getattr(args, "resume_from_checkpoint", None):
            args.resume_from_checkpoint = self.resume_from(args.output_dir)

    # --- setup and resume ----------------------------------------------------------------------

    def _start(self, output_dir: os.PathLike | str) -> FrameworkSession:
        if self.session is None:
            self.output_dir = Path(os.path.abspath(output_dir))
            self.session = FrameworkSession.open(self.run_dir, self.output_dir, heartbeat_interval=self.heartbeat_interval)
            self._doctor = FrameworkDoctor.from_env(self.session.env)
            if self._doctor is not None:  # doctor's runs must not share (or touch) the user's output_dir
                self.output_dir = self.session.rd.root / "output"
            self.output_dir.mkdir(parents=True, exist_ok=True)
            record_extra_root(self.session.rd, self.output_dir)
        return self.session

    def _roots(self) -> list[Path]:
        s = self.session
        assert s is not None and self.output_dir is not None
        return [self.output_dir, s.rd.checkpoints, *[r for r in read_extra_roots(s.rd) if r != self.output_dir]]

    def resume_from(self, directory: Optional[os.PathLike | str] = None) -> Optional[str]:
        """The checkpoint to pass to ``trainer.train(resume_from_checkpoint=...)``; None on a fresh start.
        `directory`: the Trainer's output_dir (None: the one the Trainer told this callback).

        The supervisor's choice ($RESILIENT_RESUME_FROM) when it verifies, else the newest
        checkpoint whose manifest and digests check out (older ones are tried in turn, each
        rejection recorded as a ``checkpoint_rejected`` event). Newer torn checkpoint dirs are
        removed so the Trainer never writes into one.
        """
        if directory is None and self.output_dir is None:
            raise ConfigError("resume_from() needs the Trainer's output_dir before the Trainer is built: "
                              "resume_from(args.output_dir)")
        s = self._start(directory if directory is not None else self.output_dir)  # type: ignore[arg-type]
        assert self.output_dir is not None
        info = s.resume(self._roots(), self.output_dir)
        if info is not None:
            from .._trackers import point   # the Trainer logs a step after counting it: N + 1 first

            point.set_resumed(info.step, info.step + 1)
        return str(info.path) if info else None

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start(args.output_dir)
        if self._doctor is not None:
            _remove_if_just_made(Path(args.output_dir), self._born)
            args.output_dir = str(self.output_dir)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self._start(args.output_dir)
        s.install_stop()
        s.group  # every rank here together: the shim's barrier group is created collectively
        s.check_resumed(state.global_step)  # the Trainer has loaded its checkpoint's state by now
        s.check_provenance(_arguments(args))   # before any step (and before we change save_total_limit)
        self._epoch_len = _epoch_len(kwargs.get("train_dataloader"), args.gradient_accumulation_steps)
        self._limit = args.save_total_limit
        keep = self.keep_last or self._limit
        s.set_keep_last(keep if keep else _UNLIMITED)
        self._start_schedule(s)
        args.save_total_limit = None  # we rotate, after our manifest is committed
        s.set_total_steps(state.max_steps)
        if self.async_save and args.should_save and self._background is None:  # the process that commits
            self._background = BackgroundSaves(self._write_background, "hf")
            self._window = SaveWindow(self._background.staging)
        model = kwargs.get("model")
        if self._doctor is not None and model is not None and self._loss_hook is None:
            # The Trainer reports a loss only at logging steps (averaged): doctor compares every step's own.
            self._loss_hook = model.register_forward_hook(self._record_loss)
        # The phase stays `starting` (startup timeout) until the first step ends: the Trainer may
        # still restore state and skip batches here.
        s.beat(state.global_step, int(state.epoch or 0), Phase.STARTING.value)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._commit_epoch_end_save(args, state)
        args.save_total_limit = self._limit
        if self._background is not None:
            self._background.close()  # the step save in flight commits before the process may end
            self._background = self._window = None
        if self.session is not None:
            self.session.finish()

    # --- per step ------------------------------------------------------------------------------

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self.session
        if s is None:
            return
        if not self._stopping and s.stop_agreed():
            self._stopping = True
            control.should_save = True
            control.should_training_stop = True
        if not control.should_save and (self._step_save_due(s, state.global_step) or (
                self.save_on_train_end and state.global_step >= (state.max_steps or 0) > 0)):
            control.should_save = True   # the Trainer saves this step (checkpoint-N), committed in on_save
        self._beat_for(control, state)
        if self._doctor is not None:
            loss, self._step_losses = (sum(self._step_losses) if self._step_losses else None), []
            if self._doctor.on_step(state.global_step, kwargs.get("model"),
                                    {"optimizer": kwargs.get("optimizer"), "scheduler": kwargs.get("lr_scheduler")},
                                    loss=loss, epoch=state.epoch):
                control.should_training_stop = True
        self._save_t0 = time.monotonic() if control.should_save else None
        self._before_save(args, state, control)

    def _before_save(self, args: Any, state: Any, control: Any) -> None:
        """async_save: a due step save's files are staged (`SaveWindow`) while the Trainer saves. A
        preempt, the last step or a stop asked by another callback drains the save in flight instead:
        the process may end, or the Trainer load its best checkpoint, right after this step."""
        if self._background is None or self._window is None or self._window.is_open:
            return
        if self._stopping or control.should_training_stop or state.global_step >= (state.max_steps or 0):
            self._background.drain()
        elif control.should_save:
            self._background.wait()  # one save in flight at most; the buffers are free after it
            self._window.open(Path(args.output_dir) / hf_checkpoint_name(state.global_step))

    def _record_loss(self, module: Any, inputs: Any, output: Any) -> None:
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if module.training and loss is not None and hasattr(loss, "detach"):
            self._step_losses.append(float(loss.detach()))  # summed over the step's micro-batches

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._commit_epoch_end_save(args, state)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None:
            self._beat_for(control, state)
            if control.should_save:  # save_strategy="epoch": the Trainer saves after this
                self._save_t0 = time.monotonic()
                self._before_save(args, state, control)

    def _beat_for(self, control: Any, state: Any) -> None:
        """The phase of what the Trainer does next in this step: evaluate, save, or train on."""
        phase = (Phase.EVALUATING if control.should_evaluate else Phase.SAVING if control.should_save
                 else Phase.TRAINING).value
        s = self.session
        s.beat(state.global_step, int(state.epoch or 0), phase, self._loss)
        if phase != Phase.TRAINING.value:
            s.hb.write_now()  # on disk before a long save/evaluation starts

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None:
            self.session.beat(state.global_step, int(state.epoch or 0),
                              Phase.SAVING.value if control.should_save else Phase.TRAINING.value)

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kwargs: Any) -> None:
        if logs and isinstance(logs.get("loss"), (int, float)):
            self._loss, self._loss_step = float(logs["loss"]), state.global_step
            if self.session is not None:
                self.session.hb.set_loss(self._loss, step=state.global_step)

    # --- save ----------------------------------------------------------------------------------

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self.session
        if s is None:
            return
        # The Trainer's save is collective but ends without a barrier: rank 0 writes the model and
        # optimizer while every rank writes its own rng_state_<rank>.pth. The manifest must hash them all.
        staged = self._window.close() if self._window is not None else None
        s.sync("every rank's checkpoint files written")
        path = Path(args.output_dir) / hf_checkpoint_name(state.global_step)
        took = time.monotonic() - self._save_t0 if self._save_t0 is not None else None  # the Trainer's save
        self._saved(s, took)
        if staged is not None:  # reported now, as native async saves are: when training goes on
            s.saves.add(took or 0.0, CheckpointKind.STEP, state.global_step, s.checkpoint_step)
        if (not self._stopping and float(state.epoch or 0).is_integer()
                and state.global_step < (state.max_steps or 0)):
            # Saved at an epoch's last step, before that epoch's evaluation. A resume starts the next
            # epoch from the checkpoint's RNG state without evaluating again, while the uninterrupted
            # run goes on from the state the evaluation left (its loader drew a seed): the next epoch's
            # shuffle and dropout would differ. Committed when that epoch begins, with the RNG of then
            # (every rank refreshes its own rng_state file first).
            self._at_epoch_end = (path, took, staged)
        elif staged is not None:
            self._submit(path, staged, state, control.should_training_stop)
        elif args.should_save:
            self._commit(path, int(state.epoch or 0), (self._loss, self._loss_step), state.best_model_checkpoint, took)
        if self._stopping:
            s.sync("preempt checkpoint committed")  # no rank exits (and makes torchrun end the rest) before it
            s.exit_preempted()
        s.beat(state.global_step, int(state.epoch or 0), Phase.TRAINING.value)

    def _commit_epoch_end_save(self, args: Any, state: Any) -> None:
        if self._at_epoch_end is None or self.session is None:
            return
        (path, took, staged), self._at_epoch_end = self._at_epoch_end, None
        _refresh_rng_state(path, args, staged)
        self.session.sync("every rank's RNG state refreshed")
        if staged is not None:
            self._submit(path, staged, state, False)
        elif args.should_save:
            self._commit(path, int(state.epoch or 0), (self._loss, self._loss_step), state.best_model_checkpoint, took)

    def _submit(self, path: Path, staged: StagedFiles, state: Any, drain: bool) -> None:
        """Hand the staged files to the writer thread (`_write_background`); `drain`: and wait for it."""
        assert self._background is not None
        self._background.submit(_Job(path, staged, int(state.epoch or 0), self._loss, self._loss_step,
                                     state.best_model_checkpoint))
        if drain:  # training stops after this step: the Trainer may load its best checkpoint next
            self._background.drain()

    def _write_background(self, job: _Job) -> None:
        """Writer thread: the staged files with the Trainer's own functions, then the synchronous commit."""
        try:
            job.staged.write()
        except BaseException as e:  # a failed save, whatever the reason: training continues
            assert self.session is not None
            self.session.save_failed(job.path, rundir.parse_hf_checkpoint_name(job.path.name), e, background=True)
            return
        self._commit(job.path, job.epoch, (job.loss, job.loss_step), job.best, None, CheckpointKind.STEP)

    def _commit(self, path: Path, epoch: int, logged: tuple[Optional[float], Optional[int]], best: Optional[str],
                took: Optional[float], kind: Optional[CheckpointKind] = None) -> None:
        """Rank 0: the manifest of the Trainer's checkpoint-N/, then `latest`, index and rotation.
        `logged`: the newest loss the Trainer logged, and its step."""
        s = self.session
        assert s is not None
        if not path.is_dir():
            say(f"warning: the Trainer reported a save but {path} does not exist")
            return
        if kind is None:
            kind = CheckpointKind.PREEMPT if self._stopping else CheckpointKind.STEP
        step = int(path.name.rsplit("-", 1)[-1])
        loss, loss_step = logged
        try:
            # The Trainer named the dir already: committed in place (its manifest by temp file and rename).
            manifest = Manifest.create(rundir.commit.hash_tree(path), step=step, epoch=epoch,
                                       batch_in_epoch=self._batch_in_epoch(step), kind=kind, loss=loss,
                                       meta=s.manifest_meta(),
                                       loss_step=loss_step if loss_step not in (None, step) else None)
            rundir.commit.commit_in_place(path, manifest.to_bytes(), latest_in=s.rd.checkpoints)
        except OSError as e:
            s.save_failed(path, step, e)
        else:
            # The stall: the Trainer's save and our manifest.
            s.committed(path, manifest, self._roots(), protect=[Path(best)] if best else [], seconds=took)


    def _batch_in_epoch(self, step: int) -> int:
        """The batches of its epoch a checkpoint at `step` has trained, by the Trainer's own rule for
        where a resume starts (steps into the epoch times the gradient accumulation); 0 when the
        loader has no length."""
        if self._epoch_len is None:
            return 0
        batches, accumulation = self._epoch_len
        per_epoch = max(-(-batches // accumulation), 1)   # the Trainer's optimizer steps per epoch
        return min(step % per_epoch * accumulation, batches)


# TrainingArguments that differ between attempts of one run, or between its ranks, without changing
# what is trained: left out of the args hash.
_PER_ATTEMPT_ARGS = frozenset({"output_dir", "logging_dir", "run_name", "resume_from_checkpoint",
                               "overwrite_output_dir", "local_rank", "hub_token", "save_total_limit"})


def _arguments(args: Any) -> Optional[dict]:
    """The Trainer's arguments as the args hash counts them (None: not a TrainingArguments)."""
    to_dict = getattr(args, "to_dict", None)
    if to_dict is None:
        return None
    return {k: v for k, v in to_dict().items() if k not in _PER_ATTEMPT_ARGS}


def _epoch_len(loader: Any, accumulation: Any) -> Optional[tuple[int, int]]:
    try:
        return int(len(loader)), max(int(accumulation or 1), 1)
    except TypeError:   # no loader, or an iterable one without a length
        return None


def _refresh_rng_state(path: Path, args: Any, staged: Optional[StagedFiles]) -> None:
    """Replace the RNG states in the Trainer's rng_state file (or its staged copy) with the current ones
    (same keys, same types)."""
    import random

    import numpy as np
    import torch

    name = f"rng_state_{args.process_index}.pth" if args.world_size > 1 else "rng_state.pth"
    held = staged.get(name) if staged is not None else None
    f = path / name
    if held is None and not f.is_file():
        return
    states = held if held is not None else torch.load(f, weights_only=False)
    states.update(python=random.getstate(), numpy=np.random.get_state(), cpu=torch.random.get_rng_state())
    if "cuda" in states:
        states["cuda"] = (torch.cuda.random.get_rng_state_all() if isinstance(states["cuda"], (list, tuple))
                          else torch.cuda.random.get_rng_state())
    if held is not None:
        return  # written with the rest by the writer thread
    tmp = f.with_name(f.name + ".tmp")
    torch.save(states, tmp)
    os.replace(tmp, f)
