"""Sharded (DCP) checkpoints: real 2-rank FSDP2 torchrun jobs (CPU, gloo) under the real supervisor.

The job is tests/jobs/ddp_train.py --fsdp: every nn.Linear and the root are `fully_shard`ed, so
the parameters are DTensors and the shim writes each rank's shards through
torch.distributed.checkpoint. Fault tests compare every rank's gathered final weights bitwise
with an uninterrupted 2-rank run. Resharding (2 ranks -> 1) restores model and optimizer
exactly; the continued data order and RNG cannot be, and nothing here claims they are.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

import trainer_shim
from tests.distributed.common import DDP_JOB, FAST, ddp_run
from tests.support import assert_equal_state, assert_same_weights, first_steps, weights, written_in
from tests.supervisor.helpers import ended_kinds, events, run_cli, sup_env
from trainer_shim import rundir
from trainer_shim.errors import CheckpointError

HIDDEN = 32  # ddp_train.py's default --hidden
STEPS_PER_EPOCH_2_RANKS = 8  # 128 samples / (2 ranks x batch 8)
SHARDS = {".metadata", "__0_0.distcp", "__1_0.distcp"}


def fsdp_run(tmp: Path, name: str, *job_args: str, **kw: Any):
    """ddp_run of the job with --fsdp (its parameters are DTensors: the shim saves through DCP)."""
    return ddp_run(tmp, name, "--fsdp", *job_args, **kw)


def plain_net() -> nn.Sequential:
    """The job's model without FSDP: what a user loads a sharded checkpoint into for inference."""
    return nn.Sequential(nn.Linear(16, HIDDEN), nn.ReLU(), nn.Dropout(0.3), nn.Linear(HIDDEN, 1))


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("supervisor.lock"))
    return dst


def newest(run_dir: Path) -> rundir.CheckpointInfo:
    info = rundir.newest_valid([run_dir / "checkpoints"], full=True)
    assert info is not None, f"no valid checkpoint in {run_dir}"
    return info


# --- format -----------------------------------------------------------------------------------------


def test_checkpoints_are_per_rank_shards_never_a_gathered_model(fsdp_reference: Path):
    ckpts = rundir.iter_checkpoint_dirs([fsdp_reference / "run" / "checkpoints"])
    assert [step for step, _, _ in ckpts][:2] == [24, 20]
    for _step, path, _root in ckpts:
        m = rundir.inspect_checkpoint(path, full=True).manifest
        assert m.sharded and m.world_size == 2, path
        # A 100 GB model never gathers on one rank: no model.pt/optimizer.pt, only DCP shards
        # (each rank's own) plus each rank's small trainer state.
        assert set(m.files) == SHARDS | {"rank-0.pt", "rank-1.pt"}, path
    # The gathered final weights are the same on both ranks (FSDP replicas of the full state).
    out = fsdp_reference / "out"
    assert_equal_state(weights(out / "final-rank-1.pt"), weights(out / "final-rank-0.pt"), "rank 1 vs rank 0")


@pytest.mark.parametrize("damage", ["delete", "bitflip"])
def test_a_damaged_shard_makes_the_checkpoint_invalid(fsdp_reference: Path, tmp_path: Path, damage: str):
    ck = newest(fsdp_reference / "run")
    broken = tmp_path / "checkpoints" / ck.path.name
    shutil.copytree(ck.path, broken)
    shard = broken / "__1_0.distcp"
    if damage == "delete":
        shard.unlink()
        reason = "__1_0.distcp is missing"
    else:
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01  # same size: only the digest can tell
        shard.write_bytes(bytes(data))
        reason = "__1_0.distcp digest mismatch"
    with pytest.raises(rundir.InvalidCheckpoint, match=reason):
        rundir.inspect_checkpoint(broken, full=True)
    with pytest.raises(CheckpointError, match=reason):  # the user-facing loader refuses it too
        trainer_shim.load(broken, model=plain_net())


