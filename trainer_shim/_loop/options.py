"""init() options: ONE declaration (`Options`: name, type, default and what it does) from which
`trainer_shim.init()`'s keyword signature, its docstring and the docs' option table are derived;
parsed and checked once, before anything touches the run dir (a bad option is a one-line
ConfigError naming it)."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import sys
import warnings
from typing import Any, Mapping, Optional, Union

from ..errors import ConfigError
from ..rundir import AUTO_INTERVAL as AUTO, DEFAULT_MTBF_HOURS

__all__ = ["Options", "UnknownOption", "decide_sharded", "signature", "docstring", "table"]

PathLike = Union[str, "os.PathLike[str]"]

# init(on_nonfinite=...): end the attempt unsaved, carry on, or leave the step uncounted.
ON_NONFINITE_CHOICES = ("raise", "ignore", "skip")


def _opt(default: Any, doc: str) -> Any:
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclasses.dataclass(frozen=True)
class Options:
    """Every keyword of `trainer_shim.init()`, with what it does."""

    model: Any = _opt(None, "the model; a checkpoint holds its state_dict()")
    optimizer: Any = _opt(None, "the optimizer (its state is checkpointed; it also tells whether weights "
                                "moved after run.step())")
    scheduler: Any = _opt(None, "an LR scheduler, checkpointed")
    scaler: Any = _opt(None, "an AMP GradScaler, checkpointed")
    extra: Optional[dict] = _opt(None, "name -> object with state_dict()/load_state_dict(), checkpointed")
    run_dir: Optional[PathLike] = _opt(None, "the run dir; default $RESILIENT_RUN_DIR, else runs/<script stem>")
    save_every_steps: Optional[int] = _opt(None, "a checkpoint every N optimizer steps")
    save_every_seconds: Optional[Union[float, str]] = _opt(None, 'a checkpoint every N seconds, or "auto": '
                                                                 'Young/Daly from the save cost and the MTBF')
    save_on_epoch_end: bool = _opt(True, "a checkpoint at every epoch's end (run.epochs())")
    keep_last: int = _opt(3, "rotation: the newest N step checkpoints are kept")
    keep_epochs: int = _opt(10, "rotation: the newest N epoch-end checkpoints are kept")
    keep_best: int = _opt(1, "rotation: the N of lowest loss are kept")
    fallback_dir: Optional[PathLike] = _opt(None, "a second checkpoint root for when the run dir cannot take a save")
    min_free_bytes: Optional[int] = _opt(None, "headroom kept free on the checkpoint disk")
    heartbeat_interval: float = _opt(1.0, "seconds between heartbeats")
    resume_emergency: bool = _opt(False, "also resume from inexact emergency checkpoints")
    collective_timeout: float = _opt(300.0, "seconds a multi-rank collective of the shim may take")
    sharded: Optional[bool] = _opt(None, "model/optimizer state through DCP (FSDP2/DTensor); None: detect")
    allow_reshard: Optional[bool] = _opt(None, "resume a sharded checkpoint at another world size; None: "
                                               "$RESILIENT_ALLOW_RESHARD")
    on_nonfinite: str = _opt("raise", 'a NaN/inf loss: "raise" (end unsaved), "skip" (step uncounted) or "ignore"')
    resume: Union[str, PathLike] = _opt("auto", 'standalone runs: "auto", "ask", "never" or a checkpoint path')
    strict_resume: bool = _opt(False, "refuse a checkpoint written by other code or arguments (default: warn)")
    mtbf_hours: float = _opt(DEFAULT_MTBF_HOURS, 'the "auto" intervals\' prior mean time between failures')
    async_save: bool = _opt(False, "disk saves written by a background thread from a memory slot")
    memory_every_steps: Optional[Union[int, str]] = _opt(None, 'a memory snapshot in /dev/shm every N steps, or '
                                                               '"auto" (from its cost and the failure history)')

    def __post_init__(self) -> None:
        for name in ("save_every_steps", "memory_every_steps"):
            value = getattr(self, name)
            if value is not None and value != AUTO and (isinstance(value, bool) or not isinstance(value, int)
                                                         or value <= 0):
                raise ConfigError(f"{name} must be a positive integer or 'auto', got {value!r}")
        if self.save_every_steps == AUTO and self.save_every_seconds not in (None, AUTO):
            raise ConfigError(f"save_every_steps='auto' is save_every_seconds='auto' (Young/Daly); drop "
                              f"save_every_seconds={self.save_every_seconds!r} or give save_every_steps a number")
        if self.extra is not None and not isinstance(self.extra, dict):
            raise ConfigError("extra must be a dict of objects with state_dict()/load_state_dict()")
        if self.on_nonfinite not in ON_NONFINITE_CHOICES:
            raise ConfigError(f"on_nonfinite must be one of {', '.join(ON_NONFINITE_CHOICES)}, "
                              f"got {self.on_nonfinite!r}")

    @property
    def step_interval(self) -> Optional[int]:
        """Disk saves every N steps, or None ("auto" is a time interval)."""
        return self.save_every_steps if isinstance(self.save_every_steps, int) else None

    @property
    def seconds_interval(self) -> Optional[Union[float, str]]:
        return AUTO if self.save_every_steps == AUTO else self.save_every_seconds

    def check_world(self, world_size: int) -> None:
        if self.on_nonfinite == "skip" and world_size > 1:
            # Ranks see different losses: a rank-local skip would put the ranks' step counters (and the
            # collectives that agree on saves) out of step. "raise" ends the attempt on every rank.
            raise ConfigError("on_nonfinite='skip' needs a single process; multi-rank runs use 'raise' or 'ignore'")

    @classmethod
    def parse(cls, kwargs: Mapping[str, Any]) -> "Options":
        """The options of an init() call; an unknown keyword is an UnknownOption naming the closest one."""
        known = [f.name for f in dataclasses.fields(cls)]
        for key in kwargs:
            if key not in known:
                hint = difflib.get_close_matches(key, known, n=1)
                raise UnknownOption(f"init() got an unknown option {key!r}"
                                    + (f"; did you mean {hint[0]!r}?" if hint else f"; options: {', '.join(known)}"))
        if kwargs.get("save_every_steps") == AUTO:
            warnings.warn("save_every_steps='auto' is a time interval: use save_every_seconds='auto'",
                          DeprecationWarning, stacklevel=4)   # the caller of init()
        return cls(**kwargs)


class UnknownOption(ConfigError, TypeError):
    """init() got a keyword it does not take: a TypeError as for any function, with the closest name."""


def signature(return_annotation: Any) -> inspect.Signature:
    """init()'s keyword-only signature, derived from `Options`."""
    return inspect.Signature([inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                                annotation=f.type) for f in dataclasses.fields(Options)],
                             return_annotation=return_annotation)


