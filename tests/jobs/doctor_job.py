"""A tiny job for `resilient-run doctor` tests: `exact`, `bn` (DCGAN-style defect), `rng` (forgotten
default_rng), `localrng` (the same, a local of the training function) or `modrng` (a module of the
model draws noise from its own torch.Generator). `--output_dir DIR` (anywhere after the mode): written
into before training starts, as ms-swift writes its args.json before a Trainer exists."""
import json
import os
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer_shim

mode = sys.argv[1]
if "--output_dir" in sys.argv:
    out_dir = sys.argv[sys.argv.index("--output_dir") + 1]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "args.json"), "w") as f:
        json.dump({"mode": mode}, f)
    del sys.argv[sys.argv.index("--output_dir"):sys.argv.index("--output_dir") + 2]
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, shuffle=True)


class Noisy(nn.Module):
    """Input noise from the module's own generator: not a parameter or buffer, so no checkpoint has it."""

    def __init__(self) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(3)

    def forward(self, x):
        return x + 0.01 * torch.randn(x.shape, generator=self.gen) if self.training else x


def build() -> nn.Module:  # the Noisy module is reachable only through the model, not the globals
    layers = [nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1)]
    return nn.Sequential(Noisy(), *layers) if mode == "modrng" else nn.Sequential(*layers)


model = build()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
noise_rng = np.random.default_rng(1234)

run = trainer_shim.init(model=model, optimizer=opt, save_every_steps=5)


def train() -> None:
    local_rng = np.random.default_rng(99)  # `localrng`: a generator only this function's frame holds
    for epoch in run.epochs(int(sys.argv[2]) if len(sys.argv) > 2 else 100):
        for x, y in run.batches(loader):
            if mode in ("rng", "localrng"):
                gen = noise_rng if mode == "rng" else local_rng
                x = x + torch.from_numpy(gen.normal(size=x.shape).astype("float32")) * 0.01
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            run.step(loss=loss.item())
            if mode == "bn" and run.global_step % 10 == 0:
                model(torch.randn(8, 8))  # "sample" in training mode after run.step(): BatchNorm stats change


train()
run.finish()
