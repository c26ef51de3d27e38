"""A job for the async-save isolation test: right after run.step() N returns (its save still in
flight: large writes are throttled), it changes every weight in place; the checkpoint of step N
must hold the weights as they were at step N (pytorch#144657)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import trainer_shim  # noqa: E402

_real_write = os.write


def _slow_write(fd: int, data) -> int:
    n = len(memoryview(data).cast("B"))
    if n >= 1 << 20:
        time.sleep(n / 4e6)  # 4 MB/s for checkpoint-sized writes
    return _real_write(fd, data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--mutate-at", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 512))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=args.run_dir, save_every_steps=args.mutate_at,
                            async_save=True)
    os.write = _slow_write
    x = torch.randn(8, 16)
    while run.global_step < args.steps:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        run.step()
        if run.global_step == args.mutate_at:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()},  # serialised now
                       Path(args.run_dir) / "expected.pt")
            in_flight = run.engine.fast.flight.job is not None
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(-3.0).add_(7.0)  # in place, right after run.step() returned
                for st in opt.state.values():
                    st["exp_avg"].fill_(123.0)
            print(f"async_job: mutated at step {args.mutate_at}, save in flight: {in_flight}", flush=True)
    run.finish()


if __name__ == "__main__":
    main()
