"""DLRover Flash Checkpoint beside ours (bench/bench_async.py runs this in a child process: its
saver, sockets and shared memory stay out of our process). Prints one JSON line.

Same state as bench_async (model + Adam, ~--mb MiB); figures from one run, side by side:
- floor: `buf.copy_(t)` into preallocated buffers; DLRover's DdpCheckpointer memory-save stall;
- bare torch.load of the state from a file; DLRover's load_checkpoint() from its shared memory
  (its saver still alive: the case it handles), alone (it returns views of its shared memory)
  and with load_state_dict into the model and optimizer (what a restart needs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from bench.bench_async import build, state_tensors, timed, train_step  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType

    # First: it forks its saver here, best before torch has run (a fork of a busy process can
    # inherit a held lock; its saver then never answers and the constructor times out).
    ck = DdpCheckpointer(os.path.join(args.dir, "dlrover"))
    model, opt = build(args.mb)
    tensors = state_tensors(model, opt)
    bufs = [torch.empty_like(t).copy_(t) for t in tensors]
    f = Path(args.dir) / "dlrover-bare.pt"
    res: dict[str, list[float]] = {"floor": [], "save": [], "bare": [], "load": [], "apply": []}
    step = 0

    def save() -> None:
        ck.save_checkpoint(step, {"model": model.state_dict(), "optimizer": opt.state_dict()},
                           os.path.join(args.dir, "dlrover", f"{step}.pt"), storage_type=StorageType.MEMORY)

    save()  # first save allocates its shared memory
    for _ in range(args.rounds):
        step += 1
        train_step(model, opt)
        res["floor"].append(timed(lambda: [b.copy_(t) for b, t in zip(bufs, tensors)]))
        res["save"].append(timed(save))
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
    for _ in range(args.rounds):
        res["bare"].append(timed(lambda: torch.load(f, map_location="cpu", weights_only=True)))
        t0 = time.perf_counter()
        got = ck.load_checkpoint()
        res["load"].append(time.perf_counter() - t0)
        assert got, "DLRover returned no state from memory"
        t0 = time.perf_counter()  # its load hands out views of its shared memory: applying them is the copy
        got = ck.load_checkpoint()
        model.load_state_dict(got["model"])
        opt.load_state_dict(got["optimizer"])
        res["apply"].append(time.perf_counter() - t0)
    print(json.dumps({k: statistics.median(v) for k, v in res.items()}), flush=True)
    os._exit(0)  # its saver threads/sockets would keep a normal exit waiting


if __name__ == "__main__":
    main()
