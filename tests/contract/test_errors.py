"""One exception root per side: every error trainer_shim defines (the run-dir contract's included)
derives from ShimError, every error the supervisor defines from SupervisorError, so a caller can
catch "anything from this library" with one class.

The classes are discovered by importing every module of both packages, not listed by hand: a new
module's new exception is checked without anyone remembering to add it here.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import supervisor
import trainer_shim
from supervisor.errors import SupervisorError
from trainer_shim.errors import ShimError
from trainer_shim.rundir import ContractError, EnvError, InvalidCheckpoint


def modules(package: ModuleType) -> list[ModuleType]:
    """Every module of `package`; `__main__` modules are skipped (importing one runs the program)."""
    names = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
             if not m.name.endswith(".__main__")]
    return [package] + [importlib.import_module(n) for n in names]


def exceptions_defined_in(package: ModuleType) -> list[type]:
    out = {}
    for mod in modules(package):
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == mod.__name__:
                out[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [out[k] for k in sorted(out)]


SHIM_ERRORS = exceptions_defined_in(trainer_shim)
SUPERVISOR_ERRORS = exceptions_defined_in(supervisor)


def test_discovery_finds_the_known_families() -> None:
    from trainer_shim._memory.slots import SlotError
    from supervisor.errors import LockedError

    assert {ShimError, ContractError, EnvError, InvalidCheckpoint, SlotError} <= set(SHIM_ERRORS)
    assert {SupervisorError, LockedError} <= set(SUPERVISOR_ERRORS)


@pytest.mark.parametrize("cls", SHIM_ERRORS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_shim_error_derives_from_shim_error(cls: type) -> None:
    assert issubclass(cls, ShimError)


@pytest.mark.parametrize("cls", SUPERVISOR_ERRORS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_supervisor_error_derives_from_supervisor_error(cls: type) -> None:
    assert issubclass(cls, SupervisorError)


def test_the_root_is_the_contract_root_re_exported() -> None:
    # One class, importable from both places: the torch-free contract defines it.
    import trainer_shim.rundir as rundir

    assert trainer_shim.errors.ShimError is rundir.ShimError
    assert issubclass(ContractError, ShimError) and not issubclass(SupervisorError, ShimError)
