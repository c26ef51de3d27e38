"""Exceptions of the supervisor; one base class, shallow families, each carrying its exit code."""

from __future__ import annotations

# Exit codes of `resilient-run run` (and the other commands where noted).
EXIT_OK = 0
EXIT_GAVE_UP = 1          # restarts exhausted, non-retryable exit, crash loop with nothing older
EXIT_USAGE = 2            # bad usage, config or run dir; `status` on a path that is not a run dir
EXIT_LOCKED = 3           # another live supervisor holds the run dir
EXIT_STOPPED = 75         # stopped on request after the child saved: resumable

__all__ = ["SupervisorError", "ConfigError", "RunDirError", "LockedError",
           "EXIT_OK", "EXIT_GAVE_UP", "EXIT_USAGE", "EXIT_LOCKED", "EXIT_STOPPED"]


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
