"""A job for the pipelined memory snapshots (trainer_shim._memory.late_copy).

`snap`: a model with BatchNorm (forward changes its running statistics while the optimizer's
tensors are still being copied) and Adam, a memory snapshot every step (each waited for, so none
is skipped); after run.step() of --steps, torch.save the state to --expect, run the next step's
forward, backward and optimizer.step() (the copy of that snapshot overlaps them), wait for the
snapshot, and kill -9 itself.
`--mutate-at K`: after run.step() of K, change a weight in place outside optimizer.step() (a
deterministic part of the job: the expected state includes it).
`restore`: rebuild with another seed, init() on the same run dir and print one JSON line: the
step it resumed at and whether model and optimizer state equal --expect bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import trainer_shim  # noqa: E402
from tests.jobs.raw_restore_job import snap_restore_parser, tensors  # noqa: E402

WIDTH = 512  # ~4 MiB of weights + 8 MiB of Adam state: the copy runs for a while beside forward


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, WIDTH), nn.BatchNorm1d(WIDTH), nn.ReLU(),
                          *[m for _ in range(3) for m in (nn.Linear(WIDTH, WIDTH), nn.BatchNorm1d(WIDTH), nn.ReLU())],
                          nn.Linear(WIDTH, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    opt.zero_grad()
    model(torch.randn(32, 16, generator=g)).pow(2).mean().backward()
    opt.step()


def main() -> None:
    ap = snap_restore_parser(6)
    ap.add_argument("--mutate-at", type=int, default=0)
    args = ap.parse_args()
    model, opt = build(0 if args.mode == "snap" else 1)
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=args.run_dir, memory_every_steps=1,
                            save_every_steps=1000, save_on_epoch_end=False)
    if args.mode == "restore":
        want = torch.load(args.expect, weights_only=True)
        got = tensors(model, opt)
        equal = want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)
        print(json.dumps({"step": run.global_step, "equal": equal}), flush=True)
        run.finish()
        return
    print(json.dumps({"pipelined": run.engine.fast.hasher.late is not None}), flush=True)
    while run.global_step < args.steps:
        train_step(model, opt, run.global_step)
        run.step()
        if run.global_step == args.mutate_at:
            with torch.no_grad():
                model[0].weight.mul_(0.5)
        if run.global_step < args.steps:
            run.engine.fast.drain()
    torch.save({k: v.clone() for k, v in tensors(model, opt).items()}, args.expect)
    train_step(model, opt, run.global_step)  # forward, backward and the optimizer step overlap the copy
    run.engine.fast.drain()
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
