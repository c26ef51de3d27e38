"""Costs of the multi-rank shim: the per-step stop/save flag all-reduce and a checkpoint save.

Run: .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 bench/bench_ddp.py [--mb 64]
Prints, on rank 0: the flag all-reduce (gloo, 2 x int32) per call; run.step() with and without
it; a multi-rank save of a model of --mb MiB (rank 0 writes model+optimizer, each rank its
rank-R.pt) vs the single-process write of the same state (ckpt.write_checkpoint).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import trainer_shim  # noqa: E402
from trainer_shim import checkpoint as ckpt  # noqa: E402
from trainer_shim.rundir import CheckpointKind  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root = Path(tempfile.gettempdir()) / "bench_ddp"
    if rank == 0:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    n = args.mb * (1 << 20) // 4 // 2
    model = torch.nn.Sequential(torch.nn.Linear(n // 1024, 1024, bias=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, n // 1024)).sum().backward()
    opt.step()
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=root / "run", save_on_epoch_end=False,
                            heartbeat_interval=3600)
    d = run._dist
    for _ in range(100):
        d.agree(False, False)
    t = time.perf_counter()
    for _ in range(args.iters):
        d.agree(False, False)
    ar = (time.perf_counter() - t) / args.iters
    dist.barrier()
    t = time.perf_counter()
    for _ in range(args.iters):
        run.step()
    with_ar = (time.perf_counter() - t) / args.iters
    saved, run._dist = run._dist, None  # the same step() without the all-reduce (measurement only)
    t = time.perf_counter()
    for _ in range(args.iters):
        run.step()
    without = (time.perf_counter() - t) / args.iters
    run._dist = saved
    times = []
    for _ in range(3):
        dist.barrier()
        t = time.perf_counter()
        run.save()
        times.append(time.perf_counter() - t)
        run.global_step += 1
    single = []
    if rank == 0:
        for i in range(3):
            snap = ckpt.Snapshot({ckpt.MODEL_FILE: model.state_dict(), ckpt.OPTIMIZER_FILE: opt.state_dict(),
                                  ckpt.TRAINER_FILE: {"x": 1}}, 10_000 + i, 0, 0, CheckpointKind.STEP, None)
            t = time.perf_counter()
            ckpt.write_checkpoint(root / "single", snap, meta={})
            single.append(time.perf_counter() - t)
    dist.barrier()
    if rank == 0:
        print(f"flag all-reduce (gloo, 2 ranks): {ar * 1e6:.1f} us/call")
        print(f"run.step(): {with_ar * 1e6:.1f} us with it, {without * 1e6:.1f} us without")
        print(f"multi-rank save of {args.mb} MiB model+momentum: median {statistics.median(times) * 1e3:.0f} ms "
              f"(runs {', '.join(f'{x * 1e3:.0f}' for x in times)}); single-process write_checkpoint of the "
              f"same state: median {statistics.median(single) * 1e3:.0f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
