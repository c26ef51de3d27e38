"""Per-step overhead of the HF and Lightning callbacks, side by side in one process (not a test).

    .venv/bin/python bench/bench_integrations.py [--rounds 5]

For each framework the same tiny CPU training (the examples' models) runs alternately without
and with ResilientCallback (no saves in either, so only the per-step work differs). A timing
callback records every step's end; each side reports the lower-quartile step interval of its
best round. The callback's own per-step hook is also timed directly (many calls, no training), which
is the figure noise cannot hide. Goal: <= 1 % of a tiny CPU training step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["RESILIENT_RUN_DIR"] = tempfile.mkdtemp(prefix="bench-integrations-")

import logging  # noqa: E402
import warnings  # noqa: E402

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

GOAL = 0.01


def _median_interval(stamps: list[float]) -> float:
    """Lower quartile of the step intervals: on a shared box other processes only ever add time."""
    d = sorted(b - a for a, b in zip(stamps[5:], stamps[6:]))  # skip warm-up steps
    return statistics.quantiles(d, n=4)[0]


def _side_by_side(run: Callable[[bool], list[float]], rounds: int) -> tuple[float, float]:
    bare, cb = [], []
    for r in range(rounds):
        for with_cb in ((False, True) if r % 2 == 0 else (True, False)):
            (cb if with_cb else bare).append(_median_interval(run(with_cb)))
    return min(bare), min(cb)


def _hook_cost(call: Callable[[], Any], n: int = 20000) -> float:
    call()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - t0) / n


def bench_hf(rounds: int) -> tuple[float, float, float]:
    from transformers import TrainerCallback, TrainerControl, TrainerState
    from transformers.utils import logging as hf_logging

    from examples.hf_train import build
    from trainer_shim.integrations.hf import ResilientCallback

    hf_logging.set_verbosity_error()

    class Stamp(TrainerCallback):
        def __init__(self) -> None:
            self.t: list[float] = []

        def on_step_end(self, args, state, control, **kw):
            self.t.append(time.perf_counter())

    out = tempfile.mkdtemp(prefix="bench-hf-")
    cb_for_hook: list[Any] = []

    def run(with_cb: bool) -> list[float]:
        stamp = Stamp()
        cbs: list[Any] = [stamp]
        if with_cb:
            cbs.append(ResilientCallback())
            cb_for_hook[:] = cbs[1:]
        tr = build(out, epochs=10, callbacks=cbs)
        tr.args.save_strategy = "no"
        tr.args.logging_steps = 10
        tr.train()
        return stamp.t

    bare, cb = _side_by_side(run, rounds)
    c = cb_for_hook[0]
    args, state, control = c_args = (tr_args := _Args()), TrainerState(global_step=7, epoch=1.5), TrainerControl()
    del c_args, tr_args
    return bare, cb, _hook_cost(lambda: c.on_step_end(args, state, control))


class _Args:
    save_total_limit = None
    output_dir = "."
    should_save = True


def bench_lightning(rounds: int) -> tuple[float, float, float]:
    import torch

    from examples.lightning_train import build, pl
    from trainer_shim.integrations.lightning import ResilientCallback

    class Stamp(pl.Callback):
        def __init__(self) -> None:
            self.t: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.t.append(time.perf_counter())

    holder: list[Any] = []

    def run(with_cb: bool) -> list[float]:
        stamp = Stamp()
        cbs: list[Any] = [stamp]
        if with_cb:
            cbs.append(ResilientCallback(save_on_train_end=False))
            holder[:] = [cbs[1]]
        model, loader, trainer = build(epochs=10, callbacks=cbs)
        trainer.fit(model, train_dataloaders=loader)
        holder.append(trainer) if with_cb else None
        return stamp.t

    bare, cb = _side_by_side(run, rounds)
    c, trainer = holder[0], holder[-1]
    out = {"loss": torch.tensor(0.5)}
    return bare, cb, _hook_cost(lambda: c.on_train_batch_end(trainer, None, out, None, 0))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    rows = [("HF Trainer (GPT-2 2x32)", *bench_hf(a.rounds)), ("Lightning (MLP 16-64-1)", *bench_lightning(a.rounds))]
    print(f"\n{'framework':<26}{'bare step':>12}{'with cb':>12}{'ratio':>9}{'hook/step':>12}{'hook %':>9}{'goal':>8}")
    for name, bare, cb, hook in rows:
        print(f"{name:<26}{bare * 1e3:>10.3f}ms{cb * 1e3:>10.3f}ms{cb / bare:>9.3f}{hook * 1e6:>10.1f}us"
              f"{hook / bare:>9.2%}{'<= 1%':>8}")


if __name__ == "__main__":
    main()
