"""A job for the raw memory-snapshot restore tests.

`snap`: train N steps with a memory snapshot every step (a disk save every --save-every), torch.save
the state reached after each step, and after one step more (not snapshotted), to --expect
({step: state}), then kill -9 itself (the slots stay behind). `restore`: build the model with another
seed (optionally with optimizer state from one step of its own), init() on the same run dir, and
print one JSON line: the step it resumed at, whether the state equals --expect bit for bit,
whether it landed in the tensors that existed before init() (in place), and whether the model is
still exactly its own initial weights; then whether one more training step (optimizer
state, restored RNG) lands exactly where the killed run's next step did.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import trainer_shim  # noqa: E402


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    opt.step()


def tensors(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, st in opt.state_dict()["state"].items():
        out.update({f"opt.{i}.{k}": v for k, v in st.items() if isinstance(v, torch.Tensor)})
    return out


def snap_restore_parser(steps: int) -> argparse.ArgumentParser:
    """The arguments of a snap-then-restore job: mode, --run-dir, --expect, --steps."""
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["snap", "restore"])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--expect", required=True)
    ap.add_argument("--steps", type=int, default=steps)
    return ap


def main() -> None:
    ap = snap_restore_parser(3)
    ap.add_argument("--save-every", type=int, default=1000)
    ap.add_argument("--warm-optimizer", action="store_true")
    args = ap.parse_args()
    if args.mode == "snap":
        model, opt = build(0)
        run = trainer_shim.init(model=model, optimizer=opt, run_dir=args.run_dir, memory_every_steps=1,
                                save_every_steps=args.save_every, save_on_epoch_end=False)
        want = {}
        for n in range(1, args.steps + 2):
            step(model, opt)
            if n <= args.steps:
                run.step()
                run.engine.fast.drain()  # each snapshot complete (hashed in the background) before the next
            want[n] = {k: v.clone() for k, v in tensors(model, opt).items()}
        torch.save(want, args.expect)
        os.kill(os.getpid(), signal.SIGKILL)
    model, opt = build(1)
    if args.warm_optimizer:
        step(model, opt)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    before = {k: v.data_ptr() for k, v in tensors(model, opt).items()}
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=args.run_dir, memory_every_steps=1,
                            save_every_steps=args.save_every, save_on_epoch_end=False)
    expect = torch.load(args.expect, weights_only=True)
    want, got = expect.get(run.global_step, {}), tensors(model, opt)
    out = {
        "step": run.global_step,
        "equal": got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want),
        "in_place": sorted(k for k, p in before.items() if k in got and got[k].data_ptr() == p),
        "initial": all(torch.equal(model.state_dict()[k], v) for k, v in initial.items()),
        # A non-sharded restore has no use for DCP (its import alone costs ~0.3-0.6 s).
        "dcp_imported": "torch.distributed.checkpoint" in sys.modules,
    }
    if run.global_step:
        step(model, opt)
        got, want = tensors(model, opt), expect[run.global_step + 1]
        out["next_equal"] = got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    print(json.dumps(out), flush=True)
    run.finish()


if __name__ == "__main__":
    main()
