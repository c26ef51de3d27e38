"""Doctor mode (`$RESILIENT_DOCTOR`): per-step digests of every state component plus injected
faults, for the raw loop (Probe, over the step watch every run has: trainer_shim._session.watch)
and the framework callbacks (DoctorLog, digest, state_digests). Loaded only in doctor mode.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Optional

import torch
import xxhash

from .._state import data
from .._session.watch import StepWatch
from ..errors import ShimError
from ..rundir import EXIT_OK, FAULT_KILL, MARK_BATCH, MARK_STEP, RunEnv

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None  # type: ignore[assignment]

__all__ = ["Probe", "digest", "DoctorFault", "DoctorLog", "state_digests"]

# Components compared between run.step() and the next batch: training state the checkpoint holds.
# RNGs and the data position legitimately move when the next batch is fetched.
STATE_COMPONENTS = ("model.params", "model.buffers", "optimizer", "scheduler", "scaler", "run.state")


class DoctorFault(ShimError, RuntimeError):
    """The Python exception the doctor injects (kind `raise`); a RuntimeError, like a typical user crash."""


def _feed(h: "xxhash.xxh3_64", obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif np is not None and isinstance(obj, np.ndarray):
        h.update(f"N{obj.dtype}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=str):
            h.update(repr(k).encode())
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def digest(obj: Any) -> str:
    """A content hash of nested tensors/arrays/containers/scalars (bit-level for tensors)."""
    h = xxhash.xxh3_64()
    _feed(h, obj)
    return h.hexdigest()


def _rng_kind(obj: Any) -> Optional[str]:
    if np is not None and isinstance(obj, np.random.Generator):
        return "numpy Generator"
    if np is not None and isinstance(obj, np.random.RandomState):
        return "numpy RandomState"
    if type(obj) is random.Random:
        return "random.Random"
    if isinstance(obj, torch.Generator):
        return "torch.Generator"
    return None


def _rng_state(obj: Any) -> Any:
    if np is not None and isinstance(obj, np.random.Generator):
        return obj.bit_generator.state
    if np is not None and isinstance(obj, np.random.RandomState):
        return obj.get_state()
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    return obj.getstate()


def state_digests(model: Any, stateful: dict[str, Any], loader_gen: Any = None) -> dict[str, str]:
    """Digests of the model's parameters and buffers, each `stateful` object's state_dict() (None
    skipped) and every RNG the shim captures: the components doctor compares."""
    from .._state import rng as rng_mod

    out: dict[str, str] = {}
    if isinstance(model, torch.nn.Module):
        out["model.params"] = digest(dict(model.named_parameters()))
        out["model.buffers"] = digest(dict(model.named_buffers()))
    for name, obj in stateful.items():
        if obj is not None:
            out[name] = digest(obj.state_dict())
    rs = rng_mod.capture(loader_gen)
    for k in ("python", "numpy", "torch", "cuda", "generator"):
        if rs.get(k) is not None:
            out[f"rng.{k}"] = digest(rs[k])
    return out


def _with_attrs(label: str, val: Any, where: str) -> Iterator[tuple[str, Any, str]]:
    """`val` itself and its instance attributes (not a class's, not a module's)."""
    yield f"{label}`", val, where
    if isinstance(val, (type, type(sys))) or not hasattr(val, "__dict__"):
        return
    try:
        attrs = list(vars(val).items())
    except TypeError:
        return
    for k, v in attrs:
        yield f"{label}.{k}`", v, where


class DoctorLog:
    """Doctor mode of one process (`$RESILIENT_DOCTOR*`): the digest log, the faults, the last step."""

    def __init__(self, log: str, faults: dict[int, str], stop_at: Optional[int]) -> None:
        self.log = Path(log)
        self.faults = faults
        self.stop_at = stop_at

    @classmethod
    def from_env(cls, env: Optional[RunEnv] = None) -> Optional["DoctorLog"]:
        """Doctor mode as `resilient-run doctor` set it (None outside doctor mode); `env` defaults to
        this process's environment. A bad value is rundir.EnvError (one line, names the variable)."""
        env = env if env is not None else RunEnv.from_environ(os.environ)
        if env.doctor_log is None:
            return None
        return cls(env.doctor_log, dict(env.doctor_faults), env.doctor_steps)

    def write(self, rec: dict, *, attempt: Optional[int], rank: int) -> None:
        rec.update(attempt=attempt, rank=rank, pid=os.getpid(), time=time.time())
        with open(self.log, "a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")

    def step(self, rec: dict, *, attempt: Optional[int], rank: int) -> bool:
        """Record a step (MARK_STEP), inject its fault; True when the run should end here."""
        self.write(dict(rec, at=MARK_STEP), attempt=attempt, rank=rank)
        self.fault(rec["step"], rank)
        return self.stop_at is not None and rec["step"] >= self.stop_at

    def fault(self, step: int, rank: int) -> None:
        kind = self.faults.get(step)
        if kind is None or rank != 0:
            return
        marker = self.log.with_name(f"{self.log.name}.fault-{step}")
        try:  # only the first attempt that reaches this step is interrupted
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return
        os.close(fd)
        if kind == FAULT_KILL:
            os.kill(os.getpid(), signal.SIGKILL)
        raise DoctorFault(f"resilient-run doctor: injected exception at step {step}")


