"""Exceptions raised by trainer_shim; one base class, shallow families.

The base, ShimError, lives in the torch-free contract (rundir.errors) so that the contract's own
errors derive from it too; it is re-exported here.
"""

from .rundir.errors import ShimError

__all__ = ["ShimError", "CheckpointError", "ConfigError", "CollectiveTimeout", "WorldSizeMismatch",
           "LiveStateChanged"]


class CheckpointError(ShimError):
    """A checkpoint could not be written, read or applied."""


class ConfigError(ShimError):
    """`init()` was given arguments that cannot work (bad run dir, bad option)."""


class CollectiveTimeout(ShimError):
    """A shim barrier/collective of a multi-rank run did not complete in time (a rank is stuck or gone)."""


class WorldSizeMismatch(ShimError):
    """The checkpoint was written by a different number of ranks and cannot (or may not) be resharded."""


class LiveStateChanged(CheckpointError):
    """A tensor failed its digest (or a member was refused) after bytes had already reached live tensors."""
