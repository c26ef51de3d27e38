"""Session-wide uninterrupted reference runs, computed once and compared against by many tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.save_modes import PLAIN, save_mode  # noqa: F401  (fixture)

from .helpers import run_toy


class References:
    """Lazily run the toy job uninterrupted once per argument set."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._done: dict[tuple[str, ...], Path] = {}

    def get(self, *args: str) -> Path:
        if args not in self._done:
            rd = self.base / f"ref-{len(self._done)}"
            p = run_toy(rd, *args, env=PLAIN)
            assert p.returncode == 0, p.stderr[-3000:]
            self._done[args] = rd
        return self._done[args]


@pytest.fixture(scope="session")
def refs(tmp_path_factory: pytest.TempPathFactory) -> References:
    return References(tmp_path_factory.mktemp("refs"))
