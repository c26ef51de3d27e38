"""A tiny deterministic trainer for the divergence guard tests.

Batches are a function of the step, so a resumed run continues bit-exactly. Knobs (test-only):
  RRTEST_NAN_AFTER_RESUME_FROM=N  resumed from the checkpoint of step N: the loss is NaN 3 steps later
                                  (a checkpoint that trains into NaN)
  RRTEST_NAN_AT=N                 the loss is NaN at step N in every attempt (diverges from scratch)
  RRTEST_CRASH_AT=A:N             attempt A raises right after step N
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

import trainer_shim


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--on-nonfinite", default="raise")
    ap.add_argument("--out", default=None)
    ap.add_argument("--resume", default="auto")
    args = ap.parse_args()
    attempt = int(os.environ.get("RESILIENT_ATTEMPT", "1"))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    run = trainer_shim.init(model=model, optimizer=opt, save_every_steps=args.save_every, on_nonfinite=args.on_nonfinite,
                            resume=args.resume)
    nan_after = os.environ.get("RRTEST_NAN_AFTER_RESUME_FROM")
    nan_at = int(os.environ.get("RRTEST_NAN_AT") or 0)
    if nan_after and run.resumed_from and run.global_step == int(nan_after):
        nan_at = run.global_step + 3
    crash = os.environ.get("RRTEST_CRASH_AT", "")
    crash_at = int(crash.split(":")[1]) if crash and int(crash.split(":")[0]) == attempt else 0
    while run.global_step < args.steps:
        g = torch.Generator().manual_seed(run.global_step)
        x = torch.randn(args.batch_size, 4, generator=g)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        value = loss.item()
        if run.global_step + 1 == nan_at:
            value, nan_at = float("nan"), 0   # once: with on_nonfinite="skip" the step comes again
        run.step(loss=value)
        if run.global_step == crash_at:
            raise RuntimeError(f"diverge_job: injected crash at step {crash_at}")
    run.finish()
    torch.save(model.state_dict(), Path(args.out) if args.out else run.rd.root / "final_weights.pt")
    print(f"diverge_job: finished step {run.global_step} skipped {run.skipped_steps}", flush=True)


if __name__ == "__main__":
    main()
