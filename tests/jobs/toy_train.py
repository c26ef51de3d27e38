"""A small but real training job using trainer_shim; tests and the supervisor drive it.

Fault injection: TOY_FAULTS="ATTEMPT:ACTION@STEP,..." applies ACTION right after run.step()
returns at global_step == STEP when $RESILIENT_ATTEMPT (default 1) == ATTEMPT (or ATTEMPT is *).
ACTIONs: kill, raise, exitN, hang, deadlock, cuda_oom, alloc, sigterm.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install
import trainer_shim  # noqa: E402


class ToyDataset(Dataset):
    """Deterministic samples: item i depends only on i (so any worker may serve it)."""

    def __init__(self, n: int, dim: int = 16) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, dim, generator=g)
        self.y = (self.x.sum(dim=1, keepdim=True) > 0).float()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def parse_faults(spec: str, attempt: int) -> dict[int, str]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        who, rest = item.split(":", 1)
        action, step = rest.rsplit("@", 1)
        if who == "*" or int(who) == attempt:
            out[int(step)] = action
    return out


def inject(action: str) -> None:
    sys.stdout.flush()
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        raise RuntimeError("injected crash")
    elif action.startswith("exit"):
        sys.exit(int(action[4:] or 1))
    elif action == "hang":
        while True:
            time.sleep(3600)
    elif action == "deadlock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    elif action == "cuda_oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    elif action == "alloc":
        hog = []
        while True:
            hog.append(bytearray(64 << 20))
            hog[-1][::4096] = b"x" * len(hog[-1][::4096])  # touch pages so RSS really grows
    elif action == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    else:
        raise SystemExit(f"toy_train: unknown fault action {action!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--fallback-dir", default=None)
    ap.add_argument("--keep-last", type=int, default=3)
    args = ap.parse_args()

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    attempt = int(os.environ.get("RESILIENT_ATTEMPT", "1"))
    faults = parse_faults(os.environ.get("TOY_FAULTS", ""), attempt)

    model = nn.Sequential(nn.Linear(16, args.hidden), nn.ReLU(), nn.Dropout(0.2),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    per_step = torch.optim.lr_scheduler.MultiplicativeLR(opt, lr_lambda=lambda _: 0.999)
    per_epoch = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    loader = DataLoader(ToyDataset(args.samples), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.num_workers)
    loss_fn = nn.BCEWithLogitsLoss()

    run = trainer_shim.init(model=model, optimizer=opt, scheduler=per_step, extra={"epoch_sched": per_epoch},
                            run_dir=args.run_dir, save_every_steps=args.save_every, keep_last=args.keep_last,
                            fallback_dir=args.fallback_dir)
    run.state.setdefault("seen", 0)
    for _epoch in run.epochs(args.epochs):
        model.train()
        for x, y in run.batches(loader):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            per_step.step()
            run.state["seen"] += len(x)
            run.step(loss=loss.item())
            if run.global_step in faults:
                inject(faults[run.global_step])
            if args.step_sleep:
                time.sleep(args.step_sleep)
        per_epoch.step()
    run.finish()
    out = Path(args.out) if args.out else run.rd.root / "final_weights.pt"
    torch.save(model.state_dict(), out)
    print(f"toy_train: finished step {run.global_step}", flush=True)


if __name__ == "__main__":
    main()
