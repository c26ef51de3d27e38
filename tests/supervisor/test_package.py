"""The supervisor package's public face: a curated `__all__`, resolved lazily so that importing
the package costs nothing (the CLI's typer and rich, the loop's psutil and watchdog load on use)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import supervisor
from supervisor.errors import SupervisorError
from tests.conftest import REPO, child_env


@pytest.mark.parametrize("name", supervisor.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(supervisor, name) is not None
    assert name in dir(supervisor)


def test_public_api_is_curated() -> None:
    assert len(set(supervisor.__all__)) == len(supervisor.__all__)
    assert {"main", "Supervisor", "Config", "Kind", "SupervisorError", "read_status"} <= set(supervisor.__all__)
    errors = [getattr(supervisor, n) for n in supervisor.__all__ if n.endswith("Error")]
    assert errors and all(issubclass(e, SupervisorError) for e in errors)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        supervisor.nope  # noqa: B018


def test_importing_the_package_loads_nothing_heavy() -> None:
    code = ("import sys, supervisor; heavy = sorted({'typer', 'rich', 'psutil', 'watchdog', 'torch'} & set(sys.modules)); "
            "print(heavy); sys.exit(1 if heavy else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(PYTHONPATH=str(REPO)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
