"""Save modes for the bit-exactness and fault tests: the same tests, with async saves
and memory snapshots. `make test` runs a representative subset; the full matrix needs
RRTEST_LONG_FAULTS=1 (`make test-faults`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer_shim import rundir


LONG = os.environ.get("RRTEST_LONG_FAULTS") == "1"

MODES = {
    "sync": {},
    "async": {"TOY_ASYNC_SAVE": "1"},
    "memory": {"TOY_MEMORY_EVERY": "1"},
    "async+memory": {"TOY_ASYNC_SAVE": "1", "TOY_MEMORY_EVERY": "1"},
}
PLAIN = {k: "" for k in ("TOY_ASYNC_SAVE", "TOY_MEMORY_EVERY")}  # reference runs: synchronous saves


def modes(*short: str) -> list:
    """Every mode; those not in `short` only under the long fault campaign."""
    skip = pytest.mark.skipif(not LONG, reason="long variant: set RRTEST_LONG_FAULTS=1 (make test-faults)")
    return [pytest.param(m, id=m, marks=() if m in short else skip) for m in MODES]


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
