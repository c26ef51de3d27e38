"""Bench job: records when attempt 1 kills itself and when the next attempt's first step runs.

Works under resilient-run (RESILIENT_ATTEMPT) and under torchrun (TORCHELASTIC_RESTART_COUNT),
with the same shim and model in both, so the restart paths are compared on equal terms.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import trainer_shim  # noqa: E402

marks = Path(os.environ["BENCH_MARKS"])
attempt = int(os.environ.get("RESILIENT_ATTEMPT") or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + 1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
run = trainer_shim.init(model=model, optimizer=opt, run_dir=os.environ.get("BENCH_RUN_DIR"), save_every_steps=10)
x, y = torch.randn(64, 32), torch.randn(64, 1)
first = True
for _ in run.epochs(1):
    for _b in run.batches(range(40)):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        run.step()
        if first and attempt > 1:
            with open(marks, "a") as f:
                f.write(f"first_step {time.time()}\n")
            first = False
        if attempt == 1 and os.environ.get("BENCH_WARMUP_S"):
            # A real job trains for a while before it dies: time for a supervisor to prepare its restart.
            time.sleep(float(os.environ["BENCH_WARMUP_S"]) / 20)
        if attempt == 1 and run.global_step == 20:
            with open(marks, "a") as f:
                f.write(f"kill {time.time()}\n")
            os.kill(os.getpid(), signal.SIGKILL)
run.finish()