class Probe(StepWatch):
    """Doctor mode of a raw loop (`$RESILIENT_DOCTOR`): per-step digests of every state component,
    the components changed between run.step() and the next batch, and the injected faults."""

    def __init__(self, run: Any, doctor: DoctorLog) -> None:
        super().__init__(run)
        self.doctor = doctor
        self._ref_digests: Optional[dict] = None  # component digests at the last run.step()
        self._batch_digest: Optional[str] = None
        self._extra_rngs: list[tuple[str, Any]] = []
        self._scanned_at = -1

    def on_step(self) -> None:
        super().on_step()
        run = self.run
        comps = self._components()
        self._ref_digests = comps
        if self.doctor.step({"step": run.global_step, "loss": run.loss, "epoch": run.epoch,
                             "batch": self._batch_digest, "digests": comps}, attempt=run.attempt, rank=run.rank):
            run.finish()
            sys.exit(EXIT_OK)

    def on_batch(self, batch: Any) -> None:
        # No "changed after run.step()" warning: doctor reports the changed components instead.
        self._batch_digest = digest(batch)
        if self._ref_digests is not None:
            now = self._components()
            changed = [c for c in STATE_COMPONENTS + tuple(k for k in now if k.startswith("extra."))
                       if now.get(c) != self._ref_digests.get(c)]
            if changed:
                self._write({"at": MARK_BATCH, "step": self._ref_step, "changed": changed,
                             "bn": self._has_batchnorm()})
        self._ref_digests = None

    def on_epoch_end(self) -> None:
        # The epoch-end checkpoint captures whatever the epoch body did after its last run.step().
        super().on_epoch_end()
        self._ref_digests = None

    # --- doctor internals ---------------------------------------------------------------------

    def _has_batchnorm(self) -> bool:
        m = self.run.model
        return isinstance(m, torch.nn.Module) and any(
            isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in m.modules())

    def _components(self) -> dict[str, str]:
        run = self.run
        gen = data.loader_generator(run.engine.stream.loader)
        stateful = {"optimizer": run.optimizer, "scheduler": run.scheduler, "scaler": run.scaler,
                    **{f"extra.{k}": v for k, v in run.extra.items()}}
        out = state_digests(run.model, stateful, gen)
        out["run.state"] = digest(run.state)
        out["data"] = digest([run.epoch, run.batch_in_epoch])
        for label, obj in self._uncaptured(gen):
            out[f"uncaptured.{label}"] = digest(_rng_state(obj))
        return out

    def _uncaptured(self, loader_gen: Any) -> list[tuple[str, Any]]:
        step = self.run.global_step
        if self._scanned_at < 0 or step - self._scanned_at >= 20:
            self._scanned_at = step
            known = {id(random._inst), id(torch.default_generator), id(loader_gen)}
            if np is not None:
                known.add(id(np.random.mtrand._rand))
            for v in self.run.extra.values():
                known.add(id(v))
            found: list[tuple[str, Any]] = []
            for label, obj, where in self._rng_candidates():
                kind = _rng_kind(obj)
                if kind is not None and id(obj) not in known:
                    known.add(id(obj))
                    found.append((f"{kind} {label} ({where})", obj))
            self._extra_rngs = found
        return self._extra_rngs

    def _rng_candidates(self) -> Iterator[tuple[str, Any, str]]:
        """Where a script keeps its own generators: its globals and their attributes (a module's, a
        dataset's), the model's modules, and the training loader's dataset and samplers, one level
        deep, and the locals of the script's functions running run.step(). Library-internal ones (tempfile's, a sampler's per-epoch one) live elsewhere and are
        seeded from the captured global RNGs."""
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", "") or ""
        where = f"created in {Path(script or 'the script').name}"
        for name, val in list(vars(main).items()) if main is not None else []:
            yield from _with_attrs(f"`{name}", val, where)
        # The locals of the script's own functions on the stack (a loop inside main()); only frames
        # of the script file, so no library's generators.
        frame = sys._getframe(1)
        while frame is not None and script:
            if frame.f_code.co_filename == script and frame.f_locals is not frame.f_globals:
                for name, val in list(frame.f_locals.items()):
                    yield from _with_attrs(f"`{name}", val, where)
            frame = frame.f_back
        m = self.run.model
        if isinstance(m, torch.nn.Module):
            for path, mod in m.named_modules():
                for k, v in list(vars(mod).items()):
                    yield f"`model{'.' + path if path else ''}.{k}`", v, "held by the model"
        loader = self.run.engine.stream.loader
        for attr in ("dataset", "sampler", "batch_sampler"):
            obj = getattr(loader, attr, None)
            if obj is not None:
                yield from _with_attrs(f"`loader.{attr}", obj, "held by the training data")


    def _write(self, rec: dict) -> None:
        assert self.doctor is not None
        self.doctor.write(rec, attempt=self.run.attempt, rank=self.run.rank)
