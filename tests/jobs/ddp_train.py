"""A small DDP job (CPU, gloo) using trainer_shim; run it under torchrun (or `resilient-run --nproc-per-node`).

DistributedSampler(shuffle=True), dropout (per-rank RNG), Adam, a per-step LR scheduler.
Every rank writes its final weights to OUT_DIR/final-rank-<R>.pt.

--fsdp: FSDP2 `fully_shard` (each nn.Linear, then the root) instead of DDP, so the model holds
DTensor parameters and trainer_shim saves sharded (DCP) checkpoints; the final weights are the
gathered full state, so the same bitwise comparison applies. --dump-restored PATH: right after
trainer_shim.init(), rank 0 writes the full restored model and optimizer state and the
step/epoch/batch counters.

Fault injection: DDP_FAULTS="ATTEMPT:ACTION@STEP[:RANK],..." applies ACTION right after
run.step() returns at global_step == STEP when $RESILIENT_ATTEMPT == ATTEMPT (or *), on RANK
only when given (else on every rank). ACTIONs: kill (SIGKILL itself), hang (sleep forever
outside any collective: the other ranks block in the next all-reduce), hang_pre (the same, but
before run.step(): this rank's heartbeat stops one step earlier than the others'), raise, sigterm.
TOY_ASYNC_SAVE=1 / TOY_MEMORY_EVERY=K: init(async_save=True) / init(memory_every_steps=K), as in toy_train.py.
DDP_JITTER_RANK=R: rank R adds noise to its inputs from a module-level NumPy generator that no
checkpoint holds (a defect `resilient-run doctor` must name, with the rank).
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install
import trainer_shim  # noqa: E402
from tests.jobs.jobkit import attempt, job_parser, train_step  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toy_train import inject  # noqa: E402  (the same fault actions as the single-process job)

_JITTER = np.random.default_rng(5)  # DDP_JITTER_RANK: drawn from, never checkpointed


def parse_faults(spec: str, attempt: int, rank: int) -> dict[int, str]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        who, rest = item.split(":", 1)
        action, where = rest.rsplit("@", 1)
        step, _, on_rank = where.partition(":")
        if (who == "*" or int(who) == attempt) and (not on_rank or int(on_rank) == rank):
            out[int(step)] = action
    return out


# Collective. cpu_offload=True would gather on rank 0 only (ranks_only=(0,)) and leave the other
# ranks an empty dict; on CPU there is nothing to offload, so every rank gets the whole state.
FULL = dict(full_state_dict=True, cpu_offload=False)


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of an FSDP2 model on this rank, keyed like the plain nn.Sequential's state dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(**FULL))


def full_optimizer(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """The whole optimizer state of an FSDP2 model, keyed by parameter name (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, opt, options=StateDictOptions(**FULL))


def main() -> None:
    ap = job_parser(epochs=3, samples=128, batch_size=8, save_every=4)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--heartbeat-interval", type=float, default=1.0)
    ap.add_argument("--collective-timeout", type=float, default=60.0)
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP (sharded checkpoints)")
    ap.add_argument("--dump-restored", default=None, help="rank 0 writes the state restored by init() here")
    ap.add_argument("--fallback-dir", default=None)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    random.seed(rank)
    np.random.seed(rank)
    faults = parse_faults(os.environ.get("DDP_FAULTS", ""), attempt(), rank)

    g = torch.Generator().manual_seed(1234)
    x = torch.randn(args.samples, 16, generator=g)
    ds = TensorDataset(x, (x.sum(dim=1, keepdim=True) > 0).float())
    sampler = DistributedSampler(ds, shuffle=True, seed=7)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler)
    net = nn.Sequential(nn.Linear(16, args.hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(args.hidden, 1))
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        # Every rank built the same full weights (seed 0); fully_shard keeps each rank's slice.
        for m in net:
            if isinstance(m, nn.Linear):
                fully_shard(m)
        model = fully_shard(net)
    else:
        model = DDP(net)
    torch.manual_seed(100 + rank)  # dropout masks differ per rank: per-rank RNG must be restored
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.MultiplicativeLR(opt, lr_lambda=lambda _: 0.995)
    loss_fn = nn.BCEWithLogitsLoss()

    run = trainer_shim.init(model=model, optimizer=opt, scheduler=sched, run_dir=args.run_dir,
                            save_every_steps=args.save_every, collective_timeout=args.collective_timeout,
                            heartbeat_interval=args.heartbeat_interval, fallback_dir=args.fallback_dir,
                            async_save=os.environ.get("TOY_ASYNC_SAVE") == "1",
                            memory_every_steps=int(os.environ.get("TOY_MEMORY_EVERY") or 0) or None)
    if args.dump_restored:
        # Collective under FSDP: every rank gathers, rank 0 writes.
        sd = full_weights(model) if args.fsdp else net.state_dict()
        # Only a restored optimizer: on a fresh one DCP's state-dict call would take a zero-lr
        # step to create its state, and change the run being observed.
        osd = (full_optimizer(model, opt) if args.fsdp else opt.state_dict()) if opt.state else None
        if rank == 0:
            torch.save({"model": sd, "optim": osd, "global_step": run.global_step, "epoch": run.epoch,
                        "batch_in_epoch": run.batch_in_epoch}, args.dump_restored)
    for epoch in run.epochs(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for xb, yb in run.batches(loader):
            if os.environ.get("DDP_JITTER_RANK") == str(rank):
                xb = xb + 0.01 * torch.from_numpy(_JITTER.standard_normal(tuple(xb.shape)).astype(np.float32))
            loss = train_step(model, opt, loss_fn, xb, yb, sched)
            if faults.get(run.global_step + 1) == "hang_pre":
                inject("hang")
            run.step(loss=loss)
            if run.global_step in faults and faults[run.global_step] != "hang_pre":
                inject(faults[run.global_step])
            if args.step_sleep:
                time.sleep(args.step_sleep)
    run.finish()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(full_weights(model) if args.fsdp else net.state_dict(), out / f"final-rank-{rank}.pt")
    print(f"ddp_train: rank {rank} finished step {run.global_step}", flush=True)
    dist.destroy_process_group()
    print(f"ddp_train: rank {rank} destroyed", flush=True)
    # torch 2.13 + gloo: a runloop thread can still be releasing the last collective's work (its tensors'
    # Python objects) when the interpreter finalises; it cannot take the GIL then, and the process aborts
    # with "terminate called without an active exception" (a third of FSDP runs here; cf. pytorch#179291).
    # The supervisor would restart it from the final checkpoint; these tests observe the training instead.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
