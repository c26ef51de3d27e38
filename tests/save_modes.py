"""Save modes for the bit-exactness and fault tests: the same tests, with async saves and memory
snapshots. `make test` runs a representative subset; the rest of the matrix carries the `long`
marker (`make test-faults` = `pytest -m long`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer_shim import rundir


MODES = {
    "sync": {},
    "async": {"TOY_ASYNC_SAVE": "1"},
    "memory": {"TOY_MEMORY_EVERY": "1"},
    "async+memory": {"TOY_ASYNC_SAVE": "1", "TOY_MEMORY_EVERY": "1"},
}
PLAIN = {k: "" for k in ("TOY_ASYNC_SAVE", "TOY_MEMORY_EVERY")}  # reference runs: synchronous saves


def modes(*short: str) -> list:
    """Every mode; those not in `short` are long variants."""
    return [pytest.param(m, id=m, marks=() if m in short else pytest.mark.long) for m in MODES]


def shm_segments(run_dir: Path) -> list[Path]:
    """This run dir's shared-memory slots that exist right now."""
    return [p for p in rundir.snapshot_slot_paths(Path(run_dir)) if os.path.lexists(p)]


@pytest.fixture
def save_mode(request, monkeypatch) -> str:
    """Put the parametrized mode's knobs into the environment every job of the test inherits."""
    mode = request.param
    for k, v in MODES[mode].items():
        monkeypatch.setenv(k, v)
    return mode
