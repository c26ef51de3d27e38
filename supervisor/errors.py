"""Exceptions of the supervisor; one base class, shallow families, each carrying its exit code.

The exit codes themselves are defined with every other exit code in the contract
(trainer_shim.rundir.exits); they are re-exported here for the supervisor's modules.
"""

from __future__ import annotations

from trainer_shim.rundir import (
    EXIT_GAVE_UP, EXIT_INTERRUPTED, EXIT_INVALID_CHECKPOINT, EXIT_LOCKED, EXIT_NOT_STOPPED, EXIT_OK, EXIT_STOPPED,
    EXIT_UNHEALTHY, EXIT_USAGE,
)

__all__ = ["SupervisorError", "ConfigError", "RunDirError", "LockedError",
           "EXIT_OK", "EXIT_GAVE_UP", "EXIT_USAGE", "EXIT_LOCKED", "EXIT_STOPPED",
           "EXIT_UNHEALTHY", "EXIT_INVALID_CHECKPOINT", "EXIT_NOT_STOPPED", "EXIT_INTERRUPTED"]


class SupervisorError(Exception):
    """Base class of every error the supervisor reports to the user."""

    exit_code = EXIT_USAGE


class ConfigError(SupervisorError):
    """A flag, config file or job description is invalid."""


class RunDirError(SupervisorError):
    """The run dir cannot be used (not a dir, unwritable, not a run dir)."""


class LockedError(SupervisorError):
    """Another live supervisor holds the run dir's lock."""

    exit_code = EXIT_LOCKED
