"""Costs of the smarter policies' per-step work, as ratios against a baseline measured side by side in one process.

Run: .venv/bin/python bench/bench_policies.py [--steps 20000] [--rounds 5]

- the divergence guard's check (`value - value != 0.0`, one float subtraction; the mode is only
  looked at once the loss is non-finite) against a whole run.step(loss=...), float and 0-dim tensor:
  ratio = step / (step - check), goal <= 1.05. A tensor loss pays no extra device sync: float()
  was already taken for the heartbeat before the guard existed.
- Young/Daly auto interval vs the best fixed interval of a sweep on a Poisson failure trace
  (lost work + save overhead), goal <= 1.10.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import trainer_shim  # noqa: E402
from tests.shim.test_auto_interval import wasted  # noqa: E402
from trainer_shim._policies.save_interval import young_daly  # noqa: E402


def per_step_ns(steps: int, tensor: bool, base: Path) -> float:
    run = trainer_shim.init(run_dir=base / f"{tensor}-{time.monotonic_ns()}", heartbeat_interval=3600)
    loss = torch.tensor(0.5) if tensor else 0.5
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        run.step(loss=loss)
    dt = (time.perf_counter_ns() - t0) / steps
    run.engine.hb.stop()
    return dt


def check_ns(steps: int) -> float:
    """The guard's added work per step: the subtraction and compare, minus an empty loop."""
    value = 0.5
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        if value - value != 0.0:
            pass
    t1 = time.perf_counter_ns()
    for _ in range(steps):
        pass
    t2 = time.perf_counter_ns()
    return max(0.0, ((t1 - t0) - (t2 - t1)) / steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tensor in (False, True):
            step = statistics.median(per_step_ns(a.steps, tensor, Path(tmp)) for _ in range(a.rounds))
            chk = statistics.median(check_ns(a.steps * 10) for _ in range(a.rounds))
            rows.append((f"run.step(loss={'tensor' if tensor else 'float'}) / same without the check",
                         f"{step:.0f} ns, check {chk:.0f} ns", step / max(step - chk, 1.0), "<= 1.05"))
    for mtbf, cost in ((3600.0, 20.0), (8 * 3600.0, 120.0), (1800.0, 5.0)):
        rng = random.Random(16)
        fails = [rng.expovariate(1.0 / mtbf) for _ in range(20000)]
        work = 400 * mtbf
        best = min(wasted(mtbf * f, cost, fails, work) for f in (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1,
                                                                   0.15, 0.2, 0.3, 0.5))
        auto = wasted(young_daly(cost, mtbf), cost, fails, work)
        rows.append((f"auto interval waste / best fixed (M={mtbf:g}s, C={cost:g}s)", f"tau={young_daly(cost, mtbf):.0f}s",
                     auto / best, "<= 1.10"))
    print(f"{'measure':62} {'values':>22} {'ratio':>7}  goal")
    for name, vals, ratio, goal in rows:
        print(f"{name:62} {vals:>22} {ratio:7.3f}  {goal}")


if __name__ == "__main__":
    main()
