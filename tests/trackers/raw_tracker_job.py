"""A raw loop logging one scalar per step to TensorBoard (torch's SummaryWriter in its default log
dir, tensorboardX's in ./tbx), W&B and MLflow, with no tracker code of resilient-run's.

TRACKER_KILLS="1:12,2:23": SIGKILL right after run.step() at that global step in that attempt.
TRACKER_WRITER_FIRST=1: the SummaryWriters are opened before init() (the supervisor's choice in the
environment says where this attempt resumes, not the restore).
"""

from __future__ import annotations

import os
import signal
import sys

import mlflow
import torch
import wandb
from tensorboardX import SummaryWriter as XWriter
from torch.utils.tensorboard import SummaryWriter

import trainer_shim

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
kills = dict(item.split(":") for item in filter(None, os.environ.get("TRACKER_KILLS", "").split(",")))
kill_at = int(kills.get(os.environ.get("RESILIENT_ATTEMPT", "1"), 0))


def writers() -> tuple:
    return SummaryWriter(), XWriter("tbx")


if os.environ.get("TRACKER_WRITER_FIRST"):
    tb, tbx = writers()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = trainer_shim.init(model=model, optimizer=opt, save_every_steps=5, save_on_epoch_end=False)
if not os.environ.get("TRACKER_WRITER_FIRST"):
    tb, tbx = writers()
wb = wandb.init(project="trackers-test")
mlflow.start_run()
x, y = torch.randn(64, 4), torch.randn(64, 1)
while run.global_step < STEPS:
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    run.step(loss=loss.item())
    step, value = run.global_step, loss.item()
    tb.add_scalar("loss", value, step)
    tbx.add_scalar("loss", value, step)
    wb.log({"loss": value, "global_step": step})
    mlflow.log_metric("loss", value, step=step)
    if step == kill_at:
        for w in (tb, tbx):
            w.flush()
        os.kill(os.getpid(), signal.SIGKILL)
run.finish()
for w in (tb, tbx):
    w.close()
wb.finish()
mlflow.end_run()
