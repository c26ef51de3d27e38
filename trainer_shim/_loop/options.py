"""init() options, parsed and checked once, before anything touches the run dir (a bad option is
a one-line ConfigError naming it)."""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any, Mapping, Optional, Union

from ..errors import ConfigError
from .._state.capture import uses_dtensor
from .._policies.save_interval import AUTO, DEFAULT_MTBF_HOURS

__all__ = ["Options", "decide_sharded"]

PathLike = Union[str, "os.PathLike[str]"]


@dataclasses.dataclass(frozen=True)
class Options:
    """Every keyword of `trainer_shim.init()` (README "Your training script" documents each)."""

    model: Any = None
    optimizer: Any = None
    scheduler: Any = None
    scaler: Any = None
    extra: Optional[dict] = None
    run_dir: Optional[PathLike] = None
    save_every_steps: Optional[Union[int, str]] = None      # steps, or "auto" (= save_every_seconds="auto")
    save_every_seconds: Optional[Union[float, str]] = None   # seconds, or "auto" (Young/Daly)
    save_on_epoch_end: bool = True
    keep_last: int = 3
    keep_epochs: int = 10
    keep_best: int = 1
    fallback_dir: Optional[PathLike] = None
    min_free_bytes: Optional[int] = None
    heartbeat_interval: float = 1.0
    resume_emergency: bool = False
    collective_timeout: float = 300.0
    sharded: Optional[bool] = None
    allow_reshard: Optional[bool] = None
    on_nonfinite: str = "raise"
    resume: str = "auto"
    strict_resume: bool = False
    mtbf_hours: float = DEFAULT_MTBF_HOURS
    async_save: bool = False
    memory_every_steps: Optional[Union[int, str]] = None    # steps, or "auto" (_policies.memory_interval)

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

    @property
    def step_interval(self) -> Optional[int]:
        """Disk saves every N steps, or None ("auto" is a time interval)."""
        return self.save_every_steps if isinstance(self.save_every_steps, int) else None

    @property
    def seconds_interval(self) -> Optional[Union[float, str]]:
        return AUTO if self.save_every_steps == AUTO else self.save_every_seconds

    @classmethod
    def parse(cls, kwargs: Mapping[str, Any]) -> "Options":
        """The options of an init() call; an unknown keyword is a ConfigError with the closest name."""
        known = [f.name for f in dataclasses.fields(cls)]
        for key in kwargs:
            if key not in known:
                hint = difflib.get_close_matches(key, known, n=1)
                raise ConfigError(f"init() got an unknown option {key!r}"
                                  + (f"; did you mean {hint[0]!r}?" if hint else f"; options: {', '.join(known)}"))
        return cls(**kwargs)


def decide_sharded(sharded: Optional[bool], model: Any) -> bool:
    """Whether model/optimizer state goes through DCP (FSDP2/DTensor) instead of torch.save."""
    if sharded is None:  # FSDP2/DTensor state must not be gathered to go through torch.save
        sharded = uses_dtensor(model)   # without importing DCP: a non-sharded restore never pays for it
    if sharded and model is None:
        raise ConfigError("sharded=True needs a model (its state goes through torch.distributed.checkpoint)")
    return bool(sharded)
