"""Many ranks, long variants (`make test-faults`): a hang of one rank, and Lightning DDP.

A rank that blocks inside its forward pass leaves the other blocked in DDP's gradient all-reduce: the
supervisor judges each rank's own heartbeat, calls the attempt a `hang`, ends the whole group and
restarts it from the newest committed checkpoint, bit-exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.ranks import HF_JOB, PL_JOB, committed_files, two_rank_campaign
from tests.integrations.test_integrations import _needs
from tests.support import events

pytestmark = pytest.mark.long


def _hang_named_a_rank(run: Path, attempt: int) -> None:
    ended = [e for e in events(run, "attempt_ended") if e["attempt"] == attempt]
    assert ended and "heartbeat unchanged" in ended[0]["evidence"] and ended[0]["evidence"].startswith("rank "), ended


@_needs("transformers")
def test_hf_trainer_two_ranks_hang_of_rank_1_is_a_hang_restarted_exact(tmp_path: Path) -> None:
    # 18 steps (save every 5): rank 1 blocks in the forward of step 17; the group restarts from checkpoint-15.
    run = two_rank_campaign(HF_JOB, tmp_path, "1:hang@16/1", ["hang", "success"])
    _hang_named_a_rank(run, 1)


@_needs("lightning")
def test_lightning_ddp_two_ranks_kill9_then_hang_of_rank_1_restarted_exact(tmp_path: Path) -> None:
    # 24 steps on 2 ranks (8 a rank per epoch, save every 5): rank 1 dies after step 12 (mid-epoch resume
    # from step 10, through the distributed sampler), then blocks in the forward of step 18 (resume from 15).
    run = two_rank_campaign(PL_JOB, tmp_path, "1:kill@12/1,2:hang@17/1", ["signal", "hang", "success"])
    _hang_named_a_rank(run, 2)
    ckpts = sorted(p for p in (run / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert ckpts and all(committed_files(c) for c in ckpts), ckpts
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")], "a torn save was left behind"
