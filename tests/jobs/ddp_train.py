"""A small DDP job (CPU, gloo) using trainer_shim; run it under torchrun (or `resilient-run --nproc-per-node`).

DistributedSampler(shuffle=True), dropout (per-rank RNG), Adam, a per-step LR scheduler.
Every rank writes its final weights to OUT_DIR/final-rank-<R>.pt.

Fault injection: DDP_FAULTS="ATTEMPT:ACTION@STEP[:RANK],..." applies ACTION right after
run.step() returns at global_step == STEP when $RESILIENT_ATTEMPT == ATTEMPT (or *), on RANK
only when given (else on every rank). ACTIONs: kill (SIGKILL itself), hang (sleep forever
outside any collective: the other ranks block in the next all-reduce), hang_pre (the same, but
before run.step(): this rank's heartbeat stops one step earlier than the others'), raise, sigterm.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toy_train import inject  # noqa: E402  (the same fault actions as the single-process job)


def parse_faults(spec: str, attempt: int, rank: int) -> dict[int, str]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        who, rest = item.split(":", 1)
        action, where = rest.rsplit("@", 1)
        step, _, on_rank = where.partition(":")
        if (who == "*" or int(who) == attempt) and (not on_rank or int(on_rank) == rank):
            out[int(step)] = action
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--save-every", type=int, default=4)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--heartbeat-interval", type=float, default=1.0)
    ap.add_argument("--collective-timeout", type=float, default=60.0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    random.seed(rank)
    np.random.seed(rank)
    attempt = int(os.environ.get("RESILIENT_ATTEMPT", "1"))
    faults = parse_faults(os.environ.get("DDP_FAULTS", ""), attempt, rank)

    g = torch.Generator().manual_seed(1234)
    x = torch.randn(args.samples, 16, generator=g)
    ds = TensorDataset(x, (x.sum(dim=1, keepdim=True) > 0).float())
    sampler = DistributedSampler(ds, shuffle=True, seed=7)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler)
    net = nn.Sequential(nn.Linear(16, args.hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(args.hidden, 1))
    model = DDP(net)
    torch.manual_seed(100 + rank)  # dropout masks differ per rank: per-rank RNG must be restored
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.MultiplicativeLR(opt, lr_lambda=lambda _: 0.995)
    loss_fn = nn.BCEWithLogitsLoss()

    run = trainer_shim.init(model=model, optimizer=opt, scheduler=sched, run_dir=args.run_dir,
                            save_every_steps=args.save_every, collective_timeout=args.collective_timeout,
                            heartbeat_interval=args.heartbeat_interval)
    for epoch in run.epochs(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for xb, yb in run.batches(loader):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            sched.step()
            if faults.get(run.global_step + 1) == "hang_pre":
                inject("hang")
            run.step(loss=loss.item())
            if run.global_step in faults and faults[run.global_step] != "hang_pre":
                inject(faults[run.global_step])
            if args.step_sleep:
                time.sleep(args.step_sleep)
    run.finish()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), out / f"final-rank-{rank}.pt")
    print(f"ddp_train: rank {rank} finished step {run.global_step}", flush=True)
    dist.destroy_process_group()
    print(f"ddp_train: rank {rank} destroyed", flush=True)


if __name__ == "__main__":
    main()
