"""Costs of the multi-rank shim (2 ranks, CPU, gloo), as ratios against a baseline measured side by side.

Run: .venv/bin/python bench/bench_ddp.py [--mb 64] [--rounds 5]   (it starts itself under torchrun)

Printed on rank 0, one table:
- checkpoint write, 2 ranks ÷ the single-process save of the same total state (model + Adam
  state of --mb MiB of parameters; the single-process save is the shim's own write_checkpoint on
  rank 0 while rank 1 waits), target <= 0.75:
    DDP: model.pt from rank 0, optimizer.pt from rank 1, each rank its rank-R.pt;
    DDP with init(sharded=True): DCP de-duplicates the replicas and spreads their writes;
    FSDP2 (`fully_shard`): every rank writes its own shards through DCP.
  Rounds alternate baseline / DDP / DDP-DCP / FSDP2; each side's median and best are shown.
- the per-step stop/save flag all-reduce, and run.step() with it ÷ without it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

if "RANK" not in os.environ:  # the user's command: become a 2-rank torchrun job
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                              __file__, *sys.argv[1:]]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import trainer_shim  # noqa: E402
from trainer_shim._session.engine import Solo
from trainer_shim.rundir import CheckpointKind  # noqa: E402
from trainer_shim._disk import members
from trainer_shim._state import capture
from trainer_shim import rundir


def _model(mb: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Two square layers holding `mb` MiB of float32 parameters, with Adam state after one step."""
    side = int((mb * (1 << 20) / 4 / 2) ** 0.5)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(side, side, bias=False), nn.Linear(side, side, bias=False))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _train_once(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    width = next(model.parameters()).shape[1]
    model(torch.ones(2, width)).sum().backward()
    opt.step()


def _timed(fn: Callable[[], object]) -> float:
    dist.barrier()
    t = time.perf_counter()
    fn()
    dist.barrier()  # a multi-rank save is done when the slowest rank is
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64, help="MiB of parameters (the optimizer adds twice that)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root = Path(tempfile.gettempdir()) / f"bench_ddp-{os.getppid()}"
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()

    ddp_model, ddp_opt = _model(args.mb)
    _train_once(ddp_model, ddp_opt)  # replicas stay equal: same seed, same input, no all-reduce needed
    ddp = trainer_shim.init(model=ddp_model, optimizer=ddp_opt, run_dir=root / "ddp", save_on_epoch_end=False,
                            keep_last=1, heartbeat_interval=3600)
    ddp_dcp = trainer_shim.init(model=ddp_model, optimizer=ddp_opt, run_dir=root / "ddp-dcp", save_on_epoch_end=False,
                                keep_last=1, heartbeat_interval=3600, sharded=True)

    from torch.distributed.fsdp import fully_shard

    fs_model, _ = _model(args.mb)
    for layer in fs_model:
        fully_shard(layer)
    fully_shard(fs_model)
    fs_opt = torch.optim.Adam(fs_model.parameters(), lr=1e-3)
    _train_once(fs_model, fs_opt)
    fsdp = trainer_shim.init(model=fs_model, optimizer=fs_opt, run_dir=root / "fsdp", save_on_epoch_end=False,
                             keep_last=1, heartbeat_interval=3600)
    assert fsdp.sharded and not ddp.sharded

    def single(i: int) -> None:
        if rank == 0:
            snap = capture.Capture({rundir.MODEL_FILE: ddp_model.state_dict(), rundir.OPTIMIZER_FILE: ddp_opt.state_dict(),
                                  rundir.TRAINER_FILE: {"x": 1}}, 10_000 + i, 0, 0, CheckpointKind.STEP, None)
            members.write_checkpoint(root / "single", snap, meta={})
            shutil.rmtree(root / "single" / f"step-{10_000 + i:08d}")

    def multi(run: trainer_shim.Run) -> Callable[[], object]:
        def save() -> None:
            run.global_step += 1
            if run.save() is None:
                raise RuntimeError("bench save failed")
        return save

    times: dict[str, list[float]] = {"single": [], "ddp": [], "ddp_dcp": [], "fsdp": []}
    for i in range(args.rounds + 1):  # round 0 warms caches and imports, not counted
        for name, fn in (("single", lambda: single(i)), ("ddp", multi(ddp)), ("ddp_dcp", multi(ddp_dcp)),
                         ("fsdp", multi(fsdp))):
            t = _timed(fn)
            if i:
                times[name].append(t)

    d = ddp.engine.group
    for _ in range(100):
        d.agree(False, False)
    t = time.perf_counter()
    for _ in range(args.iters):
        d.agree(False, False)
    ar = (time.perf_counter() - t) / args.iters
    dist.barrier()
    t = time.perf_counter()
    for _ in range(args.iters):
        ddp.step()
    with_ar = (time.perf_counter() - t) / args.iters
    saved, ddp.engine.group = ddp.engine.group, Solo()  # the same step() without the all-reduce
    t = time.perf_counter()
    for _ in range(args.iters):
        ddp.step()
    without = (time.perf_counter() - t) / args.iters
    ddp.engine.group = saved

    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        total = sum(t.numel() * t.element_size() for t in ddp_model.state_dict().values()) * 3 / (1 << 20)

        def ms(k: str) -> str:
            return f"median {med[k] * 1e3:.0f} ms, best {best[k] * 1e3:.0f} ms"

        rows = [
            (f"single-process save of {total:.0f} MiB (baseline)", ms("single"), "", ""),
            ("2-rank DDP save (model rank 0, optimizer rank 1)", ms("ddp"),
             f"{med['ddp'] / med['single']:.2f} (best {best['ddp'] / best['single']:.2f})", "<= 0.75"),
            ("2-rank DDP save, init(sharded=True) (DCP spreads replicas)", ms("ddp_dcp"),
             f"{med['ddp_dcp'] / med['single']:.2f} (best {best['ddp_dcp'] / best['single']:.2f})", "<= 0.75"),
            ("2-rank FSDP2 sharded save (DCP, each rank its shards)", ms("fsdp"),
             f"{med['fsdp'] / med['single']:.2f} (best {best['fsdp'] / best['single']:.2f})", "<= 0.75"),
            ("stop/save flag all-reduce (gloo, 2 x int32)", f"{ar * 1e6:.0f} us/call", "", ""),
            ("run.step() with the all-reduce / without", f"{with_ar * 1e6:.0f} us / {without * 1e6:.1f} us", "", ""),
        ]
        hdr = ("measure (2 ranks, CPU, gloo)", "measured", "ratio", "target")
        w = [max(len(r[i]) for r in rows + [hdr]) for i in range(4)]
        for r in [hdr, *rows]:
            print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
        print(f"rounds {args.rounds} each, alternating; writes to {root.parent} ({os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.2f})")
    dist.barrier()
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