def docstring(summary: str) -> str:
    """init()'s docstring: `summary`, then every option with its default and what it does."""
    lines = [summary, "", "Options (keywords only):", ""]
    for f in dataclasses.fields(Options):
        lines.append(f"    {f.name}={f.default!r}: {f.metadata['doc']}")
    return "\n".join(lines)


def table() -> str:
    """The option table of the docs (Markdown; docs/reference/options.md renders it)."""
    rows = ["| option | default | what it does |", "| --- | --- | --- |"]
    rows += [f"| `{f.name}` | `{f.default!r}` | {f.metadata['doc']} |" for f in dataclasses.fields(Options)]
    return "\n".join(rows)


def decide_sharded(sharded: Optional[bool], model: Any) -> bool:
    """Whether model/optimizer state goes through DCP (FSDP2/DTensor) instead of torch.save."""
    if sharded is None:  # FSDP2/DTensor state must not be gathered to go through torch.save
        sharded = uses_dtensor(model)   # without importing DCP: a non-sharded restore never pays for it
    if sharded and model is None:
        raise ConfigError("sharded=True needs a model (its state goes through torch.distributed.checkpoint)")
    return bool(sharded)


def uses_dtensor(model: Any) -> bool:
    """True when `model` holds DTensor parameters (FSDP2 `fully_shard`, tensor parallel), without
    importing DCP: no DTensor exists unless its module is loaded. (Creating any torch optimizer
    loads that module, so it is no sign of a sharded job; DCP itself costs ~0.3-0.6 s to import.)"""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if model is None or dtensor is None:
        return False
    return any(isinstance(p, dtensor.DTensor) for p in model.parameters())
