"""Training-loop variants the toy job does not cover: DistributedSampler, a stateful loader,
a plain list of batches, a slow dataset resumed deep into an epoch, and a crash between
optimizer.step() and run.step(). Faults come from TOY_FAULTS like the toy job."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import trainer_shim  # noqa: E402
from tests.jobs.jobkit import attempt, job_parser  # noqa: E402
from tests.jobs.toy_train import inject, parse_faults  # noqa: E402


class Indexed(Dataset):
    """Deterministic items that carry their index; optional per-item sleep (slow storage)."""

    def __init__(self, n: int, sleep: float = 0.0) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 8, generator=g)
        self.sleep = sleep

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.sleep:
            time.sleep(self.sleep)
        return self.x[i], torch.tensor(i)


class FakeStatefulLoader:
    """Duck-typed torchdata StatefulDataLoader: owns its shuffling generator and position."""

    def __init__(self, ds: Dataset, batch_size: int) -> None:
        self.ds, self.bs = ds, batch_size
        self.gen = torch.Generator().manual_seed(11)
        self.epoch_gen_state = self.gen.get_state()
        self.pos = 0
        self.resuming = False

    def __len__(self) -> int:
        return (len(self.ds) + self.bs - 1) // self.bs

    def __iter__(self):
        if not self.resuming:
            self.epoch_gen_state = self.gen.get_state()
            self.pos = 0
        self.resuming = False
        g = torch.Generator()
        g.set_state(self.epoch_gen_state)
        perm = torch.randperm(len(self.ds), generator=g).tolist()
        self.gen.set_state(g.get_state())
        batches = [perm[i:i + self.bs] for i in range(0, len(perm), self.bs)]
        while self.pos < len(batches):
            idx = batches[self.pos]
            self.pos += 1
            items = [self.ds[i] for i in idx]
            yield torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])
        # Exhausted: like torchdata, the state now means "start the next epoch".
        self.pos = 0
        self.epoch_gen_state = self.gen.get_state()

    def state_dict(self) -> dict:
        return {"epoch_gen_state": self.epoch_gen_state, "pos": self.pos, "gen": self.gen.get_state()}

    def load_state_dict(self, sd: dict) -> None:
        self.epoch_gen_state, self.pos = sd["epoch_gen_state"], sd["pos"]
        self.gen.set_state(sd["gen"])
        self.resuming = self.pos > 0


def main() -> None:
    ap = job_parser(epochs=2, samples=64, batch_size=4, save_every=5)
    ap.add_argument("--loader", choices=["dist", "stateful", "list", "slow", "dataloader"], default="dataloader")
    ap.add_argument("--crash-dirty-at", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(0)
    faults = parse_faults(os.environ.get("TOY_FAULTS", ""), attempt())

    sleep = float(os.environ.get("VARIANT_SLEEP", "0"))
    ds = Indexed(args.samples, sleep)
    sampler = None
    if args.loader == "dist":
        sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
        loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler)
    elif args.loader == "stateful":
        loader = FakeStatefulLoader(ds, args.batch_size)
    elif args.loader == "list":
        g = torch.Generator().manual_seed(5)
        loader = [(torch.randn(args.batch_size, 8, generator=g), torch.zeros(args.batch_size)) for _ in range(10)]
    else:
        loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True)

    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    run = trainer_shim.init(model=model, optimizer=opt, scheduler=sched, run_dir=args.run_dir,
                            save_every_steps=args.save_every)
    for epoch in run.epochs(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        t0 = time.monotonic()
        first = True
        for x, idx in run.batches(loader):
            if first and args.loader == "slow":
                print(f"variant: first batch after {time.monotonic() - t0:.4f} s index {idx.tolist()}", flush=True)
            first = False
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            if args.crash_dirty_at and run.global_step + 1 == args.crash_dirty_at:
                raise RuntimeError("crash between optimizer.step() and run.step()")
            run.step(loss=loss.item())
            if args.loader == "slow" and run.global_step == 5001:
                print(f"variant: batch 5000 index {idx.tolist()}", flush=True)
            if run.global_step in faults:
                inject(faults[run.global_step])
        sched.step()
    run.finish()
    torch.save(model.state_dict(), run.rd.root / "final_weights.pt")
    print(f"variant: finished step {run.global_step}", flush=True)


if __name__ == "__main__":
    main()
