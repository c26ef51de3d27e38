"""The wheel smoke's raw loop: a plain PyTorch script with trainer_shim's calls, nothing else.

    python toy.py OUT.pt [READY]

Writes its final weights to OUT.pt. With READY, attempt 1 of a supervised run writes its pid there
at step 12 (its step-10 checkpoint committed) and then waits to be SIGKILLed from outside; without
it, or in any later attempt, it runs straight through (the uninterrupted reference run).
"""
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer_shim

out = Path(sys.argv[1])
ready = Path(sys.argv[2]) if len(sys.argv) > 2 else None

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
loader = DataLoader(data, batch_size=32, shuffle=True)   # 8 steps an epoch, 32 in all
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)

run = trainer_shim.init(model=model, optimizer=opt, scheduler=sched, save_every_steps=5)
for epoch in run.epochs(4):
    for x, y in run.batches(loader):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        run.step(loss=loss.item())
        if ready is not None and os.environ.get("RESILIENT_ATTEMPT") == "1" and run.global_step == 12:
            ready.with_suffix(".tmp").write_text(str(os.getpid()))
            ready.with_suffix(".tmp").rename(ready)      # whole: the smoke reads it as soon as it exists
            while True:          # the victim: it only waits for the SIGKILL, which the smoke sends
                time.sleep(1)
    sched.step()
run.finish()
torch.save(model.state_dict(), out)
