"""init() options checked once, before anything touches the run dir (a bad option is a one-line ConfigError)."""

from __future__ import annotations

import sys
from typing import Any, Optional

from .errors import ConfigError
from .loading import sharded_module

__all__ = ["validate", "decide_sharded"]


def validate(save_every_steps: Optional[int], extra: Any) -> None:
    if save_every_steps is not None and save_every_steps <= 0:
        raise ConfigError(f"save_every_steps must be positive, got {save_every_steps}")
    if extra is not None and not isinstance(extra, dict):
        raise ConfigError("extra must be a dict of objects with state_dict()/load_state_dict()")


def decide_sharded(sharded: Optional[bool], model: Any) -> bool:
    """Whether model/optimizer state goes through DCP (FSDP2/DTensor) instead of torch.save."""
    if sharded is None:  # FSDP2/DTensor state must not be gathered to go through torch.save
        # No DTensor exists unless its module was imported: spare everyone else DCP's import.
        sharded = "torch.distributed.tensor" in sys.modules and sharded_module().uses_dtensor(model)
    if sharded and model is None:
        raise ConfigError("sharded=True needs a model (its state goes through torch.distributed.checkpoint)")
    return bool(sharded)
