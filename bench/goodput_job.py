"""The job bench/bench_goodput.py runs under every tool: model + Adam (bench_async.build), a
deterministic batch per global step (so final weights are comparable bit for bit), N steps.

    GOODPUT_MODE=bare       no checkpoint at all (the ETTR reference: no faults, no checkpoints)
    GOODPUT_MODE=shim       trainer_shim.init(**json(GOODPUT_OPTS)) (under resilient-run)
    GOODPUT_MODE=torchsave  what a careful user writes under torchrun: torch.save to a temp file,
                            fsync, rename, fsync the dir every --save-every steps; resume from it
    GOODPUT_MODE=dlrover    DLRover's Flash Checkpoint as its docs show it, under `dlrover-run`:
                            a memory save every --memory-every steps, a disk save every --save-every
                            steps, resume from load_checkpoint() (its agent keeps the memory copy
                            across a restart)

GOODPUT_MARKS: each attempt appends "start <pid> <time>", then "step <N> <time>" per step (the
bench counts steps redone and finds the process to kill from them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.bench_async import HIDDEN, build  # noqa: E402


def train_step(model, opt, step: int, batch: int) -> None:
    g = torch.Generator().manual_seed(step)
    opt.zero_grad(set_to_none=True)
    model(torch.randn(batch, HIDDEN, generator=g)).pow(2).mean().backward()
    opt.step()


def _durable_save(state: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Flash:
    """DLRover Flash Checkpoint with run.step()/finish() like the shim's Run (one code path below)."""

    def __init__(self, root: str, model, opt, disk_every: int, memory_every: int) -> None:
        from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType

        self._ck, self._types, self.root = DdpCheckpointer(root), StorageType, root
        self.model, self.opt, self.disk_every, self.global_step = model, opt, disk_every, 0
        self.memory_every = memory_every

    def restore(self) -> int:
        state = self._ck.load_checkpoint()   # from the agent's shared memory, else its newest on disk
        if state:
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            self.global_step = int(state["step"])
        return self.global_step

    def step(self) -> None:
        self.global_step += 1
        if self.global_step % self.disk_every == 0:
            kind = self._types.DISK
        elif self.global_step % self.memory_every == 0:
            kind = self._types.MEMORY
        else:
            return
        self._ck.save_checkpoint(self.global_step, {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                                                    "step": self.global_step},
                                 os.path.join(self.root, f"checkpoint-{self.global_step}.pt"), storage_type=kind)

    def finish(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--memory-every", type=int, default=1, help="dlrover mode: steps between memory saves")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    mode = os.environ["GOODPUT_MODE"]
    marks = open(os.environ["GOODPUT_MARKS"], "a", buffering=1)
    marks.write(f"start {os.getpid()} {time.time()}\n")
    model, opt = build(args.mb)   # one warm-up step inside: Adam's state exists, as in a real job
    step, run = 0, None
    ckpt = Path(args.dir) / "latest.pt"
    if mode == "shim":
        import trainer_shim
        run = trainer_shim.init(model=model, optimizer=opt, run_dir=args.dir, save_on_epoch_end=False,
                                **json.loads(os.environ.get("GOODPUT_OPTS") or "{}"))
        step = run.global_step
    elif mode == "dlrover":
        run = _Flash(args.dir, model, opt, args.save_every, args.memory_every)
        step = run.restore()
    elif mode == "torchsave" and ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
    while step < args.steps:
        train_step(model, opt, step, args.batch)
        step += 1
        if run is not None:
            run.step()
        elif mode == "torchsave" and step % args.save_every == 0:
            _durable_save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, ckpt)
        marks.write(f"step {step} {time.time()}\n")
    if run is not None:
        run.finish()
    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
