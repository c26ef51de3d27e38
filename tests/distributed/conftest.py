from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.common import ddp_run
from tests.supervisor.helpers import ended_kinds


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank DDP run every fault test must reproduce bit for bit."""
    tmp = tmp_path_factory.mktemp("ddp-ref")
    p, rd, out = ddp_run(tmp, "ref")
    assert p.returncode == 0, p.stderr[-3000:]
    assert ended_kinds(rd) == ["success"]
    return tmp / "ref"
