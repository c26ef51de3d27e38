"""The contract's exceptions: one base, shallow families (a caller catches ContractError)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ContractError", "InvalidCheckpoint", "EnvError"]


class ContractError(Exception):
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
