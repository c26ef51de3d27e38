"""Session-wide uninterrupted reference runs, computed once and compared against by many tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import built_once
from tests.save_modes import PLAIN, save_mode  # noqa: F401  (fixture)

from .helpers import run_toy


class References:
    """Lazily run the toy job uninterrupted once per argument set (and test session: every xdist
    worker reads the same run dir)."""

    def get(self, *args: str) -> Path:
        def build(d: Path) -> None:
            p = run_toy(d / "ref", *args, env=PLAIN)
            assert p.returncode == 0, p.stderr[-3000:]
        return built_once("shim-reference", args, build) / "ref"


@pytest.fixture(scope="session")
def refs() -> References:
    return References()
