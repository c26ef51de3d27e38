"""The public API: `init()` returns a Run that counts steps, beats, checkpoints and resumes bit-exactly."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Optional

import torch

from . import checkpoint as ckpt
from . import data, rng, rotation, rundir, signals
from .errors import CheckpointError, CollectiveTimeout, ConfigError, WorldSizeMismatch
from .heartbeat import Heartbeat
from .rundir import CheckpointKind, Phase

__all__ = ["Run", "init", "load", "LoadResult"]

_PREFIX = "trainer_shim:"


def _say(msg: str) -> None:
    print(f"{_PREFIX} {msg}", file=sys.stderr, flush=True)


def _script_path() -> Optional[Path]:
    main = sys.modules.get("__main__")
    f = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else None)
    return Path(f).resolve() if f else None


def git_info(directory: Optional[Path], timeout: float = 2.0) -> tuple[Optional[str], Optional[bool]]:
    """(commit, dirty) of the repository containing `directory`; (None, None) when not a repo."""
    if directory is None:
        return None, None
    try:
        head = subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=timeout)
        if head.returncode != 0:
            return None, None
        commit = head.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None, None
    try:
        st = subprocess.run(["git", "-C", str(directory), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=timeout)
        dirty: Optional[bool] = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        dirty = None
    return commit, dirty


def _sharded() -> Any:
    """The DCP module, imported on first use (it costs ~0.6 s and only sharded runs need it)."""
    from . import sharded

    return sharded


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Run:
    """One training process's view of its run dir. Create it with `trainer_shim.init()`."""

    def __init__(
        self,
        *,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        extra: Optional[dict[str, Any]] = None,
        run_dir: Optional[os.PathLike | str] = None,
        save_every_steps: Optional[int] = None,
        save_every_seconds: Optional[float] = None,
        save_on_epoch_end: bool = True,
        keep_last: int = 3,
        keep_epochs: int = 10,
        keep_best: int = 1,
        fallback_dir: Optional[os.PathLike | str] = None,
        min_free_bytes: Optional[int] = None,
        heartbeat_interval: float = 1.0,
        resume_emergency: bool = False,
        collective_timeout: float = 300.0,
        sharded: Optional[bool] = None,
        allow_reshard: Optional[bool] = None,
    ) -> None:
        if save_every_steps is not None and save_every_steps <= 0:
            raise ConfigError(f"save_every_steps must be positive, got {save_every_steps}")
        if extra is not None and not isinstance(extra, dict):
            raise ConfigError("extra must be a dict of objects with state_dict()/load_state_dict()")
        script = _script_path()
        try:  # the product env, parsed once; a bad value is a one-line configuration error
            self.env = env = rundir.RunEnv.from_environ(os.environ)
            root = run_dir or env.run_dir or Path("runs") / (script.stem if script else "interactive")
            self.rd = rundir.ensure_run_dir(Path(root).absolute(), env.node)
        except rundir.ContractError as e:
            raise ConfigError(str(e)) from e
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self._dist: Any = None  # distributed.Dist when WORLD_SIZE > 1; None keeps the single-process path
        if self.world_size > 1:
            from . import distributed

            if distributed.active_world_size() != self.world_size:
                raise ConfigError(f"WORLD_SIZE={self.world_size} but torch.distributed is not initialised with that "
                                  "world size; call torch.distributed.init_process_group() before trainer_shim.init()")
            self._dist = distributed.Dist(collective_timeout)
        if sharded is None:  # FSDP2/DTensor state must not be gathered to go through torch.save
            # No DTensor exists unless its module was imported: spare everyone else DCP's import.
            sharded = "torch.distributed.tensor" in sys.modules and _sharded().uses_dtensor(model)
        if sharded and model is None:
            raise ConfigError("sharded=True needs a model (its state goes through torch.distributed.checkpoint)")
        self.sharded = bool(sharded)
        self.allow_reshard = bool(env.allow_reshard if allow_reshard is None else allow_reshard)
        self.attempt = env.attempt
        # The step mark is reset before the first beat: the supervisor trusts a mark only once this
        # attempt's heartbeat exists, so it never reads a previous attempt's step as ours.
        self._mark = rundir.StepMark(self.rd.step_mark(self.rank))
        # The first beat goes out before any restore work, so a slow restore is visibly "starting".
        self._hb = Heartbeat(self.rd.heartbeat(self.rank), rank=self.rank, attempt=self.attempt,
                             interval=heartbeat_interval, node=self.rd.node)
        self._hb.write_now()

        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.extra: dict[str, Any] = dict(extra or {})
        self.save_every_steps = save_every_steps
        self.save_every_seconds = save_every_seconds
        self.save_on_epoch_end = save_on_epoch_end
        self.keep_last, self.keep_epochs, self.keep_best = keep_last, keep_epochs, keep_best
        self.fallback_dir = Path(fallback_dir).absolute() if fallback_dir else None
        self.min_free_bytes = int(min_free_bytes or 0)
        self.heartbeat_interval = float(heartbeat_interval)
        self.resume_emergency = resume_emergency

        self.global_step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.loss: Optional[float] = None
        self.resumed_from: Optional[str] = None
        self._rejected_paths: set[str] = set()  # real paths of checkpoints this process refused
        self.state: dict[str, Any] = {}
        self.checkpoint_step: Optional[int] = None

        self._yielded = 0                 # batches handed out by the current training stream
        self._stream_epoch: Optional[int] = None  # epoch whose training stream has started
        self._stream_done = False
        self._in_epochs = False
        self._stream_loader: Any = None   # the loader of the training stream (for stateful ones)
        self._epoch_rng: Optional[dict] = None  # RNG right before this epoch's iterator was built
        self._resume_stream: Optional[dict] = None  # mid-epoch resume data, used by batches()
        self._dirty = False               # an optimizer.step() ran since the last run.step()
        self._hb_last = -math.inf
        self._last_save_t = time.monotonic()
        self._last_size = 0               # bytes of the last checkpoint (free-space check)
        self._resumed_step: Optional[int] = None
        self._committed_step: Optional[int] = None  # newest checkpoint this process committed
        self._warned_workers = False
        self._finished = False
        self._deleters: list[threading.Thread] = []  # background rmtree of rotated checkpoints

        self._stop = signals.StopFlag()
        self._stop.install()
        signals.install_stack_dumps(self.rd.stacks_file(os.getpid()))
        signals.tie_forked_children()
        signals.install_excepthook(self._on_exception)
        if optimizer is not None and hasattr(optimizer, "register_step_post_hook"):
            optimizer.register_step_post_hook(self._on_optimizer_step)

        if self._dist is None or self.rank == 0:
            for d in self.search_dirs:
                for t in rundir.tmp_dirs(d):  # abandoned writes of a killed attempt
                    shutil.rmtree(t, ignore_errors=True)
        self.git_commit, self.git_dirty = git_info(script.parent if script else None)

        self.last_failure: Optional[str] = os.environ.get(rundir.ENV_LAST_FAILURE) or None
        if self._dist is not None:
            self._dist.barrier("startup barrier")  # rank 0 has cleaned up before anyone saves
            self._restore_dist()
        else:
            self._restore()
        self._mark.set(self.global_step)
        # Second "starting" beat: the supervisor learns what was actually restored (after any fallback).
        self._hb.write_now(step=self.global_step, epoch=self.epoch, loss=self.loss,
                           resumed_from=self.resumed_from, checkpoint_step=self.checkpoint_step)
        self._hb.start()

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
        self._in_epochs = True
        try:
            e = self.epoch
            while e < num_epochs:
                self.epoch = e
                yield e
                self._end_epoch()
                e += 1
        finally:
            self._in_epochs = False

    def batches(self, loader: Iterable) -> Iterator[Any]:
        """Yield the epoch's batches in the interrupted run's order, skipping consumed ones unloaded.

        The first run.batches() of an epoch is its training stream; later calls in the same epoch
        (e.g. validation) pass through untouched. Without run.epochs(), a new call after the
        previous stream was exhausted starts the next epoch.
        """
        if self._stream_epoch == self.epoch:
            if not (self._stream_done and not self._in_epochs):
                yield from loader
                return
            self._advance_epoch_counters()
        self._stream_epoch = self.epoch
        self._stream_done = False
        self._stream_loader = loader
        resume = self._resume_stream
        self._resume_stream = None
        if resume is not None and resume["epoch"] == self.epoch and (
                resume["batch_in_epoch"] > 0 or (resume.get("loader_state") is not None and data.is_stateful(loader))):
            it = self._resumed_iter(loader, resume)
            self._yielded = resume["batch_in_epoch"]
        else:
            self._epoch_rng = rng.capture(data.loader_generator(loader))
            it = iter(loader)
            self._yielded = 0
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except Exception:
                if self._stop.requested:
                    # A SIGTERM sent to the whole process group also reaches DataLoader workers,
                    # whose torch-installed handler kills them, so fetching the next batch fails.
                    # Nothing has changed since the last run.step(): stop gracefully instead.
                    _say("the data loader failed after a stop signal (its workers got it too); stopping")
                    self._preempt()
                raise
            self._yielded += 1
            yield batch
        self._stream_done = True

    def step(self, loss: Any = None) -> None:
        """Count one optimizer step: heartbeat when due, checkpoint when due, graceful stop if asked."""
        self.global_step += 1
        self._mark.set(self.global_step)
        self.batch_in_epoch = self._yielded if self._stream_epoch == self.epoch else self.batch_in_epoch + 1
        if loss is not None:
            self.loss = loss if type(loss) is float else float(loss)
        self._dirty = False
        now = time.monotonic()
        if now - self._hb_last >= self.heartbeat_interval:
            self._hb_last = now
            f = self._hb.fields
            f["step"] = self.global_step
            f["epoch"] = self.epoch
            f["loss"] = self.loss
            f["phase"] = "training"
            self._hb.request()
        every = self.save_every_steps
        timed = self.save_every_seconds is not None and now - self._last_save_t >= self.save_every_seconds
        stop = self._stop.requested
        if self._dist is not None:
            # Every rank must save, and stop, at the same step: one MAX all-reduce of both flags.
            stop, timed = self._dist.agree(stop, timed)
        if (every and self.global_step % every == 0) or timed:
            self._save(CheckpointKind.STEP)
        if stop:
            self._preempt()

    def heartbeat(self) -> None:
        """An explicit liveness beat for long non-step work (validation); rate-limited like step()."""
        now = time.monotonic()
        if now - self._hb_last >= self.heartbeat_interval:
            self._hb_last = now
            self._hb.fields.update(step=self.global_step, epoch=self.epoch, loss=self.loss, phase="training")
            self._hb.request()
        if self._stop.requested and self._dist is None:  # multi-rank: the stop is agreed at run.step()
            self._preempt()

    def save(self) -> Optional[Path]:
        """Checkpoint now (kind step); returns the checkpoint dir, or None if the save failed."""
        return self._save(CheckpointKind.STEP)

    def finish(self) -> None:
        """Final checkpoint and the `finished` heartbeat; the run dir is left ready for inspection."""
        if self._finished:
            return
        self._save(CheckpointKind.FINAL)
        self._finished = True
        for t in self._deleters:  # a finished run leaves no trash behind
            t.join()
        self._hb.stop()
        self._mark.close()
        self._hb.write_now(phase=Phase.FINISHED.value, step=self.global_step, epoch=self.epoch,
                           loss=self.loss, checkpoint_step=self.checkpoint_step)

    # --- epochs -------------------------------------------------------------------------------

    def _advance_epoch_counters(self) -> None:
        self.epoch += 1
        self.batch_in_epoch = 0
        self._yielded = 0
        self._stream_epoch = None
        self._epoch_rng = None

    def _end_epoch(self) -> None:
        self._advance_epoch_counters()
        self._hb.fields["epoch"] = self.epoch
        if self.save_on_epoch_end:
            self._save(CheckpointKind.EPOCH)
        stop = self._stop.requested
        if self._dist is not None:
            stop, _ = self._dist.agree(stop, False)
        if stop:
            self._preempt()

    def _resumed_iter(self, loader: Any, resume: dict) -> Iterator:
        """The iterator of a mid-epoch resume; leaves the RNG exactly as after the checkpointed step."""
        k = resume["batch_in_epoch"]
        gen = data.loader_generator(loader)
        epoch_rng = resume.get("epoch_rng")
        self._epoch_rng = epoch_rng if k > 0 else rng.capture(gen)
        if epoch_rng is not None and k > 0:
            rng.restore(epoch_rng, gen)  # the iterator's own draws must see the epoch-start state
        if data.is_stateful(loader) and resume.get("loader_state") is not None:
            # A stateful loader knows its own position (and its own shuffling state) at any k.
            loader.load_state_dict(resume["loader_state"])
            it = iter(loader)
        elif data.can_skip_by_index(loader):
            if loader.num_workers > 0 and not self._warned_workers:
                self._warned_workers = True
                _say(f"warning: mid-epoch resume with num_workers={loader.num_workers}: batches are "
                     "identical for a deterministic __getitem__, but worker-side randomness may differ "
                     "(workers are assigned round-robin from the resume point)")
            new, skip = data.resumed_loader(loader, k)
            it = iter(new)
            skip.prime()  # single-process loaders draw the sampler seed lazily: do it now
        else:
            it = data.skip_plain(loader, k)
        if k > 0:  # at k == 0 the iterator's draws are exactly what the interrupted run did next
            rng.restore(resume["step_rng"])
        return it

    # --- saving -------------------------------------------------------------------------------

    def _on_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        self._dirty = True

    def _existing(self, step: int) -> Optional[Path]:
        name = rundir.checkpoint_name(step)
        for d in self.search_dirs:
            if (d / name).is_dir():
                return d / name
        return None

    def _reusable(self, step: int, exact: bool) -> Optional[Path]:
        """The committed checkpoint at `step` that a save there may keep instead of writing, if any.

        One that must not stand for this run's state at the step is moved out of the way: an
        emergency one when an exact save comes (it was kept only for inspection), one this process
        rejected (a bit flip the size check cannot see) or that fails the size check, and one
        another world size wrote (before a reshard: a different timeline).
        """
        existing = self._existing(step)
        if existing is None:
            return None
        why = "rejected at resume" if os.path.realpath(existing) in self._rejected_paths else None
        if why is None:
            try:
                m = rundir.inspect_checkpoint(existing).manifest
                if exact and not m.exact:
                    why = "inexact (emergency)"
                elif m.world_size != self.world_size:
                    why = f"written by {m.world_size} rank(s)"
            except rundir.InvalidCheckpoint as e:
                why = f"invalid: {e.reason}"
        if why is None:
            return existing
        trash = existing.parent / f"{rundir.TMP_PREFIX}deleting-{existing.name}"
        try:
            shutil.rmtree(trash, ignore_errors=True)
            os.rename(existing, trash)
            shutil.rmtree(trash, ignore_errors=True)
        except OSError as e:
            _say(f"warning: cannot replace checkpoint {existing} ({why}): {e}")
            return existing
        _say(f"replacing checkpoint {existing} ({why})")
        return None

    def _snapshot(self, kind: CheckpointKind, exact: bool) -> ckpt.Snapshot:
        """Collect state (CPU tensors by reference, device tensors copied); the write is synchronous."""
        files: dict[str, Any] = {}
        # Multi-rank: DDP replicas are identical, so each is written once, and by different ranks
        # (model: rank 0, optimizer: the last rank) so the two biggest members are written in
        # parallel. Sharded: every rank's shards go through DCP in the write itself.
        single = self._dist is None
        if self.model is not None and not self.sharded and (single or self.rank == 0):
            files[ckpt.MODEL_FILE] = ckpt.to_cpu(self.model.state_dict())
        if self.optimizer is not None and not self.sharded and (single or self.rank == self.world_size - 1):
            files[ckpt.OPTIMIZER_FILE] = ckpt.to_cpu(self.optimizer.state_dict())
        stream = self._stream_loader  # kept across epochs: a stateful loader's state matters at epoch ends too
        trainer = {
            "format": rundir.FORMAT_VERSION,
            "global_step": self.global_step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "loss": self.loss,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "extra": {k: v.state_dict() for k, v in self.extra.items() if v is not None},
            "state": ckpt.check_plain(self.state, "run.state"),
            "rng": rng.capture(),
            "epoch_rng": self._epoch_rng if self.batch_in_epoch > 0 else None,
            "loader_state": stream.state_dict() if stream is not None and data.is_stateful(stream) else None,
        }
        files[ckpt.TRAINER_FILE if self._dist is None else ckpt.rank_file(self.rank)] = ckpt.to_cpu(trainer)
        return ckpt.Snapshot(files, self.global_step, self.epoch, self.batch_in_epoch, kind, self.loss, exact,
                             sharded=self.sharded)

    def _save(self, kind: CheckpointKind, exact: bool = True) -> Optional[Path]:
        """Save at the current step unless it already has a checkpoint; storage failures never raise."""
        if self._dist is not None:
            return self._save_dist(kind)
        self._last_save_t = time.monotonic()
        existing = self._reusable(self.global_step, exact)
        if existing is not None:
            self._upgrade_kind(existing, kind)
            return existing
        snap = self._snapshot(kind, exact)
        self._hb.fields.update(step=self.global_step, epoch=self.epoch, loss=self.loss)
        self._hb.begin_save()
        try:
            for root in self.search_dirs:
                if not self._ensure_space(root, snap):
                    continue
                try:
                    path, manifest, nbytes = ckpt.write_checkpoint(
                        root, snap, meta={"git_commit": self.git_commit, "git_dirty": self.git_dirty},
                        progress=self._on_progress, shards=self._write_shards if self.sharded else None)
                except CheckpointError as e:
                    self._last_size = max(self._last_size, self._hb.save_bytes)
                    self._failed(root, str(e))
                    continue
                self._last_size = nbytes
                self.checkpoint_step = self._committed_step = self.global_step
                self._index_add(path, manifest)
                self._rotate()
                return path
            return None
        finally:
            self._last_save_t = time.monotonic()
            self._hb.end_save(checkpoint_step=self.checkpoint_step)

    def _write_shards(self, tmp: Path) -> dict[str, rundir.FileEntry]:
        """Single process: the DCP set of model and optimizer (no collectives)."""
        files, _referenced = _sharded().save(tmp, self.model, self.optimizer, rank=0, progress=self._on_progress)
        return files

    def _save_dist(self, kind: CheckpointKind) -> Optional[Path]:
        """The multi-rank commit protocol; every rank calls it at the same step.

        rank 0 picks the root and creates `.tmp-step-N`; every rank writes its members there
        (rank 0: model and rank-0.pt; the last rank: optimizer; rank R: rank-R.pt; sharded: every
        rank its DCP shards); rank 0 gathers every rank's
        {file: (size, digest)}, writes MANIFEST.json listing them all, renames, repoints latest
        and broadcasts the outcome. A storage failure on any rank fails the save everywhere
        (checkpoint_failed) and training continues; a collective timeout ends the process.
        """
        d = self._dist
        self._last_save_t = time.monotonic()
        step = self.global_step
        decision: Any = None
        if self.rank == 0:
            existing = self._reusable(step, True)
            if existing is not None:
                self._upgrade_kind(existing, kind)
                decision = ("exists", str(existing))
            else:
                decision = ("none", None)
                name = rundir.checkpoint_name(step)
                probe = ckpt.Snapshot({}, step, self.epoch, self.batch_in_epoch, kind, self.loss)
                for root in self.search_dirs:
                    if not self._ensure_space(root, probe):
                        continue
                    tmp = root / f"{rundir.TMP_PREFIX}{name}"
                    try:
                        root.mkdir(mode=rundir.RUN_DIR_MODE, parents=True, exist_ok=True)
                        if tmp.exists():
                            shutil.rmtree(tmp)
                        tmp.mkdir(mode=rundir.RUN_DIR_MODE)
                    except OSError as e:
                        self._failed(root, f"cannot create {tmp}: {e.strerror or e}")
                        continue
                    decision = ("write", str(tmp))
                    break
        snap = self._snapshot(kind, True)
        self._hb.fields.update(step=step, epoch=self.epoch, loss=self.loss)
        self._hb.begin_save()
        try:
            try:
                d.barrier(f"checkpoint barrier at step {step}")
                decision = d.broadcast(decision, "checkpoint decision")
                if decision[0] == "exists":
                    return Path(decision[1])
                if decision[0] != "write":
                    return None
                tmp = Path(decision[1])
                mine: dict[str, tuple[int, str]] = {}
                err: Optional[str] = None
                written = 0
                try:
                    for fname, obj in snap.files.items():
                        base = written
                        mine[fname] = ckpt.write_member(tmp, fname, obj, lambda n: self._on_progress(base + n))
                        written += mine[fname][0]
                except (OSError, RuntimeError) as e:
                    err = f"rank {self.rank}: {type(e).__name__}: {e}"
                referenced: set[str] = set()
                if self.sharded:  # collective: every rank takes part even after its own failure
                    try:
                        base = written
                        shards, referenced = d.guard("sharded checkpoint write", _sharded().save, tmp, self.model,
                                                     self.optimizer, rank=self.rank, group=d.group,
                                                     progress=lambda n: self._on_progress(base + n))
                        mine.update({f: (e.size, e.xxh3_128) for f, e in shards.items()})
                    except (OSError, CheckpointError) as e:
                        err = err or f"rank {self.rank}: {type(e).__name__}: {e}"
                reports = d.all_gather((mine, err), "checkpoint file reports")
                outcome: Any = None
                if self.rank == 0:
                    errs = [e for _, e in reports if e]
                    files: dict[str, tuple[int, str]] = {}
                    for m, _ in reports:
                        files.update(m)
                    lost = sorted(referenced - set(files))
                    if lost and not errs:  # DCP's metadata names shards no rank reported writing
                        errs.append(f"shards missing from every rank's report: {', '.join(lost[:5])}")
                    if errs:
                        shutil.rmtree(tmp, ignore_errors=True)
                        outcome = ("failed", "; ".join(errs))
                    else:
                        try:
                            final, manifest = ckpt.commit_members(
                                tmp.parent, tmp, snap, files, world_size=d.world_size,
                                meta={"git_commit": self.git_commit, "git_dirty": self.git_dirty})
                            outcome = ("ok", str(final), sum(sz for sz, _ in files.values()))
                            self._index_add(final, manifest)
                            self._rotate()
                        except CheckpointError as e:
                            outcome = ("failed", str(e))
                    if outcome[0] == "failed":
                        self._failed(tmp.parent, outcome[1])
                outcome = d.broadcast(outcome, "checkpoint outcome")
            except CollectiveTimeout as e:
                if self.rank == 0:
                    self._failed(self.rd.checkpoints, str(e))
                _say(f"error: {e}; exiting (the supervisor resumes from the newest complete checkpoint)")
                raise
            if outcome[0] != "ok":
                return None
            self._last_size = outcome[2]
            self.checkpoint_step = self._committed_step = step
            return Path(outcome[1])
        finally:
            self._last_save_t = time.monotonic()
            self._hb.end_save(checkpoint_step=self.checkpoint_step)

    def _on_progress(self, nbytes: int) -> None:
        self._hb.save_bytes = nbytes

    def _failed(self, root: Path, error: str) -> None:
        _say(f"warning: checkpoint at step {self.global_step} failed in {root}: {error}; training continues")
        self._event("checkpoint_failed", path=str(root / rundir.checkpoint_name(self.global_step)), error=error)

    def _event(self, event: str, **fields: Any) -> None:
        try:
            rundir.append_event(self.rd, event, self.attempt, **fields)
        except OSError as e:
            _say(f"warning: cannot append to {self.rd.events}: {e}")

    def _ensure_space(self, root: Path, snap: ckpt.Snapshot) -> bool:
        """Free space >= 1.2 x last checkpoint + min_free_bytes, rotating first if that makes room."""
        need = int(1.2 * self._last_size) + self.min_free_bytes
        if need <= 0:
            return True
        free = self._free(root)
        if free is None or free >= need:
            return True
        name = rundir.checkpoint_name(snap.global_step)
        self._rotate(placeholder=rotation.Entry(name, snap.global_step, snap.kind, snap.loss, snap.exact))
        free = self._free(root)
        if free is None or free >= need:
            return True
        self._failed(root, f"no_space: need {need} bytes free, have {free}")
        return False

    @staticmethod
    def _free(root: Path) -> Optional[int]:
        p = root
        while not p.exists() and p != p.parent:
            p = p.parent
        try:
            return shutil.disk_usage(p).free
        except OSError:
            return None

    # --- index and rotation -------------------------------------------------------------------

    def _write_index(self, idx: dict) -> None:
        try:
            idx = {n: e for n, e in idx.items() if isinstance(e, dict)}  # drop foreign junk
            entries = []
            for n, e in idx.items():
                try:
                    kind = CheckpointKind(e.get("kind", "step"))
                except ValueError:
                    kind = CheckpointKind.STEP
                loss = e.get("loss") if isinstance(e.get("loss"), (int, float)) else None
                entries.append(rotation.Entry(n, int(e.get("global_step") or 0), kind, loss,
                                              kind is not CheckpointKind.EMERGENCY))
            best = rotation.best_names(entries, self.keep_best)
            for n in idx:
                idx[n]["is_best"] = n in best
            rundir.atomic_write_json(self.rd.index, idx)
        except (OSError, TypeError, ValueError) as e:
            # The index is bookkeeping: losing an update must never stop training.
            _say(f"warning: cannot write {self.rd.index}: {e}")

    def _index_add(self, path: Path, manifest: rundir.Manifest) -> None:
        idx = rundir.read_index(self.rd)
        idx[path.name] = rundir.index_entry(manifest, is_best=False, directory=path)
        self._write_index(idx)

    def _upgrade_kind(self, path: Path, kind: CheckpointKind) -> None:
        idx = rundir.read_index(self.rd)
        ent = idx.get(path.name)
        if not isinstance(ent, dict):
            try:
                info = rundir.inspect_checkpoint(path)
            except rundir.InvalidCheckpoint:
                return
            ent = idx[path.name] = rundir.index_entry(info.manifest, is_best=False, directory=path)
        try:
            old = CheckpointKind(ent.get("kind", "step"))
        except ValueError:
            old = CheckpointKind.STEP
        if kind.rank > old.rank:
            ent["kind"] = kind.value
            self._write_index(idx)

    def _rotate(self, placeholder: Optional[rotation.Entry] = None) -> None:
        """Delete what the retention policy drops; a failure here is reported and ignored."""
        try:
            idx = rundir.read_index(self.rd)
            found: dict[str, tuple[Path, rotation.Entry]] = {}
            for step, path, _root in rundir.iter_checkpoint_dirs(self.search_dirs):
                if path.name in found:
                    continue
                try:
                    info = rundir.inspect_checkpoint(path)
                except rundir.InvalidCheckpoint:
                    continue  # not ours to judge: a damaged dir stays for inspection
                kind = info.manifest.kind
                try:
                    kind = CheckpointKind(idx.get(path.name, {}).get("kind", kind.value))
                except ValueError:
                    pass
                found[path.name] = (path, rotation.Entry(path.name, step, kind, info.manifest.loss,
                                                         info.manifest.exact))
            entries = [e for _, e in found.values()]
            protected = set()
            if placeholder is not None:
                entries.append(placeholder)
                protected.add(placeholder.name)
            for d in self.search_dirs:
                try:
                    protected.add(os.path.basename(os.readlink(d / rundir.LATEST)))
                except OSError:
                    pass
            if self._resumed_step is not None and (self._committed_step is None
                                                   or self._committed_step <= self._resumed_step):
                protected.add(rundir.checkpoint_name(self._resumed_step))
            doomed = rotation.to_delete(entries, keep_last=self.keep_last, keep_epochs=self.keep_epochs,
                                        keep_best=self.keep_best, protected=protected)
            for name in doomed:
                if name not in found:
                    continue
                path = found[name][0]
                # Rename first: a half-deleted dir must never look like a committed checkpoint.
                trash = path.parent / f"{rundir.TMP_PREFIX}deleting-{name}"
                os.rename(path, trash)
                if placeholder is not None:  # making room: the space must be free now
                    shutil.rmtree(trash, ignore_errors=True)
                else:  # unlinking GBs costs tens of ms; the renamed dir is already invisible
                    t = threading.Thread(target=shutil.rmtree, args=(trash, True), daemon=True,
                                         name="trainer_shim-rotate")
                    t.start()
                    self._deleters.append(t)
                idx.pop(name, None)
            if doomed:
                for n in [n for n, e in idx.items() if not Path(e.get("dir", "")).is_dir()]:
                    idx.pop(n)
                self._write_index(idx)
        except OSError as e:
            _say(f"warning: checkpoint rotation failed: {e}")

    # --- stopping and crashing ----------------------------------------------------------------

    def _preempt(self) -> None:
        self._save(CheckpointKind.PREEMPT)
        self._hb.stop()
        self._mark.close()
        self._hb.write_now(phase=Phase.STOPPING.value, step=self.global_step, epoch=self.epoch,
                           loss=self.loss, checkpoint_step=self.checkpoint_step)
        _say(f"stop requested (signal {self._stop.signum}); checkpoint at step {self.global_step}; "
             f"exiting {rundir.EXIT_PREEMPTED}")
        if self._dist is not None:
            self._dist.destroy()
        sys.exit(rundir.EXIT_PREEMPTED)

    def _on_exception(self, tp: type, value: BaseException, tb: Optional[TracebackType]) -> None:
        rec = {"type": signals.qualified_name(tp), "message": str(value),
               "traceback": "".join(traceback.format_exception(tp, value, tb)),
               "step": self.global_step, "time": rundir.now_iso()}
        efile = self.rd.error_file(self.attempt, self.rank if self._dist is not None else 0)
        try:
            rundir.atomic_write_json(efile, rec)
        except OSError as e:
            _say(f"warning: cannot write {efile}: {e}")
        if self._finished:
            return
        if self._dist is not None:
            # The other ranks are not in this save's collectives: an emergency checkpoint cannot commit.
            _say("no emergency checkpoint: multi-rank runs save only at steps all ranks agree on")
            return
        if self.optimizer is None:
            _say("no emergency checkpoint: without an optimizer the shim cannot tell whether the weights match the step")
        elif self._dirty:
            _say(f"no emergency checkpoint: optimizer.step() ran after run.step() {self.global_step}, "
                 "so the weights match no step")
        elif self._existing(self.global_step) is not None:
            _say(f"no emergency checkpoint: step {self.global_step} already has one")
        else:
            path = self._save(CheckpointKind.EMERGENCY, exact=False)
            if path is not None:
                _say(f"emergency checkpoint (inexact, not auto-resumed) at {path}")

    # --- restoring ----------------------------------------------------------------------------

    def _reject(self, path: Path, reason: str) -> None:
        self._rejected_paths.add(os.path.realpath(path))
        _say(f"warning: rejected checkpoint {path}: {reason}")
        self._event("checkpoint_rejected", path=str(path), reason=reason)

    def _restore(self) -> None:
        """Load the requested or newest valid checkpoint, falling back to older ones on rejection."""
        requested = self.env.resume_from
        if requested == rundir.RESUME_NONE:
            _say(f"starting fresh in {self.rd.root} (supervisor: no valid checkpoint)")
            return
        below: Optional[int] = None
        if requested:
            path = Path(requested)
            try:
                self._apply(path)
                return
            except WorldSizeMismatch as e:
                self._world_size_refused(path, e)
            except CheckpointError as e:
                self._reject(path, str(e))
                below = rundir.parse_checkpoint_name(path.name)
        while True:
            info = rundir.newest_valid(self.search_dirs, allow_inexact=self.resume_emergency,
                                       below_step=below, on_reject=self._reject)
            if info is None:
                _say(f"starting fresh in {self.rd.root}")
                return
            try:
                self._apply(info.path)
                return
            except WorldSizeMismatch as e:
                self._world_size_refused(info.path, e)
            except CheckpointError as e:
                self._reject(info.path, str(e))
                below = info.step

    def _world_size_refused(self, path: Path, e: Exception) -> None:
        msg = f"cannot resume from {path}: {e}"
        _say(f"error: {msg}")
        if self.rank == 0:
            self._event("checkpoint_rejected", path=str(path), reason=str(e))
        if self._dist is not None:
            self._dist.destroy()
        raise SystemExit(2)  # a configuration problem: retrying cannot help

    def _restore_dist(self) -> None:
        """rank 0 chooses (the supervisor's pick, else the newest valid), broadcasts, every rank loads it;
        a checkpoint any rank cannot apply is rejected and the next older one tried, on all ranks."""
        d = self._dist
        requested = self.env.resume_from
        if requested == rundir.RESUME_NONE:
            if self.rank == 0:
                _say(f"starting fresh in {self.rd.root} (supervisor: no valid checkpoint)")
            return
        below: Optional[int] = None
        first = True
        while True:
            cand: Optional[str] = None
            if self.rank == 0:
                if first and requested:
                    cand = requested
                else:
                    info = rundir.newest_valid(self.search_dirs, below_step=below, on_reject=self._reject)
                    cand = str(info.path) if info else None
            first = False
            cand = d.broadcast(cand, "checkpoint choice")
            if cand is None:
                if self.rank == 0:
                    _say(f"starting fresh in {self.rd.root}")
                return
            err = self._verify_share(Path(cand))
            errs = [(r, e) for r, e in enumerate(d.all_gather(err, "checkpoint verification")) if e]
            if not errs:
                try:
                    self._apply(Path(cand), verify=False)
                except WorldSizeMismatch as e:
                    self._world_size_refused(Path(cand), e)
                except CheckpointError as e:
                    err = str(e)
                errs = [(r, e) for r, e in enumerate(d.all_gather(err, "restore outcome")) if e]
            if not errs:
                return
            if self.rank == 0:
                self._reject(Path(cand), "; ".join(f"rank {r}: {e}" for r, e in errs))
            self.resumed_from = None
            below = rundir.parse_checkpoint_name(Path(cand).name)

    def _verify_share(self, path: Path) -> Optional[str]:
        """Hash this rank's share of a multi-rank checkpoint's files (ranks split the work by size)."""
        def share(files: dict[str, rundir.FileEntry]) -> list[str]:
            load = [0] * self.world_size
            picked: list[str] = []
            for name in sorted(files, key=lambda n: (-files[n].size, n)):  # greedy: biggest to least loaded
                r = min(range(self.world_size), key=lambda i: (load[i], i))
                load[r] += files[name].size
                if r == self.rank:
                    picked.append(name)
            return picked

        try:
            rundir.inspect_checkpoint(path, full=True, digest_only=share)
        except rundir.InvalidCheckpoint as e:
            return e.reason
        return None

    def _refuse_world_size(self, m: rundir.Manifest) -> None:
        was, now = m.world_size, self.world_size
        if not m.sharded:
            raise WorldSizeMismatch(f"it was written by {was} rank(s), this run has {now}; only sharded (DCP) "
                                    f"checkpoints can be resharded: run with {was} rank(s)")
        if not self.allow_reshard:
            raise WorldSizeMismatch(
                f"it was written by {was} rank(s), this run has {now}; its model and optimizer would reshard "
                f"exactly, but data order and per-rank RNG cannot continue a {was}-rank run bit-exactly: run "
                f"with {was} rank(s), or set {rundir.ENV_ALLOW_RESHARD}=1 to resume at {now}")

    def _apply(self, path: Path, verify: bool = True) -> None:
        try:
            head = rundir.inspect_checkpoint(path)
        except rundir.InvalidCheckpoint as e:
            raise CheckpointError(e.reason) from e
        hm = head.manifest
        reshard = hm.world_size != self.world_size
        if reshard:
            self._refuse_world_size(hm)
        if ckpt.TRAINER_FILE in hm.files:  # written by one process
            mine = ckpt.TRAINER_FILE
        else:  # per-rank state; a rank the old world did not have continues from rank 0's
            mine = ckpt.rank_file(self.rank if self.rank < hm.world_size else 0)
        names = [mine] if hm.sharded else [ckpt.MODEL_FILE, ckpt.OPTIMIZER_FILE, mine]
        info, files = ckpt.read_checkpoint(path, names=names, verify=verify)
        tr = files.get(mine)
        m = info.manifest
        if not isinstance(tr, dict) or "rng" not in tr:
            raise CheckpointError(f"{mine} lacks trainer state")
        if m.sharded:
            if self.model is None:
                raise CheckpointError("a sharded checkpoint needs init(model=...) to load into")
            group = self._dist.group if self._dist is not None else None
            load = self._dist.guard if self._dist is not None else (lambda _what, fn, *a, **k: fn(*a, **k))
            load("sharded checkpoint load", _sharded().load, path, self.model, self.optimizer, group=group)
            self._dirty = False  # DCP initialises a fresh optimizer's state with a zero-lr step
        elif self.model is not None:
            if ckpt.MODEL_FILE not in files:
                raise CheckpointError(f"{ckpt.MODEL_FILE} missing")
            self.model.load_state_dict(files[ckpt.MODEL_FILE])
        if self.optimizer is not None and ckpt.OPTIMIZER_FILE in files:
            self.optimizer.load_state_dict(files[ckpt.OPTIMIZER_FILE])
        if self.scheduler is not None and tr.get("scheduler") is not None:
            self.scheduler.load_state_dict(tr["scheduler"])
        if self.scaler is not None and tr.get("scaler") is not None:
            self.scaler.load_state_dict(tr["scaler"])
        for k, obj in self.extra.items():
            if obj is not None and k in (tr.get("extra") or {}):
                obj.load_state_dict(tr["extra"][k])
        self.state.clear()
        self.state.update(tr.get("state") or {})
        # Resharded: each rank's share of an epoch changes with the world size; resume at the
        # same fraction of the epoch (the global sample count) in the new world's batches.
        k = m.batch_in_epoch * m.world_size // self.world_size if reshard else m.batch_in_epoch
        self.global_step, self.epoch, self.batch_in_epoch = m.global_step, m.epoch, k
        self.loss = tr.get("loss", m.loss)
        if self.rank >= m.world_size:  # a rank the old world lacked starts from rank 0's RNGs: make them its own
            tr = {**tr, "rng": rng.derive(tr["rng"], self.rank),
                  "epoch_rng": rng.derive(tr["epoch_rng"], self.rank) if tr.get("epoch_rng") else None}
        rng.restore(tr["rng"])
        if k > 0 or tr.get("loader_state") is not None:
            self._resume_stream = {"epoch": m.epoch, "batch_in_epoch": k,
                                   "epoch_rng": tr.get("epoch_rng"), "step_rng": tr["rng"],
                                   "loader_state": tr.get("loader_state")}
        self.resumed_from = str(info.path)
        self._resumed_step = self.checkpoint_step = m.global_step
        self._last_size = sum(f.size for f in m.files.values())
        _say(f"resumed from {info.path} (step {m.global_step}, epoch {m.epoch}, batch {k})"
             + ("" if m.exact else " [inexact emergency checkpoint]")
             + (f" [resharded from {m.world_size} to {self.world_size} rank(s): not bit-exact]" if reshard else ""))
        if reshard and self.rank == 0:
            self._event("checkpoint_resharded", path=str(info.path), from_world_size=m.world_size,
                        to_world_size=self.world_size, batch_in_epoch=k)
        if m.git_commit and self.git_commit and m.git_commit != self.git_commit:
            _say(f"warning: checkpoint was written at git commit {m.git_commit[:12]}, "
                 f"the script is now at {self.git_commit[:12]}")


