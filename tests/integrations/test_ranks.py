"""Many ranks: 2-rank framework jobs under torchrun (gloo, CPU) are supervised per rank and resume exactly.

Both ranks heartbeat into their own file (so a single stuck rank is judged by itself), rank 0
commits each checkpoint only after every rank wrote its files, and a kill -9 of one rank restarts
the whole group from the newest committed checkpoint, bit-exact. The hang variants are in
test_ranks_long.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.ranks import HF_JOB, committed_files, two_rank_campaign
from tests.integrations.test_integrations import _needs


@pytest.mark.long   # ~28 s: make test-faults (test_hf_async's two-rank kill runs in make test)
@_needs("transformers")
def test_hf_trainer_two_ranks_kill9_of_rank_1_restarts_the_group_exact(tmp_path: Path) -> None:
    # 18 steps on 2 ranks (save every 5): rank 1 dies after step 12, both restart from checkpoint-10.
    run = two_rank_campaign(HF_JOB, tmp_path, "1:kill@12/1", ["signal", "success"], heartbeat_timeout=20)
    ckpts = sorted(run.glob("checkpoint-*"))
    assert ckpts, list(run.iterdir())
    for c in ckpts:  # every rank's RNG state is inside the commit, not written after it
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= committed_files(c), c
