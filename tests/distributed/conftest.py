from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import built_once
from tests.distributed.common import recovered_run


def _uninterrupted(tmp_path_factory, name: str, *job_args: str) -> Path:
    """Run once per test session (every xdist worker reads the same one)."""
    return built_once(name, job_args, lambda d: recovered_run(d, "ref", *job_args, kinds=["success"])) / "ref"


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank DDP run every fault test must reproduce bit for bit."""
    return _uninterrupted(tmp_path_factory, "ddp-ref")


@pytest.fixture(scope="session")
def fsdp_reference(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank FSDP2 run (the job with --fsdp)."""
    return _uninterrupted(tmp_path_factory, "fsdp-ref", "--fsdp")