def init(**kwargs: Any) -> Run:
    """Create the Run: first heartbeat, then restore the requested or newest valid checkpoint."""
    return Run(**kwargs)


@dataclasses.dataclass
class LoadResult:
    """What `load()` found: the checkpoint, its manifest, and the model state dict."""

    path: Path
    manifest: rundir.Manifest
    model_state: dict
    missing_keys: list[str]
    unexpected_keys: list[str]


def load(path_or_run_dir: os.PathLike | str, model: Any = None, *, optimizer: Any = None,
         map_location: Any = "cpu", strict: bool = True) -> LoadResult:
    """Verify and safely load a checkpoint (a checkpoint dir, a checkpoints dir or a run dir) into `model`."""
    p = Path(path_or_run_dir)
    if not (p / rundir.MANIFEST_NAME).exists():
        roots = [p / rundir.CHECKPOINTS] if (p / rundir.CHECKPOINTS).is_dir() else [p]
        info = rundir.newest_valid(roots)
        if info is None:
            raise CheckpointError(f"no valid checkpoint under {p}")
        p = info.path
    try:
        sharded = rundir.inspect_checkpoint(p).manifest.sharded
    except rundir.InvalidCheckpoint as e:
        raise CheckpointError(e.reason) from e
    if sharded:  # a DCP set: load it in this one process (resharded to full tensors)
        info, _ = ckpt.read_checkpoint(p, names=[])
        if model is not None and (optimizer is not None or strict):
            _sharded().load(info.path, model, optimizer)
            return LoadResult(info.path, info.manifest, model.state_dict(), [], [])
        sd = _sharded().full_model_state(info.path)
        files: dict[str, Any] = {}
    else:
        info, files = ckpt.read_checkpoint(p, model_only=optimizer is None)
        sd = files[ckpt.MODEL_FILE]
    if map_location not in (None, "cpu", torch.device("cpu")):
        sd = {k: v.to(map_location) if isinstance(v, torch.Tensor) else v for k, v in sd.items()}
    missing: list[str] = []
    unexpected: list[str] = []
    if model is not None:
        res = model.load_state_dict(sd, strict=strict)
        missing, unexpected = list(res.missing_keys), list(res.unexpected_keys)
    if optimizer is not None and ckpt.OPTIMIZER_FILE in files:
        optimizer.load_state_dict(files[ckpt.OPTIMIZER_FILE])
    return LoadResult(info.path, info.manifest, sd, missing, unexpected)
