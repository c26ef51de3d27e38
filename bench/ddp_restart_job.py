"""Bench job for bench_ddp_restart.py: a 2-rank DDP job (CPU, gloo) on trainer_shim that writes marks.

Every rank appends `rank attempt step pid monotonic` to $BENCH_MARKS after each run.step() of
attempt 1 and after the first run.step() of every later attempt, plus `rank attempt start pid
monotonic` when the process starts (before `import torch`) so the bench can split the restart
into phases. The bench SIGKILLs one rank from outside; the job never kills itself.

The attempt number comes from $RESILIENT_ATTEMPT under resilient-run and from
$TORCHELASTIC_RESTART_COUNT under a bare torchrun --max-restarts, so one script serves both;
the shim (same model, same checkpoints) resumes from its newest checkpoint either way.
"""

import os
import sys
import time
from pathlib import Path

T_START = time.monotonic()
RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("RESILIENT_ATTEMPT") or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + 1)
MARKS = Path(os.environ["BENCH_MARKS"])


def mark(what: object, t: float) -> None:
    # One short O_APPEND write per line: lines of the two ranks never interleave.
    fd = os.open(MARKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{RANK} {ATTEMPT} {what} {os.getpid()} {t:.6f}\n".encode())
    finally:
        os.close(fd)


mark("start", T_START)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

mark("imported", time.monotonic())

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import trainer_shim  # noqa: E402


def main() -> None:
    steps = int(os.environ.get("BENCH_STEPS", "60"))
    step_sleep = float(os.environ.get("BENCH_STEP_SLEEP", "0.05"))
    dist.init_process_group("gloo")
    mark("rendezvous", time.monotonic())
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=os.environ.get("BENCH_RUN_DIR"),
                            save_every_steps=10)
    mark("restored", time.monotonic())
    g = torch.Generator().manual_seed(RANK)
    x, y = torch.randn(64, 32, generator=g), torch.randn(64, 1, generator=g)
    first = True
    for _ in run.epochs(1):
        for _b in run.batches(range(steps)):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            run.step()
            if first or ATTEMPT == 1:
                mark(run.global_step, time.monotonic())
                first = False
            time.sleep(step_sleep)
    run.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