def test_bitflipped_shard_is_rejected_at_resume_and_the_older_checkpoint_continues_exactly(
        fsdp_reference: Path, tmp_path: Path):
    # The supervisor only checks sizes; the ranks split the digest work (_verify_share), so the
    # rank that hashes rank 1's shard must reject the checkpoint for every rank.
    rd = copy_run(fsdp_reference / "run", tmp_path / "flip" / "run")
    shard = rd / "checkpoints" / rundir.checkpoint_name(24) / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    before = len(events(rd, "attempt_started"))
    out = tmp_path / "flip" / "out"
    p = run_cli("--nproc-per-node", "2", "--run-dir", str(rd), *FAST, DDP_JOB, "--fsdp", "--out-dir", str(out),
                env=sup_env(), timeout=150)
    assert p.returncode == 0, p.stderr[-3000:]
    assert ended_kinds(rd)[before:] == ["success"]
    rejected = events(rd, "checkpoint_rejected")
    assert any(e["path"].endswith(rundir.checkpoint_name(24)) and "__1_0.distcp digest mismatch" in e["reason"]
               for e in rejected), rejected
    assert first_steps(rd)[before + 1] == 21, p.stderr[-2000:]  # resumed from step 20, the newest sound one
    assert_same_weights(out, fsdp_reference / "out")
    # Back at step 24 the corrupt checkpoint is replaced, not kept: the run's newest is sound.
    assert newest(rd).step == 24 and written_in(rd, newest(rd).path, before + 1)


# --- faults ---------------------------------------------------------------------------------------


def test_sigkill_of_either_rank_over_attempts_is_bit_exact(fsdp_reference: Path, tmp_path: Path):
    # rank 1 mid-epoch between saves; rank 0 right after the step-12 save committed (its shards
    # and the manifest must be complete the moment run.step() returns).
    p, rd, out = fsdp_run(tmp_path, "kills", faults="1:kill@6:1,2:kill@12:0")
    assert p.returncode == 0, p.stderr[-3000:]
    assert ended_kinds(rd) == ["signal", "signal", "success"]
    ev = [e["evidence"] for e in events(rd, "attempt_ended")]
    assert ev[0].startswith("exit code 1; rank 1 (pid ") and "killed by SIGKILL" in ev[0].split(",")[0], ev[0]
    assert ev[1].startswith("exit code 1; rank 0 (pid ") and "killed by SIGKILL" in ev[1].split(",")[0], ev[1]
    assert [e["resume_from"] for e in events(rd, "attempt_started")][1:] == [
        str(rd.resolve() / "checkpoints" / rundir.checkpoint_name(s)) for s in (4, 12)]
    assert_same_weights(out, fsdp_reference / "out")


# --- reshard 2 -> 1 -----------------------------------------------------------------------------------


