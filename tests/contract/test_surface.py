"""The contract's surface: every exported name resolves to what its module defines, even after every
submodule was imported (a submodule import binds the module on the package under its own name)."""

from __future__ import annotations

import importlib
import subprocess
import sys

from tests.conftest import REPO, child_env

_CHECK = r"""
import importlib, types
from trainer_shim import rundir
for sub in rundir.SUBMODULES:
    importlib.import_module(f"trainer_shim.rundir.{sub}")
bad = [n for n in rundir.__all__ if n != "commit" and isinstance(getattr(rundir, n), types.ModuleType)]
wrong = [n for n in rundir.__all__ if n != "commit"
         and getattr(rundir, n) is not getattr(importlib.import_module(f"trainer_shim.rundir.{rundir._WHERE[n]}"), n)]
print(bad, wrong)
"""


def test_every_exported_name_is_its_modules_object_after_every_submodule_was_imported() -> None:
    p = subprocess.run([sys.executable, "-c", _CHECK], env=child_env(PYTHONPATH=str(REPO)), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[] []"


def test_every_submodule_is_mapped() -> None:
    from trainer_shim import rundir

    files = {p.stem for p in (REPO / "trainer_shim" / "rundir").glob("*.py") if p.stem != "__init__"}
    assert files == set(rundir.SUBMODULES)
    for sub in rundir.SUBMODULES:
        importlib.import_module(f"trainer_shim.rundir.{sub}")
