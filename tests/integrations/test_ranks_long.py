"""Many ranks, long variants (`make test-faults`): a hang of one rank, and Lightning DDP.

A rank that blocks inside its forward pass leaves the other blocked in DDP's gradient all-reduce: the
supervisor judges each rank's own heartbeat, calls the attempt a `hang`, ends the whole group and
restarts it from the newest committed checkpoint, bit-exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import signal

from tests.integrations.ranks import FAST, HF_JOB, PL_JOB, committed_files, finish, start_run, two_rank_campaign
from tests.integrations.test_integrations import _needs
from tests.support import assert_same_weights, events, heartbeat, kill_group, run_cli, start_cli, sup_env, wait_until
from trainer_shim import rundir

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
    run = two_rank_campaign(PL_JOB, tmp_path, "1:kill@12/1,2:hang@17/1", ["signal", "hang", "success"],
                             heartbeat_timeout=12)  # the kill's survivor must not look hung (see two_rank_campaign)
    _hang_named_a_rank(run, 2)
    ckpts = sorted(p for p in (run / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert ckpts and all(committed_files(c) for c in ckpts), ckpts
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")], "a torn save was left behind"


@_needs("transformers")
def test_hf_trainer_two_ranks_stop_saves_every_rank_at_one_step_and_rerun_is_exact(tmp_path: Path) -> None:
    # Rank 0 holds step 6's end until its SIGTERM; rank 1 is already in step 7's all-reduce and sees its
    # own SIGTERM later: the stop is agreed at step 7's end, so both save there and exit 75.
    base = start_run(HF_JOB, tmp_path / "baseline", "")
    run, out = tmp_path / "run", tmp_path / "weights.pt"
    # rank 1 waits silently in the all-reduce while rank 0 holds its pause: a longer heartbeat timeout
    cli = ["run", "--run-dir", str(run), *FAST, "--grace-period", "30", "--heartbeat-timeout", "20", str(HF_JOB),
           "--output_dir", str(run), "--out", str(out)]
    p = start_cli(*cli, env=sup_env(RRTEST_FAULTS="1:pause@6/0"), cwd=tmp_path)
    try:
        wait_until(lambda: (heartbeat(run) or {}).get("step") == 6, timeout=120, what="rank 0 at step 6")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    finally:
        kill_group(p)
    assert p.returncode == 75, err[-3000:]
    assert [e["kind"] for e in events(run, "attempt_ended")] == ["preempted"]
    hbs = [heartbeat(run, r) for r in (0, 1)]
    assert [h["phase"] for h in hbs] == ["stopping", "stopping"] and hbs[0]["step"] == hbs[1]["step"] == 7, hbs
    ck = rundir.inspect_checkpoint(run / rundir.hf_checkpoint_name(7), full=True)
    assert ck.manifest.kind == "preempt" and {"rng_state_0.pth", "rng_state_1.pth"} <= set(ck.manifest.files)
    r = run_cli(*cli, env=sup_env(), cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert events(run, "attempt_started")[-1]["resume_from"]
    assert finish(base[0]) is not None and base[0].returncode == 0
    assert_same_weights(out, base[2])