def test_reshard_two_ranks_to_one_is_refused_unless_allowed_then_restores_model_and_optimizer_exactly(
        tmp_path: Path):
    # A 2-rank run loses a rank mid-epoch and is not restarted (--max-restarts 0): its newest
    # checkpoint is step 12, half-way through epoch 1 (batch 4 of 8 per rank).
    p, rd, _ = fsdp_run(tmp_path, "lost", faults="1:kill@13:1", extra=("--max-restarts", "0"))
    assert p.returncode != 0 and ended_kinds(rd) == ["signal"], p.stderr[-3000:]
    ck = newest(rd)
    old = ck.manifest
    assert (old.global_step, old.epoch, old.batch_in_epoch, old.world_size) == (12, 1, 4, 2)
    assert 0 < old.batch_in_epoch < STEPS_PER_EPOCH_2_RANKS
    # What the 2-rank checkpoint holds, read by one plain process from its DCP set (now: the
    # resumed run's rotation may delete it once it has committed newer checkpoints).
    saved_model = trainer_shim.load(ck.path).model_state
    net = plain_net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    trainer_shim.load(ck.path, model=net, optimizer=opt)
    saved_opt = get_optimizer_state_dict(net, opt)  # keyed by parameter name, like the job's dump
    out, dump = tmp_path / "one" / "out", tmp_path / "one" / "restored.pt"
    dump.parent.mkdir()
    one = ("--nproc-per-node", "1", "--run-dir", str(rd), *FAST, DDP_JOB, "--fsdp", "--out-dir", str(out),
           "--dump-restored", str(dump))

    # Without permission: refused in one line, the rank exits 2 and that is not retried.
    started = len(events(rd, "attempt_started"))
    p = run_cli(*one, env=sup_env(), timeout=120)
    assert p.returncode == 1, p.stderr[-3000:]
    assert (f"cannot resume from {ck.path.resolve()}: it was written by 2 rank(s), this run has 1; its model and "
            "optimizer would reshard exactly, but data order and per-rank RNG cannot continue a 2-rank run "
            "bit-exactly: run with 2 rank(s), or set RESILIENT_ALLOW_RESHARD=1 to resume at 1") in p.stderr
    assert "exit code 2 is not retryable" in events(rd, "gave_up")[-1]["reason"]
    assert len(events(rd, "attempt_started")) == started + 1  # no retry
    assert not dump.exists()  # the job never got past init()

    # With RESILIENT_ALLOW_RESHARD=1: it resumes at one rank and finishes.
    p = run_cli(*one, env=sup_env(RESILIENT_ALLOW_RESHARD="1"), timeout=150)
    assert p.returncode == 0, p.stderr[-3000:]
    assert ended_kinds(rd)[-1] == "success"
    assert events(rd, "attempt_started")[-1]["resume_from"] == str(ck.path.resolve())
    (ev,) = events(rd, "checkpoint_resharded")
    assert (ev["path"], ev["from_world_size"], ev["to_world_size"]) == (str(ck.path.resolve()), 2, 1)
    # Same fraction of the epoch: 4 batches on each of 2 ranks = 8 batches on one.
    assert ev["batch_in_epoch"] == old.batch_in_epoch * 2

    restored = torch.load(dump, weights_only=True)
    assert (restored["global_step"], restored["epoch"], restored["batch_in_epoch"]) == (12, 1, 8)
    # Exact where exactness allows: the one rank's model and optimizer are bit for bit the
    # 2-rank checkpoint's (the data order and dropout RNG that follow are not, and are not checked).
    assert_equal_state(restored["model"], saved_model, "restored model vs the 2-rank checkpoint")
    got_opt = restored["optim"]
    assert got_opt["state"].keys() == saved_opt["state"].keys() == saved_model.keys()
    for name, st in saved_opt["state"].items():
        assert_equal_state(got_opt["state"][name], st, f"restored optimizer state of {name}")
    assert [g["lr"] for g in got_opt["param_groups"]] == [g["lr"] for g in saved_opt["param_groups"]]

    # The run continued from there at one rank and keeps writing (1-rank) sharded checkpoints.
    last = newest(rd)
    assert last.manifest.world_size == 1 and last.manifest.sharded and last.manifest.global_step > 12
    assert set(last.manifest.files) == {".metadata", "__0_0.distcp", "trainer.pt"}  # one process: trainer.pt
    assert_equal_state(trainer_shim.load(last.path).model_state, weights(out / "final-rank-0.pt"),
                       "the 1-rank run's last checkpoint vs its final weights")


# --- inference load in one plain process ---------------------------------------------------------------


def test_load_into_a_plain_module_in_one_process_gives_the_full_weights(fsdp_reference: Path):
    final = weights(fsdp_reference / "out" / "final-rank-0.pt")
    net = plain_net()
    res = trainer_shim.load(fsdp_reference / "run", model=net)  # a run dir: its newest valid checkpoint
    assert res.path == newest(fsdp_reference / "run").path and res.manifest.global_step == 24
    assert res.manifest.sharded and res.missing_keys == [] and res.unexpected_keys == []
    assert_equal_state(net.state_dict(), final, "plain module loaded from the sharded checkpoint")
    # Without a model: the whole state dict, for export.
    assert_equal_state(trainer_shim.load(res.path).model_state, final, "state dict of the sharded checkpoint")
