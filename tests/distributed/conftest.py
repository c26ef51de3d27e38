from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.common import recovered_run


def _uninterrupted(tmp_path_factory, name: str, *job_args: str) -> Path:
    tmp = tmp_path_factory.mktemp(name)
    recovered_run(tmp, "ref", *job_args, kinds=["success"])
    return tmp / "ref"


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank DDP run every fault test must reproduce bit for bit."""
    return _uninterrupted(tmp_path_factory, "ddp-ref")


@pytest.fixture(scope="session")
def fsdp_reference(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank FSDP2 run (the job with --fsdp)."""
    return _uninterrupted(tmp_path_factory, "fsdp-ref", "--fsdp")
