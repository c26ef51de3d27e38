"""Exceptions raised by trainer_shim; one base class, shallow families."""


class ShimError(Exception):
    """Base class of every error trainer_shim raises."""


class CheckpointError(ShimError):
    """A checkpoint could not be written, read or applied."""


class ConfigError(ShimError):
    """`init()` was given arguments that cannot work (bad run dir, bad option)."""
