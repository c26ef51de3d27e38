"""The root of every trainer_shim exception, and the contract's own (a caller catches ContractError).

ShimError is defined here, below everything else in trainer_shim, so that the torch-free contract
can derive from it; trainer_shim.errors re-exports it. The supervisor has its own root
(supervisor.errors.SupervisorError) and catches contract errors as ContractError.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ShimError", "ContractError", "InvalidCheckpoint", "EnvError"]


class ShimError(Exception):
    """Base class of every error trainer_shim raises, the run-dir contract's included."""


class ContractError(ShimError):
    """A run-dir file is missing, unreadable or not of the documented shape."""


class InvalidCheckpoint(ContractError):
    """A checkpoint directory failed validation; `reason` says why in one line."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


class EnvError(ContractError):
    """A product environment variable has a value we refuse to guess about (one line, names the fix)."""

    def __init__(self, name: str, value: str, allowed: str) -> None:
        super().__init__(f"{name}={value!r} is not valid; use {allowed}")
        self.name = name
        self.value = value
