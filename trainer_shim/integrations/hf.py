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

ms-swift builds the callbacks it names in ``--callbacks`` as ``cls(args, trainer)`` before its
Trainer; so built, the callback sets ``args.resume_from_checkpoint`` itself (ms-swift passes it to
``train()``). A plugin file (``--external_plugins FILE --callbacks resilient``) needs two lines:

    from swift.callbacks import callbacks_map
    callbacks_map["resilient"] = ResilientCallback
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

from transformers import TrainerCallback

from .. import rundir
from ..rundir import CheckpointKind, Manifest, Phase, hf_checkpoint_name, read_extra_roots, record_extra_root
from ._doctor import FrameworkDoctor
from ._session import Session, say

__all__ = ["ResilientCallback"]

_UNLIMITED = 1 << 30


def _remove_if_just_made(path: Path, since: float) -> None:
    """Doctor mode: the Trainer made the user's output_dir in its __init__, before any callback
    could redirect it; doctor's runs leave no trace there. Only an empty dir made since `since`."""
    try:
        if path.stat().st_ctime >= since and not any(path.iterdir()):
            path.rmdir()
    except OSError:
        pass


class ResilientCallback(TrainerCallback):
    """Supervision for a ``transformers.Trainer``; see the module docstring."""

    def __init__(self, run_dir: Any = None, trainer: Any = None, *, heartbeat_interval: float = 1.0) -> None:
        swift_args = None
        if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)) and hasattr(run_dir, "output_dir"):
            swift_args, run_dir = run_dir, None  # ms-swift's cls(args, trainer); `trainer` is not needed
        self.run_dir = run_dir
        self.heartbeat_interval = heartbeat_interval
        self.session: Optional[Session] = None
        self.output_dir: Optional[Path] = None
        self._limit: Any = None
        self._stopping = False
        self._loss: Optional[float] = None
        self._doctor: Optional[FrameworkDoctor] = None
        self._save_t0: Optional[float] = None   # the step end before the Trainer's save (its stall starts)
        self._at_epoch_end: Optional[tuple] = None  # a save at an epoch's last step, committed at the next epoch
        self._step_losses: list[float] = []  # doctor mode: this step's training forward losses
        self._loss_hook: Any = None
        self._born = time.time()  # before the Trainer (built after its callbacks) creates output_dir
        if swift_args is not None and not getattr(swift_args, "resume_from_checkpoint", None):
            swift_args.resume_from_checkpoint = self.resume_from(swift_args.output_dir)

    # --- setup and resume ----------------------------------------------------------------------

    def _start(self, output_dir: os.PathLike | str) -> Session:
        if self.session is None:
            self.output_dir = Path(os.path.abspath(output_dir))
            self.session = Session.open(self.run_dir, self.output_dir, heartbeat_interval=self.heartbeat_interval)
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

    def resume_from(self, output_dir: os.PathLike | str) -> Optional[str]:
        """The checkpoint to pass to ``trainer.train(resume_from_checkpoint=...)``; None on a fresh start.

        The supervisor's choice ($RESILIENT_RESUME_FROM) when it verifies, else the newest
        checkpoint whose manifest and digests check out (older ones are tried in turn, each
        rejection recorded as a ``checkpoint_rejected`` event). Newer torn checkpoint dirs are
        removed so the Trainer never writes into one.
        """
        s = self._start(output_dir)
        assert self.output_dir is not None
        info = s.resume(self._roots(), self.output_dir)
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
        self._limit = args.save_total_limit
        s.set_keep_last(self._limit if self._limit else _UNLIMITED)
        args.save_total_limit = None  # we rotate, after our manifest is committed
        s.set_total_steps(state.max_steps)
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
        self._beat_for(control, state)
        if self._doctor is not None:
            loss, self._step_losses = (sum(self._step_losses) if self._step_losses else None), []
            if self._doctor.on_step(state.global_step, kwargs.get("model"),
                                    {"optimizer": kwargs.get("optimizer"), "scheduler": kwargs.get("lr_scheduler")},
                                    loss=loss, epoch=state.epoch):
                control.should_training_stop = True
        self._save_t0 = time.monotonic() if control.should_save else None

    def _record_loss(self, module: Any, inputs: Any, output: Any) -> None:
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if module.training and loss is not None and hasattr(loss, "detach"):
            self._step_losses.append(float(loss.detach()))  # summed over the step's micro-batches

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._commit_epoch_end_save(args, state)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None:
            self._beat_for(control, state)

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
            self._loss = float(logs["loss"])
            if self.session is not None:
                self.session.hb.fields["loss"] = self._loss

    # --- save ----------------------------------------------------------------------------------

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self.session
        if s is None:
            return
        # The Trainer's save is collective but ends without a barrier: rank 0 writes the model and
        # optimizer while every rank writes its own rng_state_<rank>.pth. The manifest must hash them all.
        s.sync("every rank's checkpoint files written")
        path = Path(args.output_dir) / hf_checkpoint_name(state.global_step)
        took = time.monotonic() - self._save_t0 if self._save_t0 is not None else None  # the Trainer's save
        if (not self._stopping and float(state.epoch or 0).is_integer()
                and state.global_step < (state.max_steps or 0)):
            # Saved at an epoch's last step, before that epoch's evaluation. A resume starts the next
            # epoch from the checkpoint's RNG state without evaluating again, while the uninterrupted
            # run goes on from the state the evaluation left (its loader drew a seed): the next epoch's
            # shuffle and dropout would differ. Committed when that epoch begins, with the RNG of then
            # (every rank refreshes its own rng_state file first).
            self._at_epoch_end = (path, took)
        elif args.should_save:
            self._commit(path, state, took)
        if self._stopping:
            s.sync("preempt checkpoint committed")  # no rank exits (and makes torchrun end the rest) before it
            s.exit_preempted()
        s.beat(state.global_step, int(state.epoch or 0), Phase.TRAINING.value)

    def _commit_epoch_end_save(self, args: Any, state: Any) -> None:
        if self._at_epoch_end is None or self.session is None:
            return
        (path, took), self._at_epoch_end = self._at_epoch_end, None
        if path.is_dir():
            _refresh_rng_state(path, args)
        self.session.sync("every rank's RNG state refreshed")
        if args.should_save:
            self._commit(path, state, took)

    def _commit(self, path: Path, state: Any, took: Optional[float]) -> None:
        """Rank 0: the manifest of the Trainer's checkpoint-N/, then `latest`, index and rotation."""
        s = self.session
        assert s is not None
        if not path.is_dir():
            say(f"warning: the Trainer reported a save but {path} does not exist")
            return
        kind = CheckpointKind.PREEMPT if self._stopping else CheckpointKind.STEP
        step = int(path.name.rsplit("-", 1)[-1])
        try:
            # The Trainer named the dir already: committed in place (its manifest by temp file and rename).
            manifest = Manifest.create(rundir.commit.hash_tree(path), step=step,
                                       epoch=int(state.epoch or 0), batch_in_epoch=0, kind=kind, loss=self._loss)
            rundir.commit.commit_in_place(path, manifest.to_bytes())
        except OSError as e:
            s.save_failed(path, e, f"cannot commit {path}")
        else:
            best = state.best_model_checkpoint
            # The stall: the Trainer's save and our manifest.
            s.committed(path, manifest, self._roots(), protect=[Path(best)] if best else [], seconds=took)


def _refresh_rng_state(path: Path, args: Any) -> None:
    """Overwrite the RNG states in the Trainer's rng_state file with the current ones (same keys, same types)."""
    import random

    import numpy as np
    import torch

    name = f"rng_state_{args.process_index}.pth" if args.world_size > 1 else "rng_state.pth"
    f = path / name
    if not f.is_file():
        return
    states = torch.load(f, weights_only=False)
    states.update(python=random.getstate(), numpy=np.random.get_state(), cpu=torch.random.get_rng_state())
    if "cuda" in states:
        states["cuda"] = (torch.cuda.random.get_rng_state_all() if isinstance(states["cuda"], (list, tuple))
                          else torch.cuda.random.get_rng_state())
    tmp = f.with_name(f.name + ".tmp")
    torch.save(states, tmp)
    os.replace(tmp, f)
